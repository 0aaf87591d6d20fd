"""tools/gpu_kit.py without a GPU: its help, its refusals, a stage cut or killed at its limit, and stage 1 rehearsed
on the CPU (its `multi30k` group with the tiny preset: train, choose, evaluate into a scoreboard record)."""

import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
import torch

import gpu_kit
import run_heavy_chapters

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("TRANSFORMER_LIB_DATA", ROOT.parent / "shared" / "data"))
KIT = [sys.executable, "tools/gpu_kit.py"]


def kit(*arguments, **kwargs):
    return subprocess.run([*KIT, *arguments], cwd=ROOT, capture_output=True, text=True, **kwargs)


def needs_data():
    if not (DATA / "multi30k" / "train.jsonl").is_file():
        pytest.skip(f"the offline Multi30k copy is not at {DATA}; set TRANSFORMER_LIB_DATA")


@pytest.fixture
def fake_data(tmp_path):
    """A data folder with the three Multi30k files, enough for the checks made before a stage starts."""
    folder = tmp_path / "data"
    (folder / "multi30k").mkdir(parents=True)
    for split in ("train", "validation", "test"):
        (folder / "multi30k" / f"{split}.jsonl").write_text('{"de": "Hallo", "en": "Hello"}\n')
    return folder


FACTS = {"gpu": None, "torch": torch.__version__, "cuda": None, "date": "2026-11-28T00:00:00+00:00"}


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def packed(out: Path) -> list[str]:
    with tarfile.open(out / "results.tar.gz") as tar:
        return tar.getnames()


def test_help_documents_every_stage_with_its_limits_and_groups():
    done = kit("--help")
    assert done.returncode == 0
    text = " ".join(done.stdout.split())  # argparse rewraps the options' help
    for stage, (limit, rehearse_limit, _) in gpu_kit.STAGES.items():
        assert limit <= gpu_kit.MAX_STAGE_S
        assert f"{stage} ({limit} s) [{rehearse_limit} s]" in text, stage
        groups = dict.fromkeys(c.group for c in gpu_kit.stage_checks(stage, Path("W"), False, kit_options()))
        assert f"{stage}:{''.join(groups)}" in "".join(text.split()), (stage, groups)  # --only's help, unwrapped
    for words in ("summary.json", "results.tar.gz", "--resume", "--rehearse", "TRANSFORMER_LIB_AUTOCAST=fp16",
                  "into a copy", "jobs", "wheelhouse", "790 TFLOP/s", "'The GPU plan'"):
        assert words in text, words


def kit_options(**changes):
    import argparse

    return argparse.Namespace(**{"jobs": 4, "run_minutes": 6.0, **changes})


def test_each_check_limit_in_help_is_the_one_the_stage_gives():
    listing = kit("--list").stdout
    for stage in gpu_kit.STAGES:
        for check in gpu_kit.stage_checks(stage, Path("WORK"), False, kit_options()):
            assert f"{check.limit_s:4d} s  {check.name}" in listing


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the kit runs for real there")
def test_without_a_gpu_it_stops_at_once_with_one_line(tmp_path, fake_data):
    done = kit("--stage", "1", "--out", str(tmp_path / "out"), "--data", str(fake_data))
    assert done.returncode == 2
    assert done.stderr.startswith("error: no CUDA GPU") and done.stderr.count("\n") == 1
    assert "--rehearse" in done.stderr
    assert not (tmp_path / "out").exists()


def test_without_its_wheelhouse_it_stops_with_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        gpu_kit.provide_modules(("json", "no_such_module_of_the_kit"), dict(os.environ), tmp_path / "wheels")
    assert stop.value.code == 3
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "no_such_module_of_the_kit" in error and "gpu_wheelhouse.py" in error


def test_an_output_folder_with_results_is_refused_unless_resumed(tmp_path, fake_data):
    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.json").write_text(json.dumps({"stage": "1b", "checks": []}))
    common = ["--rehearse", "--data", str(fake_data), "--out", str(out)]
    done = kit("--stage", "1", *common)
    assert done.returncode == 2 and "already holds summary.json" in done.stderr and "--resume" in done.stderr
    done = kit("--stage", "1", "--resume", *common)  # the results of another stage
    assert done.returncode == 2 and "stage '1b', not '1'" in done.stderr
    (out / "mine.txt").write_text("a file of the user's")
    done = kit("--stage", "1b", "--resume", *common)
    assert done.returncode == 2 and "mine.txt" in done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["mine.txt", "summary.json"]  # nothing touched
    done = kit("--stage", "1", "--resume", "--rehearse", "--data", str(fake_data), "--out", str(tmp_path / "new"))
    assert done.returncode == 2 and "holds no results to resume" in done.stderr


def test_bad_arguments_are_refused_naming_them(tmp_path, fake_data):
    common = ["--rehearse", "--data", str(fake_data), "--out", str(tmp_path / "out")]
    assert "--limit must be" in kit("--stage", "1", "--limit", "900", *common).stderr
    assert "--only nope: stage 1b has the groups tests t4" in kit("--stage", "1b", "--only", "nope", *common).stderr
    assert "holds no multi30k" in kit("--stage", "1", "--rehearse", "--data", str(tmp_path),
                                      "--out", str(tmp_path / "out")).stderr
    assert not (tmp_path / "out").exists()


def test_no_ablation_run_starts_that_could_not_finish_in_the_stage(tmp_path, fake_data):
    out = tmp_path / "out"
    done = kit("--stage", "3", "--rehearse", "--limit", "60", "--run-minutes", "5", "--data", str(fake_data),
               "--out", str(out))
    assert done.returncode == 0, done.stderr  # nothing failed: nothing could be run
    [check] = summary(out)["checks"]
    assert check["passed"] is None and check["error"].startswith("not run: less than --run-minutes 5 is left")


def test_a_stage_at_its_limit_keeps_what_it_finished_packed(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    out.mkdir(), work.mkdir()
    stage = gpu_kit.Stage("1", out, work, FACTS, limit_s=20, env=dict(os.environ), previous=None)
    py = sys.executable
    record = work / "first" / "record.json"
    stage.run(gpu_kit.Check("writes a record", [py, "-c", f"import pathlib; p = pathlib.Path({str(record)!r}); "
                                                          "p.parent.mkdir(); p.write_text('{}'); print('done')"],
                            60, expect="done", group="first"))
    # a training stopped at its limit gets SIGINT first, and saves before it stops
    saving = ("import signal, sys, time, pathlib\n"
              "def save(*_):\n"
              f"    pathlib.Path({str(work / 'saved.txt')!r}).write_text('saved'); sys.exit(130)\n"
              "signal.signal(signal.SIGINT, save)\n"
              "print('training', flush=True); time.sleep(60)\n")
    stage.run(gpu_kit.Check("outruns the stage", [py, "-c", saving], 60, group="second", interrupt=True))
    stage.run(gpu_kit.Check("no time left", [py, "-c", "print(1)"], 60, group="third"))
    stage.close()
    results = {r["check"]: r for r in summary(out)["checks"]}
    assert results["writes a record"]["passed"] is True
    assert results["outruns the stage"]["passed"] is False
    assert results["outruns the stage"]["error"].startswith("stopped at its limit of")
    assert results["outruns the stage"]["seconds"] < 20
    assert results["no time left"]["passed"] is None and results["no time left"]["error"].startswith("not reached")
    assert (work / "saved.txt").read_text() == "saved"  # SIGINT reached it before SIGKILL
    assert sorted(p.name for p in out.iterdir()) == sorted(gpu_kit.FILES)
    assert {"first/record.json", "saved.txt"} <= set(packed(out))
    assert "==== outruns the stage" in (out / "log.txt").read_text() and "training" in (out / "log.txt").read_text()
    assert "FAIL  outruns the stage" in (out / "summary.txt").read_text()


def test_each_test_case_becomes_a_result_with_its_error(tmp_path):
    junit = tmp_path / "tests.xml"
    junit.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_gpu" name="test_a" time="1.5"/>'
        '<testcase classname="tests.test_gpu" name="test_b" time="2"><failure message="assert 1 == 2"/></testcase>'
        '<testcase classname="tests.test_gpu" name="test_c" time="0"><skipped message="needs bf16"/></testcase>'
        "</testsuite></testsuites>")
    (tmp_path / "out").mkdir()
    stage = gpu_kit.Stage("1", tmp_path / "out", tmp_path, FACTS, 60, {}, None)
    gpu_kit.test_results(junit, stage)
    assert [(r["check"], r["passed"], r["error"]) for r in stage.results] == [
        ("test test_gpu::test_a", True, None),
        ("test test_gpu::test_b", False, "assert 1 == 2"),
        ("test test_gpu::test_c", None, "skipped: needs bf16"),  # neither passed nor failed: reported apart
    ]
    stage.close()


def test_results_keep_records_and_notebooks_not_weights():
    keep = gpu_kit.keep_in_results
    assert keep(Path("multi30k/history.json")) and keep(Path("scoreboard/multi30k-cuda.json"))
    assert keep(Path("chapters/08_translation.ipynb")) and keep(Path("chapters/scoreboard/multi30k-cuda.json"))
    assert not keep(Path("multi30k/checkpoint.pt")) and not keep(Path("multi30k/epoch-020.pt"))
    assert not keep(Path("book/08_translation.ipynb")) and not keep(Path("book/runs/multi30k-de-en/tokenizer.json"))
    assert not keep(Path("ablation-runs/x/run/history.json")) and not keep(Path("multi30k/.lock"))


def test_only_the_notebooks_executed_in_the_copy_are_kept(tmp_path):
    copy = run_heavy_chapters.make_copy(tmp_path / "book")
    gpu_kit.keep_chapters(tmp_path)
    assert not (tmp_path / "chapters").exists()  # chapter 8's stored run, as the book has it: not this run's
    notebook = json.loads((copy / "09_attention_heatmaps.ipynb").read_text())
    notebook["metadata"]["transformer_book"]["run"]["started_utc"] = "2026-11-28T00:00:00+00:00"  # as a run rewrites
    (copy / "09_attention_heatmaps.ipynb").write_text(json.dumps(notebook))
    (copy / "runs" / "smoke-de-en" / "scoreboard").mkdir(parents=True)
    (copy / "runs" / "smoke-de-en" / "scoreboard" / "tiny-cpu.json").write_text("{}")
    gpu_kit.keep_chapters(tmp_path)
    assert sorted(str(p.relative_to(tmp_path)) for p in (tmp_path / "chapters").rglob("*.*")) == [
        "chapters/09_attention_heatmaps.ipynb", "chapters/scoreboard/tiny-cpu.json"]


def test_on_resume_each_file_goes_back_only_with_its_group():
    assert [gpu_kit.owner(name) for name in (
        "tests.xml", "multi30k/history.json", "scoreboard/multi30k-cuda.json", "multi30k-fp16/history.json",
        "benchmarks/gpu-base-bf16-compile.json", "benchmarks/rehearsal-small-bf16.json",
        "chapters/08_translation.ipynb", "chapters/scoreboard/multi30k-cuda.json",
        "chapters/09_attention_heatmaps.ipynb", "cell-times.json", "ablations/baseline-seed0.json")] == [
        "tests", "multi30k", "multi30k", "t4", "base-bf16-compile", "small-bf16", "chapter-8", "chapter-8",
        "chapter-9", None, None]
    groups = {check.group for stage in gpu_kit.STAGES
              for check in gpu_kit.stage_checks(stage, Path("W"), False, kit_options())}
    assert {"tests", "multi30k", "t4", "base-bf16-compile", "small-bf16", "chapter-8", "chapter-9"} <= groups


def test_the_chapters_run_into_a_copy_only(tmp_path, monkeypatch):
    def refused(*arguments):
        with pytest.raises(SystemExit) as stop:
            run_heavy_chapters.main(list(arguments))
        return stop.value.code

    monkeypatch.setenv("TRANSFORMER_BOOK_SMOKE", "1")
    assert refused() == 2  # a smoke run never into the book itself
    monkeypatch.delenv("TRANSFORMER_BOOK_SMOKE")
    assert refused("--into", str(ROOT / "book" / "copy")) == 2  # not inside book/
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    assert refused("--into", str(tmp_path / "full")) == 2  # nothing overwritten
    assert refused("--check", "--into", str(tmp_path / "new")) == 2
    copy = run_heavy_chapters.make_copy(tmp_path / "copy")
    assert (copy / "08_translation.ipynb").is_file() and not (copy / "_build").exists()
    (copy / "runs").mkdir()
    (copy / "runs" / "left-by-chapter-8").write_text("")
    assert run_heavy_chapters.make_copy(copy) == copy  # its own copy is used again, as it is (chapter 9 after 8)
    assert (copy / "runs" / "left-by-chapter-8").is_file()


def test_cell_times_are_rewritten_after_every_cell(tmp_path):
    import nbformat

    path = tmp_path / "times.json"
    times = run_heavy_chapters.CellTimes(path)
    times.start("08_translation.ipynb")
    cell = nbformat.v4.new_code_cell("\n# settings\nx = 1")
    times.cell_start(cell=cell, cell_index=3)
    times.cell_done("08_translation.ipynb", cell=cell, cell_index=3, execute_reply={})
    written = json.loads(path.read_text())["08_translation.ipynb"]
    assert written["finished"] is False and written["cells"][0]["index"] == 3
    assert written["cells"][0]["first_line"] == "# settings" and written["cells"][0]["seconds"] >= 0
    times.finish("08_translation.ipynb")
    assert json.loads(path.read_text())["08_translation.ipynb"]["finished"] is True
    later = run_heavy_chapters.CellTimes(path)  # chapter 9 in a call of its own: chapter 8's times are kept
    later.start("09_attention_heatmaps.ipynb")
    assert sorted(json.loads(path.read_text())) == ["08_translation.ipynb", "09_attention_heatmaps.ipynb"]


def test_stage_1_rehearsed_packs_a_scoreboard_record_and_resumes(tmp_path):
    needs_data()
    out = tmp_path / "stage1"
    env = {**os.environ, "TRANSFORMER_LIB_DATA": str(DATA), "OMP_NUM_THREADS": "1"}
    done = kit("--stage", "1", "--rehearse", "--only", "multi30k", "--out", str(out), env=env, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert sorted(p.name for p in out.iterdir()) == sorted(gpu_kit.FILES)  # nothing else, no folder
    report = summary(out)
    assert report["rehearsal"] is True and report["stage"] == "1" and report["passed"] is True
    assert [r["check"] for r in report["checks"]] == ["multi30k: train", "multi30k: choose the decoding on validation",
                                                      "multi30k: evaluate test2016, scoreboard record"]
    assert report["checks"][0]["facts"]["trained_steps"] > 0 and report["checks"][2]["facts"]["bleu"] >= 0
    names = packed(out)
    assert "multi30k/history.json" in names and "multi30k/decoding.json" in names
    assert [n for n in names if n.startswith("scoreboard/")] == ["scoreboard/tiny-cpu.json"]  # <preset>-<device>
    assert not any(n.endswith(".pt") for n in names)
    # resumed: the group that passed is kept, not run again
    again = kit("--stage", "1", "--rehearse", "--only", "multi30k", "--resume", "--out", str(out), env=env,
                timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    kept = summary(out)["checks"]
    assert len(kept) == 3 and all(r["kept_from"] == report["date"] for r in kept)
    assert "multi30k/history.json" in packed(out)


def test_a_kit_killed_from_outside_leaves_its_finished_checks(tmp_path):
    needs_data()
    out = tmp_path / "stage1"
    env = {**os.environ, "TRANSFORMER_LIB_DATA": str(DATA), "OMP_NUM_THREADS": "1"}
    process = subprocess.Popen([*KIT, "--stage", "1", "--rehearse", "--only", "multi30k", "--out", str(out)],
                               cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and process.poll() is None:
            log = (out / "log.txt").read_text() if (out / "log.txt").is_file() else ""
            if "==== multi30k: choose" in log:
                break  # the training is done and recorded: the choice of decoding is running now
            time.sleep(0.5)
        assert process.poll() is None, "the kit ended before it could be killed"
    finally:
        os.killpg(process.pid, signal.SIGKILL)  # as a device call's limit kills: no chance to clean up
        process.wait()
    report = summary(out)
    assert report["checks"][0]["check"] == "multi30k: train" and report["checks"][0]["passed"] is True
    assert "multi30k/history.json" in packed(out)
    assert "==== multi30k: choose" in (out / "log.txt").read_text()


def test_every_stage_provides_the_packages_dependencies():
    # The GPU machine has the package installed nowhere: a dependency it lacks (datasets, on 2026-11-28) must come from
    # the wheelhouse before any stage imports transformer_lib.
    import re
    import tomllib

    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    names = {re.split(r"[<>=!~ \[;]", requirement, maxsplit=1)[0] for requirement in project["dependencies"]}
    assert names <= set(gpu_kit.BASE_MODULES), names - set(gpu_kit.BASE_MODULES)
