"""tools/gpu_check.py on a machine without a GPU: its help, its refusal, and how it reads and reports results."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

import gpu_check


def test_help_says_what_it_runs_and_how_long_it_takes():
    done = subprocess.run([sys.executable, "tools/gpu_check.py", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0
    for words in ("tests/test_gpu.py", "resume", "TRANSFORMER_LIB_AUTOCAST=fp16", "chapters 8 and 9", "minutes",
                  "gpu_check.json"):
        assert words in done.stdout, words


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: gpu_check.py runs for real there")
def test_without_a_gpu_it_stops_at_once_with_one_line(tmp_path):
    done = subprocess.run([sys.executable, "tools/gpu_check.py", "--out", str(tmp_path / "out")], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 2
    assert done.stderr.startswith("error: no CUDA GPU") and done.stderr.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_each_test_case_becomes_a_check_with_its_error(tmp_path):
    junit = tmp_path / "tests.xml"
    junit.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.test_gpu" name="test_a" time="1.5"/>'
        '<testcase classname="tests.test_gpu" name="test_b" time="2"><failure message="assert 1 == 2"/></testcase>'
        '<testcase classname="tests.test_gpu" name="test_c" time="0"><skipped message="needs bf16"/></testcase>'
        "</testsuite></testsuites>")
    checks = gpu_check.Checks({})
    gpu_check.test_results(junit, checks)
    assert [(r["check"], r["passed"], r["error"]) for r in checks.results] == [
        ("test test_gpu::test_a", True, None),
        ("test test_gpu::test_b", False, "assert 1 == 2"),
        ("test test_gpu::test_c", None, "skipped: needs bf16"),  # neither passed nor failed: reported apart
    ]


def test_a_failing_command_is_a_failed_check_and_the_next_one_still_runs():
    checks = gpu_check.Checks({})
    checks.run("fails", [sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"], 60)
    checks.run("slow", [sys.executable, "-c", "import time; time.sleep(5)"], 1)
    checks.run("passes", [sys.executable, "-c", "print('trained 4 steps')"], 60, expect=r"trained 4 steps")
    assert [(r["passed"], r["error"]) for r in checks.results] == [
        (False, "exit status 3: boom"), (False, "did not finish within 1 s"), (True, None)]
    facts = {"gpu": "NVIDIA H100", "gpu_count": 1, "compute_capability": "9.0", "torch": "2.13.0", "cuda": "12.8",
             "date": "2026-11-25T00:00:00+00:00"}
    text = gpu_check.summary(facts, checks.results)
    assert text.startswith("gpu_check on NVIDIA H100") and "1 of 3 checks passed (0 skipped)" in text and "FAIL  slow" in text
