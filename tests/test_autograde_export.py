"""The exercises exported for autograders (tools/autograde_export.py; book/instructor_guide.md, 'Grading'): the
pytest files pass on the book's answers and fail on the stubs with the graders' messages, for every chapter; otter
assign and otter run on chapter 4's master notebook give the answer full marks and the stub zero; and the guide's
list of the reference answers that the student edition's package holds is true."""

import ast
import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
import zipfile
from pathlib import Path

import pytest

import autograde_export as ae
import student_edition as se
from transformer_lib.grading import EXERCISE_GRADERS

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "book"


def _env() -> dict:
    """The environment of a grading run: this checkout's transformer_lib first, no strict mode inherited."""
    env = {key: value for key, value in os.environ.items() if key != "TRANSFORMER_LIB_STRICT_GRADING"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def _all_exercises() -> list[ae.Exercise]:
    return [e for path in ae.select("all") for e in ae.read_exercises(path)]


# ----------------------------------------------------------------------------------------------------------------
# Reading the exercises


def test_every_coding_exercise_is_read_with_its_grader_answer_and_imports():
    exercises = _all_exercises()
    assert sorted(e.label for e in exercises) == sorted(EXERCISE_GRADERS)
    for e in exercises:
        assert EXERCISE_GRADERS[e.label].__name__ == e.grader
        assert re.fullmatch(r"[1-9]\d?\.\d", e.number) and e.stars.count("★") in (1, 2, 3) and e.minutes > 0, e
        assert ":label:" not in e.text and "**Difficulty:**" not in e.text and "{cite" not in e.text, e.label
        for source in (e.stub, e.solution):  # each def stands alone with the imports found for it
            namespace: dict = {}
            exec(compile("\n".join(e.imports) + "\n" + source, e.label, "exec"), namespace)
            assert callable(namespace[e.function]), e.label
        stub = {}
        exec("\n".join(e.imports) + "\n" + e.stub, stub)
        with pytest.raises(NotImplementedError):
            stub[e.function](*[None] * len(ast.parse(e.stub).body[0].args.args))
        master = ast.parse(ae.master_function(e)).body[0]  # otter's cell: the stub's header, prompt and answer
        assert master.name == e.function and "# BEGIN SOLUTION NO PROMPT" in ae.master_function(e)


def test_the_exercise_numbers_are_those_the_stubs_print():
    for e in _all_exercises():
        said = re.search(r"Exercise (\d\.\d)", e.stub)
        if said:  # most stubs name their exercise in their NotImplementedError
            assert said[1] == e.number, f"{e.label}: read as {e.number}, the stub says {said[1]}"


# ----------------------------------------------------------------------------------------------------------------
# The pytest files


def _run_pytest(folder: Path) -> dict[str, str]:
    """Run pytest in an exported folder; {test name: '' if it passed, else its failure message}."""
    report = folder.parent / f"{folder.name}-report.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={report}", "."],
                   cwd=folder, env=_env(), capture_output=True, text=True, timeout=600)
    results = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        failure = case.find("failure")
        error = case.find("error")
        bad = failure if failure is not None else error
        results[case.get("name")] = "" if bad is None else f"{bad.get('message', '')}\n{bad.text or ''}"
    return results


def test_the_pytest_export_passes_on_the_answers_and_fails_on_the_stubs(tmp_path):
    exercises = _all_exercises()
    expected = {f"test_{e.function}_{kind}" for e in exercises for kind in ("public", "fresh")}
    assert ae.main(["pytest", "--chapter", "all", "--out", str(tmp_path / "answers"), "--solutions"]) == 0
    assert ae.main(["pytest", "--chapter", "all", "--out", str(tmp_path / "stubs")]) == 0
    for name in ("adapters.py", "conftest.py"):
        assert (tmp_path / "answers" / name).read_text() == (tmp_path / "stubs" / name).read_text()

    answers = _run_pytest(tmp_path / "answers")
    assert set(answers) == expected
    assert not [name for name, message in answers.items() if message], answers

    stubs = _run_pytest(tmp_path / "stubs")
    assert set(stubs) == expected
    by_test = {f"test_{e.function}_{kind}": e for e in exercises for kind in ("public", "fresh")}
    for name, message in stubs.items():
        e = by_test[name]
        assert f"Exercise not attempted yet: write {e.function}" in message and f"{e.grader} checks it" in message, (
            f"{name} did not fail with its grader's message:\n{message[-2000:]}")


def test_the_adapter_sends_the_checks_to_the_students_module_and_a_wrong_answer_gets_its_diagnosis(tmp_path):
    out = tmp_path / "ch4"
    assert ae.main(["pytest", "--chapter", "4", "--out", str(out)]) == 0
    (out / "homework.py").write_text(
        "import torch\n\n\ndef my_packed_mask(segments):\n"
        "    same = segments[:, :, None] == segments[:, None, :]\n"
        "    real = (segments != 0)[:, None, :]\n"
        "    causal = torch.ones(segments.size(1), segments.size(1), dtype=torch.bool).tril()\n"
        "    return ~(same & real & causal)[:, None]  # the mistake: True where the key is hidden\n"
    )
    adapters = (out / "adapters.py").read_text()
    (out / "adapters.py").write_text(adapters.replace('"my_packed_mask": "exercises"', '"my_packed_mask": "homework"'))
    results = _run_pytest(out)
    assert set(results) == {"test_my_packed_mask_public", "test_my_packed_mask_fresh"}
    for message in results.values():
        assert "Likely cause: the mask is inverted" in message, message[-2000:]


# ----------------------------------------------------------------------------------------------------------------
# otter


def _otter_run(otter: str, autograder: Path, notebook: Path, out: Path) -> tuple[float, float]:
    out.mkdir()
    done = subprocess.run([otter, "run", "-a", str(autograder), "-o", str(out), "--no-logo", str(notebook)],
                          env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    scored = [test for test in results["tests"] if "max_score" in test]
    return sum(t.get("score") or 0 for t in scored), sum(t["max_score"] for t in scored)


def test_otter_assign_builds_the_assignment_and_otter_run_gives_the_answer_full_marks_and_the_stub_zero(tmp_path):
    pytest.importorskip("otter", reason="otter-grader is in the dev extra: pip install -e '.[dev]'")
    otter = shutil.which("otter", path=str(Path(sys.executable).parent)) or shutil.which("otter")
    assert otter, "otter-grader is installed but its `otter` command is not on PATH"
    out = tmp_path / "export"
    assert ae.main(["otter", "--chapter", "4", "--out", str(out)]) == 0
    folder = out / "04_masking"
    assert (folder / "requirements.txt").read_text().startswith("transformer-lib @ git+")
    done = subprocess.run([otter, "assign", "04_masking.ipynb", "dist"], cwd=folder, env=_env(), capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    student = folder / "dist" / "student" / "04_masking.ipynb"
    solved = folder / "dist" / "autograder" / "04_masking.ipynb"
    (autograder,) = (folder / "dist" / "autograder").glob("*.zip")
    with zipfile.ZipFile(autograder) as archive:  # the grading image installs the package the chapter was written for
        assert (folder / "requirements.txt").read_text().strip() in archive.read("environment.yml").decode()
    student_text = student.read_text()
    assert 'raise NotImplementedError(\\"Exercise 4.4: write my_packed_mask\\")' in student_text
    assert "same & real & causal" not in student_text and "same & real & causal" in solved.read_text()
    public = (folder / "dist" / "student" / "tests" / "ex_masking_packed.py").read_text()
    assert "seed=0" in public and "seed=None" not in public  # the hidden test stays with the autograder

    assert _otter_run(otter, autograder, solved, tmp_path / "solved") == (2, 2)
    assert _otter_run(otter, autograder, student, tmp_path / "unsolved") == (0, 2)

    # For Colab: the student's notebook installs otter-grader and fetches its public tests from the given address.
    colab = tmp_path / "colab"
    url = "https://example.org/course/tests"
    assert ae.main(["otter", "--chapter", "4", "--out", str(colab), "--colab", "--tests-url", url]) == 0
    done = subprocess.run([otter, "assign", "--no-run-tests", "04_masking.ipynb", "dist"], cwd=colab / "04_masking",
                          env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    cells = json.loads((colab / "04_masking" / "dist" / "student" / "04_masking.ipynb").read_text())["cells"]
    first = ["".join(cell["source"]) for cell in cells[:2]]
    assert first[0] == "%pip install -q otter-grader" and f'otter.Notebook(tests_url_prefix="{url}")' in first[1]


# ----------------------------------------------------------------------------------------------------------------
# Refusals


@pytest.mark.parametrize("chapter, said", [
    ("99", f"--chapter '99' is not a chapter of the book; expected a number from 1 to {max(ae.chapters(BOOK))}, or all"),
    ("four", "--chapter 'four' is not a chapter of the book"),
])
def test_an_unknown_chapter_is_one_line_and_nothing_is_written(tmp_path, capsys, chapter, said):
    assert ae.main(["otter", "--chapter", chapter, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert said in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("form", ["otter", "pytest"])
def test_an_existing_folder_is_refused_in_one_line_and_left_as_it_was(tmp_path, capsys, form):
    out = tmp_path / "out"
    out.mkdir()
    (out / "adapters.py").write_text("mine")
    assert ae.main([form, "--chapter", "4", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"--out {out} is a folder that is not empty; give a new folder (nothing was written)" in err
    assert err.count("\n") == 1 and [p.name for p in out.iterdir()] == ["adapters.py"]
    assert (out / "adapters.py").read_text() == "mine"


# ----------------------------------------------------------------------------------------------------------------
# What the student edition holds (book/instructor_guide.md)

ROW = re.compile(r"^\| `(ex-[\w-]+)` \| `(transformer_lib/[\w/]+\.py)` \| `(\w+)` \|", re.M)


def test_the_guide_names_the_reference_answer_of_every_coding_exercise_that_the_edition_ships():
    guide = (BOOK / "instructor_guide.md").read_text(encoding="utf-8")
    rows = ROW.findall(guide)
    assert sorted(label for label, _, _ in rows) == sorted(EXERCISE_GRADERS)
    shipped = set(se.tracked_files(ROOT))
    assert "tests/test_exercise_graders.py" in shipped and "tests/test_exercise_graders.py" in guide
    for label, module, function in rows:
        assert module in shipped, f"{label}: {module} is not among the files the student edition copies"
        tree = ast.parse((ROOT / module).read_text(encoding="utf-8"))
        assert function in {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}, (label, module, function)


def test_each_reference_the_guide_names_passes_its_exercises_grader():
    """The guide's claim, run: each function it names is a full answer, which the exercise's own grader accepts."""
    import importlib

    guide = (BOOK / "instructor_guide.md").read_text(encoding="utf-8")
    for label, module, function in ROW.findall(guide):
        answer = getattr(importlib.import_module(module[:-3].replace("/", ".")), function)
        EXERCISE_GRADERS[label](answer, seed=0)  # raises ExerciseGradeError if it is not an answer


def test_the_guide_sends_no_one_to_a_discontinued_service():
    guide = (BOOK / "instructor_guide.md").read_text(encoding="utf-8").lower()
    for name in ("github classroom", "classroom.github.com"):  # discontinued on 2026-08-28
        assert name not in guide, f"book/instructor_guide.md names {name!r}"
    assert "## grading" in guide and "### otter-grader and gradescope" in guide and "### pytest files" in guide
