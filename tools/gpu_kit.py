"""The GPU kit: what to run wherever a GPU is at hand, in stages that each fit one short window of GPU time.

    python tools/gpu_kit.py --stage 1 --out DIR                # on a machine with a CUDA GPU
    python tools/gpu_kit.py --stage 1 --out DIR --resume       # again, redoing only what did not pass
    python tools/gpu_kit.py --stage 1 --out DIR --rehearse     # the same code path on the CPU, tiny preset
    python tools/gpu_kit.py --list                             # every stage's checks and their time limits

A window of GPU time is short (15 minutes with the machine's start, 10 minutes a command) and only a few files come
back from it, so each stage has a time limit of its own and gives every check a limit inside it; a check that would
outrun the stage is cut at the stage's end, and checks that no time is left for are reported as not reached. After
every check the stage rewrites, each atomically, the files of DIR, and nothing else goes there:

  DIR/summary.json   the machine (GPU, torch, CUDA), the stage, and per check: passed, seconds, limit, error, facts
  DIR/summary.txt    the same for people
  DIR/log.txt        every command and its output, appended as it runs (a stage killed from outside keeps it)
  DIR/results.tar.gz what the checks wrote: run records, scoreboard and benchmark JSON, executed notebooks and cell
                     times, ablation records and logs (never weights: checkpoints stay on the machine)

so a stage cut short, or killed at its limit, leaves what it finished packed: four files, no folder below DIR.

Stages, with their limits on a GPU (an H100/H200; seconds; the rehearsal's in brackets):

  1   (480 s) [600 s]  `multi30k` trained with the command line (360 s: the preset's 20 epochs, 3,320 steps; on an
                       H200 on 2026-11-28 a minute of start and 9.3 s an epoch, about 5 minutes in all; a run not
                       done at its limit is stopped as Ctrl-C stops it, saved, and the decoding is still chosen and
                       scored, on what it trained), the decoding chosen on validation (`choose`, 60 s: 18 s there),
                       test2016 evaluated into a scoreboard record in the results, not the book's scoreboard
                       (`evaluate --scoreboard`, 50 s)
  1b  (420 s) [600 s]  the GPU tests (tests/test_gpu.py and the CUDA case of the cache test: 240 s; more than 150 s
                       there), then the T4's path forced (TRANSFORMER_LIB_AUTOCAST=fp16: float16 with a
                       GradScaler): 100 steps, resumed to 200, evaluated on test2016 (60 s each)
  1c  (420 s) [600 s]  the benchmark's small and base rows in bf16, each without and with torch.compile
                       (benchmarks/benchmark.py: 60, 60, 130 and 170 s)
  2   (480 s) [900 s]  chapter 8 executed in full on the GPU by tools/run_heavy_chapters.py into a copy of the book
                       (the book's notebooks are not touched), with the wall time of each cell (rewritten after
                       every cell, so a chapter cut at the limit still says how far it got)
  2b  (420 s) [600 s]  chapter 9 the same way; it trains its own translator (10 epochs), chapter 8's run being in
                       another window
  3   (450 s) [600 s]  the ablation sweep (benchmarks/ablations.py): every variant with seeds 0 and 1, --jobs runs
                       at once on the one GPU; each record packed as soon as it is written. A run cut by the limit
                       is lost (its checkpoint cannot come back), so no run starts later than --run-minutes before
                       the end. Resumable across windows: the records of earlier windows (--records, by default
                       benchmarks/results/ablations/multi30k) are copied in first and not run again

Stage 1 was first sized from FLOPs: 553 TFLOP of training (20 epochs of 166 batches of about 167 GFLOP) is 2 to 4 s
of an H200's 790 TFLOP/s bf16 peak at 20-35 % of it, and a model this small is bound by kernel launches and the host
instead, assumed at 20-40 ms a step. Measured on an H200 (2026-11-28, torch 2.11): 56 ms a step with the greedy
validation BLEU every second epoch, 15 epochs in 242 s with the start, so the first window's 240 s stopped it there
(validation BLEU 39.58 with beam 4 on the average of epochs 14-15). Its checkpoint (about 90 MB: 7.6 million weights
and Adam's two moments, 12 bytes each) cannot come back from the machine (16 MiB a file), so a run cut short is
trained again in the next window, never resumed.

What each stage needs that the GPU machine lacks comes from the wheelhouse, .gpu/wheels (tools/gpu_wheelhouse.py
builds it, with the offline Multi30k in .gpu/data): missing modules are installed from it (pip --no-index, into a
folder outside the repository) before the stage starts. A folder DIR that already holds results is refused unless
--resume is given: then the checks that passed are kept, their files too, and the others run again.

Without a CUDA GPU (and without --rehearse) it stops at once with one line, exit status 2; without a module the
stage needs and no wheelhouse to install it from, exit status 3. Exit status 0 when every check passed (a skipped
test is no failure), 1 otherwise. CONTRIBUTING.md, 'The GPU plan', gives the device call for each stage.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's transformer_lib, whatever is installed

from transformer_lib.files import atomic_open, atomic_write_text  # noqa: E402  (never half a file)

KIT = ROOT / ".gpu"  # ignored (.gitignore): the wheelhouse and the data that travel to the GPU machine
WHEELS, DATA = KIT / "wheels", KIT / "data"
SITE = Path(tempfile.gettempdir()) / "gpu_kit_site"  # where the wheelhouse is installed: outside the repository
FILES = ("summary.json", "summary.txt", "log.txt", "results.tar.gz")  # everything the kit writes into --out
MAX_STAGE_S = 480  # no stage runs longer on a GPU: 8 minutes of the 15 a window has, the machine's start included
GRACE_S = 30  # a check at its limit gets SIGINT (a training saves and stops), then this long before SIGKILL
RESERVE_S = 5  # kept at a stage's end for the last packing
HEAVY = ("08_translation.ipynb", "09_attention_heatmaps.ipynb")  # the chapters stage 2 runs

# The stages: (limit on a GPU, limit in a rehearsal, modules the stage imports beyond the package's own).
STAGES = {
    "1": (480, 600, ()),
    "1b": (420, 600, ("pytest",)),
    "1c": (420, 600, ()),
    "2": (480, 900, ("nbformat", "nbclient", "ipykernel")),
    "2b": (420, 600, ("nbformat", "nbclient", "ipykernel")),
    "3": (450, 600, ("pandas", "sacrebleu")),
}
# transformer_lib's own dependencies (pyproject.toml): every stage imports the package, and load_pairs needs datasets
BASE_MODULES = ("torch", "numpy", "tokenizers", "datasets", "sacrebleu", "tqdm", "matplotlib", "seaborn", "altair")


@dataclass
class Check:
    """One command of a stage: its name, argv (run from the repository root), limit and what it must print."""

    name: str
    command: list[str]
    limit_s: int
    expect: str | None = None
    env: dict = field(default_factory=dict)
    group: str = ""  # checks of one group are redone together on --resume (a training and what reads its run)
    needs: Path | None = None  # a file an earlier check must have written, else this one is not run
    interrupt: bool = False  # at its limit: SIGINT first (a training saves its checkpoint), then SIGKILL


# ---------------------------------------------------------------------------------------------------------------
# What each stage runs, on a GPU and in a rehearsal


def stage_checks(stage: str, work: Path, rehearse: bool, options: argparse.Namespace) -> list[Check]:
    """The checks of a stage, in order; work is the folder whose files end in results.tar.gz."""
    py = sys.executable
    cli = [py, "-m", "transformer_lib"]
    run, t4 = work / "multi30k", work / "multi30k-fp16"
    preset = ["--preset", "tiny", "--train-limit", "2000"] if rehearse else ["--preset", "multi30k"]
    if stage == "1":  # the scoreboard's GPU row
        quick = ["--limit", "100", "--max-len", "30"] if rehearse else []
        return [
            Check("multi30k: train", [*cli, "train", *preset, "--no-progress", "--out", str(run)],
                  90 if rehearse else 360, r"trained [\d,]+ steps", group="multi30k", interrupt=True),
            Check("multi30k: choose the decoding on validation", [*cli, "choose", "--checkpoint", str(run),
                                                                  "--alpha", "0.6", "1.0", *quick],
                  120 if rehearse else 60, r"chosen on the validation split", group="multi30k",
                  needs=run / "checkpoint.pt"),
            Check("multi30k: evaluate test2016, scoreboard record", [
                *cli, "evaluate", "--checkpoint", str(run), "--split", "test", "--scoreboard",
                str(work / "scoreboard")], 120 if rehearse else 50,
                r"BLEU = [\s\S]*scoreboard record written to", group="multi30k", needs=run / "decoding.json"),
        ]
    if stage == "1b":  # the GPU tests and the T4's path
        steps = (20, 40) if rehearse else (100, 200)
        return [
            Check("GPU tests", [py, "-m", "pytest", "tests/test_gpu.py",
                                "tests/test_decoding.py::test_cached_and_uncached_decoding_agree", "-q", "-rs",
                                "-p", "no:cacheprovider", f"--junitxml={work / 'tests.xml'}"], 240, group="tests"),
            Check(f"T4 path (fp16, GradScaler): train {steps[0]} steps", [
                *cli, "train", *preset, "--no-progress", "--max-steps", str(steps[0]), "--out", str(t4)], 60,
                rf"trained {steps[0]} steps", {"TRANSFORMER_LIB_AUTOCAST": "fp16"}, group="t4", interrupt=True),
            Check(f"T4 path: resume to {steps[1]} steps", [
                *cli, "train", "--out", str(t4), "--resume", "--no-progress", "--max-steps", str(steps[1])], 60,
                rf"trained {steps[1]} steps", {"TRANSFORMER_LIB_AUTOCAST": "fp16"}, group="t4",
                needs=t4 / "checkpoint.pt", interrupt=True),
            Check("T4 path: evaluate test2016", [*cli, "evaluate", "--checkpoint", str(t4), "--split", "test",
                                                 *(["--max-len", "30"] if rehearse else [])],
                  120 if rehearse else 60, r"BLEU = ", {"TRANSFORMER_LIB_AUTOCAST": "fp16"}, group="t4",
                  needs=t4 / "checkpoint.pt"),
        ]
    if stage == "1c":
        checks = []
        for size, compiled, limit in (("small", False, 60), ("base", False, 60), ("small", True, 130),
                                      ("base", True, 170)):
            name = f"{size}-bf16{'-compile' if compiled else ''}"
            size_arguments = ["--size", "tiny", "--device", "cpu", "--steps", "3", "--repeats", "2", "--no-memory"] \
                if rehearse else ["--size", size]  # the rehearsal runs each row with the tiny model
            report = work / "benchmarks" / f"{'rehearsal' if rehearse else 'gpu'}-{name}.json"  # as in results/
            checks.append(Check(f"benchmark: {size} model, bf16{', torch.compile' if compiled else ''}", [
                py, "benchmarks/benchmark.py", *size_arguments, "--dtype", "bf16",
                *(["--compile"] if compiled else []), "--json", str(report)],
                240 if rehearse else limit, r"target tokens/s", group=name))
        return checks
    if stage in ("2", "2b"):  # chapter 9 in a window of its own: it trains its own translator (10 epochs)
        smoke = {"TRANSFORMER_BOOK_SMOKE": "1"} if rehearse else {}
        chapter, name, limit = ("8", HEAVY[0], 600 if rehearse else 480) if stage == "2" else \
            ("9", HEAVY[1], 300 if rehearse else 420)
        return [Check(f"chapter {chapter} into a copy of the book", [
            py, "tools/run_heavy_chapters.py", name, "--into", str(work / "book"), "--cell-times",
            str(work / "cell-times.json")], limit, rf"{name}: done in", smoke, group=f"chapter-{chapter}")]
    if stage == "3":
        records = work / "ablations"
        sizes = ["--preset", "tiny", "--train-limit", "300", "--epochs", "1", "--alpha", "1.0", "--max-len", "20"] \
            if rehearse else []
        limit = 600 if rehearse else 450
        stop_after = max(0.01, (limit - options.run_minutes * 60) / 60)  # set again from the time left
        return [Check("ablation sweep", [
            py, "benchmarks/ablations.py", "--out", str(records), "--seeds", "0", "1", "--jobs", str(options.jobs),
            "--stop-after", f"{stop_after:.2f}", "--work", str(work / "ablation-runs"), *sizes], limit,
            r"runs to do", group="ablations")]
    raise ValueError(f"--stage must be one of {sorted(STAGES)}, got {stage!r}")


# ---------------------------------------------------------------------------------------------------------------
# Running checks within a stage's time, and keeping their results


class Stage:
    """Runs a stage's checks against its deadline and rewrites DIR's files after each."""

    def __init__(self, stage: str, out: Path, work: Path, facts: dict, limit_s: float, env: dict,
                 previous: dict | None):
        self.stage, self.out, self.work, self.facts, self.env = stage, out, work, facts, env
        self.started = time.monotonic()
        self.deadline = self.started + limit_s
        self.limit_s = limit_s
        self.results: list[dict] = []
        self.kept = [r for r in (previous or {}).get("checks", []) if r.get("kept_from")]  # earlier windows'
        self.log = open(out / "log.txt", "ab")  # appended as it runs; bytes, so that offsets are exact
        self.child: subprocess.Popen | None = None
        self.extra_facts: dict = {}

    # -- running --------------------------------------------------------------------------------------------------

    def left(self) -> float:
        return self.deadline - time.monotonic() - RESERVE_S

    def run(self, check: Check, on_tick=None) -> dict:
        """Run one check within min(its limit, the stage's time left); record it; rewrite the files."""
        if check.needs is not None and not check.needs.exists():
            return self.record(check, None, 0.0, 0, f"not run: {check.needs.name} is missing (an earlier check of "
                                                     f"{check.group!r} did not write it)")
        limit = min(check.limit_s, self.left())
        if limit < 10:
            return self.record(check, None, 0.0, 0, "not reached: the stage's time limit was spent")
        self.log.write(f"\n==== {check.name} (limit {limit:.0f} s): {shlex.join(check.command)}\n".encode())
        self.log.flush()
        started = time.monotonic()
        output_start = self.log.tell()
        self.child = subprocess.Popen(check.command, cwd=ROOT, env={**self.env, **check.env}, stdout=self.log,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        error, last_tick = None, started
        while self.child.poll() is None:
            if time.monotonic() - started > limit:
                error = f"stopped at its limit of {limit:.0f} s"
                self.stop_child(check.interrupt)
                break
            time.sleep(0.5)
            if on_tick is not None and time.monotonic() - last_tick > 20:
                on_tick()
                last_tick = time.monotonic()
        returncode = self.child.wait()
        self.child = None
        seconds = time.monotonic() - started
        self.log.flush()
        output = (self.out / "log.txt").read_bytes()[output_start:].decode("utf-8", errors="replace")
        if error is None and returncode != 0:
            error = f"exit status {returncode}: {last_line(output)}"
        elif error is None and check.expect and not re.search(check.expect, output):
            error = f"the output lacks {check.expect!r}"
        return self.record(check, error is None, seconds, limit, error, output)

    def stop_child(self, interrupt: bool) -> None:
        """SIGINT to the check's process group (a training saves and stops), SIGKILL after GRACE_S."""
        if self.child is None or self.child.poll() is not None:
            return
        if interrupt:
            os.killpg(self.child.pid, signal.SIGINT)
            try:
                self.child.wait(timeout=min(GRACE_S, max(1.0, self.deadline - time.monotonic())))
                return
            except subprocess.TimeoutExpired:
                pass
        os.killpg(self.child.pid, signal.SIGKILL)
        self.child.wait()

    def record(self, check: Check, passed: bool | None, seconds: float, limit: float, error: str | None,
               output: str = "") -> dict:
        result = {"check": check.name, "group": check.group, "passed": passed, "seconds": round(seconds, 1),
                  "limit_s": round(limit), "error": error, "facts": facts_of(check, output)}
        self.results.append(result)
        mark = {True: "PASS", False: "FAIL", None: "SKIP"}[passed]
        print(f"{mark}  {check.name}  ({seconds:.0f} s of {limit:.0f}){'' if error is None else ': ' + error}",
              flush=True)
        self.write()
        return result

    def add(self, name: str, group: str, passed: bool | None, seconds: float, error: str | None,
            facts: dict | None = None) -> None:
        """A result read from a check's own report (a test case, an ablation run), not a command of its own."""
        self.results.append({"check": name, "group": group, "passed": passed, "seconds": round(seconds, 1),
                             "limit_s": None, "error": error, "facts": facts or {}})

    # -- writing --------------------------------------------------------------------------------------------------

    def report(self) -> dict:
        results = self.kept + self.results
        return {"kit": "tools/gpu_kit.py", "stage": self.stage, **self.facts, **self.extra_facts,
                "limit_s": round(self.limit_s), "elapsed_s": round(time.monotonic() - self.started, 1),
                "passed": all(r["passed"] is not False for r in results), "checks": results}

    def write(self) -> None:
        """Rewrite summary.json, summary.txt and results.tar.gz, each atomically; flush the log."""
        self.log.flush()
        pack(self.work, self.out / "results.tar.gz")
        report = self.report()
        atomic_write_text(self.out / "summary.txt", summary_text(report))
        atomic_write_text(self.out / "summary.json", json.dumps(report, indent=1) + "\n")

    def close(self) -> None:
        if not self.log.closed:
            self.write()
            self.log.close()


def last_line(output: str) -> str:
    """The last non-empty line of a command's output: where the error usually is."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(no output)"


def facts_of(check: Check, output: str) -> dict:
    """Numbers worth keeping from a check's output: steps trained, BLEU, wall minutes, a record's path."""
    facts = {}
    for key, pattern in (("trained_steps", r"trained ([\d,]+) steps"), ("bleu", r"BLEU = ([\d.]+)"),
                         ("stopped_at_step", r"stopped by \w+ at step ([\d,]+)")):
        found = re.findall(pattern, output)
        if found:
            facts[key] = float(found[-1].replace(",", "")) if key == "bleu" else int(found[-1].replace(",", ""))
    return facts


def pack(work: Path, archive: Path) -> None:
    """Every file under work (but checkpoints and caches: they are large and cannot come back) into a tar.gz."""
    with atomic_open(archive, "wb") as file, tarfile.open(fileobj=file, mode="w:gz") as tar:
        for path in sorted(work.rglob("*")):
            if path.is_file() and not path.is_symlink() and keep_in_results(path.relative_to(work)):
                tar.add(path, arcname=str(path.relative_to(work)), recursive=False)


def keep_in_results(relative: Path) -> bool:
    """What the results keep: records, logs, notebooks, tokenizers; not weights, locks or caches."""
    parts = set(relative.parts)
    if parts & {"__pycache__", ".ipynb_checkpoints", "ablation-runs", "_build"} or relative.name.startswith("."):
        return False
    if relative.parts[0] == "book":
        return False  # the copy of the book: what it produced is copied into chapters/ (keep_chapters)
    return relative.suffix not in (".pt", ".lock", ".tmp")


def owner(relative: str) -> str | None:
    """The group of checks that wrote a file of the results; None for a file that several groups add to."""
    if relative == "tests.xml":
        return "tests"
    if relative.startswith(("multi30k/", "scoreboard/")):
        return "multi30k"
    if relative.startswith("multi30k-fp16/"):
        return "t4"
    if relative.startswith("benchmarks/"):
        return relative.split("/", 1)[1].split("-", 1)[1].removesuffix(".json")  # gpu-small-bf16.json: small-bf16
    if relative.startswith("chapters/"):
        return "chapter-9" if relative.startswith(f"chapters/{HEAVY[1]}") else "chapter-8"
    return None  # cell-times.json, the ablation records and logs


def keep_chapters(work: Path) -> None:
    """Copy the notebooks executed here (no longer the book's: their run record is new) and chapter 8's scoreboard
    record out of the copy of the book into chapters/, which the results keep."""
    kept = work / "chapters"
    for name in HEAVY:
        path = work / "book" / name
        if path.is_file() and path.read_bytes() != (ROOT / "book" / name).read_bytes():
            kept.mkdir(exist_ok=True)
            shutil.copyfile(path, kept / name)
    for record in (work / "book" / "runs").glob("*/scoreboard/*.json"):
        (kept / "scoreboard").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(record, kept / "scoreboard" / record.name)


def summary_text(report: dict) -> str:
    checks = report["checks"]
    passed = sum(r["passed"] is True for r in checks)
    skipped = sum(r["passed"] is None for r in checks)
    lines = [f"gpu_kit stage {report['stage']} on {report['gpu'] or 'the CPU (rehearsal)'}, torch {report['torch']}, "
             f"CUDA {report['cuda']}, {report['date']}; limit {report['limit_s']} s, {report['elapsed_s']:.0f} s used",
             f"{passed} of {len(checks)} checks passed ({skipped} skipped or not run)", ""]
    for result in checks:
        mark = {True: "PASS", False: "FAIL", None: "SKIP"}[result["passed"]]
        kept = " (kept from an earlier window)" if result.get("kept_from") else ""
        facts = "".join(f", {key} {value}" for key, value in result.get("facts", {}).items()
                        if not isinstance(value, (dict, list)))
        lines.append(f"{mark}  {result['check']}  ({result['seconds']:.0f} s{facts}){kept}"
                     + ("" if result["error"] is None else f"\n      {result['error']}"))
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------------------
# What the stages read back from their checks


def test_results(junit: Path, stage: Stage) -> None:
    """One result per test case of a pytest JUnit report."""
    if not junit.is_file():
        return
    for case in ElementTree.parse(junit).getroot().iter("testcase"):
        failed = case.find("failure") if case.find("failure") is not None else case.find("error")
        skipped = case.find("skipped")
        error = None if failed is None else (failed.get("message") or "failed")[:300]
        passed = failed is None
        if skipped is not None:  # bf16 on an older GPU, any gpu test in a rehearsal: neither passed nor failed
            passed, error = None, f"skipped: {skipped.get('message', '')[:300]}"
        stage.add(f"test {case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}", "tests", passed,
                  float(case.get("time", 0)), error)


def chapter_results(work: Path, stage: Stage, group: str) -> None:
    """The wall time of the chapter just run and its slowest cells, from the cell times run_heavy_chapters.py wrote."""
    path = work / "cell-times.json"
    if not path.is_file():
        return
    for chapter, timing in json.loads(path.read_text(encoding="utf-8")).items():
        if not chapter.startswith(f"0{group[-1]}_"):
            continue
        cells = sorted(timing["cells"], key=lambda cell: -cell["seconds"])
        stage.add(f"chapter {chapter}: {'ran to its end' if timing['finished'] else 'stopped part-way'}",
                  group, timing["finished"], timing["wall_seconds"] or 0.0,
                  None if timing["finished"] else f"stopped after {len(timing['cells'])} code cells",
                  {"code_cells_run": len(timing["cells"]), "slowest_cells": cells[:5]})


def ablation_results(records: Path, stage: Stage, known: set[str], earlier: set[str]) -> None:
    """One result per ablation record not yet reported (known holds the names reported; earlier, those of earlier
    windows, copied in before the sweep)."""
    for path in sorted(records.glob("*-seed*.json")):
        if path.name in known:
            continue
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # being written: the next look reads it
        known.add(path.name)
        facts = {"minutes": record.get("minutes"), "steps": record.get("steps"), "jobs": record.get("jobs"),
                 "test_bleu": (record.get("test") or {}).get("bleu"), "this_window": path.name not in earlier}
        stage.add(f"ablation {record['variant']} seed {record['seed']}", "ablations", not record["diverged"],
                  60 * (record.get("wall_minutes") or record.get("minutes") or 0.0),
                  record.get("error") if record["diverged"] else None, facts)


# ---------------------------------------------------------------------------------------------------------------
# Before a stage: the machine, the modules, the data, the output folder


def machine_facts(rehearse: bool) -> dict:
    import torch

    facts = {"rehearsal": rehearse, "torch": torch.__version__, "cuda": torch.version.cuda,
             "python": platform.python_version(), "cores": os.cpu_count(),
             "date": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    if hasattr(os, "getloadavg"):
        facts["load_average_at_start"] = round(os.getloadavg()[0], 2)
    if rehearse:
        return {**facts, "gpu": None, "gpu_count": 0, "compute_capability": None}
    if not torch.cuda.is_available():
        print("error: no CUDA GPU is visible to torch (torch.cuda.is_available() is False); gpu_kit.py runs its "
              "stages on a GPU: use --rehearse to rehearse them on the CPU", file=sys.stderr)
        raise SystemExit(2)
    major, minor = torch.cuda.get_device_capability(0)
    return {**facts, "gpu": torch.cuda.get_device_name(0), "gpu_count": torch.cuda.device_count(),
            "compute_capability": f"{major}.{minor}"}


def missing_modules(modules: tuple[str, ...], env: dict) -> list[str]:
    """The modules a child process (with env) cannot import."""
    code = ("import importlib.util, sys; print(' '.join(m for m in sys.argv[1:] "
            "if importlib.util.find_spec(m) is None))")
    done = subprocess.run([sys.executable, "-c", code, *modules], env=env, capture_output=True, text=True,
                          cwd=ROOT, check=True)
    return done.stdout.split()


def provide_modules(modules: tuple[str, ...], env: dict, wheels: Path) -> None:
    """Install the wheelhouse (into SITE, on the children's PYTHONPATH) when a module the stage needs is missing."""
    missing = missing_modules(modules, env)
    if not missing:
        return
    if not wheels.is_dir() or not list(wheels.glob("*.whl")):
        print(f"error: {', '.join(missing)} cannot be imported here and the wheelhouse {wheels} holds no wheels; "
              f"build it with python tools/gpu_wheelhouse.py on a machine with PyPI and carry .gpu "
              f"(CONTRIBUTING.md, 'The GPU plan')", file=sys.stderr)
        raise SystemExit(3)
    print(f"installing the wheelhouse ({', '.join(missing)} missing) into {SITE} ...", flush=True)
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                           "--no-cache-dir", "--upgrade", "--target", str(SITE), *map(str, sorted(wheels.glob(
                               "*.whl")))], capture_output=True, text=True)
    if done.returncode != 0:
        print(f"error: installing the wheelhouse {wheels} failed: {last_line(done.stdout + done.stderr)}",
              file=sys.stderr)
        raise SystemExit(3)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SITE), env.get("PYTHONPATH")]))
    still = missing_modules(modules, env)
    if still:
        print(f"error: the wheelhouse {wheels} lacks {', '.join(still)}; build it again with "
              f"python tools/gpu_wheelhouse.py", file=sys.stderr)
        raise SystemExit(3)


def data_folder(given: Path | None, parser: argparse.ArgumentParser) -> Path:
    """--data, else .gpu/data (the carried copy), else TRANSFORMER_LIB_DATA: a folder with multi30k/*.jsonl."""
    candidates = [given] if given else [DATA, *([Path(os.environ["TRANSFORMER_LIB_DATA"])]
                                                if os.environ.get("TRANSFORMER_LIB_DATA") else [])]
    for folder in candidates:
        if all((folder / "multi30k" / f"{split}.jsonl").is_file() for split in ("train", "validation", "test")):
            return folder.resolve()
    where = f"--data {str(given)!r}" if given else f"{DATA} (built by tools/gpu_wheelhouse.py) or TRANSFORMER_LIB_DATA"
    parser.error(f"{where} holds no multi30k/{{train,validation,test}}.jsonl; the kit reads Multi30k offline only")


def open_out(out: Path, stage: str, resume: bool, parser: argparse.ArgumentParser) -> dict | None:
    """Check --out: new or empty, or (with --resume) the results of this stage; return the earlier summary."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        parser.error(f"--out {str(out)!r} is a link or a file; give a folder for the results")
    held = sorted(p.name for p in out.iterdir()) if out.is_dir() else []
    if held and not resume:
        parser.error(f"--out {str(out)!r} already holds {', '.join(held[:4])}; give a new folder, or --resume to "
                     f"keep what passed there and run the rest (nothing is overwritten silently)")
    if not held:
        if resume:
            parser.error(f"--resume: --out {str(out)!r} holds no results to resume; leave --resume out")
        out.mkdir(parents=True, exist_ok=True)
        return None
    strangers = [name for name in held if name not in FILES]
    if strangers:
        parser.error(f"--resume: --out {str(out)!r} holds {', '.join(strangers[:4])}, which the kit did not write; "
                     f"give the folder of an earlier run of this stage")
    try:
        previous = json.loads((out / "summary.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        parser.error(f"--resume: {str(out / 'summary.json')!r} cannot be read ({error})")
    if previous.get("stage") != stage:
        parser.error(f"--resume: {str(out)!r} holds the results of stage {previous.get('stage')!r}, not {stage!r}")
    return previous


def resume_from(previous: dict, out: Path, work: Path) -> tuple[set[str], list[dict]]:
    """Unpack the earlier results into work; return the groups whose checks all passed, and those checks."""
    groups: dict[str, list[dict]] = {}
    for result in previous.get("checks", []):
        groups.setdefault(result["group"], []).append(result)
    done = {group for group, results in groups.items() if all(r["passed"] is not False for r in results)
            and not any(r["error"] and r["error"].startswith(("not reached", "not run")) for r in results)}
    archive = out / "results.tar.gz"
    if archive.is_file():  # the files of the groups kept, and those that several groups add to
        with tarfile.open(archive) as tar:
            members = [m for m in tar.getmembers() if owner(m.name) in done or owner(m.name) is None]
            tar.extractall(work, members=members, filter="data")
    kept = [{**r, "kept_from": r.get("kept_from") or previous.get("date")} for r in previous.get("checks", [])
            if r["group"] in done]
    return done, kept


# ---------------------------------------------------------------------------------------------------------------


def list_stages() -> str:
    options = argparse.Namespace(jobs=4, run_minutes=6.0)
    lines = []
    for stage, (limit, rehearse_limit, _) in STAGES.items():
        lines.append(f"stage {stage}: {limit} s on a GPU, {rehearse_limit} s in a rehearsal")
        for check in stage_checks(stage, Path("WORK"), False, options):
            lines.append(f"  {check.limit_s:4d} s  {check.name}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stage", choices=list(STAGES), help="which stage to run")
    parser.add_argument("--out", type=Path, help="folder for summary.json, summary.txt, log.txt, results.tar.gz")
    parser.add_argument("--resume", action="store_true",
                        help="--out holds this stage's earlier results: keep the groups of checks that passed, run "
                             "the others")
    parser.add_argument("--rehearse", action="store_true",
                        help="run the stage on the CPU with the tiny preset and the rehearsal's limits")
    parser.add_argument("--limit", type=float, metavar="SECONDS",
                        help=f"a shorter time limit for the stage (at most its own, never above {MAX_STAGE_S})")
    parser.add_argument("--only", nargs="+", metavar="GROUP",
                        help="run only these groups of checks (stage 1: multi30k; 1b: tests t4; 1c: small-bf16 "
                             "base-bf16 small-bf16-compile base-bf16-compile; 2: chapter-8; 2b: chapter-9; "
                             "3: ablations)")
    parser.add_argument("--data", type=Path, help="folder holding multi30k/*.jsonl (default: .gpu/data, else "
                                                  "TRANSFORMER_LIB_DATA)")
    parser.add_argument("--wheels", type=Path, default=WHEELS, help="the wheelhouse (default: %(default)s)")
    parser.add_argument("--jobs", type=int, default=4, help="stage 3: ablation runs at once (default: %(default)s)")
    parser.add_argument("--run-minutes", type=float, default=6.0,
                        help="stage 3: minutes one ablation run takes; none starts later than this before the end "
                             "(default: %(default)s)")
    parser.add_argument("--records", type=Path,
                        help="stage 3: a folder of earlier windows' ablation records, copied in first and not run "
                             "again (default: benchmarks/results/ablations/multi30k; none in a rehearsal)")
    parser.add_argument("--list", action="store_true", help="list every stage's checks and limits, and stop")
    args = parser.parse_args(argv)
    if args.list:
        print(list_stages())
        return 0
    if args.stage is None or args.out is None:
        parser.error("give --stage and --out (or --list)")
    limit, rehearse_limit, modules = STAGES[args.stage]
    stage_limit = rehearse_limit if args.rehearse else limit
    if args.limit is not None:
        if not 0 < args.limit <= stage_limit:
            parser.error(f"--limit must be a number of seconds above 0 and at most stage {args.stage}'s "
                         f"{stage_limit}, got {args.limit:g}")
        stage_limit = args.limit
    if args.jobs < 1:
        parser.error(f"--jobs must be a positive number of runs at once, got {args.jobs}")
    if not 0 < args.run_minutes <= 60:
        parser.error(f"--run-minutes must be minutes above 0 and at most 60, got {args.run_minutes:g}")
    if args.records is not None and not args.records.is_dir():
        parser.error(f"--records {str(args.records)!r} is not a folder of ablation records")
    if args.only:
        groups = [check.group for check in stage_checks(args.stage, Path("WORK"), args.rehearse, args)]
        unknown = sorted(set(args.only) - set(groups))
        if unknown:
            parser.error(f"--only {' '.join(unknown)}: stage {args.stage} has the groups "
                         f"{' '.join(dict.fromkeys(groups))}")
    facts = machine_facts(args.rehearse)  # before anything is written: no GPU, no folder
    env = {key: value for key, value in os.environ.items()
           if key not in ("TRANSFORMER_BOOK_SMOKE", "TRANSFORMER_LIB_AUTOCAST")}  # each check sets what it needs
    env.update(TRANSFORMER_LIB_DATA=str(data_folder(args.data, parser)), HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               PYTHONUNBUFFERED="1")
    # this checkout's transformer_lib for every child (the scripts in benchmarks/ and tools/, the notebooks' kernels):
    # the GPU machine has it installed nowhere
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    provide_modules(tuple(dict.fromkeys(BASE_MODULES + modules)), env, args.wheels)
    previous = open_out(args.out, args.stage, args.resume, parser)
    with tempfile.TemporaryDirectory(prefix=f"gpu_kit_{args.stage}_") as scratch:
        work = Path(scratch)
        done, kept = resume_from(previous, args.out, work) if previous else (set(), [])
        if args.stage == "3":  # ablations.py itself skips the runs whose records came back: the sweep always runs
            done, kept = set(), []
        stage = Stage(args.stage, args.out, work, facts, stage_limit, env, {"checks": kept})
        stop = signal.getsignal(signal.SIGTERM)

        def stopped(signum, frame):  # killed from outside (a device call's limit): keep what is finished
            stage.stop_child(False)
            stage.extra_facts["stopped_by"] = signal.Signals(signum).name
            stage.close()
            raise SystemExit(1)

        signal.signal(signal.SIGTERM, stopped)
        try:
            run_stage(stage, args, work, done)
        except KeyboardInterrupt:
            stage.stop_child(False)
            stage.extra_facts["stopped_by"] = "SIGINT"
        finally:
            signal.signal(signal.SIGTERM, stop)
            stage.close()
    report = stage.report()
    print("\n" + summary_text(report), end="")
    return 0 if report["passed"] else 1


def run_stage(stage: Stage, args: argparse.Namespace, work: Path, done: set[str]) -> None:
    for check in stage_checks(args.stage, work, args.rehearse, args):
        if check.group in done or (args.only and check.group not in args.only):
            continue
        if check.group == "tests":
            stage.run(check)
            test_results(work / "tests.xml", stage)
        elif args.stage in ("2", "2b"):
            stage.run(check, on_tick=lambda: (keep_chapters(work), stage.write()))
            keep_chapters(work)
            chapter_results(work, stage, check.group)
            stage.write()
        elif args.stage == "3":
            ablations = work / "ablations"
            ablations.mkdir(exist_ok=True)
            (work / "ablation-runs").mkdir(exist_ok=True)
            records = args.records if args.records is not None else (
                None if args.rehearse else ROOT / "benchmarks" / "results" / "ablations" / "multi30k")
            if records is not None and records.is_dir():
                for path in records.glob("*-seed*.json"):
                    if not (ablations / path.name).exists():
                        shutil.copy2(path, ablations / path.name)
            earlier, known = {path.name for path in ablations.glob("*-seed*.json")}, set()
            stage.extra_facts["ablation_records_before"] = len(earlier)
            ablation_results(ablations, stage, known, earlier)
            spare = stage.left() - args.run_minutes * 60  # seconds in which a run may still start and finish
            if spare <= 0:
                stage.record(check, None, 0.0, 0, f"not run: less than --run-minutes {args.run_minutes:g} is left "
                                                  f"of the stage ({stage.left():.0f} s), so no run could finish")
                continue
            check.command[check.command.index("--stop-after") + 1] = f"{max(0.01, spare / 60):.2f}"

            def tick():
                ablation_results(ablations, stage, known, earlier)
                stage.write()

            stage.run(check, on_tick=tick)
            ablation_results(ablations, stage, known, earlier)
            stage.extra_facts["ablation_records_after"] = len(known)
            stage.write()
        else:
            stage.run(check)


if __name__ == "__main__":
    sys.exit(main())
