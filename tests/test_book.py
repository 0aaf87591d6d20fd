"""The book's invariants: every chapter is listed, stored without outputs, starts with the Colab cell, cites what
exists, imports earlier pieces and ends with checked exercises (CONTRIBUTING.md, 'Adding a chapter')."""

import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "book"

import colab

import transformer_lib.grading

CHAPTERS = sorted(BOOK.glob("[0-9][0-9]_*.ipynb"))
APPENDICES = sorted(BOOK.glob("appendix_*.ipynb"))  # after the chapters; they need no exercises
NOTEBOOKS = CHAPTERS + APPENDICES
# Heavy chapters: they store the outputs of their latest full run, so the build does not execute them
# (CONTRIBUTING.md, 'Stored outputs of chapters 8 and 9').
GPU_CHAPTERS = {"08_translation.ipynb", "09_attention_heatmaps.ipynb"}


def load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def text_of(notebook: dict, kind: str | None = None) -> str:
    return "\n".join("".join(c["source"]) for c in notebook["cells"] if kind is None or c["cell_type"] == kind)


def toc_files() -> list[str]:
    toc = yaml.safe_load((BOOK / "_toc.yml").read_text(encoding="utf-8"))
    files = [toc["root"]]
    for part in toc.get("parts", []):
        files += [chapter["file"] for chapter in part["chapters"]]
    return files


def test_every_page_is_in_the_toc():
    listed = toc_files()
    assert sorted(BOOK.glob("*.ipynb")) == sorted(NOTEBOOKS), "a notebook is named neither NN_slug nor appendix_slug"
    for path in NOTEBOOKS + sorted(BOOK.glob("*.md")):
        assert path.stem in listed, f"{path.name} is not in book/_toc.yml"
    for name in listed:
        assert (BOOK / f"{name}.ipynb").exists() or (BOOK / f"{name}.md").exists(), f"_toc.yml lists missing {name}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_stored_without_outputs_unless_a_recorded_heavy_chapter(path):
    notebook = load(path)
    stored = [i for i, c in enumerate(notebook["cells"]) if c["cell_type"] == "code" and (c["outputs"] or c["execution_count"])]
    if path.name in GPU_CHAPTERS:  # outputs of the latest full run, checked by tests/test_heavy_chapters.py
        assert stored, f"{path.name} must store the outputs of a full run: python tools/run_heavy_chapters.py"
    else:
        assert stored == [], f"cells {stored} have stored outputs"


def test_only_the_notebooks_that_use_a_gpu_ask_colab_for_one():
    meta = {path.name: load(path)["metadata"] for path in NOTEBOOKS}
    asking = {name for name, m in meta.items() if m.get("accelerator") == "GPU" or "gpuType" in m.get("colab", {})}
    assert asking == {"08_translation.ipynb", "09_attention_heatmaps.ipynb", "appendix_performance.ipynb"}
    assert asking == colab.GPU_NOTEBOOKS


@pytest.mark.parametrize("name", sorted(colab.GPU_NOTEBOOKS))
def test_a_gpu_notebook_says_how_to_switch_colab_to_a_gpu(name):
    # Colab opens a notebook on a CPU when no GPU is free or the learner's quota is used up.
    assert "Change runtime type" in text_of(load(BOOK / name), "markdown"), (
        f"{name} does not say how to switch Colab to a GPU runtime (Runtime → Change runtime type → GPU)")


def test_gpu_chapters_are_not_executed_at_build_time():
    config = yaml.safe_load((BOOK / "_config.yml").read_text(encoding="utf-8"))
    assert set(config["execute"].get("exclude_patterns", [])) == GPU_CHAPTERS


def _package_commit() -> str:
    try:
        return colab.package_commit(ROOT)
    except ValueError as error:  # a shallow clone, or a copy without git: the commit cannot be found here
        pytest.skip(f"{error} (CI clones with the history; GitHub's checkout needs fetch-depth: 0)")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_colab_install_cell_pins_the_package_commit_and_runtime_metadata_follow_the_config(path):
    url, _ = colab.repository(BOOK / "_config.yml")
    commit = _package_commit()
    assert colab.problems(load(path), url, commit, gpu=colab.wants_gpu(path), extras=colab.extras_for(path)) == []
    assert colab.pinned(load(path)) == (url, commit)
    assert "@main" not in "".join(load(path)["cells"][0]["source"])  # never "whatever main is today"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_opens_with_title_and_goals(path):
    notebook = load(path)
    first_text = "".join(notebook["cells"][1]["source"])
    assert first_text.startswith("# "), "the cell after the install cell must hold the chapter title"
    assert "After this chapter you will be able to" in first_text


def bib_keys() -> set[str]:
    return set(re.findall(r"@\w+\{([^,\s]+),", (BOOK / "references.bib").read_text(encoding="utf-8")))


def test_every_bibliography_entry_is_there_once():
    # a repeated key is a warning of the build's bibtex reader, so -W fails on it: say which key here
    keys = re.findall(r"@\w+\{([^,\s]+),", (BOOK / "references.bib").read_text(encoding="utf-8"))
    assert not {key for key in keys if keys.count(key) > 1}, "repeated entries in book/references.bib"
    text = (BOOK / "references.bib").read_text(encoding="utf-8")
    assert text.count("{") == text.count("}"), "unbalanced braces in book/references.bib"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_citations_exist_and_the_paper_is_cited(path):
    text = text_of(load(path), "markdown")
    cited = {key.strip() for group in re.findall(r"\{cite(?::\w+)?\}`([^`]+)`", text) for key in group.split(",")}
    assert "vaswani2017attention" in cited or path.stem == "01_text_to_tensors" and cited
    assert cited <= bib_keys(), f"unknown citation keys: {cited - bib_keys()}"


def graders_called(code: str) -> list[str]:
    """The exercise graders (grade_attention, ...) that a cell calls; the generic grade_against is not one."""
    return [name for name in re.findall(r"\b(grade_\w+)\(", code) if name != "grade_against"]


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.stem)
def test_exercises_are_labelled_rated_solved_and_one_is_graded_code(path):
    notebook = load(path)
    markdown = text_of(notebook, "markdown")
    exercises = re.findall(r":::\{exercise\}[^\n]*\n:label: (\S+)\n(.*?)\n:::", markdown, re.S)
    assert len(exercises) >= 3, f"{path.name} has {len(exercises)} exercises, expected at least 3"
    solved = set(re.findall(r":::\{solution(?:-start)?\} (\S+)", markdown))
    for label, body in exercises:
        assert re.search(r"\*\*Difficulty:\*\* [★☆]{3} · \*\*Time:\*\* \d+", body), f"{label}: no difficulty/time"
        assert label in solved, f"exercise {label} has no solution"
    cells = notebook["cells"]
    stubs = [i for i, c in enumerate(cells) if "exercise-stub" in c.get("metadata", {}).get("tags", [])]
    assert stubs, "no coding exercise (a stub cell tagged exercise-stub)"
    code = text_of(notebook, "code")
    for i in stubs:
        stub = "".join(cells[i]["source"])
        called = graders_called(stub)
        assert "NotImplementedError" in stub and called, f"cell {i}: stub without a call to a grader"
        for name in called:
            assert callable(getattr(transformer_lib.grading, name, None)), (
                f"cell {i}: transformer_lib.grading has no {name}")
            assert re.search(rf"from transformer_lib\.grading import [^\n]*\b{name}\b", code) or (
                f"grading.{name}(" in stub), f"cell {i}: {name} is not imported from transformer_lib.grading"
        solutions = [c for c in cells[i + 1 :] if "solution" in c.get("metadata", {}).get("tags", [])]
        assert solutions and graders_called("".join(solutions[0]["source"])) == called, (
            f"cell {i}: the solution does not call the stub's check {called}")


def test_the_landing_page_quotes_chapter_8s_stored_scores():
    """The scores the landing page promises are the ones chapter 8's recorded run printed (intro.md)."""
    intro = (BOOK / "intro.md").read_text(encoding="utf-8")
    quoted = re.findall(r"\*\*(BLEU|chrF) (\d+\.\d\d)\*\*", intro)
    assert {name for name, _ in quoted} == {"BLEU", "chrF"}, "intro.md should quote the translator's BLEU and chrF"
    outputs = "".join("".join(o.get("text", "")) for c in load(BOOK / "08_translation.ipynb")["cells"]
                      if c["cell_type"] == "code" for o in c.get("outputs", []))
    line = re.search(r"^beam 4 : BLEU = (\d+\.\d\d) .*\n\s+chrF\s+(\d+\.\d\d)", outputs, re.M)  # sacreBLEU's line
    assert line and dict(quoted) == {"BLEU": line[1], "chrF": line[2]}, (quoted, line and line.group(0))


def test_the_training_minutes_quoted_are_the_recorded_runs():
    """README, landing page, instructor guide and chapter 8's prose quote the recorded run's training minutes, as its
    scoreboard record has them: a new recorded run that trains faster or slower fails here until they are updated."""
    record = json.loads((ROOT / "benchmarks/results/scoreboard/multi30k-cpu-cpu.json").read_text(encoding="utf-8"))
    chapter_8 = "".join("".join(c["source"]) for c in load(BOOK / "08_translation.ipynb")["cells"]
                        if c["cell_type"] == "markdown")
    text = {name: (ROOT / name).read_text(encoding="utf-8") for name in ("README.md", "book/intro.md",
                                                                         "book/instructor_guide.md")}
    quoted = {
        "README.md": re.findall(r"the recorded run: (\d+\.\d) minutes of training", text["README.md"]),
        "book/intro.md": re.findall(r"trained for (\d+\.\d) minutes", text["book/intro.md"]),
        "book/instructor_guide.md": re.findall(r"its training took (\d+\.\d)\s+minutes",
                                               text["book/instructor_guide.md"]),
        "book/08_translation.ipynb": re.findall(r"(\d+\.\d) minutes of training steps", chapter_8),
    }
    assert quoted == {name: [f"{record['training_minutes']:.1f}"] for name in quoted}
