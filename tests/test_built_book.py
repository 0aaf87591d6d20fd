"""tools/built_book.py and conftest.py: a notebook the book build executed is not run again by nbval, and only when
its executed copy is current and ran cleanly."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

import built_book


def notebook(*cells: dict) -> dict:
    return {"cells": list(cells), "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def code(source: str, count: int | None = None, outputs: list | None = None, tags: list | None = None) -> dict:
    return {
        "cell_type": "code",
        "execution_count": count,
        "metadata": {"tags": tags or []},
        "outputs": outputs or [],
        "source": source,
    }


ERROR = {"output_type": "error", "ename": "NotImplementedError", "evalue": "", "traceback": []}


@pytest.fixture
def project(tmp_path):
    """A project with a package file, a book config excluding 08_*, one notebook and an empty build folder."""
    (tmp_path / "transformer_lib").mkdir()
    (tmp_path / "transformer_lib" / "model.py").write_text("x = 1\n")
    book = tmp_path / "book"
    book.mkdir()
    (book / "_config.yml").write_text("execute:\n  execute_notebooks: force\n  exclude_patterns:\n    - 08_*.ipynb\n")
    (book / "03_attention.ipynb").write_text(json.dumps(notebook(code("a = 1"), code(""), code("print(a)"))))
    (tmp_path / "build" / "jupyter_execute").mkdir(parents=True)
    return tmp_path


def write_copy(project: Path, nb: dict, name: str = "03_attention.ipynb") -> Path:
    copy = project / "build" / "jupyter_execute" / name
    copy.write_text(json.dumps(nb))
    later = time.time() + 10
    os.utime(copy, (later, later))  # written after everything it depends on, as a build does
    return copy


def verdict(project: Path, name: str = "03_attention.ipynb") -> str | None:
    return built_book.why_not_reusable(project / "book" / name, project / "build", project)


def test_a_current_clean_copy_is_reused(project):
    write_copy(project, notebook(code("a = 1", 1), code(""), code("print(a)", 2)))
    assert verdict(project) is None


def test_a_missing_copy_is_not(project):
    assert "no executed copy" in verdict(project)


def test_a_notebook_the_build_does_not_execute_is_not(project):
    (project / "book" / "08_translation.ipynb").write_text(json.dumps(notebook(code("a = 1"))))
    write_copy(project, notebook(code("a = 1", 1)), "08_translation.ipynb")
    assert "does not execute it" in verdict(project, "08_translation.ipynb")


def test_a_copy_with_other_code_is_not(project):
    write_copy(project, notebook(code("a = 2", 1), code(""), code("print(a)", 2)))
    assert "other code" in verdict(project)


def test_a_copy_with_an_unexecuted_cell_is_not(project):
    write_copy(project, notebook(code("a = 1", 1), code(""), code("print(a)")))
    assert "code cell 3 of the executed copy was not executed" in verdict(project)


def test_an_error_counts_in_every_cell_even_a_tagged_one(project):
    write_copy(project, notebook(code("a = 1", 1, [ERROR]), code(""), code("print(a)", 2)))
    assert "code cell 1 of the executed copy holds an error" in verdict(project)
    write_copy(project, notebook(code("a = 1", 1, [ERROR], ["raises-exception"]), code(""), code("print(a)", 2)))
    assert "code cell 1 of the executed copy holds an error" in verdict(project)  # Run all would stop there


@pytest.mark.parametrize("changed", ["book/03_attention.ipynb", "book/_config.yml", "transformer_lib/model.py"])
def test_a_copy_older_than_what_it_depends_on_is_not(project, changed):
    copy = write_copy(project, notebook(code("a = 1", 1), code(""), code("print(a)", 2)))
    later = copy.stat().st_mtime + 10
    os.utime(project / changed, (later, later))
    assert "older than" in verdict(project)


def test_nbval_leaves_out_only_the_notebooks_the_build_ran(tmp_path):
    """conftest.py, end to end: with a current executed copy of chapter 3 only, chapter 3's cells are deselected
    and chapter 4's are collected, and the header says why chapter 4 runs."""
    build = tmp_path / "_build"
    (build / "jupyter_execute").mkdir(parents=True)
    nb = json.loads((ROOT / "book" / "03_attention.ipynb").read_text(encoding="utf-8"))
    for count, cell in enumerate((c for c in nb["cells"] if c["cell_type"] == "code"), start=1):
        cell["execution_count"] = count
    (build / "jupyter_execute" / "03_attention.ipynb").write_text(json.dumps(nb), encoding="utf-8")
    env = dict(os.environ, TRANSFORMER_BOOK_BUILT=str(build))

    def collect(*options: str) -> str:
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", *options, "--nbval-lax", "--nbval-current-env",
             "-p", "no:cacheprovider", "-p", "no:xdist", "book/03_attention.ipynb", "book/04_masking.ipynb"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
        )
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    items = collect("-q")
    collected = [line for line in items.splitlines() if "::" in line]
    assert collected and all(line.startswith("book/04_masking.ipynb::") for line in collected), items
    code_cells = sum(c["cell_type"] == "code" for c in nb["cells"])
    assert f"({code_cells} deselected)" in items, items
    header = collect()  # the report header, which -q leaves out
    reused = "TRANSFORMER_BOOK_BUILT: already executed by the book build, not run again by nbval: 03_attention.ipynb\n"
    assert reused in header, header
    assert "run by nbval: 04_masking.ipynb, because no executed copy" in header, header
