"""Make the student edition of the book: the same repository with every solution removed
(CONTRIBUTING.md, 'Exercises and the student edition').

    python tools/student_edition.py --out DIR [--branch student] [--build]
                                   [--url URL] [--clear-all-outputs] [--force] [--include-untracked] [--repo PATH]

1. Copies the repository's tracked files (`git ls-files`, as they are in the working tree) into DIR; with
   --include-untracked also the files git neither tracks nor ignores. Build outputs and .venv are never copied.
2. In every DIR/book/*.ipynb:
   - removes every cell tagged `solution`;
   - removes every `{solution}` directive (`:::{solution} label` ... `:::`) from markdown cells, keeping the
     cell's other text;
   - removes everything from a `{solution-start}` marker through its `{solution-end}` marker (the cells in
     between, markdown and code; the text before the start marker and after the end marker stays);
   - replaces each nbgrader region (`### BEGIN SOLUTION` ... `### END SOLUTION`) of a code cell by
     `raise NotImplementedError("Exercise: write your solution here")`, indented like the markers, and tags the
     cell `raises-exception` so that the book still builds (an instructor's own regions may stub top-level code,
     which no grader catches; the book's exercise stubs, tagged `exercise-stub`, never raise);
   - clears every output and execution count, except in the notebooks that the build does not execute
     (execute.exclude_patterns: chapters 8 and 9, whose stored outputs come from their latest recorded full run; see
     CONTRIBUTING.md, 'Stored outputs of chapters 8 and 9'); there only the outputs of removed cells and of stubbed
     cells go. --clear-all-outputs clears those too;
   - keeps the Colab install cell as it is: it installs the package from the full edition's repository at the
     commit the notebook was written for (tools/colab.py), the same code either way.
3. Sets repository.branch in DIR/book/_config.yml to that branch (and repository.url to --url, when the edition
   is published in another repository), so that the launch buttons open the student notebooks; adds a banner to
   DIR/book/intro.md; leaves out of DIR/book/_toc.yml any page whose file is not in DIR (a chapter that is listed
   but not yet committed).
4. With --build, runs `jupyter-book build -W -n --keep-going DIR/book` and exits with its status.

It refuses, naming the notebook and the cell, a `{solution-start}` without its `{solution-end}` (or the reverse),
an unterminated `{solution}` directive and an nbgrader region without its END marker. It prints what it removed
from each notebook, and names any later cell that uses a name that only a removed solution cell defined.
"""

from __future__ import annotations

import argparse
import ast
import builtins
import fnmatch
import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

import colab  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent

SOLUTION_TAG = "solution"
STUB_TAG = "exercise-stub"  # the book's exercise stubs: they print "not attempted yet" and raise nothing
NBGRADER_TAG = "raises-exception"  # a cell whose nbgrader region became a raising stub
NBGRADER_STUB = 'raise NotImplementedError("Exercise: write your solution here")'

# A directive's opening line: a fence of 3+ colons or backticks, then {name}. MyST closes it at the first later
# line made only of the same fence character, at least as many times (markdown-it's container and fence rules).
_OPEN = re.compile(r"^[ \t]*(?P<fence>:{3,}|`{3,})\{(?P<name>solution|solution-start|solution-end)\}")
_BEGIN = re.compile(r"^(?P<indent>[ \t]*)#+[ \t]*BEGIN SOLUTION\b")
_END = re.compile(r"^(?P<indent>[ \t]*)#+[ \t]*END SOLUTION\b")


class SolutionMarkupError(ValueError):
    """The solution markup of a notebook cannot be removed safely (an unbalanced or unterminated marker)."""


@dataclass
class Removed:
    """What was taken out of one notebook."""

    solution_cells: int = 0  # cells tagged `solution`
    directives: int = 0  # `{solution}` directives removed from markdown cells
    blocks: int = 0  # `{solution-start}` ... `{solution-end}` regions
    block_cells: int = 0  # untagged cells dropped because they lay inside such a region
    nbgrader_regions: int = 0  # nbgrader regions turned into stubs
    outputs_cleared: int = 0  # code cells that had outputs or an execution count
    outputs_kept: int = 0  # code cells whose stored outputs stay (a notebook the build does not execute)
    kept: list[int] = field(default_factory=list)  # the original indices of the cells that stay
    warnings: list[str] = field(default_factory=list)  # later cells that need a removed solution

    def summary(self) -> str:
        return (
            f"{self.solution_cells} solution cells, {self.directives} solution directives, "
            f"{self.blocks} solution-start/end blocks ({self.block_cells} more cells), "
            f"{self.nbgrader_regions} nbgrader regions stubbed, outputs cleared in {self.outputs_cleared} cells"
            + (f", stored outputs kept in {self.outputs_kept} cells (not executed at build time)"
               if self.outputs_kept else "")
        )


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return "".join(source) if isinstance(source, list) else source


def _set_source(cell: dict, text: str) -> None:
    cell["source"] = text.splitlines(keepends=True)


def _tags(cell: dict) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def _closing_line(lines: list[str], start: int, fence: str) -> int | None:
    """Index of the line that closes the directive opened at lines[start] with `fence`, or None."""
    closing = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
    for index in range(start + 1, len(lines)):
        if closing.match(lines[index]):
            return index
    return None


def _tidy(text: str) -> str:
    """Drop the blank lines a removal leaves behind."""
    return re.sub(r"\n{3,}", "\n\n", text).strip("\n")


def _remove_directives(text: str, where: str) -> tuple[str, int]:
    """Remove every `{solution}` directive from a markdown text; return the text and how many were removed."""
    lines = text.splitlines(keepends=True)
    kept, count, index = [], 0, 0
    while index < len(lines):
        match = _OPEN.match(lines[index])
        if match and match["name"] == "solution":
            end = _closing_line(lines, index, match["fence"])
            if end is None:
                raise SolutionMarkupError(f"{where}: the {{solution}} directive on line {index + 1} is never closed")
            count += 1
            index = end + 1
            continue
        kept.append(lines[index])
        index += 1
    return ("".join(kept), count) if count else (text, 0)


def _find_marker(lines: list[str], name: str, where: str) -> tuple[int, int] | None:
    """(first line, closing line) of the first `{name}` marker directive in lines, or None."""
    for index, line in enumerate(lines):
        match = _OPEN.match(line)
        if match and match["name"] == name:
            end = _closing_line(lines, index, match["fence"])
            if end is None:
                raise SolutionMarkupError(f"{where}: the {{{name}}} marker on line {index + 1} is never closed")
            return index, end
    return None


def _stub_nbgrader(source: str, where: str) -> tuple[str, int]:
    """Replace each nbgrader `### BEGIN SOLUTION` ... `### END SOLUTION` region by a raising stub."""
    lines = source.splitlines(keepends=True)
    out, count, begin = [], 0, None
    for number, line in enumerate(lines, start=1):
        if _BEGIN.match(line):
            if begin is not None:
                raise SolutionMarkupError(
                    f"{where}: `BEGIN SOLUTION` on line {number} inside the region opened on line {begin}"
                )
            begin = number
            out.append(_BEGIN.match(line)["indent"] + NBGRADER_STUB + "\n")
        elif _END.match(line):
            if begin is None:
                raise SolutionMarkupError(
                    f"{where}: `END SOLUTION` on line {number} without a `BEGIN SOLUTION` before it"
                )
            begin = None
            count += 1
        elif begin is None:
            out.append(line)
    if begin is not None:
        raise SolutionMarkupError(f"{where}: the nbgrader region opened on line {begin} has no `### END SOLUTION`")
    if not count:
        return source, 0
    text = "".join(out)
    return (text[:-1] if not source.endswith("\n") and text.endswith("\n") else text), count


def strip_notebook(notebook: dict, name: str = "notebook", clear_outputs: bool = True) -> Removed:
    """Remove every solution from a notebook (a dict in nbformat 4), in place; return what was removed.

    clear_outputs=False keeps the stored outputs of the cells that stay unchanged (a notebook the build does not
    execute); the outputs of a cell whose nbgrader regions were stubbed are cleared all the same.
    """
    removed = Removed()
    kept: list[dict] = []
    open_block: int | None = None  # the index of the cell whose `{solution-start}` is still open
    for index, cell in enumerate(notebook["cells"]):
        where = f"{name}, cell {index}"
        text = _source(cell)
        is_solution = SOLUTION_TAG in _tags(cell)
        is_markdown = cell["cell_type"] == "markdown"
        removed.solution_cells += is_solution
        if open_block is not None:
            if is_markdown:
                lines = text.splitlines(keepends=True)
                start = _find_marker(lines, "solution-start", where)
                end = _find_marker(lines, "solution-end", where)
                if start and (end is None or start[0] < end[0]):
                    raise SolutionMarkupError(
                        f"{where}: a {{solution-start}} marker opens inside the solution opened in cell "
                        f"{open_block}, which has no {{solution-end}} before it"
                    )
                if end:
                    open_block, text = None, "".join(lines[end[1] + 1 :])  # keep what follows the end marker
            if open_block is not None:
                removed.block_cells += not is_solution
                continue
        if is_markdown:
            # Even a cell tagged `solution` is read, so that a region it opens is removed to its end.
            text, open_block = _strip_markdown(text, index, where, removed)
            if is_solution or not text.strip():
                continue
            if text != _source(cell):
                _set_source(cell, _tidy(text))
        elif is_solution:
            continue
        elif cell["cell_type"] == "code":
            text, regions = _stub_nbgrader(text, where)
            if regions:
                removed.nbgrader_regions += regions
                _set_source(cell, text)
                tags = cell.setdefault("metadata", {}).setdefault("tags", [])
                if NBGRADER_TAG not in tags:
                    tags.append(NBGRADER_TAG)
            if clear_outputs or regions:
                if cell.get("outputs") or cell.get("execution_count") is not None:
                    removed.outputs_cleared += 1
                cell["outputs"], cell["execution_count"] = [], None
            else:
                removed.outputs_kept += bool(cell.get("outputs"))
        kept.append(cell)
        removed.kept.append(index)
    if open_block is not None:
        raise SolutionMarkupError(
            f"{name}, cell {open_block}: the {{solution-start}} marker has no {{solution-end}} after it"
        )
    notebook["cells"] = kept
    return removed


def _strip_markdown(text: str, index: int, where: str, removed: Removed) -> tuple[str, int | None]:
    """Remove the solutions of one markdown cell that starts outside a solution region.

    Returns the text to keep and, when a `{solution-start}` is left open at the end of the cell, this cell's index.
    """
    kept = ""
    while True:
        lines = text.splitlines(keepends=True)
        start = _find_marker(lines, "solution-start", where)
        end = _find_marker(lines, "solution-end", where)
        if end and (start is None or end[0] < start[0]):
            raise SolutionMarkupError(f"{where}: a {{solution-end}} marker without a {{solution-start}} before it")
        if start is None:
            text, count = _remove_directives(text, where)
            removed.directives += count
            return kept + text, None
        before, count = _remove_directives("".join(lines[: start[0]]), where)
        removed.directives += count
        kept += before
        removed.blocks += 1
        if end is None:
            return kept, index
        text = "".join(lines[end[1] + 1 :])


# ----------------------------------------------------------------------------------------------------------------
# Which later cells need a name that only a removed solution defined


def _parse(source: str) -> ast.Module | None:
    lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
    try:
        return ast.parse("\n".join(lines))
    except SyntaxError:
        return None


def _defined(tree: ast.Module) -> set[str]:
    """Names a cell binds at module level (assignments, definitions, imports, loop and `with` targets)."""
    names: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            return
        if isinstance(node, ast.Lambda):
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return names


def _used(tree: ast.Module) -> set[str]:
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}


def missing_definitions(original: dict, kept: list[int], name: str) -> list[str]:
    """Kept cells (by original index) that need what only a removed cell defined.

    Two cases: a name that, before the cell, only a removed cell (a solution) defined; and a name whose last
    definition left before the cell is an exercise stub (a cell tagged exercise-stub or raises-exception), which a
    removed solution cell redefined in the full edition. The first fails with a NameError, the second with
    NotImplementedError.
    """
    kept_indices = set(kept)
    defined_by_kept: set[str] = set(dir(builtins)) | {"display", "get_ipython"}
    defined_by_removed: dict[str, int] = {}
    stubbed: dict[str, int] = {}  # name -> the stub cell that is its last definition left
    replaced: dict[str, int] = {}  # name -> the removed cell that redefined a stubbed name
    found = []
    for index, cell in enumerate(original["cells"]):
        if cell["cell_type"] != "code":
            continue
        tree = _parse(_source(cell))
        if tree is None:
            continue
        defined = _defined(tree)
        if index not in kept_indices:
            for each in defined:
                defined_by_removed.setdefault(each, index)
                if each in stubbed:
                    replaced.setdefault(each, index)
            continue
        if {STUB_TAG, NBGRADER_TAG} & set(_tags(cell)):
            stubbed.update(dict.fromkeys(defined, index))
            for each in defined:
                replaced.pop(each, None)
        else:
            for used in sorted(_used(tree) - defined):
                if used not in defined_by_kept and used in defined_by_removed:
                    found.append(
                        f"{name}, cell {index}: uses `{used}`, which only the removed cell "
                        f"{defined_by_removed[used]} defines"
                    )
                elif used in stubbed and used in replaced:
                    found.append(
                        f"{name}, cell {index}: uses `{used}`, which the student edition defines only as the "
                        f"exercise stub of cell {stubbed[used]} (the removed cell {replaced[used]} replaced it)"
                    )
            for each in defined:
                stubbed.pop(each, None)
        defined_by_kept |= defined
    return found


# ----------------------------------------------------------------------------------------------------------------
# The edition


def tracked_files(root: Path = ROOT) -> list[str]:
    """The repository's tracked files that exist in the working tree, relative to root."""
    return _git_files(root, "--cached")


def untracked_files(root: Path = ROOT) -> list[str]:
    """Files git does not track and does not ignore (new files not yet added), relative to root."""
    return _git_files(root, "--others", "--exclude-standard")


def _git_files(root: Path, *options: str) -> list[str]:
    try:
        listing = subprocess.run(["git", "ls-files", "-z", *options], cwd=root, capture_output=True, check=True).stdout
    except FileNotFoundError:
        raise ValueError("git is not installed (or not on PATH); the edition is made of the files git tracks") from None
    except subprocess.CalledProcessError as error:
        said = error.stderr.decode("utf-8", "replace").strip().splitlines()
        raise ValueError(f"--repo {root} is not a git repository ({said[0] if said else 'git ls-files failed'}); "
                         f"give a clone of the book's repository") from None
    return [name for name in listing.decode("utf-8").split("\0") if name and (root / name).is_file()]


def set_repository(config_path: Path, **values: str) -> None:
    """Set keys of the `repository:` section of a _config.yml (branch, url), keeping its comments and layout."""
    lines = config_path.read_text(encoding="utf-8").splitlines(keepends=True)
    try:
        start = next(i for i, line in enumerate(lines) if re.match(r"^repository:\s*(#.*)?$", line))
    except StopIteration:
        raise ValueError(f"{config_path} has no top-level `repository:` section") from None
    for key, value in values.items():
        end = start + 1
        while end < len(lines) and (not lines[end].strip() or lines[end][0] in " \t#"):
            end += 1
        for i in range(start + 1, end):
            match = re.match(rf"^(\s+){key}:", lines[i])
            if match:
                lines[i] = f"{match[1]}{key}: {value}\n"
                break
        else:
            indent = next((re.match(r"^(\s+)\S", lines[i])[1] for i in range(start + 1, end) if lines[i].strip()), "  ")
            lines.insert(start + 1, f"{indent}{key}: {value}\n")
    repository = yaml.safe_load("".join(lines)).get("repository") or {}
    if any(str(repository.get(key)) != value for key, value in values.items()):
        raise ValueError(f"could not set {values} in the repository section of {config_path}")
    config_path.write_text("".join(lines), encoding="utf-8")


def add_banner(intro: Path, url: str, full_branch: str, branch: str) -> None:
    """Put a note under the title of intro.md saying that this is the student edition."""
    banner = (
        ":::{important}\n"
        "This is the **student edition** of the book: the solutions of the exercises have been removed, and the\n"
        f"launch buttons open the notebooks of the `{branch}` branch. The full edition, with the solutions, is the\n"
        f"`{full_branch}` branch of the book's repository, <{url}/tree/{full_branch}>.\n"
        ":::\n"
    )
    lines = intro.read_text(encoding="utf-8").splitlines(keepends=True)
    title = next((i for i, line in enumerate(lines) if line.startswith("# ")), None)
    if title is None:
        lines[:0] = [banner, "\n"]
    else:
        lines[title + 1 : title + 1] = ["\n", banner]
    intro.write_text("".join(lines), encoding="utf-8")


def prune_toc(toc_path: Path) -> list[str]:
    """Leave out of a _toc.yml the pages whose file does not exist; return their names."""
    book = toc_path.parent
    toc = yaml.safe_load(toc_path.read_text(encoding="utf-8"))

    def exists(name: str) -> bool:
        return any((book / f"{name}{suffix}").is_file() for suffix in ("", ".ipynb", ".md"))

    missing: list[str] = []

    def prune(entries: list[dict]) -> list[dict]:
        kept = []
        for entry in entries:
            if "file" in entry and not exists(entry["file"]):
                missing.append(entry["file"])
                continue
            for key in ("sections", "chapters"):
                if key in entry:
                    entry[key] = prune(entry[key])
            kept.append(entry)
        return kept

    for key in ("chapters", "sections"):
        if key in toc:
            toc[key] = prune(toc[key])
    if "parts" in toc:
        for part in toc["parts"]:
            part["chapters"] = prune(part.get("chapters", []))
        toc["parts"] = [part for part in toc["parts"] if part["chapters"]]
    if missing:
        header = "# The student edition's table of contents, made by tools/student_edition.py.\n"
        toc_path.write_text(header + yaml.safe_dump(toc, sort_keys=False, allow_unicode=True), encoding="utf-8")
    return missing


def executed_at_build(book: Path, path: Path) -> bool:
    """Whether `jupyter-book build` executes this notebook (execute_notebooks and execute.exclude_patterns)."""
    config = yaml.safe_load((book / "_config.yml").read_text(encoding="utf-8")) or {}
    execute = config.get("execute") or {}
    if execute.get("execute_notebooks", "auto") in ("off", False):
        return False
    relative = path.relative_to(book).as_posix()
    return not any(
        fnmatch.fnmatch(relative, pattern) or fnmatch.fnmatch(path.name, pattern)
        for pattern in execute.get("exclude_patterns") or []
    )


def make_edition(
    out: Path,
    branch: str = "student",
    root: Path = ROOT,
    force: bool = False,
    include_untracked: bool = False,
    url: str | None = None,
    clear_all_outputs: bool = False,
) -> dict[str, Removed]:
    """Write the student edition of the repository at root into out; return what was removed, per notebook.

    Copies the tracked files as they are in the working tree, and with include_untracked also the files that git
    neither tracks nor ignores (what `git add -A` would add); build outputs and environments are never copied.
    url, when given, replaces repository.url: the edition is published in another repository.
    """
    out, root = out.resolve(), root.resolve()
    if not (root / "book" / "_config.yml").is_file():
        raise ValueError(f"--repo {root} holds no book/_config.yml; give the folder of the book's repository")
    if out == root or out in root.parents or root in out.parents:
        raise ValueError(f"--out {out} must lie outside the repository {root}")
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out} is a file, not a folder; give a new folder for the edition")
    tracked, untracked = tracked_files(root), untracked_files(root)  # --repo is a git clone: checked before writing
    full_url, full_branch = colab.repository(root / "book" / "_config.yml")
    if branch == full_branch and (url is None or url.rstrip("/") == full_url):
        raise ValueError(f"--branch {branch!r} is the full edition's branch in its repository ({full_url}), whose "
                         f"notebooks hold the solutions; give the branch the student edition is published on "
                         f"(default: student), or another repository with --url")
    if out.exists() and any(path.name != ".git" for path in out.iterdir()):
        if not force:
            raise FileExistsError(f"--out {out} is not empty; choose a new folder or pass --force to replace its files")
        for path in out.iterdir():
            if path.name != ".git":
                shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
    out.mkdir(parents=True, exist_ok=True)

    for name in tracked + (untracked if include_untracked else []):
        target = out / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, target)
    for name in untracked:
        if include_untracked:
            print(f"note: {name} is not tracked by git; copied because of --include-untracked")
        elif name.startswith("book/"):
            print(f"note: {name} is not tracked by git, so it is not in the edition (git add it, or "
                  "--include-untracked)")

    book = out / "book"
    report: dict[str, Removed] = {}
    for path in sorted(book.glob("*.ipynb")):
        original = json.loads(path.read_text(encoding="utf-8"))
        notebook = json.loads(json.dumps(original))
        clear = clear_all_outputs or executed_at_build(book, path)
        removed = strip_notebook(notebook, f"book/{path.name}", clear_outputs=clear)
        removed.warnings = missing_definitions(original, removed.kept, f"book/{path.name}")
        path.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
        report[path.name] = removed

    set_repository(book / "_config.yml", branch=branch, **({"url": url.rstrip("/")} if url else {}))
    add_banner(book / "intro.md", full_url, full_branch, branch)
    for name in prune_toc(book / "_toc.yml"):
        print(f"note: book/_toc.yml lists {name}, which is not in the edition; it is left out of its table of contents")
    return report


def build(out: Path) -> int:
    """Build the edition's book with warnings as errors; return jupyter-book's exit status."""
    # The jupyter-book of this Python's environment when there is one (the environment need not be activated).
    beside = Path(sys.executable).with_name("jupyter-book")
    program = str(beside) if beside.is_file() else "jupyter-book"
    command = [program, "build", "-W", "-n", "--keep-going", str(out / "book")]
    print("running:", " ".join(command), flush=True)
    return subprocess.run(command).returncode


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="the folder to write the student edition into")
    parser.add_argument(
        "--branch", default="student", help="the branch the edition is published on (default: %(default)s)"
    )
    parser.add_argument("--url", help="publish in this repository instead of the one in book/_config.yml")
    parser.add_argument("--build", action="store_true", help="then build its book with jupyter-book build -W -n")
    parser.add_argument("--repo", type=Path, default=ROOT, help="the repository to make it from (default: this one)")
    parser.add_argument(
        "--include-untracked", action="store_true",
        help="also copy the files git neither tracks nor ignores (not yet added)",
    )
    parser.add_argument(
        "--clear-all-outputs", action="store_true",
        help="also clear the stored outputs of the notebooks the build does not execute (the GPU chapters)",
    )
    parser.add_argument("--force", action="store_true", help="replace the files of a non-empty --out (keeps its .git)")
    args = parser.parse_args(argv)
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9._/-]*", args.branch) or ".." in args.branch:
        parser.error(f"--branch must be a git branch name such as 'student' (letters, digits, '.', '_', '-', '/'), "
                     f"got {args.branch!r}")
    try:
        report = make_edition(
            args.out, args.branch, root=args.repo, force=args.force, include_untracked=args.include_untracked,
            url=args.url, clear_all_outputs=args.clear_all_outputs,
        )
    except (SolutionMarkupError, ValueError, OSError) as error:  # FileExistsError too
        print(f"error: {error}", file=sys.stderr)
        return 2
    for name, removed in report.items():
        print(f"{name}: {removed.summary()}")
        for warning in removed.warnings:
            print(f"warning: {warning}")
    print(f"wrote the student edition (branch {args.branch}) to {args.out}")
    if args.build:
        status = build(args.out)
        if status:
            print(f"error: jupyter-book build failed (exit status {status})", file=sys.stderr)
        return status
    return 0


if __name__ == "__main__":
    sys.exit(main())
