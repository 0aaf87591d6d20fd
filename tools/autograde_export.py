"""Export the book's coding exercises for an autograder: otter-grader master notebooks, or plain pytest files
(book/instructor_guide.md, 'Grading').

    python tools/autograde_export.py otter --chapter 4 --out DIR [--colab] [--tests-url URL]
    python tools/autograde_export.py pytest --chapter all --out DIR [--solutions]

A coding exercise is a cell tagged `exercise-stub` that defines `my_<name>(...)` and calls its grader,
`grade_<what>(my_<name>)`, under the exercise's `{exercise}` directive; its answer is the function of the same name
in the first cell tagged `solution` after the stub (CONTRIBUTING.md, 'Exercises and the student edition'). Every
exercise gets two checks, both the exercise's own grader from transformer_lib.grading, run with
TRANSFORMER_LIB_STRICT_GRADING=1 so that an untouched stub fails instead of printing a line:
- the public check, the grader's own cases at a fixed seed (PUBLIC_SEED), the same inputs on every run;
- the fresh check, the grader with inputs drawn anew on every run (no seed).

otter: DIR/<chapter>/<chapter>.ipynb, one otter master notebook (otter-grader's v1 format: `# ASSIGNMENT CONFIG`,
`# BEGIN QUESTION`, `# BEGIN SOLUTION`, `# BEGIN TESTS`) per chapter, one question per coding exercise: the prompt
is the exercise's text, the solution the book's folded one (the student's copy gets the stub's
`raise NotImplementedError`), the public check a public test and the fresh check a hidden one, in otter's
exception-based test format; and DIR/<chapter>/requirements.txt, the package at the commit the chapter's Colab cell
installs. `otter assign DIR/<chapter>/<chapter>.ipynb DIR/<chapter>/dist` then writes the student notebook
(dist/student) and the autograder zip (dist/autograder). --colab declares that students run it in Colab (otter's
`runs_on: colab`: the notebook installs otter-grader and reads its tests from files, which --tests-url says where to
download from).

pytest: DIR/exercises.py (the stubs, or with --solutions the book's answers: what the student fills in), DIR/adapters.py
(the one file that says where each of the student's functions is imported from), DIR/conftest.py (strict grading)
and DIR/test_<chapter>.py for each chapter; `python -m pytest DIR` grades.

--chapter takes a chapter's number (1, 2, ...) or `all`. An unknown chapter, a chapter without coding exercises and a
--out folder that exists and is not empty are each refused with one line, before anything is written.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import json
import re
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import colab  # noqa: E402
import export  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "book"

STUB_TAG, SOLUTION_TAG = "exercise-stub", "solution"
PUBLIC_SEED = 0  # the public checks' inputs: the grader's own cases, drawn with this seed
STRICT = "TRANSFORMER_LIB_STRICT_GRADING"  # set to 1, an untouched stub fails (transformer_lib/grading/engine.py)

_EXERCISE = re.compile(
    r"^:::\{exercise\}[ \t]*(?P<title>[^\n]*)\n:label:[ \t]*(?P<label>\S+)\n(?P<body>.*?)\n:::[ \t]*$", re.M | re.S)
_DIFFICULTY = re.compile(r"\*\*Difficulty:\*\*\s*(?P<stars>[★☆]{3})\s*·\s*\*\*Time:\*\*\s*(?P<minutes>\d+)\s*min")
_ROLE = re.compile(r"\{[\w:-]+\}`(?P<text>[^`<]*?)\s*(?:<[^`>]*>)?`")  # {cite:p}`key`, {ref}`text <target>`


class ExportError(ValueError):
    """A chapter's exercises cannot be exported (an unknown chapter, a stub without its grader call or answer, ...)."""


@dataclass
class Exercise:
    """One coding exercise of a chapter, as the book writes it."""

    chapter: str  # the notebook's stem, e.g. 04_masking
    number: str  # e.g. 4.4: the chapter and the exercise's place among the chapter's exercises
    label: str  # e.g. ex-masking-packed
    title: str
    stars: str
    minutes: int
    text: str  # the task, in markdown, without the directive's fences, label and difficulty line
    function: str  # e.g. my_packed_mask
    grader: str  # e.g. grade_packed_mask
    stub: str  # the stub's def, as the book writes it
    solution: str  # the answer's def, from the first solution cell after the stub
    imports: list[str] = field(default_factory=list)  # the chapter's import lines that the two defs need

    @property
    def question(self) -> str:
        """The otter question's name, from the exercise's label: ex_masking_packed."""
        return self.label.replace("-", "_")


# ----------------------------------------------------------------------------------------------------------------
# Reading the exercises of a chapter


def _source(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _tags(cell: dict) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def chapters(book: Path = BOOK) -> dict[int, Path]:
    """The numbered chapters of the book, by number: {4: book/04_masking.ipynb, ...}."""
    return {int(path.name[:2]): path for path in sorted(book.glob("[0-9][0-9]_*.ipynb"))}


def select(chapter: str, book: Path = BOOK) -> list[Path]:
    """The notebooks named by --chapter: a number or `all` (the chapters that have coding exercises)."""
    known = chapters(book)
    with_exercises = {n: p for n, p in known.items() if any(STUB_TAG in _tags(c) for c in _cells(p))}
    if chapter == "all":
        return list(with_exercises.values())
    if not re.fullmatch(r"\d{1,2}", chapter) or int(chapter) not in known:
        raise ExportError(f"--chapter {chapter!r} is not a chapter of the book; expected a number from "
                          f"{min(known)} to {max(known)}, or all")
    if int(chapter) not in with_exercises:
        raise ExportError(f"--chapter {chapter}: {known[int(chapter)].name} has no coding exercise (no cell tagged "
                          f"{STUB_TAG}); chapters with coding exercises: {', '.join(map(str, with_exercises))}")
    return [known[int(chapter)]]


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def _function(tree: ast.Module, source: str, name: str | None = None) -> ast.FunctionDef | None:
    """The top-level def of a cell named name (or, without a name, the first one named my_*)."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and (node.name == name if name else node.name.startswith("my_")):
            return node
    return None


def _segment(source: str, node: ast.AST) -> str:
    lines = source.splitlines()
    start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    return "\n".join(lines[start - 1 : node.end_lineno])


def _grader_call(tree: ast.Module, function: str) -> str | None:
    """The name of the grader a cell calls on function: grade_x(my_y) at the top level."""
    for node in tree.body:
        if (isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name)
                and node.value.func.id.startswith("grade_")
                and any(isinstance(a, ast.Name) and a.id == function for a in node.value.args)):
            return node.value.func.id
    return None


def _bound_by_imports(cells: list[dict]) -> dict[str, str]:
    """Every name that a top-level import of the notebook binds -> that import as one line."""
    bound: dict[str, str] = {}
    for cell in cells:
        if cell["cell_type"] != "code":
            continue
        try:
            tree = ast.parse(_source(cell))
        except SyntaxError:  # a cell of IPython magics: it imports nothing the exercises need
            continue
        for node in tree.body:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    name = alias.asname or alias.name.split(".")[0]
                    bound.setdefault(name, f"import {alias.name}" + (f" as {alias.asname}" if alias.asname else ""))
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                for alias in node.names:
                    name = alias.asname or alias.name
                    bound.setdefault(name, f"from {node.module} import {alias.name}"
                                     + (f" as {alias.asname}" if alias.asname else ""))
    return bound


def _bound_by_exports(path: Path) -> dict[str, str]:
    """Every name that the notebook's `#| export` cells define -> its import from the module they are written to
    (tools/export.py): a class the chapter writes, such as MultiHeadAttention, is transformer_lib.multihead's."""
    _, _, blocks = export.notebook_cells(path)
    bound: dict[str, str] = {}
    for module, sources in blocks.items():
        for source in sources:
            for node in ast.parse(source).body:
                names = [node.name] if isinstance(node, (ast.FunctionDef, ast.ClassDef)) else [
                    t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
                for name in names:
                    bound.setdefault(name, f"from transformer_lib.{module} import {name}")
    return bound


def free_names(function: ast.FunctionDef) -> set[str]:
    """The names a def reads that neither it nor Python's builtins define (annotations and defaults included)."""
    stored = {arg.arg for arg in ast.walk(function) if isinstance(arg, ast.arg)}
    stored |= {n.id for n in ast.walk(function) if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))}
    stored |= {n.name for n in ast.walk(function)
               if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n is not function}
    loaded = {n.id for n in ast.walk(function) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return loaded - stored - set(dir(builtins)) - {function.name}


def _clean_markdown(text: str) -> str:
    """The exercise's text for a notebook outside the book: MyST roles become their text."""
    return _ROLE.sub(lambda m: m["text"], text).strip()


def read_exercises(path: Path) -> list[Exercise]:
    """The coding exercises of one chapter notebook, in order."""
    from transformer_lib.grading import EXERCISE_GRADERS

    cells = _cells(path)
    chapter, number = path.stem, int(path.name[:2])
    imports = {**_bound_by_exports(path), **_bound_by_imports(cells)}
    found: list[Exercise] = []
    directive: tuple[int, re.Match] | None = None  # (its place among the chapter's exercises, the match)
    count = 0
    for index, cell in enumerate(cells):
        source = _source(cell)
        if cell["cell_type"] == "markdown":
            for match in _EXERCISE.finditer(source):
                count += 1
                directive = (count, match)
            continue
        if STUB_TAG not in _tags(cell):
            continue
        where = f"{path.name}, cell {index}"
        tree = ast.parse(source)
        stub = _function(tree, source)
        if stub is None:
            raise ExportError(f"{where}: the cell tagged {STUB_TAG} defines no function named my_*")
        grader = _grader_call(tree, stub.name)
        if grader is None:
            raise ExportError(f"{where}: the stub cell does not call a grader on {stub.name} "
                              f"(e.g. grade_x({stub.name}))")
        if directive is None:
            raise ExportError(f"{where}: the stub {stub.name} comes before any {{exercise}} directive")
        place, match = directive
        label = match["label"]
        if label not in EXERCISE_GRADERS or EXERCISE_GRADERS[label].__name__ != grader:
            registered = EXERCISE_GRADERS[label].__name__ if label in EXERCISE_GRADERS else "no grader"
            raise ExportError(f"{where}: the stub calls {grader}, but EXERCISE_GRADERS has {registered} for the "
                              f"exercise above it, {label}")
        answer = None
        for later in cells[index + 1 :]:
            if later["cell_type"] == "code" and SOLUTION_TAG in _tags(later):
                later_source = _source(later)
                answer = _function(ast.parse(later_source), later_source, stub.name)
                if answer is not None:
                    answer_source = _segment(later_source, answer)
                    break
        if answer is None:
            raise ExportError(f"{where}: no cell tagged {SOLUTION_TAG} after the stub defines {stub.name}")
        needed = sorted(free_names(stub) | free_names(answer))
        missing = [name for name in needed if name not in imports]
        if missing:
            raise ExportError(f"{where}: {stub.name} uses {', '.join(missing)}, which no import of {path.name} "
                              f"defines; an exported exercise can only use imported names")
        body = match["body"]
        difficulty = _DIFFICULTY.search(body)
        if difficulty is None:
            raise ExportError(f"{where}: the exercise {label} has no "
                              f"'**Difficulty:** ★★☆ · **Time:** N min' line")
        text = _clean_markdown(body[: difficulty.start()] + body[difficulty.end() :])
        found.append(Exercise(
            chapter=chapter, number=f"{number}.{place}", label=label, title=match["title"].strip(),
            stars=difficulty["stars"], minutes=int(difficulty["minutes"]), text=text, function=stub.name,
            grader=grader, stub=_segment(source, stub), solution=answer_source,
            imports=sorted({imports[name] for name in needed}),
        ))
    return found


# ----------------------------------------------------------------------------------------------------------------
# The checks, as source


def check_function(exercise: Exercise, name: str, seed: int | None) -> str:
    """A test function that runs the exercise's grader in strict mode on the student's function, which it receives as
    its argument (otter passes the notebook's global of that name; the pytest files pass the adapter's)."""
    inputs = (f"the grader's own cases, drawn with seed={seed}" if seed is not None
              else "inputs drawn anew on every run")
    return textwrap.dedent(f'''\
        def {name}({exercise.function}):
            """Exercise {exercise.number} ({exercise.label}): {exercise.grader} on {inputs}."""
            import os

            from transformer_lib.grading import {exercise.grader}

            before = os.environ.get("{STRICT}")
            os.environ["{STRICT}"] = "1"  # an untouched stub fails instead of printing a line
            try:
                {exercise.grader}({exercise.function}, seed={seed!r})
            finally:
                if before is None:
                    del os.environ["{STRICT}"]
                else:
                    os.environ["{STRICT}"] = before
        ''')


def _body_lines(source: str, node: ast.FunctionDef) -> tuple[list[str], list[str]]:
    """(the def's header lines with its docstring, the rest of its body's lines) of a def's source."""
    lines = source.splitlines()
    first = node.body[0]
    has_docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(
        first.value.value, str)
    rest = node.body[1:] if has_docstring else node.body
    offset = node.lineno - 1 if not node.decorator_list else node.decorator_list[0].lineno - 1
    split = (rest[0].lineno - 1 - offset) if rest else len(lines)
    return lines[:split], lines[split:]


def master_function(exercise: Exercise) -> str:
    """The def for otter's solution cell: the stub's header and docstring, then the stub's body as the student's
    prompt and the book's answer as the solution (otter keeps one or the other)."""
    stub_tree, answer_tree = ast.parse(exercise.stub).body[0], ast.parse(exercise.solution).body[0]
    header, stub_body = _body_lines(exercise.stub, stub_tree)
    _, answer_body = _body_lines(exercise.solution, answer_tree)
    indent = re.match(r"\s*", stub_body[0] if stub_body else "    ")[0]
    return "\n".join([
        *header,
        f'{indent}""" # BEGIN PROMPT',
        *stub_body,
        f'{indent}""" # END PROMPT',
        f"{indent}# BEGIN SOLUTION NO PROMPT",
        *answer_body,
        f"{indent}# END SOLUTION",
    ])


# ----------------------------------------------------------------------------------------------------------------
# otter


def _raw(text: str) -> dict:
    return {"cell_type": "raw", "metadata": {}, "source": text}


def _markdown(text: str) -> dict:
    return {"cell_type": "markdown", "metadata": {}, "source": text}


def _code(text: str) -> dict:
    return {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": text}


def otter_notebook(path: Path, exercises: list[Exercise], colab_run: bool = False,
                   tests_url: str | None = None) -> dict:
    """The otter master notebook of one chapter's coding exercises."""
    cells = _cells(path)
    url, _ = colab.repository(path.parent / "_config.yml")
    config = {
        "name": path.stem,
        "requirements": "requirements.txt",
        "init_cell": True,
        "check_all_cell": True,
        "export_cell": {"pdf": False, "instructions": "Submit the zip file that the cell below makes."},
        "tests": {"files": True, "ok_format": False, **({"url_prefix": tests_url} if tests_url else {})},
        "generate": {"pdf": False, "show_stdout": True},
        **({"runs_on": "colab"} if colab_run else {}),
    }
    total = sum(e.minutes for e in exercises)
    out = [
        _raw("# ASSIGNMENT CONFIG\n" + _yaml(config)),
        _markdown(
            f"# The coding exercises of chapter {int(path.name[:2])}\n\n"
            f"From *Transformer, Piece by Piece*, [{path.stem}]({url}/blob/main/book/{path.name}): read the chapter "
            f"first. Write each function where the cell says so; the cell below it runs the exercise's check on "
            f"the grader's own inputs, and the autograder runs it again on inputs drawn anew. About {total} minutes."
        ),
    ]
    if cells and colab.is_install_cell(cells[0]):
        out.append(_code(_source(cells[0])))  # installs the package in Colab; does nothing elsewhere
    graders = ", ".join(sorted({e.grader for e in exercises}))
    out.append(_code(_import_block(line for e in exercises for line in e.imports)
                     + f"\nfrom transformer_lib.grading import {graders}"))
    for e in exercises:
        out += [
            _raw(f"# BEGIN QUESTION\nname: {e.question}\npoints: 2"),
            _markdown(f"**Exercise {e.number}: {e.title}** ({e.stars} · {e.minutes} min)\n\n{e.text}"),
            _raw("# BEGIN SOLUTION"),
            _code(f"{master_function(e)}\n\n\n{e.grader}({e.function})"),
            _raw("# END SOLUTION"),
            _raw("# BEGIN TESTS"),
            _code('""" # BEGIN TEST CONFIG\nhidden: false\npoints: 1\n""" # END TEST CONFIG\n'
                  + check_function(e, "test_public", PUBLIC_SEED)),
            _code('""" # BEGIN TEST CONFIG\nhidden: true\npoints: 1\n""" # END TEST CONFIG\n'
                  + check_function(e, "test_fresh", None)),
            _raw("# END TESTS"),
            _raw("# END QUESTION"),
        ]
    for number, cell in enumerate(out):
        cell["id"] = f"cell-{number}"
    return {"cells": out, "metadata": {"kernelspec": colab.KERNEL_METADATA, "language_info": {"name": "python"}},
            "nbformat": 4, "nbformat_minor": 5}


def _import_block(lines) -> str:
    """Import lines, the plain imports first, then the from-imports, each group sorted."""
    unique = set(lines)
    return "\n".join(sorted(line for line in unique if line.startswith("import "))
                     + sorted(line for line in unique if line.startswith("from ")))


def _yaml(config: dict) -> str:
    import yaml

    return yaml.safe_dump(config, sort_keys=False, allow_unicode=True).rstrip("\n")


def requirements(path: Path) -> str:
    """requirements.txt of a chapter's autograder: the package at the commit the chapter's Colab cell installs."""
    pin = colab.pinned(json.loads(path.read_text(encoding="utf-8")))
    if pin is None:
        raise ExportError(f"{path.name} has no Colab install cell to take the package's commit from; run "
                          f"python tools/colab.py --sync")
    url, commit = pin
    return f"transformer-lib @ git+{url}@{commit}\n"


def write_otter(paths: list[Path], out: Path, colab_run: bool = False, tests_url: str | None = None) -> list[Path]:
    """Write the otter master notebook (and requirements.txt) of each chapter; return the notebooks."""
    planned = [(path, read_exercises(path)) for path in paths]  # every chapter read before anything is written
    _refuse_existing(out)
    written = []
    for path, exercises in planned:
        folder = out / path.stem
        folder.mkdir(parents=True)
        notebook = folder / f"{path.stem}.ipynb"
        notebook.write_text(json.dumps(otter_notebook(path, exercises, colab_run, tests_url), indent=1,
                                       ensure_ascii=False) + "\n", encoding="utf-8")
        (folder / "requirements.txt").write_text(requirements(path), encoding="utf-8")
        written.append(notebook)
    return written


# ----------------------------------------------------------------------------------------------------------------
# pytest


ADAPTERS = '''\
"""The one file that connects these checks to a student's code: where each function is imported from.

By default every function comes from exercises.py beside this file. If your students write their code elsewhere
(a package of their own, a file per chapter), change the module named for each function below; nothing else needs
to change. The tests call get(name) and hand what it returns to the exercise's grader.
"""

import importlib

# function -> the module it is imported from
FUNCTIONS = {
%s
}


def get(name):
    """The student's function called name, imported from the module FUNCTIONS names for it."""
    module_name = FUNCTIONS[name]
    module = importlib.import_module(module_name)
    function = getattr(module, name, None)
    if not callable(function):
        raise AssertionError(f"{module_name} defines no function {name}: write it there (its stub is in "
                             f"exercises.py), or name the module it is in, in FUNCTIONS of adapters.py")
    return function
'''

CONFTEST = f'''\
"""The checks run in strict mode: an exercise whose function still raises NotImplementedError (the stub) fails,
with the grader's "Exercise not attempted yet" line, instead of passing with a printed line."""

import os

os.environ["{STRICT}"] = "1"
'''


def exercises_module(exercises: list[Exercise], solutions: bool) -> str:
    """exercises.py: the stubs the student fills in (or, with solutions, the book's answers)."""
    what = "the book's answers (for checking the checks)" if solutions else "write each function's body"
    parts = [f'"""The coding exercises of Transformer, Piece by Piece: {what}.\n\n'
             f'Each function is graded by `python -m pytest` in this folder; adapters.py says where the tests import\n'
             f'it from."""', _import_block(line for e in exercises for line in e.imports)]
    for e in exercises:
        parts.append(f"# Exercise {e.number}, {e.title}\n# ({e.label}, book/{e.chapter}.ipynb)\n"
                     + (e.solution if solutions else e.stub))
    return "\n\n\n".join(parts) + "\n"


def test_module(chapter: str, exercises: list[Exercise]) -> str:
    """test_<chapter>.py: for each exercise, its grader on the grader's own cases and on inputs drawn anew."""
    graders = ", ".join(sorted({e.grader for e in exercises}))
    parts = [f'"""The checks of the coding exercises of book/{chapter}.ipynb: each exercise\'s grader on the\n'
             f'grader\'s own cases (seed {PUBLIC_SEED}) and on inputs drawn anew (conftest.py makes an untouched stub '
             f'fail)."""'
             f"\n\nimport adapters\nfrom transformer_lib.grading import {graders}"]
    for e in exercises:
        for suffix, seed, inputs in (("public", PUBLIC_SEED, f"the grader's own cases, seed {PUBLIC_SEED}"),
                                     ("fresh", None, "inputs drawn anew on every run")):
            parts.append(f"def test_{e.function}_{suffix}():\n"
                         f'    """Exercise {e.number} ({e.label}): {e.grader} on {inputs}."""\n'
                         f"    {e.grader}(adapters.get({e.function!r}), seed={seed!r})")
    return "\n\n\n".join(parts) + "\n"


def write_pytest(paths: list[Path], out: Path, solutions: bool = False) -> list[Path]:
    """Write exercises.py, adapters.py, conftest.py and one test file per chapter; return the test files."""
    planned = [(path, read_exercises(path)) for path in paths]
    everything = [e for _, exercises in planned for e in exercises]
    bound: dict[str, str] = {}
    for e in everything:
        for line in e.imports:
            name = line.split(" as ")[-1].split()[-1].split(".")[0]
            if bound.setdefault(name, line) != line:
                raise ExportError(f"two chapters bind {name} differently ({bound[name]!r} and {line!r}); export "
                                  f"those chapters one at a time")
    _refuse_existing(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "exercises.py").write_text(exercises_module(everything, solutions), encoding="utf-8")
    table = "\n".join(f'    "{e.function}": "exercises",  # exercise {e.number}, {e.label}' for e in everything)
    (out / "adapters.py").write_text(ADAPTERS % table, encoding="utf-8")
    (out / "conftest.py").write_text(CONFTEST, encoding="utf-8")
    written = []
    for path, exercises in planned:
        test_file = out / f"test_{path.stem}.py"
        test_file.write_text(test_module(path.stem, exercises), encoding="utf-8")
        written.append(test_file)
    return written


# ----------------------------------------------------------------------------------------------------------------
# The command


def _refuse_existing(out: Path) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        kind = "a folder that is not empty" if out.is_dir() else "a file"
        raise ExportError(f"--out {out} is {kind}; give a new folder (nothing was written)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("format", choices=("otter", "pytest"), help="otter master notebooks, or pytest files")
    parser.add_argument("--chapter", required=True, help="a chapter's number, or all")
    parser.add_argument("--out", type=Path, required=True, help="a new folder to write into")
    parser.add_argument("--colab", action="store_true", help="otter: students run the notebook in Colab")
    parser.add_argument("--tests-url", help="otter, with --colab: the URL prefix students' notebooks fetch tests from")
    parser.add_argument("--solutions", action="store_true",
                        help="pytest: exercises.py holds the book's answers instead of the stubs")
    args = parser.parse_args(argv)
    if args.format == "pytest" and (args.colab or args.tests_url):
        parser.error("--colab and --tests-url apply to the otter format only")
    if args.format == "otter" and args.solutions:
        parser.error("--solutions applies to the pytest format only (otter's notebook holds both)")
    if args.tests_url and not args.colab:
        parser.error("--tests-url needs --colab (a notebook run elsewhere reads its tests beside it)")
    try:
        paths = select(args.chapter)
        if args.format == "otter":
            written = write_otter(paths, args.out, args.colab, args.tests_url)
        else:
            written = write_pytest(paths, args.out, args.solutions)
    except (ExportError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
