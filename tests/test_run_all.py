"""*Run all* goes through every notebook of the book, top to bottom, and no cell raises: not an unsolved exercise
either (CONTRIBUTING.md, 'Exercises and the student edition').

No notebook is executed here a second time. The book build (myst-nb, through nbclient, with `allow_errors: false`;
a failing notebook is a warning, which CI's `-W` makes an error) and nbval (`pytest ... book`) already execute every
notebook top to bottom and stop at the first cell that raises, unless that cell is tagged `raises-exception`; so the
first test makes sure no cell is. What those runs left behind is then read: the build's executed copies (when TRANSFORMER_BOOK_BUILT names
a build, as in CI) and the stored outputs of chapters 8 and 9, which take 40 minutes to run. The exercise stubs
themselves are run here, each in the namespace of its chapter's imports: a stub must print one line and not raise.
"""

import contextlib
import io
import json
import os
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "book"

from run_heavy_chapters import HEAVY_CHAPTERS

NOTEBOOKS = sorted(BOOK.glob("*.ipynb"))
# Tags with which nbval or myst-nb let a cell raise or skip it: Run all in Colab honours neither.
LENIENT_TAGS = {"raises-exception", "skip-execution", "nbval-skip", "nbval-raises-exception"}


def load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def code_cells(notebook: dict) -> list[dict]:
    return [c for c in notebook["cells"] if c["cell_type"] == "code"]


def tags(cell: dict) -> list[str]:
    return cell.get("metadata", {}).get("tags", [])


def test_the_build_and_nbval_stop_at_any_cell_that_raises():
    config = yaml.safe_load((BOOK / "_config.yml").read_text(encoding="utf-8"))
    assert config["execute"]["allow_errors"] is False
    # A failing notebook is a warning, so that the rest of the book is still written; CI's -W makes it an error.
    assert config["sphinx"]["config"]["nb_execution_raise_on_error"] is False
    lenient = [f"{path.name}, cell {i}: {sorted(LENIENT_TAGS & set(tags(c)))}"
               for path in NOTEBOOKS for i, c in enumerate(load(path)["cells"]) if LENIENT_TAGS & set(tags(c))]
    assert not lenient, "cells that the build or nbval may let raise, where Run all would stop:\n" + "\n".join(lenient)


STUBS = [(path, cell) for path in NOTEBOOKS for cell in code_cells(load(path)) if "exercise-stub" in tags(cell)]


@pytest.mark.parametrize("path, cell", STUBS, ids=[f"{p.stem}-{c['id']}" for p, c in STUBS])
def test_an_unsolved_exercise_prints_what_to_do_and_raises_nothing(path, cell):
    source = "".join(cell["source"])
    namespace: dict = {}
    # What the chapters import before their exercises: torch, the package's public names and the graders.
    exec("import torch\nfrom torch import Tensor, nn\nfrom transformer_lib import *\n"
         "from transformer_lib.grading import *", namespace)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(source, f"{path.name}:{cell['id']}", "exec"), namespace)
    written = out.getvalue()
    function = re.search(r"^def (my_\w+)\(", source, re.M)[1]
    grader = re.search(r"^(grade_\w+)\(", source, re.M)[1]
    assert written == (f"Exercise not attempted yet: write {function} above, then run this cell again "
                       f"({grader} checks it).\n"), written


def ran_top_to_bottom(notebook: dict, name: str) -> list[str]:
    """What shows that notebook was not run by Run all to its end: an error, a cell left out, cells out of order.

    The Colab install cell is left out: it does nothing outside Colab, and tools/colab.py re-pins it after a run
    (it is outside the code_hash of a stored run too: transformer_lib/scoreboard.py)."""
    problems, counts = [], []
    for index, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] != "code" or not "".join(cell["source"]).strip() or cell.get("id") == "colab-install":
            continue
        if cell.get("execution_count") is None:
            problems.append(f"{name}, cell {index} was not executed")
        else:
            counts.append(cell["execution_count"])
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                problems.append(f"{name}, cell {index} raised {output.get('ename')}")
    if counts != sorted(counts) or len(set(counts)) != len(counts):
        problems.append(f"{name}: the cells did not run once each, in order (execution counts {counts})")
    return problems


@pytest.mark.parametrize("name", HEAVY_CHAPTERS)
def test_the_stored_run_of_a_heavy_chapter_went_top_to_bottom(name):
    problems = ran_top_to_bottom(load(BOOK / name), name)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p.name not in HEAVY_CHAPTERS], ids=lambda p: p.stem)
def test_the_build_executed_the_notebook_top_to_bottom(path):
    build = os.environ.get("TRANSFORMER_BOOK_BUILT")
    if not build:
        pytest.skip("TRANSFORMER_BOOK_BUILT is not set: nbval (pytest ... book) executes this notebook top to bottom "
                    "and fails at the first cell that raises")
    copy = Path(build) / "jupyter_execute" / path.name
    if not copy.is_file():
        pytest.skip(f"no executed copy at {copy}; nbval executes the notebook")
    problems = ran_top_to_bottom(load(copy), path.name)
    assert not problems, "\n".join(problems)
