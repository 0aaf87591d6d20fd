"""What each choice of the paper is worth: the translator trained again with one choice changed at a time.

    python benchmarks/ablations.py --out benchmarks/results/ablations/multi30k   # every variant, seeds 0 and 1
    python benchmarks/ablations.py --preset multi30k-cpu --seeds 0 --stop-after 110 \
        --out benchmarks/results/ablations/multi30k-cpu                               # the CPU sweep, in pieces
    python benchmarks/ablations.py --out DIR --variants baseline pre-norm --jobs 4  # some of them, 4 at a time
    python benchmarks/ablations.py --summary benchmarks/results/ablations/multi30k-cpu  # the tables, from the records

Every run trains a German->English translator on Multi30k with chapter 8's train_translator, from the preset
(default multi30k) with one variant's settings changed, for the preset's number of epochs: with one seed, every
variant sees the same batches in the same order and takes the same number of steps (the batches depend on the
tokenizer, the token budget and the seed, none of which a variant changes), so runs are compared at equal updates;
their minutes are recorded beside, as the price. Then, on the validation split only: greedy search with the final
weights, and beam search with each --alpha for the final weights and for the average of the last epochs the preset
keeps. The decoding with the best validation BLEU is the run's choice, and test2016 is decoded with it, and (the
rows on decoding) greedy with the final weights and beam search with the final weights at their best alpha.

Each run writes one record, DIR/<variant>-seed<S>.json, as soon as it ends (a diverged run records where and why),
and a run whose record exists is not repeated, so an interrupted sweep goes on where it stopped. A run trains in a
folder of its own under --work, <variant>-seed<S>, kept until its record is written: a run that was stopped (a
session's end, a kill) goes on from its last checkpoint when the sweep is called again, and its record lists where
it was resumed. --stop-after starts no run after that many minutes (a machine's command limit). --jobs N trains N runs at once: on a GPU a model
this small leaves most of it idle, so runs share it; on a CPU keep 1. Minutes measured while runs share a device
say so in the record (jobs).

This file runs the sweep; ablation_records.py holds the variants and the records' schema, ablation_tables.py the
statistics and tables that --summary prints.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from transformer_lib.cli import alpha_value, beam_size, non_negative_int, positive_int
from transformer_lib.files import check_replaceable
from transformer_lib.settings import CHOSEN_ON
from transformer_lib.recipe import PRESETS, resolve_settings

from ablation_records import (VARIANTS, RecordError, check_hypotheses, differs_from_sweep, log_path, merge,
                              read_record, read_records, record_path, test2016_references)
from ablation_tables import runs_table, summary_table


def _minutes_argument(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        number = math.nan
    if not 0 < number < math.inf:
        raise argparse.ArgumentTypeError(f"expected a positive number of minutes, got {value!r}")
    return number


def _folder_argument(value: str) -> str:
    if not Path(value).is_dir():
        raise argparse.ArgumentTypeError(f"expected an existing folder for the runs' folders, got {value!r}; "
                                         f"create it, or leave --work out to use {DEFAULT_WORK}")
    return value


DEFAULT_WORK = Path(tempfile.gettempdir()) / "transformer_lib_ablations"  # where runs train unless --work says
PROGRESS_FILE = "progress.json"  # beside a run's folder: what a resumed run's record needs from its earlier parts


def run_folder(args: argparse.Namespace) -> Path:
    """The folder one (variant, seed) of the sweep that writes to --out trains in, kept until its record is written,
    so that a stopped run resumes; named after --out too, so that two sweeps never share a run."""
    out = Path(args.out).resolve()
    sweep = f"{out.name}-{hashlib.sha256(str(out).encode()).hexdigest()[:8]}"
    return Path(args.work or DEFAULT_WORK) / sweep / f"{args.variant}-seed{args.seed}"


def open_log(path: Path, append: bool = False):
    """A run's log, created or emptied (or, append, added to: a resumed run keeps its earlier parts' lines); never a
    link (O_NOFOLLOW), a folder or a special file (check_replaceable)."""
    check_replaceable(path, "ablation log")
    keep = os.O_APPEND if append else os.O_TRUNC
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | keep | getattr(os, "O_NOFOLLOW", 0), 0o666)
    return os.fdopen(descriptor, "w", encoding="utf-8")


def _device_facts() -> dict:
    import torch

    import transformer_lib as tl

    device = tl.get_device()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else tl.runtime.cpu_name()
    return {"device": device.type, "device_name": name, "torch": torch.__version__, "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "python": platform.python_version()}


def run_one(args: argparse.Namespace) -> dict:
    """Train one (variant, seed), decode as the module says, and return its record (also written to --out)."""
    import transformer_lib as tl
    from transformer_lib import split_decoding, translation
    from transformer_lib.files import read_checked_json, write_checked_json
    from transformer_lib.guards import DivergedError
    from transformer_lib.runs import read_run_record

    description, changes = VARIANTS[args.variant]
    overrides = merge(json.loads(args.overrides), changes)
    settings = resolve_settings(args.preset, overrides)  # every value checked before training
    record = {
        "what": "one run of the ablations on Multi30k de->en (benchmarks/ablations.py)",
        "variant": args.variant, "description": description, "changes": changes, "seed": args.seed,
        "preset": args.preset, "overrides": overrides, "settings": settings, "train_limit": args.train_limit,
        "epochs_asked": args.epochs, "jobs": args.jobs, **_device_facts(),
        "date": datetime.date.today().isoformat(), "diverged": False,
    }
    out = Path(args.out)
    run_dir = run_folder(args)
    if args.overwrite and run_dir.exists():
        shutil.rmtree(run_dir)  # --overwrite runs it again from the start
    run_dir.mkdir(parents=True, exist_ok=True)
    checkpoint = run_dir / "run" / "checkpoint.pt"
    resumed = checkpoint.exists()
    # What the earlier parts of a resumed run measured: the load average at each epoch's end, their wall minutes,
    # and where each part began; the epoch records themselves are in the checkpoint.
    progress = read_checked_json(run_dir / PROGRESS_FILE, "a stopped run's progress", "benchmarks/ablations.py") if (
        resumed and (run_dir / PROGRESS_FILE).exists()) else {"load_average": [], "wall_minutes": 0.0, "resumed": []}
    if resumed:
        state = tl.load_checkpoint(checkpoint)["state"]
        progress["load_average"] = progress["load_average"][: state["epoch"]]  # epochs the checkpoint holds
        progress["resumed"].append({"step": state["step"], "epoch": state["epoch"],
                                    "date": datetime.date.today().isoformat(), **_device_facts()})
        print(f"resuming {run_dir / 'run'} from step {state['step']:,} (epoch {state['epoch']})", flush=True)
    curve: list[dict] = []
    started = time.perf_counter()

    def wall_minutes() -> float:
        return progress["wall_minutes"] + (time.perf_counter() - started) / 60

    def on_record(point: dict) -> None:  # the epoch records, kept for the curve and shown in the run's log
        curve.append(point)
        if hasattr(os, "getloadavg"):  # the machine's 1-minute load average: was anything else running?
            progress["load_average"].append(round(os.getloadavg()[0], 2))
        write_checked_json(run_dir / PROGRESS_FILE, {**progress, "wall_minutes": wall_minutes()}, indent=1)
        print(json.dumps(point), flush=True)

    try:
        summary = tl.train_translator(
            run_dir / "run", preset=args.preset, overrides=overrides, seed=args.seed, epochs=args.epochs,
            train_limit=args.train_limit, progress=False, on_record=on_record, resume=resumed, overwrite=not resumed)
    except DivergedError as error:  # a variant that fails to train is a result, not a crash
        record.update(diverged=True, error=str(error), curve=curve, steps=None, minutes=None,
                      wall_minutes=wall_minutes(), resumed=progress["resumed"])
        write_checked_json(record_path(out, args.variant, args.seed), record, indent=1)
        shutil.rmtree(run_dir, ignore_errors=True)
        return record
    curve = summary["validation"]  # every epoch's record, those of the run's earlier parts too
    record.update(steps=summary["steps"], epochs=summary["epochs"], curve=curve, load_average=progress["load_average"],
                  resumed=progress["resumed"],
                  minutes=curve[-1]["minutes"] if curve else None,  # training only, as the scoreboard counts
                  final_valid_loss=curve[-1]["valid_loss"] if curve else None)
    run = read_run_record(run_dir / "run" / "checkpoint.pt")["run"]  # Multi30k de-en, as the runs train
    splits = {split: split_decoding.split_pairs(run, split) for split in ("validation", "test")}
    decodes, loaded, hypotheses = [], {}, {}

    def row_of(split: str, average_last: int, beam: int, alpha: float, scores: dict) -> dict:
        row = {"split": split, "average_last": average_last, "beam_size": beam, "alpha": alpha,
               "bleu": scores["bleu"], "chrf": scores["chrf"], "bp": scores["bp"], "ratio": scores["ratio"],
               "bleu_signature": scores["bleu_signature"]}
        decodes.append(row)
        return row

    def sweep(beam: int, alphas: list[float], average_lasts: list[int] | None) -> list[dict]:
        rows = split_decoding.sweep(run_dir / "run", splits["validation"], beam_size=beam, alphas=alphas,
                                    average_lasts=average_lasts, max_len=args.max_len, progress=False,
                                    print_rows=False)
        return [row_of("validation", r["average_last"], beam, r["alpha"], r["scores"]) for r in rows]

    def decode(split: str, average_last: int, beam: int, alpha: float, keep: str | None = None) -> dict:
        if average_last not in loaded:
            loaded[average_last] = translation.load_translator(run_dir / "run", average_last=average_last)
        model, tokenizer = loaded[average_last]
        sources, references = zip(*splits[split])
        hypotheses_of, scores = split_decoding.decode_and_score(model, tokenizer, sources, references,
                                                                beam_size=beam, alpha=alpha, max_len=args.max_len,
                                                                progress=False)
        if keep is not None:  # the sentences themselves, for bootstrap intervals and paired tests later
            hypotheses[keep] = hypotheses_of
        return row_of(split, average_last, beam, alpha, scores)

    greedy = sweep(1, [0.0], [1])[0]
    record["valid_bleu_greedy"] = greedy["bleu"]
    beams = sweep(args.beam, args.alpha, None)  # the final weights and the average of every kept epoch
    chosen = max(beams, key=lambda row: row["bleu"])  # the first of equal scores, as best_decoding picks
    best_final = max((row for row in beams if row["average_last"] == 1), key=lambda row: row["bleu"])
    record["chosen"] = {"beam_size": chosen["beam_size"], "alpha": chosen["alpha"],
                        "average_last": chosen["average_last"], "valid_bleu": chosen["bleu"],
                        "chosen_on": CHOSEN_ON}
    test = decode("test", chosen["average_last"], chosen["beam_size"], chosen["alpha"], keep="chosen")
    record["test"] = {key: test[key] for key in ("bleu", "chrf", "bp", "ratio", "bleu_signature")}
    # The rows on decoding, on the test split too: greedy, and beam search without the averaged weights.
    record["test_greedy_final"] = decode("test", 1, 1, 0.0, keep="greedy_final")["bleu"]
    if chosen is best_final:
        record["test_beam_final"] = test["bleu"]
        hypotheses["beam_final"] = hypotheses["chosen"]
    else:
        record["test_beam_final"] = decode("test", 1, best_final["beam_size"], best_final["alpha"],
                                           keep="beam_final")["bleu"]
    record["decodes"] = decodes
    record["test_hypotheses"] = hypotheses  # test2016's 1,000 sentences per decoding, in the split's order
    record["wall_minutes"] = wall_minutes()
    write_checked_json(record_path(out, args.variant, args.seed), record, indent=1)
    shutil.rmtree(run_dir, ignore_errors=True)  # only now: until the record exists, the run can resume
    return record


def sweep_of_arguments(args: argparse.Namespace) -> dict:
    """What this call's sweep asks for, as sweep_of gives it for a record."""
    return {"preset": args.preset, "overrides": json.loads(args.overrides), "train_limit": args.train_limit,
            "epochs_asked": args.epochs, "beam": args.beam, "alpha": sorted(set(args.alpha))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--out", type=Path, help="folder for the records (one JSON file per run)")
    parser.add_argument("--summary", type=Path, metavar="DIR", help="print the table of the records in DIR and stop")
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--seeds", type=non_negative_int, nargs="+", default=[0, 1])
    parser.add_argument("--preset", default="multi30k", choices=sorted(PRESETS), help="default: %(default)s")
    parser.add_argument("--overrides", default="{}", help="JSON settings laid under every variant (quick trials)")
    parser.add_argument("--train-limit", type=positive_int, help="only the first N training pairs (quick trials)")
    parser.add_argument("--epochs", type=positive_int, help="train this many epochs instead of the preset's")
    parser.add_argument("--beam", type=beam_size, default=4, help="default: %(default)s")
    parser.add_argument("--alpha", type=alpha_value, nargs="+", default=[0.6, 0.8, 1.0, 1.2],
                        help="default: %(default)s, chapter 8's")
    parser.add_argument("--max-len", type=positive_int, help="at most this many tokens per translation")
    parser.add_argument("--jobs", type=positive_int, default=1, help="runs trained at once (default: %(default)s)")
    parser.add_argument("--stop-after", type=_minutes_argument, help="start no run after this many minutes")
    parser.add_argument("--overwrite", action="store_true", help="run again the runs that have a record")
    parser.add_argument("--work", type=_folder_argument,
                        help="an existing folder for the runs' folders, each kept until its record is written so "
                             "that a stopped run resumes (default: transformer_lib_ablations in the system's "
                             "temporary folder)")
    parser.add_argument("--variant", help=argparse.SUPPRESS)  # one run, in a process of its own
    parser.add_argument("--seed", type=non_negative_int, help=argparse.SUPPRESS)
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    args = parser.parse_args(argv)
    try:
        return _main(args, parser, argv)
    except (ValueError, OSError) as error:  # a bad record, bad settings, a file that cannot be written: one line
        if args.debug:
            raise
        print(f"error: {error}", file=sys.stderr)
        return 1


def _main(args: argparse.Namespace, parser: argparse.ArgumentParser, argv: list[str] | None) -> int:
    if args.summary is not None:
        import pandas as pd

        records = read_records(args.summary)
        if not records:
            raise RecordError(f"--summary {str(args.summary)!r} holds no ablation records (VARIANT-seedS.json); give "
                              f"the folder that --out wrote them to")
        references = test2016_references()
        check_hypotheses(records, references, args.summary)
        with pd.option_context("display.width", 200, "display.max_columns", None):
            print(runs_table(records, references).round(3).to_string(index=False), end="\n\n")
            print(summary_table(records).round(2).to_string(index=False))
        return 0
    if args.out is None:
        parser.error("give --out (a folder for the records), or --summary DIR")
    try:
        overrides = json.loads(args.overrides)
    except json.JSONDecodeError as error:
        parser.error(f"--overrides is not JSON ({error.msg} at column {error.colno}): {args.overrides!r}")
    if not isinstance(overrides, dict):
        parser.error(f'--overrides must be a JSON object like {{"training": {{"epochs": 2}}}}, got {args.overrides!r}')
    try:  # every run's settings checked before the first trains: a typo stops here
        resolve_settings(args.preset, overrides, "--overrides")
        for variant in args.variants:
            resolve_settings(args.preset, merge(overrides, VARIANTS[variant][1]), "--overrides")
    except (TypeError, ValueError) as error:  # whatever the settings refuse: one line that names --overrides
        raise ValueError(str(error) if str(error).startswith("--overrides") else f"--overrides: {error}") from error
    if args.out.is_symlink() or (args.out.exists() and not args.out.is_dir()):
        parser.error(f"--out {str(args.out)!r} is a link or a file; give a folder for the records")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.variant is not None:
        record = run_one(args)
        print(f"{args.variant} seed {args.seed}: " + ("diverged" if record["diverged"] else
              f"{record['steps']} steps, {record['minutes']:.1f} min, test BLEU {record['test']['bleu']:.2f}"))
        return 0
    todo, asked = [], set()
    for seed in dict.fromkeys(args.seeds):
        for variant in dict.fromkeys(args.variants):
            path = record_path(args.out, variant, seed)
            asked.add(path)
            if args.overwrite or not (path.exists() or path.is_symlink()):
                todo.append((variant, seed))
    # Every record already in the folder, not only this call's variants and seeds, is of this sweep, or nothing
    # trains: a new seed or variant run with other settings would otherwise land among the folder's records, and
    # the tables and the appendix would then refuse the folder (read_records). Those --overwrite runs again are not.
    replaced = {record_path(args.out, variant, seed) for variant, seed in todo}
    kept = []
    for path in sorted(args.out.glob("*-seed*.json")):
        if path in replaced:
            continue
        kept.append(read_record(path))  # a corrupt record stops the sweep, named
        other = differs_from_sweep(kept[-1], sweep_of_arguments(args))
        if other is not None:
            advice = ("--overwrite to run it again with this sweep's settings" if path in asked else
                      "the folder's own settings (the record holds them)")
            raise RecordError(f"ablation record {str(path)!r} in --out {str(args.out)!r} is of another sweep: "
                              f"{other}; nothing was trained: give another --out, or run with {advice}")
    if kept:
        check_hypotheses(kept, test2016_references(), args.out)
    logs = args.out / "logs"
    if logs.is_symlink() or (logs.exists() and not logs.is_dir()):
        raise ValueError(f"{str(logs)!r} is a link or a file, not the folder of the runs' logs; nothing is written "
                         f"through it: remove it, or give another --out")
    logs.mkdir(exist_ok=True)
    for variant, seed in todo:  # no log is written through a link, nor over a folder or a FIFO: checked before any run
        check_replaceable(log_path(args.out, variant, seed), "ablation log")
    print(f"{len(todo)} runs to do, {args.jobs} at a time; records in {args.out}", flush=True)
    started, running, failed = time.perf_counter(), [], []
    env = dict(os.environ)
    if args.jobs > 1 and "OMP_NUM_THREADS" not in env:  # runs that share a CPU share its cores
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // args.jobs))
    passed = list(argv if argv is not None else sys.argv[1:])  # the workers' options are this call's
    while todo or running:
        while todo and len(running) < args.jobs and not (
                args.stop_after is not None and (time.perf_counter() - started) / 60 > args.stop_after):
            variant, seed = todo.pop(0)
            folder = run_folder(argparse.Namespace(**{**vars(args), "variant": variant, "seed": seed}))
            resuming = not args.overwrite and (folder / "run" / "checkpoint.pt").exists()
            log = open_log(log_path(args.out, variant, seed), append=resuming)
            command = [sys.executable, __file__, *passed, "--variant", variant, "--seed", str(seed)]
            running.append((variant, seed, log, subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                                                 env=env)))
        if args.stop_after is not None and todo and not running:
            print(f"--stop-after {args.stop_after:g} minutes: {len(todo)} runs left for the next call")
            break
        time.sleep(1)
        for item in list(running):
            variant, seed, log, process = item
            if process.poll() is not None:
                running.remove(item)
                log.close()
                tail = log_path(args.out, variant, seed).read_text(encoding="utf-8").strip()
                print(tail.splitlines()[-1] if tail else f"{variant} seed {seed}: no output", flush=True)
                if process.returncode != 0:
                    failed.append(f"{variant} seed {seed}")
    if failed:
        print(f"failed (see {args.out / 'logs'}): {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
