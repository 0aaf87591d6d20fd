"""One failing notebook never costs the reader the whole book: built as the README builds it, a book whose notebook
raises still gets every page written, the failing one with its error shown; built as CI builds it (-W), the same
failure fails the build (book/_config.yml: nb_execution_raise_on_error: false)."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


def notebook(*sources: str) -> str:
    cells = [{"cell_type": "markdown", "id": "title", "metadata": {}, "source": [sources[0]]}]
    cells += [{"cell_type": "code", "execution_count": None, "id": f"c{i}", "metadata": {}, "outputs": [],
               "source": [source]} for i, source in enumerate(sources[1:])]
    return json.dumps({"cells": cells, "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python",
                                                                   "name": "python3"}},
                       "nbformat": 4, "nbformat_minor": 5})


@pytest.fixture(scope="module")
def small_book(tmp_path_factory) -> Path:
    """A book with the real book's execution and Sphinx settings and two notebooks, the second of which raises."""
    if shutil.which("jupyter-book", path=str(Path(sys.executable).parent)) is None and not shutil.which("jupyter-book"):
        pytest.skip("jupyter-book is not installed (pip install -e '.[dev]')")
    book = tmp_path_factory.mktemp("book")
    real = yaml.safe_load((ROOT / "book" / "_config.yml").read_text(encoding="utf-8"))
    config = {"title": "T", "execute": {key: value for key, value in real["execute"].items() if key != "exclude_patterns"},
              "sphinx": {"config": {key: real["sphinx"]["config"][key]
                                    for key in ("nb_execution_raise_on_error", "nb_execution_show_tb")}}}
    config["execute"]["timeout"] = 60
    (book / "_config.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    (book / "_toc.yml").write_text("format: jb-book\nroot: intro\nchapters:\n- file: good\n- file: bad\n",
                                   encoding="utf-8")
    (book / "intro.md").write_text("# Intro\n\nThe start.\n", encoding="utf-8")
    (book / "good.ipynb").write_text(notebook("# Good", "print('all is well')"), encoding="utf-8")
    (book / "bad.ipynb").write_text(notebook("# Bad", "print('before')", "raise RuntimeError('this page fails')",
                                             "print('never reached')"), encoding="utf-8")
    return book


def build(book: Path, *options: str) -> subprocess.CompletedProcess:
    program = Path(sys.executable).with_name("jupyter-book")
    shutil.rmtree(book / "_build", ignore_errors=True)
    return subprocess.run([str(program) if program.is_file() else "jupyter-book", "build", *options, str(book)],
                          capture_output=True, text=True, timeout=600)


def test_the_readmes_build_writes_every_page_and_shows_the_error(small_book):
    done = build(small_book)
    html = small_book / "_build" / "html"
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "all is well" in (html / "good.html").read_text(encoding="utf-8")
    bad = (html / "bad.html").read_text(encoding="utf-8")
    assert "before" in bad and "this page fails" in bad  # the reader sees where it stopped, and why
    assert "Executing notebook failed" in done.stdout + done.stderr  # and the build says so


def test_cis_build_with_warnings_as_errors_fails_on_it(small_book):
    done = build(small_book, "-W", "-n", "--keep-going")
    assert done.returncode != 0
    assert "bad" in done.stdout + done.stderr
