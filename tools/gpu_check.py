"""Check the GPU path end to end on a machine with a CUDA GPU: the first thing to run wherever one is at hand.

    python tools/gpu_check.py --out DIR [--data FOLDER] [--quick]

It runs, each with its own time limit, and goes on when one fails:

  1. the GPU tests (every test marked `gpu`: tests/test_gpu.py and the CUDA case of the cache test in
     tests/test_decoding.py) and the CPU stand-ins of the same branches
     (tests/test_device_paths.py), on this GPU: pinned copies, fused Adam, no host sync between log entries, bf16 and
     fp16 with a GradScaler, Ctrl-C and resume, a checkpoint moved between the GPU and the CPU, the key/value cache,
     torch.compile with varying shapes, torchrun with NCCL;
  2. a short `multi30k` training with the command line, in the GPU's own precision: train, resume, choose the
     decoding on the validation split, evaluate on test2016 and write its scoreboard record (into a temporary
     folder: the book's scoreboard is not touched), the path of a scoreboard row on a GPU;
  3. the same with the T4's path forced (TRANSFORMER_LIB_AUTOCAST=fp16: float16 with a GradScaler) on a newer GPU;
  4. chapters 8 and 9 executed top to bottom on the GPU in smoke mode (TRANSFORMER_BOOK_SMOKE=1), into a temporary
     folder: the book's stored notebooks are not touched.

About 10 minutes on one H100 (15 at most: each step has a limit, and --quick halves the trainings). It needs the
Multi30k data: the Hugging Face Hub, or an offline copy named by --data or TRANSFORMER_LIB_DATA
(multi30k/{train,validation,test}.jsonl). It writes DIR/gpu_check.json (GPU name, compute capability, torch, CUDA,
and per check: passed, seconds, error), DIR/gpu_check.txt (the same for people) and DIR/gpu_check.log (every
command's output). Exit status 0 when every check passed, 1 otherwise, 2 when there is no GPU.
"""

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's transformer_lib, whatever is installed

from transformer_lib.files import atomic_write_text  # noqa: E402  (never half a file, never through a link)


def gpu_facts() -> dict:
    """What machine this is: GPU, compute capability, torch and CUDA versions."""
    import torch

    if not torch.cuda.is_available():
        print("error: no CUDA GPU is visible to torch (torch.cuda.is_available() is False); gpu_check.py checks "
              "the GPU path and has nothing to check here", file=sys.stderr)
        raise SystemExit(2)
    major, minor = torch.cuda.get_device_capability(0)
    return {"gpu": torch.cuda.get_device_name(0), "gpu_count": torch.cuda.device_count(),
            "compute_capability": f"{major}.{minor}", "torch": torch.__version__, "cuda": torch.version.cuda,
            "python": platform.python_version(), "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}


class Checks:
    """Runs commands as named checks, each with a time limit, and keeps what happened."""

    def __init__(self, env: dict):
        self.results: list[dict] = []
        self.log: list[str] = []  # every command's output, written at the end (atomically, like every file here)
        self.env = env

    def run(self, name: str, command: list[str], limit_s: int, env: dict | None = None, expect: str | None = None):
        """Run command from the repository root; passed when it exits 0 in time (and prints `expect`, if given)."""
        started = time.perf_counter()
        self.log.append(f"\n==== {name}: {' '.join(command)}\n")
        error = None
        try:
            done = subprocess.run(command, cwd=ROOT, env={**self.env, **(env or {})}, capture_output=True, text=True,
                                  timeout=limit_s)
            output = done.stdout + done.stderr
            if done.returncode != 0:
                error = f"exit status {done.returncode}: {last_line(output)}"
            elif expect and not re.search(expect, output):
                error = f"the output lacks {expect!r}"
        except subprocess.TimeoutExpired as timeout:
            output = (timeout.stdout or b"").decode(errors="replace") + (timeout.stderr or b"").decode(errors="replace")
            error = f"did not finish within {limit_s} s"
        self.log.append(output)
        seconds = round(time.perf_counter() - started, 1)
        result = {"check": name, "passed": error is None, "seconds": seconds, "error": error}
        self.results.append(result)
        why = "" if error is None else f": {error}"
        print(f"{'PASS' if error is None else 'FAIL'}  {name}  ({seconds:.0f} s){why}",
              flush=True)
        return output

    def add(self, name: str, passed: bool | None, seconds: float, error: str | None) -> None:
        self.results.append({"check": name, "passed": passed, "seconds": seconds, "error": error})


def last_line(output: str) -> str:
    """The last non-empty line of a command's output: where the error usually is."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(no output)"


def test_results(junit: Path, checks: Checks) -> None:
    """One result per test case of a pytest JUnit report."""
    if not junit.is_file():
        return
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        failed = case.find("failure") if case.find("failure") is not None else case.find("error")
        skipped = case.find("skipped")
        name = f"test {case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        error = None if failed is None else (failed.get("message") or "failed")[:300]
        passed = failed is None
        if skipped is not None:  # e.g. bf16 on a GPU older than compute capability 8.0: neither passed nor failed
            passed, error = None, f"skipped: {skipped.get('message', '')[:300]}"
        checks.add(name, passed, round(float(case.get("time", 0)), 1), error)


def training_checks(checks: Checks, work: Path, name: str, steps: int, env: dict, scoreboard: bool = True) -> None:
    """train --max-steps steps//2, --resume to steps, choose on validation, evaluate on test2016 (with --scoreboard,
    which needs an epoch's record: at least one full epoch, about 160 steps of multi30k)."""
    run = work / name
    cli = [sys.executable, "-m", "transformer_lib"]
    common = ["--preset", "multi30k", "--no-progress"]
    checks.run(f"{name}: train {steps // 2} steps", [*cli, "train", *common, "--max-steps", str(steps // 2),
                                                    "--out", str(run)], 300, env, expect=rf"trained {steps // 2} steps")
    checks.run(f"{name}: resume to {steps} steps", [*cli, "train", "--out", str(run), "--resume", "--no-progress",
                                                    "--max-steps", str(steps)], 300, env,
               expect=rf"trained {steps} steps")
    checks.run(f"{name}: choose the decoding on validation", [*cli, "choose", "--checkpoint", str(run), "--alpha",
                                                              "0.6", "1.0"], 300, env,
               expect=r"chosen on the validation split")
    if scoreboard:
        checks.run(f"{name}: evaluate on test2016, scoreboard record", [
            *cli, "evaluate", "--checkpoint", str(run), "--split", "test", "--scoreboard", str(work / f"{name}-board")],
            180, env, expect=r"BLEU = [\s\S]*scoreboard record written to .*multi30k-cuda\.json")
    else:
        checks.run(f"{name}: evaluate on test2016", [*cli, "evaluate", "--checkpoint", str(run), "--split", "test"],
                   180, env, expect=r"BLEU = ")


def chapter_checks(checks: Checks, work: Path) -> None:
    """Chapters 8 and 9, copied into work/ with the book's figures, executed top to bottom in smoke mode."""
    book = work / "book"
    shutil.copytree(ROOT / "book", book, ignore=shutil.ignore_patterns("_build"))
    for name in ("08_translation.ipynb", "09_attention_heatmaps.ipynb"):  # 9 reads the run 8 leaves in book/runs
        code = ("import nbformat, sys; from nbclient import NotebookClient; "
                "nb = nbformat.read(sys.argv[1], as_version=4); "
                "NotebookClient(nb, timeout=600, kernel_name='python3', resources={'metadata': {'path': sys.argv[2]}})"
                ".execute(); print('executed', len(nb.cells), 'cells')")
        checks.run(f"chapter {name[:2]} (smoke mode, on the GPU)", [sys.executable, "-c", code, str(book / name),
                                                                     str(book)], 420,
                   {"TRANSFORMER_BOOK_SMOKE": "1"}, expect="executed")


def summary(facts: dict, results: list[dict]) -> str:
    passed = sum(result["passed"] is True for result in results)
    skipped = sum(result["passed"] is None for result in results)
    lines = [f"gpu_check on {facts['gpu']} (compute capability {facts['compute_capability']}, "
             f"{facts['gpu_count']} GPU), torch {facts['torch']}, CUDA {facts['cuda']}, {facts['date']}",
             f"{passed} of {len(results)} checks passed ({skipped} skipped) in "
             f"{sum(r['seconds'] for r in results) / 60:.1f} min", ""]
    for result in results:
        mark = {True: "PASS", False: "FAIL", None: "SKIP"}[result["passed"]]
        lines.append(f"{mark}  {result['check']}  ({result['seconds']:.0f} s)"
                     + ("" if result["error"] is None else f"\n      {result['error']}"))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="folder for gpu_check.json, .txt and .log")
    parser.add_argument("--data", type=Path, help="folder holding multi30k/*.jsonl (default: TRANSFORMER_LIB_DATA, "
                                                  "else the Hugging Face Hub)")
    parser.add_argument("--quick", action="store_true", help="half-length trainings (about 6 minutes in all)")
    args = parser.parse_args(argv)
    if args.out.exists() and not args.out.is_dir():
        parser.error(f"--out {str(args.out)!r} exists and is not a folder")
    facts = gpu_facts()
    args.out.mkdir(parents=True, exist_ok=True)
    env = {key: value for key, value in os.environ.items() if key not in ("TRANSFORMER_BOOK_SMOKE",
                                                                          "TRANSFORMER_LIB_AUTOCAST")}
    if args.data:
        if not (args.data / "multi30k" / "train.jsonl").is_file():
            parser.error(f"--data {str(args.data)!r} holds no multi30k/train.jsonl")
        env["TRANSFORMER_LIB_DATA"] = str(args.data.resolve())
    checks = Checks(env)
    print(f"gpu_check: {facts['gpu']}, torch {facts['torch']}; results in {args.out}", flush=True)
    steps = 300 if args.quick else 600
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as scratch:
        work = Path(scratch)
        junit = work / "tests.xml"
        checks.run("pytest: GPU tests and their CPU stand-ins", [
            sys.executable, "-m", "pytest", "tests/test_gpu.py", "tests/test_device_paths.py",
            "tests/test_decoding.py::test_cached_and_uncached_decoding_agree", "-q", "-rs",
            "-p", "no:cacheprovider", f"--junitxml={junit}"], 420)
        test_results(junit, checks)
        training_checks(checks, work, "multi30k", steps, {})
        training_checks(checks, work, "multi30k-fp16-gradscaler", steps // 2, {"TRANSFORMER_LIB_AUTOCAST": "fp16"},
                        scoreboard=False)  # --quick: 150 steps, less than an epoch
        chapter_checks(checks, work)
    passed = all(result["passed"] is not False for result in checks.results)  # a skipped check is no failure
    report = {**facts, "checks": checks.results, "passed": passed}
    text = summary(facts, checks.results)
    atomic_write_text(args.out / "gpu_check.json", json.dumps(report, indent=2) + "\n")
    atomic_write_text(args.out / "gpu_check.txt", text)
    atomic_write_text(args.out / "gpu_check.log", "".join(checks.log))
    print("\n" + text, end="")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
