"""The student edition (tools/student_edition.py; CONTRIBUTING.md, 'Exercises and the student edition'): every
removal rule on small notebooks, then the whole book made, built with warnings as errors and searched for any
surviving solution text."""

import html
import json
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "book"

import colab
import student_edition as se
from test_links import pages_with_machine_paths_or_tracebacks

PACKAGE_COMMIT = "0123456789abcdef0123456789abcdef01234567"  # what a notebook's install cell pins

DATA = Path(os.environ.get("TRANSFORMER_LIB_DATA", ROOT.parent / "shared" / "data"))


# ----------------------------------------------------------------------------------------------------------------
# Small notebooks


def md(text: str, tags: list[str] | None = None) -> dict:
    return {"cell_type": "markdown", "metadata": {"tags": tags or []}, "source": text.splitlines(keepends=True)}


def code(text: str, tags: list[str] | None = None, outputs: list | None = None, count: int | None = None) -> dict:
    return {
        "cell_type": "code",
        "execution_count": count,
        "metadata": {"tags": tags or []},
        "outputs": outputs or [],
        "source": text.splitlines(keepends=True),
    }


def notebook(*cells: dict) -> dict:
    return {"cells": list(cells), "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def sources(nb: dict) -> list[str]:
    return ["".join(cell["source"]) for cell in nb["cells"]]


EXERCISE = ":::{exercise} Explain\n:label: ex-a\n\n**Difficulty:** ★☆☆ · **Time:** 5 min\n\nWhy?\n:::"


def test_cells_tagged_solution_are_removed():
    nb = notebook(md("Intro."), code("x = 1"), code("secret = 42", tags=["solution"]), md("Answer.", tags=["solution"]))
    removed = se.strip_notebook(nb, "t.ipynb")
    assert sources(nb) == ["Intro.", "x = 1"]
    assert removed.solution_cells == 2 and removed.kept == [0, 1]


def test_solution_directive_is_removed_and_the_rest_of_the_cell_kept():
    text = (
        f"## Exercises\n\n{EXERCISE}\n\n:::{{solution}} ex-a\n:class: dropdown\n\nBecause of the mask.\n\n"
        "```python\nprint('a code fence inside the solution')\n```\n:::\n\n"
        "::::{solution} ex-b\nA four-colon fence.\n:::{note}\nnested\n:::\n::::\n\n"
        "````{solution} ex-c\nA backtick fence.\n```python\nx = 2\n```\n````\n\nText after the solutions."
    )
    nb = notebook(md(text))
    removed = se.strip_notebook(nb, "t.ipynb")
    (kept,) = sources(nb)
    assert kept == f"## Exercises\n\n{EXERCISE}\n\nText after the solutions."
    assert removed.directives == 3


def test_a_cell_holding_only_a_solution_directive_disappears():
    nb = notebook(md(EXERCISE), md(":::{solution} ex-a\n:class: dropdown\n\nBecause.\n:::"), md("Next."))
    se.strip_notebook(nb, "t.ipynb")
    assert sources(nb) == [EXERCISE, "Next."]


def test_solution_start_to_end_is_removed_with_every_cell_between():
    nb = notebook(
        md(f"{EXERCISE}\n\n:::{{solution-start}} ex-a\n:class: dropdown\n:::\n\nThe explanation of the answer."),
        code("answer = compute()", tags=["solution"]),
        md("More solution text, untagged."),
        code("print(answer)"),
        md(":::{solution-end}\n:::\n\n## After the solution"),
        code("after = 1"),
    )
    removed = se.strip_notebook(nb, "t.ipynb")
    assert sources(nb) == [EXERCISE, "## After the solution", "after = 1"]
    assert (removed.blocks, removed.block_cells, removed.solution_cells) == (1, 2, 1)
    assert removed.kept == [0, 4, 5]


def test_start_and_end_in_one_cell():
    nb = notebook(md("Before.\n\n:::{solution-start} ex-a\n:::\nHidden.\n:::{solution-end}\n:::\nAfter."))
    se.strip_notebook(nb, "t.ipynb")
    assert sources(nb) == ["Before.\n\nAfter."]


def test_nbgrader_regions_become_indented_stubs():
    source = (
        "def area(r):\n"
        '    """Area of a circle."""\n'
        "    ### BEGIN SOLUTION\n"
        "    return math.pi * r ** 2\n"
        "    ### END SOLUTION\n"
        "\n"
        "### BEGIN SOLUTION\n"
        "top_level_answer = 3\n"
        "### END SOLUTION\n"
        "check(area)"
    )
    nb = notebook(code(source))
    removed = se.strip_notebook(nb, "t.ipynb")
    stub = se.NBGRADER_STUB
    assert sources(nb) == [f'def area(r):\n    """Area of a circle."""\n    {stub}\n\n{stub}\ncheck(area)']
    assert removed.nbgrader_regions == 2
    assert "raises-exception" in nb["cells"][0]["metadata"]["tags"]
    compile(sources(nb)[0], "stub", "exec")  # still valid Python


@pytest.mark.parametrize(
    "cells, message",
    [
        (
            [md("x"), md(":::{solution-start} ex-a\n:::\nHidden."), code("y = 1")],
            r"t\.ipynb, cell 1: .*no \{solution-end\}",
        ),
        ([md("x"), md(":::{solution-end}\n:::")], r"t\.ipynb, cell 1: .*\{solution-end\} marker without"),
        (
            [md(":::{solution-start} a\n:::"), md(":::{solution-start} b\n:::"), md(":::{solution-end}\n:::")],
            r"t\.ipynb, cell 1: a \{solution-start\} marker opens inside the solution opened in cell 0",
        ),
        ([md("x"), md(":::{solution} ex-a\nnever closed")], r"t\.ipynb, cell 1: the \{solution\} directive on line 1"),
        (
            [code("def f():\n    ### BEGIN SOLUTION\n    return 1\n")],
            r"t\.ipynb, cell 0: .*line 2 has no `### END SOLUTION`",
        ),
        ([code("x = 1\n### END SOLUTION\n")], r"t\.ipynb, cell 0: `END SOLUTION` on line 2 without"),
        ([code("### BEGIN SOLUTION\n### BEGIN SOLUTION\n")], r"t\.ipynb, cell 0: `BEGIN SOLUTION` on line 2 inside"),
    ],
    ids=["start-without-end", "end-without-start", "nested-start", "open-directive", "open-nbgrader",
         "nbgrader-end-only", "nbgrader-nested"],
)
def test_unbalanced_markers_are_refused_naming_notebook_and_cell(cells, message):
    with pytest.raises(se.SolutionMarkupError, match=message):
        se.strip_notebook(notebook(*cells), "t.ipynb")


def test_outputs_and_execution_counts_are_cleared():
    output = {"output_type": "stream", "name": "stdout", "text": ["42\n"]}
    nb = notebook(code("print(42)", outputs=[output], count=3), code("y = 2", count=4), code("z = 3"))
    removed = se.strip_notebook(nb, "t.ipynb")
    assert all(cell["outputs"] == [] and cell["execution_count"] is None for cell in nb["cells"])
    assert removed.outputs_cleared == 2


def test_outputs_of_a_notebook_the_build_does_not_execute_are_kept_except_where_stubbed(tmp_path):
    output = {"output_type": "stream", "name": "stdout", "text": ["recorded on a GPU\n"]}
    nb = notebook(
        code("print('gpu')", outputs=[output], count=1),
        code("x = 1\n### BEGIN SOLUTION\nx = 2\n### END SOLUTION\nprint(x)", outputs=[output], count=2),
        code("print('answer')", tags=["solution"], outputs=[output], count=3),
    )
    removed = se.strip_notebook(nb, "t.ipynb", clear_outputs=False)
    assert [(c["outputs"], c["execution_count"]) for c in nb["cells"]] == [([output], 1), ([], None)]
    assert (removed.outputs_kept, removed.outputs_cleared) == (1, 1)
    book = tmp_path / "book"
    book.mkdir()
    (book / "_config.yml").write_text("execute:\n  execute_notebooks: force\n  exclude_patterns:\n    - 08_*.ipynb\n")
    assert not se.executed_at_build(book, book / "08_translation.ipynb")
    assert se.executed_at_build(book, book / "07_training_toy.ipynb")
    (book / "_config.yml").write_text("execute:\n  execute_notebooks: 'off'\n")
    assert not se.executed_at_build(book, book / "07_training_toy.ipynb")


def test_a_later_cell_that_needs_a_removed_solution_is_named():
    nb = notebook(
        code("def f(x):\n    raise NotImplementedError", tags=["exercise-stub"]),
        code("table = build()\ndef f(x):\n    return x", tags=["solution"]),
        code("print(f(2))"),
        code("print(table)"),
        code("table = 1\nprint(table)"),
    )
    original = json.loads(json.dumps(nb))
    removed = se.strip_notebook(nb, "t.ipynb")
    warnings = se.missing_definitions(original, removed.kept, "t.ipynb")
    assert warnings == [
        "t.ipynb, cell 2: uses `f`, which the student edition defines only as the exercise stub of cell 0 "
        "(the removed cell 1 replaced it)",
        "t.ipynb, cell 3: uses `table`, which only the removed cell 1 defines",
    ]


def test_set_repository_keeps_comments(tmp_path):
    config = tmp_path / "_config.yml"
    before = "title: T\n# the repository\nrepository:\n  url: https://x/y  # the url\n  branch: main\nhtml: {}\n"
    config.write_text(before)
    se.set_repository(config, branch="student")
    assert config.read_text() == before.replace("branch: main", "branch: student")
    config.write_text("repository:\n    url: https://x/y\nhtml: {}\n")
    se.set_repository(config, branch="student", url="https://x/course")
    assert yaml.safe_load(config.read_text())["repository"] == {"url": "https://x/course", "branch": "student"}


def make_repo(root: Path) -> Path:
    """A tiny repository with the book's layout: one chapter, an ignored build and an untracked file."""
    book = root / "book"
    book.mkdir(parents=True)
    (book / "_config.yml").write_text(
        "title: T\nrepository:\n  url: https://github.com/o/r\n  path_to_book: book\n  branch: main\n", encoding="utf-8"
    )
    (book / "_toc.yml").write_text(
        "format: jb-book\nroot: intro\nparts:\n- caption: One\n  chapters:\n  - file: 01_a\n  - file: 02_missing\n"
        "- caption: Two\n  chapters:\n  - file: 03_missing\n",
        encoding="utf-8",
    )
    (book / "intro.md").write_text("# The book\n\nWelcome.\n", encoding="utf-8")
    output = {"output_type": "stream", "name": "stdout", "text": ["1\n"]}
    nb = notebook(
        colab.install_cell("https://github.com/o/r", PACKAGE_COMMIT),
        md("# A\n\nText."),
        code("x = 1\nprint(x)", outputs=[output], count=1),
        md(EXERCISE),
        code("def f():\n    raise NotImplementedError\nf()", tags=["exercise-stub"]),
        code("def f():\n    return 1", tags=["solution"]),
    )
    (book / "01_a.ipynb").write_text(json.dumps(nb), encoding="utf-8")
    (root / ".gitignore").write_text("book/_build/\n")
    (book / "_build").mkdir()
    (book / "_build" / "junk.html").write_text("built")
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    subprocess.run(["git", "add", "-A"], cwd=root, check=True)
    (book / "scratch.md").write_text("not tracked")
    return root


def test_make_edition_copies_tracked_files_and_points_everything_at_the_branch(tmp_path, capsys):
    root = make_repo(tmp_path / "repo")
    out = tmp_path / "edition"
    report = se.make_edition(out, "student", root=root)
    assert report["01_a.ipynb"].solution_cells == 1
    assert not (out / "book" / "_build").exists() and not (out / "book" / "scratch.md").exists()
    assert "scratch.md is not tracked" in capsys.readouterr().out
    assert colab.repository(out / "book" / "_config.yml") == ("https://github.com/o/r", "student")
    nb = json.loads((out / "book" / "01_a.ipynb").read_text(encoding="utf-8"))
    # The install cell is the full edition's: the package from its repository, at the commit the notebook pins.
    assert colab.problems(nb, "https://github.com/o/r", PACKAGE_COMMIT) == []
    code_cells = [cell for cell in nb["cells"] if cell["cell_type"] == "code"]
    assert all(cell["outputs"] == [] and cell["execution_count"] is None for cell in code_cells)
    assert [c.get("metadata", {}).get("tags", []) for c in nb["cells"]].count(["solution"]) == 0
    intro = (out / "book" / "intro.md").read_text(encoding="utf-8")
    assert intro.startswith("# The book\n\n:::{important}\nThis is the **student edition**")
    assert "https://github.com/o/r/tree/main" in intro
    toc = yaml.safe_load((out / "book" / "_toc.yml").read_text(encoding="utf-8"))
    assert toc["parts"] == [{"caption": "One", "chapters": [{"file": "01_a"}]}]
    # The repository itself is untouched.
    assert colab.pinned(json.loads((root / "book" / "01_a.ipynb").read_text())) == ("https://github.com/o/r",
                                                                                   PACKAGE_COMMIT)
    with pytest.raises(FileExistsError, match="not empty"):
        se.make_edition(out, "student", root=root)
    se.make_edition(out, "other", root=root, force=True, include_untracked=True, url="https://github.com/o/course")
    assert colab.repository(out / "book" / "_config.yml") == ("https://github.com/o/course", "other")
    assert colab.pinned(json.loads((out / "book" / "01_a.ipynb").read_text())) == ("https://github.com/o/r",
                                                                                  PACKAGE_COMMIT)
    assert (out / "book" / "scratch.md").is_file() and not (out / "book" / "_build").exists()
    with pytest.raises(ValueError, match="outside the repository"):
        se.make_edition(root / "edition", "student", root=root)
    # The full edition's branch in its own repository would send the launch buttons to the solutions.
    with pytest.raises(ValueError, match="--branch 'main' is the full edition's branch"):
        se.make_edition(tmp_path / "e2", "main", root=root)
    assert not (tmp_path / "e2").exists()
    se.make_edition(tmp_path / "e3", "main", root=root, url="https://github.com/o/course")  # another repository


def test_the_command_refuses_unbalanced_markers_with_the_cell(tmp_path):
    root = make_repo(tmp_path / "repo")
    path = root / "book" / "01_a.ipynb"
    nb = json.loads(path.read_text())
    nb["cells"].append(md(":::{solution-start} ex-a\n:::\nforgotten end"))
    path.write_text(json.dumps(nb))
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "student_edition.py"), "--repo", str(root), "--out", str(tmp_path / "e")],
        capture_output=True, text=True,
    )
    assert result.returncode == 2
    assert "error: book/01_a.ipynb, cell 6: the {solution-start} marker has no {solution-end} after it" in result.stderr


def test_an_out_that_is_a_file_or_a_repo_that_is_not_the_books_clone_is_one_line(tmp_path, capsys):
    root = make_repo(tmp_path / "repo")
    hyp = tmp_path / "hyp.en"
    hyp.write_text("a translation\n", encoding="utf-8")
    copy = tmp_path / "not-git"  # the book's files without git: nothing says which are tracked
    (copy / "book").mkdir(parents=True)
    (copy / "book" / "_config.yml").write_text((root / "book" / "_config.yml").read_text())
    edition = tmp_path / "edition"
    for argv, expected in [(["--repo", str(root), "--out", str(hyp)], f"--out {hyp} is a file, not a folder"),
                           (["--repo", str(tmp_path / "nope"), "--out", str(edition)], "holds no book/_config.yml"),
                           (["--repo", str(copy), "--out", str(edition)], f"--repo {copy} is not a git repository")]:
        assert se.main(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and "\n" not in err and expected in err, err
    assert hyp.read_text(encoding="utf-8") == "a translation\n" and not edition.exists()  # nothing written


def test_colab_refuses_a_book_folder_without_its_config_in_one_line(tmp_path, capsys):
    for book in (tmp_path / "nope", tmp_path):
        with pytest.raises(SystemExit) as stop:
            colab.main(["--check", "--book", str(book)])
        err = capsys.readouterr().err
        assert stop.value.code == 2 and f"--book {str(book)!r} is not the book's folder" in err, err


# ----------------------------------------------------------------------------------------------------------------
# The real book, end to end

DIRECTIVE_OPEN = re.compile(r"^\s*(:{3,}|`{3,})\{(solution|solution-start|solution-end)\}")


def split_solution_text(nb: dict) -> tuple[list[str], list[str]]:
    """(solution lines, other lines) of a notebook, by a plain line scan independent of the tool's code."""
    solution, other = [], []
    region = False  # between {solution-start} and {solution-end}
    directive_fence = None  # the fence of an open {solution} directive
    for cell in nb["cells"]:
        tagged = "solution" in cell.get("metadata", {}).get("tags", [])
        for line in "".join(cell["source"]).splitlines():
            opened = DIRECTIVE_OPEN.match(line) if cell["cell_type"] == "markdown" else None
            if directive_fence:
                solution.append(line)
                if re.fullmatch(rf"\s*{re.escape(directive_fence[0])}{{{len(directive_fence)},}}\s*", line):
                    directive_fence = None
            elif opened and opened[2] == "solution":
                directive_fence = opened[1]
            elif opened and opened[2] == "solution-start":
                region = True
            elif opened and opened[2] == "solution-end":
                region = False
            elif tagged or region:
                solution.append(line)
            else:
                other.append(line)
    return solution, other


def words(text: str) -> str:
    """Text reduced to its word characters, so that a line still matches after HTML escaping and highlighting."""
    return " " + " ".join(re.findall(r"\w+", text)) + " "


class _Text(HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []

    def handle_data(self, data):
        self.parts.append(data)


def readable_forms(path: Path) -> list[str]:
    """The text of an output file as it might carry a solution line: raw, and for HTML and notebooks, as text."""
    raw = path.read_bytes().decode("utf-8", errors="replace")
    forms = [raw]
    if path.suffix == ".html":
        parser = _Text()
        parser.feed(raw)
        forms.append(html.unescape("".join(parser.parts)))
    elif path.suffix == ".ipynb" or path.name.endswith(".ipynb.txt"):
        try:
            nb = json.loads(raw)
        except json.JSONDecodeError:
            pass
        else:
            strings: list[str] = []

            def collect(value):
                if isinstance(value, str):
                    strings.append(value)
                elif isinstance(value, list):
                    for item in value:
                        collect(item)
                elif isinstance(value, dict):
                    for item in value.values():
                        collect(item)

            collect(nb)
            forms.append("".join(strings))
    return forms


BINARY = {".png", ".jpg", ".jpeg", ".gif", ".ico", ".woff", ".woff2", ".ttf", ".eot", ".pdf", ".zip", ".gz"}
EXERCISE_LABELS = re.compile(r":::\{exercise\}[^\n]*\n:label: (\S+)")


def markdown_of(nb: dict) -> str:
    return "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")


def stub_count(nb: dict) -> int:
    return sum("exercise-stub" in c.get("metadata", {}).get("tags", []) for c in nb["cells"])


def test_the_student_edition_of_the_book_builds_and_holds_no_solution(tmp_path):
    out = tmp_path / "student"
    # The original notebooks (the tracked ones, which the edition is made from), read before it is made.
    tracked = se.tracked_files(ROOT)
    originals = {
        Path(name).name: json.loads((ROOT / name).read_text(encoding="utf-8"))
        for name in tracked
        if re.fullmatch(r"book/[^/]+\.ipynb", name)
    }
    env = dict(os.environ, TRANSFORMER_BOOK_SMOKE="1", TRANSFORMER_LIB_DATA=str(DATA))
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "student_edition.py"), "--out", str(out), "--branch", "student",
         "--build"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600,
    )
    assert result.returncode == 0, f"the student edition failed:\n{result.stdout[-6000:]}\n{result.stderr[-6000:]}"
    needs = re.findall(r"^warning: .*", result.stdout, re.M)
    assert not needs, "cells that need a removed solution:\n" + "\n".join(needs)

    # Solution text, from the original notebooks: distinctive lines that occur nowhere outside the solutions.
    outside, candidates = [], {}
    for name, nb in originals.items():
        solution, other = split_solution_text(nb)
        outside += other
        for line in solution:
            candidates.setdefault(line.strip(), name)
    for name in tracked:
        if not name.endswith(".ipynb") and Path(name).suffix not in BINARY:
            outside.append((ROOT / name).read_text(encoding="utf-8", errors="replace"))
    outside_words = words("\n".join(outside))
    distinctive = {
        line: name
        for line, name in candidates.items()
        if len(line) >= 25 and len(words(line).split()) >= 4 and words(line) not in outside_words
    }
    with_solutions = {name for name in originals if split_solution_text(originals[name])[0]}
    assert with_solutions <= set(distinctive.values()), "a notebook with solutions gave no distinctive line to look for"

    html_files = list((out / "book" / "_build" / "html").rglob("*.html"))
    sources = list((out / "book" / "_build" / "html" / "_sources").rglob("*"))
    assert len(html_files) >= len(originals) and any(p.suffix == ".ipynb" for p in sources)
    leaks = []
    for path in sorted(p for p in out.rglob("*") if p.is_file() and p.suffix not in BINARY and ".git" not in p.parts):
        forms = [words(form) for form in readable_forms(path)]
        for line, name in distinctive.items():
            if any(words(line) in form for form in forms):
                leaks.append(f"{path.relative_to(out)}: {line!r} (from {name})")
    assert not leaks, f"{len(leaks)} solution lines survive:\n" + "\n".join(leaks[:40])

    # Every exercise and every coding stub is still there, and the pages were built.
    for name, nb in originals.items():
        student = json.loads((out / "book" / name).read_text(encoding="utf-8"))
        assert EXERCISE_LABELS.findall(markdown_of(student)) == EXERCISE_LABELS.findall(markdown_of(nb)), name
        assert stub_count(student) == stub_count(nb), name
        assert not any("solution" in c.get("metadata", {}).get("tags", []) for c in student["cells"]), name
        assert "{solution" not in markdown_of(student), name
        code_cells = [c for c in student["cells"] if c["cell_type"] == "code"]
        if se.executed_at_build(out / "book", out / "book" / name):
            assert all(c["outputs"] == [] and c["execution_count"] is None for c in code_cells), name
        else:  # a GPU chapter keeps the stored outputs of its remaining cells
            # (CONTRIBUTING.md, 'Stored outputs of chapters 8 and 9')
            stored = {c.get("id"): c["outputs"] for c in nb["cells"] if c["cell_type"] == "code"}
            assert all(c["outputs"] == stored.get(c.get("id"), []) for c in code_cells[1:]), name
        page = out / "book" / "_build" / "html" / f"{Path(name).stem}.html"
        assert page.is_file(), f"{page.name} was not built"
        if EXERCISE_LABELS.findall(markdown_of(nb)):
            assert "exercise" in page.read_text(encoding="utf-8")
    assert "student edition" in (out / "book" / "_build" / "html" / "intro.html").read_text(encoding="utf-8")
    assert not pages_with_machine_paths_or_tracebacks(out / "book" / "_build" / "html")


# ----------------------------------------------------------------------------------------------------------------
# The instructor guide's chapter map follows the chapters

TIME = re.compile(r"\*\*Time:\*\* (\d+) min")


def exercise_minutes(path: Path) -> int:
    nb = json.loads(path.read_text(encoding="utf-8"))
    markdown = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")
    bodies = re.findall(r":::\{exercise\}[^\n]*\n(.*?)\n:::", markdown, re.S)
    return sum(int(m) for body in bodies for m in TIME.findall(body))


def test_instructor_guide_chapter_map_matches_the_exercises():
    guide = (BOOK / "instructor_guide.md").read_text(encoding="utf-8")
    rows: dict[int, str] = {}  # chapter number -> the row's last cell, the exercise time
    for match in re.finditer(r"^\|\s*(\d+)\.\s(.*)\|\s*$", guide, re.M):
        rows[int(match[1])] = match[2].split("|")[-1].strip()
    for path in sorted(BOOK.glob("[0-9][0-9]_*.ipynb")):
        number = int(path.name[:2])
        assert number in rows, f"the chapter map in book/instructor_guide.md has no row for {path.name}"
        minutes = exercise_minutes(path)
        if minutes:
            assert rows[number] == f"{minutes} min", (
                f"{path.name}: its exercises add up to {minutes} min, the chapter map says {rows[number]!r}"
            )
        else:
            assert rows[number] == "in preparation", f"{path.name} has no exercises yet: write 'in preparation'"


@pytest.mark.parametrize("branch", ["", "two words", "../main", "-x"])
def test_a_branch_that_git_could_not_name_is_refused_before_anything_is_written(tmp_path, capsys, branch):
    with pytest.raises(SystemExit) as stop:
        se.main(["--out", str(tmp_path / "edition"), f"--branch={branch}"])
    assert stop.value.code == 2 and "--branch must be a git branch name" in capsys.readouterr().err
    assert not (tmp_path / "edition").exists()
