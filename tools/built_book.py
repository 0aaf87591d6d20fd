"""Which notebooks a finished `jupyter-book build` has already executed, so that a test run need not execute them
again (CONTRIBUTING.md, 'Running the tests and building the book').

    python tools/built_book.py [--build book/_build]

`jupyter-book build book` executes every notebook that `book/_config.yml` does not exclude and keeps the executed
copies in `book/_build/jupyter_execute/`. A notebook that fails there is a warning (`nb_execution_raise_on_error:
false`, so that one failing page does not cost the whole book) and its copy holds the error or the cells it never
reached; a copy that ran every code cell with no error in any (no cell of the book may raise, not even an exercise
stub: CONTRIBUTING.md, 'Exercises and the student edition') has passed all that nbval (`--nbval-lax`, no cell marked
for output comparison) checks. When the environment variable
`TRANSFORMER_BOOK_BUILT` names a build folder, `conftest.py` leaves out of the test run the nbval items of every
notebook whose executed copy there is proven current by `reusable()`:

- the copy exists and holds the same code cells, in the same order, as the notebook;
- every code cell with code was executed, and no cell holds an error;
- the copy is newer than the notebook, than every file of `transformer_lib/` and than `book/_config.yml`.

A notebook that fails any of these is executed by nbval as usual; the report header of the test run names each
one and says why. CI builds the book first and then runs the tests with `TRANSFORMER_BOOK_BUILT=book/_build`, so
that chapters 1 to 7 and the appendices are executed once per run instead of twice.

Run alone, the script prints that verdict for every notebook of the book.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from student_edition import executed_at_build  # noqa: E402

def _code_cells(notebook: dict) -> list[dict]:
    return [cell for cell in notebook["cells"] if cell["cell_type"] == "code"]


def _source(cell: dict) -> str:
    source = cell.get("source", "")
    return source if isinstance(source, str) else "".join(source)


def _newest_input(notebook: Path, root: Path) -> float:
    """The latest modification time among what an executed copy depends on: the notebook, the package, the config."""
    inputs = [notebook, root / "book" / "_config.yml", *(root / "transformer_lib").rglob("*.py")]
    return max(path.stat().st_mtime for path in inputs if path.is_file())


def why_not_reusable(notebook: Path, build: Path, root: Path = ROOT) -> str | None:
    """None when the executed copy of `notebook` in `build` is current and ran cleanly; otherwise the reason."""
    book = notebook.parent
    if not executed_at_build(book, notebook):
        return "the build does not execute it (execute.exclude_patterns or execute_notebooks: off)"
    copy = build / "jupyter_execute" / notebook.relative_to(book)
    if not copy.is_file():
        return f"no executed copy at {copy}"
    if copy.stat().st_mtime < _newest_input(notebook, root):
        return "the executed copy is older than the notebook, book/_config.yml or a file of transformer_lib/"
    ours = _code_cells(json.loads(notebook.read_text(encoding="utf-8")))
    theirs = _code_cells(json.loads(copy.read_text(encoding="utf-8")))
    if [_source(cell) for cell in ours] != [_source(cell) for cell in theirs]:
        return "the executed copy holds other code than the notebook"
    for index, cell in enumerate(theirs, start=1):
        if _source(cell).strip() and cell.get("execution_count") is None:
            return f"code cell {index} of the executed copy was not executed"
        if any(out.get("output_type") == "error" for out in cell.get("outputs", [])):
            return f"code cell {index} of the executed copy holds an error"
    return None


def reusable(book: Path, build: Path, root: Path = ROOT) -> dict[str, str | None]:
    """For every notebook of `book`: None if its executed copy in `build` can stand for a run, else the reason."""
    return {path.name: why_not_reusable(path, build, root) for path in sorted(book.glob("*.ipynb"))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--build", type=Path, default=ROOT / "book" / "_build", help="the build folder (book/_build)")
    args = parser.parse_args(argv)
    if not args.build.is_dir():
        print(f"error: --build {args.build} is not a folder; build the book first (jupyter-book build book)")
        return 2
    for name, reason in reusable(ROOT / "book", args.build).items():
        print(f"{name}: {'executed by the build, reusable' if reason is None else reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
