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
and a run whose record exists is not repeated, so an interrupted sweep goes on where it stopped; --stop-after
starts no run after that many minutes (a machine's command limit). --jobs N trains N runs at once: on a GPU a model
this small leaves most of it idle, so runs share it; on a CPU keep 1. Minutes measured while runs share a device
say so in the record (jobs).
"""

from __future__ import annotations

import argparse
import datetime
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
from transformer_lib.files import check_replaceable, read_checked_json
from transformer_lib.settings import CHOSEN_ON, RULES, is_count, is_minutes, is_number, is_score
from transformer_lib.recipe import PRESETS, resolve_settings
from transformer_lib.scoring import bootstrap_interval, paired_bootstrap

# name -> (what it changes, settings overrides). The baseline is the preset as chapter 8 trains it: post-norm with
# warm-up, label smoothing 0.1, dropout 0.1, sinusoidal positions, one embedding matrix shared by source and target,
# scaled by sqrt(d_model) and reused by the output projection.
VARIANTS: dict[str, tuple[str, dict]] = {
    "baseline": ("the preset as chapter 8 trains it", {}),
    "pre-norm": ("LayerNorm before each sublayer instead of after the residual sum (chapter 6)",
                 {"model": {"norm_first": True}}),
    "no-warmup": ("post-norm without warm-up: warmup=1, the schedule's inverse square-root decay from the first step",
                  {"training": {"warmup": 1}}),
    "pre-norm-no-warmup": ("pre-norm without warm-up (warmup=1)",
                           {"model": {"norm_first": True}, "training": {"warmup": 1}}),
    "no-embedding-scale": ("embeddings not multiplied by sqrt(d_model) (chapter 1)",
                           {"model": {"scale_embeddings": False}}),
    "untied-output": ("an output projection of its own instead of the embedding matrix (chapter 6)",
                      {"model": {"tie_embeddings": False}}),
    "separate-embeddings": ("one embedding for the source and another for the target (each still of the joint "
                            "vocabulary; the target's reused by the output projection)",
                            {"model": {"share_embeddings": False}}),
    "no-label-smoothing": ("label smoothing 0 instead of 0.1 (chapter 7)", {"training": {"label_smoothing": 0.0}}),
    "dropout-0.3": ("dropout 0.3 instead of 0.1", {"model": {"dropout": 0.3}}),
    "learned-positions": ("learned positional embeddings instead of sinusoids (chapter 2)",
                          {"model": {"positional": "learned"}}),
}


def merge(overrides: dict, extra: dict) -> dict:
    """overrides with extra's parts laid over them, key by key."""
    for part, values in {**overrides, **extra}.items():
        if not isinstance(values, dict):
            raise ValueError(f'--overrides: {part!r} must be an object of settings like {{"epochs": 2}}, got '
                             f"{json.dumps(values)[:60]}")
    merged = {part: dict(values) for part, values in overrides.items()}
    for part, values in extra.items():
        merged.setdefault(part, {}).update(values)
    return merged


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
        raise argparse.ArgumentTypeError(f"expected an existing folder for the runs' temporary folders, got {value!r}; "
                                         f"create it, or leave --work out to use the system's")
    return value


def record_path(out: Path, variant: str, seed: int) -> Path:
    return out / f"{variant}-seed{seed}.json"


def log_path(out: Path, variant: str, seed: int) -> Path:
    return out / "logs" / f"{variant}-seed{seed}.log"


def open_log(path: Path):
    """A run's log, created or emptied; never a link (O_NOFOLLOW), a folder or a special file (check_replaceable)."""
    check_replaceable(path, "ablation log")
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o666)
    return os.fdopen(descriptor, "w", encoding="utf-8")


def test2016_references() -> list[str]:
    """test2016's English references, as the runs decoded it."""
    from transformer_lib.data import load_pairs

    return [en for _, en in load_pairs("multi30k", "test", "de", "en")]


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
    from transformer_lib.files import write_checked_json
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
    run_dir = Path(tempfile.mkdtemp(prefix=f"ablation_{args.variant}_{args.seed}_", dir=args.work))
    curve: list[dict] = []

    load: list[float] = []  # the machine's 1-minute load average at each epoch's end: was anything else running?

    def on_record(point: dict) -> None:  # the epoch records, kept for the curve and shown in the run's log
        curve.append(point)
        if hasattr(os, "getloadavg"):
            load.append(round(os.getloadavg()[0], 2))
        print(json.dumps(point), flush=True)

    started = time.perf_counter()
    try:
        try:
            summary = tl.train_translator(
                run_dir / "run", preset=args.preset, overrides=overrides, seed=args.seed, epochs=args.epochs,
                train_limit=args.train_limit, progress=False, on_record=on_record)
        except DivergedError as error:  # a variant that fails to train is a result, not a crash
            record.update(diverged=True, error=str(error), curve=curve, steps=None, minutes=None,
                          wall_minutes=(time.perf_counter() - started) / 60)
            write_checked_json(record_path(out, args.variant, args.seed), record, indent=1)
            return record
        record.update(steps=summary["steps"], epochs=summary["epochs"], curve=curve, load_average=load,
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
        record["wall_minutes"] = (time.perf_counter() - started) / 60
        write_checked_json(record_path(out, args.variant, args.seed), record, indent=1)
        return record
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


RECORD_KEYS = ("what", "variant", "description", "changes", "seed", "preset", "overrides", "settings", "train_limit",
               "epochs_asked", "jobs", "device", "device_name", "torch", "cores", "torch_threads", "python", "date",
               "diverged", "curve", "steps", "minutes", "wall_minutes")
TRAINED_KEYS = ("epochs", "final_valid_loss", "valid_bleu_greedy", "chosen", "test", "test_greedy_final",
                "test_beam_final", "decodes", "test_hypotheses")


class RecordError(ValueError):
    """A record file that is not a complete record of benchmarks/ablations.py, or not of this sweep."""


def _text(value) -> bool:
    return isinstance(value, str) and value != ""


def _date(value) -> bool:
    try:
        datetime.date.fromisoformat(value)
    except (TypeError, ValueError):
        return False
    return True


def _optional(test):
    return lambda value: value is None or test(value)


def _at_least_0(value) -> bool:
    return is_number(value) and value >= 0


def _point(point) -> bool:  # one epoch of the curve, as validation.validation_hook records it
    return (isinstance(point, dict) and is_count(point.get("epoch")) and is_count(point.get("step"), 0)
            and _at_least_0(point.get("minutes")) and all(_optional(is_number)(point.get(key))
                                                          for key in ("train_loss", "valid_loss"))
            and _optional(is_score)(point.get("valid_bleu")))


def _scores(row) -> bool:  # corpus_scores' numbers, as the records keep them
    return (isinstance(row, dict) and is_score(row.get("bleu")) and is_score(row.get("chrf"))
            and _at_least_0(row.get("bp")) and _at_least_0(row.get("ratio")) and _text(row.get("bleu_signature")))


def _decoding(row) -> bool:  # beam_size, alpha and average_last, by the rules of decoding.json
    return isinstance(row, dict) and all(test(row.get(key)) for key, (test, _) in RULES["decoding"].items())


def _hypotheses(kept) -> bool:
    return (isinstance(kept, dict) and sorted(kept) == ["beam_final", "chosen", "greedy_final"]
            and all(isinstance(h, list) and all(isinstance(t, str) for t in h) for h in kept.values())
            and len({len(h) for h in kept.values()}) == 1)


# key -> (test, what is expected): every field that the sweep, the tables and the appendix read, of every record ...
FIELDS = {
    "what": (_text, "a sentence"), "description": (_text, "a sentence"), "preset": (_text, "a preset's name"),
    "overrides": (lambda v: isinstance(v, dict) and all(isinstance(part, dict) for part in v.values()),
                  "an object of settings parts"),
    "settings": (lambda v: isinstance(v, dict) and all(isinstance(v.get(part), dict) for part in ("model", "training"))
                 and is_count(v["training"].get("epochs")), "the run's settings, model and training with its epochs"),
    "train_limit": (_optional(is_count), "null or a positive count"),
    "epochs_asked": (_optional(is_count), "null or a positive count"), "jobs": (is_count, "a positive count"),
    "device": (_text, "a device's name"), "device_name": (_text, "a device's name"), "torch": (_text, "a version"),
    "python": (_text, "a version"), "cores": (_optional(is_count), "null or a positive count"),
    "torch_threads": (is_count, "a positive count"), "date": (_date, "a date, YYYY-MM-DD"),
    "curve": (lambda v: isinstance(v, list) and all(_point(p) for p in v),
              "a list of epoch records (epoch, step, minutes, losses, validation BLEU)"),
    "wall_minutes": (is_minutes, "a number of minutes up to a year"),
}
# ... and of a run that trained to its end
TRAINED_FIELDS = {
    "steps": (is_count, "a positive count"), "epochs": (is_count, "a positive count"),
    "minutes": (is_minutes, "a number of minutes up to a year"), "final_valid_loss": (_at_least_0, "a number >= 0"),
    "load_average": (_optional(lambda v: isinstance(v, list) and all(_at_least_0(x) for x in v)),
                     "a list of load averages, numbers >= 0"),  # missing in the first records
    **{key: (is_score, "a number from 0 to 100")
       for key in ("valid_bleu_greedy", "test_greedy_final", "test_beam_final")},
    "test": (_scores, "the scores bleu and chrf (numbers from 0 to 100), bp and ratio (numbers >= 0), bleu_signature"),
    "chosen": (lambda v: _decoding(v) and is_score(v.get("valid_bleu")) and v.get("chosen_on") == CHOSEN_ON,
               f"a decoding chosen on the validation split: beam_size, alpha, average_last, valid_bleu, chosen_on "
               f"{CHOSEN_ON!r}"),
    "decodes": (lambda v: isinstance(v, list) and v != [] and all(
        _decoding(row) and _scores(row) and row.get("split") in ("validation", "test") for row in v),
        "a list of decodings: split, beam_size, alpha, average_last and their scores"),
    "test_hypotheses": (_hypotheses, "the test hypotheses of its three decodings, chosen, greedy_final and beam_final "
                                     "(lists of sentences, of one length)"),
}


def check_record(record, path: Path) -> dict:
    """record as run_one writes it: complete, every field of the right type and range, its file named after it, its
    variant's changes those of VARIANTS; else a RecordError naming the file and what is wrong."""
    def wrong(problem: str) -> RecordError:
        return RecordError(f"ablation record {str(path)!r} {problem}; remove it (or run with --overwrite) to run it "
                           f"again")

    if not isinstance(record, dict):
        raise wrong(f"holds a JSON {type(record).__name__}, not a record")
    missing = [key for key in RECORD_KEYS + (() if record.get("diverged") else TRAINED_KEYS) if key not in record]
    if missing:
        raise wrong(f"lacks {', '.join(missing)}: it is not a complete record")
    if not isinstance(record["variant"], str) or record["variant"] not in VARIANTS or not is_count(record["seed"], 0):
        raise wrong(f"names variant {record['variant']!r} and seed {record['seed']!r}; expected one of VARIANTS and "
                    f"a seed >= 0")
    if path.name != record_path(path.parent, record["variant"], record["seed"]).name:
        raise wrong(f"holds the record of {record['variant']} seed {record['seed']}, which belongs in "
                    f"{record_path(path.parent, record['variant'], record['seed']).name}")
    if record["changes"] != VARIANTS[record["variant"]][1]:
        raise wrong(f"changes {record['changes']} where {record['variant']} now changes "
                    f"{VARIANTS[record['variant']][1]}")
    if not isinstance(record["diverged"], bool):
        raise wrong(f"has diverged {json.dumps(record['diverged'])[:60]}, not true or false")
    for key, (test, expected) in {**FIELDS, **({} if record["diverged"] else TRAINED_FIELDS)}.items():
        if not test(record.get(key)):
            raise wrong(f"has {key} {json.dumps(record.get(key))[:60]}, not {expected}")
    if record["diverged"]:
        if not _text(record.get("error")):
            raise wrong("records a diverged run without its error")
        return record
    epochs = record["settings"]["training"]["epochs"] if record["epochs_asked"] is None else record["epochs_asked"]
    if record["epochs"] != epochs or len(record["curve"]) != epochs:
        raise wrong(f"records {record['epochs']} epochs and {len(record['curve'])} epoch records where its run asked "
                    f"for {epochs}: a run cut short")
    if record["chosen"]["average_last"] > epochs:
        raise wrong(f"chose the average of the last {record['chosen']['average_last']} epochs of a run of {epochs}")
    return record


def read_record(path: Path) -> dict:
    """The checked record in path; a RecordError naming the file when it is not valid JSON or not a record."""
    if path.is_symlink() or not path.is_file():
        raise RecordError(f"ablation record {str(path)!r} is a link or not a regular file; the records are the files "
                          f"run_one writes")
    try:
        record = read_checked_json(path, "ablation record", "run_one (run it again with --overwrite)")
    except ValueError as error:  # not UTF-8, not JSON, or failing its checksum: named, with where
        raise RecordError(str(error)) from None
    return check_record(record, path)


def read_records(folder: Path) -> list[dict]:
    """Every record in folder, checked (read_record), and all of one sweep (differs_from_sweep)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise RecordError(f"--summary {str(folder)!r} is not a folder of ablation records")
    records = [read_record(path) for path in sorted(folder.glob("*-seed*.json"))]
    if records:  # compared with a trained baseline where there is one: its overrides are the sweep's own
        first = min(records, key=lambda r: (r["diverged"], r["variant"] != "baseline"))
        name, sweep = record_path(folder, first["variant"], first["seed"]), sweep_of(first)
        for record in records:
            other = differs_from_sweep(record, sweep, name.name)
            if other is not None:
                raise RecordError(f"ablation records {str(name)!r} and "
                                  f"{str(record_path(folder, record['variant'], record['seed']))!r} are of two "
                                  f"sweeps: the second has {other}; keep each sweep's records in a folder of its own")
    return records


def check_hypotheses(records: list[dict], references: list[str], folder: Path) -> None:
    """Refuse, naming its file, a trained record whose test hypotheses are not one per sentence of references."""
    for record in (r for r in records if not r["diverged"]):
        count = len(record["test_hypotheses"]["chosen"])
        if count != len(references):
            raise RecordError(f"ablation record {str(record_path(Path(folder), record['variant'], record['seed']))!r} "
                              f"holds {count} test hypotheses per decoding where test2016 has {len(references)} "
                              f"sentences: it was decoded from another test set; remove it (or run with --overwrite) "
                              f"to run it again")


def sweep_of(record: dict) -> dict:
    """What the sweep of a record asked for: preset, the overrides under every variant (the record's own without
    its variant's changes), data, length and, for a trained run, the decoding sweep (beam and alphas)."""
    changes = VARIANTS[record["variant"]][1]
    overrides = {part: {key: value for key, value in values.items() if key not in changes.get(part, {})}
                 for part, values in record["overrides"].items()}
    trained = not record["diverged"]
    return {"preset": record["preset"], "train_limit": record["train_limit"], "epochs_asked": record["epochs_asked"],
            "overrides": {part: values for part, values in overrides.items() if values or part not in changes},
            "beam": record["chosen"]["beam_size"] if trained else None, "alpha": alphas_of(record) if trained else None}


def sweep_of_arguments(args: argparse.Namespace) -> dict:
    """What this call's sweep asks for, as sweep_of gives it for a record."""
    return {"preset": args.preset, "overrides": json.loads(args.overrides), "train_limit": args.train_limit,
            "epochs_asked": args.epochs, "beam": args.beam, "alpha": sorted(set(args.alpha))}


def alphas_of(record: dict) -> list[float]:
    """The alphas of a trained record's beam search on the validation split."""
    return sorted({row["alpha"] for row in record["decodes"] if row["split"] == "validation" and row["beam_size"] > 1})


def differs_from_sweep(record: dict, sweep: dict, whose: str = "this sweep") -> str | None:
    """What makes a record another sweep's (its preset, settings, data, length or decoding sweep), or None."""
    asked = {"preset": sweep["preset"], "overrides": merge(sweep["overrides"], VARIANTS[record["variant"]][1]),
             "train_limit": sweep["train_limit"], "epochs_asked": sweep["epochs_asked"]}
    for key, value in asked.items():
        if record[key] != value:
            return f"{key} {record[key]!r} where {whose} has {value!r}"
    if not record["diverged"] and sweep["beam"] is not None:
        if alphas_of(record) != sweep["alpha"] or record["chosen"]["beam_size"] != sweep["beam"]:
            return (f"a decoding sweep of beam {record['chosen']['beam_size']} and alpha {alphas_of(record)} where "
                    f"{whose} has beam {sweep['beam']} and alpha {sweep['alpha']}")
    return None


def baselines(records: list[dict]) -> dict[int, dict]:
    """The baseline's runs that trained to the end, by seed: what every other run of the same seed is measured
    against (same initial weights and batches)."""
    return {r["seed"]: r for r in records if r["variant"] == "baseline" and not r["diverged"]}


def significance(records: list[dict], references: list[str], n_samples: int = 1000) -> dict[tuple[str, int], dict]:
    """sacreBLEU's own statistics of each trained run's test2016 BLEU (the decoding it chose on validation), keyed by
    (variant, seed): "mean" and "ci", the bootstrap estimate and the half-width of its 95% interval
    (scoring.bootstrap_interval, n_samples resamples of the test sentences), and "p_value", the paired bootstrap test
    (scoring.paired_bootstrap, sacreBLEU's paired_bs) of the run against the baseline of the same seed, which sees
    the same batches; None for the baseline itself and for a seed without a baseline. sacreBLEU fixes its random
    seed (SACREBLEU_SEED, 12345 by default), so the numbers repeat and every run is resampled alike."""
    trained = [r for r in records if not r["diverged"]]
    by_seed = baselines(records)
    stats = {}
    for run in trained:
        hypotheses = run["test_hypotheses"]["chosen"]
        interval = bootstrap_interval(hypotheses, references, n_bootstrap=n_samples)
        baseline = by_seed.get(run["seed"])
        paired = None if baseline is None or baseline is run else paired_bootstrap(
            baseline["test_hypotheses"]["chosen"], hypotheses, references, n_bootstrap=n_samples)
        stats[run["variant"], run["seed"]] = {"mean": interval["mean"], "ci": interval["ci"],
                                              "p_value": None if paired is None else paired["p_value"]}
    return stats


def runs_table(records: list[dict], references: list[str]):
    """A pandas DataFrame, one row per run (variants in VARIANTS' order, then seeds): its test BLEU with sacreBLEU's
    bootstrap mean and 95% interval, its difference from the baseline of the same seed with the paired test's
    p-value, its validation BLEU (the decoding it chose), training minutes and steps, the mean load average of the
    machine while it trained (above the cores' count: other work shared them), and where a diverged run stopped."""
    import pandas as pd

    stats = significance(records, references)
    baseline = baselines(records)
    rows = []
    for variant in VARIANTS:
        for run in sorted((r for r in records if r["variant"] == variant), key=lambda r: r["seed"]):
            row = {"variant": variant, "seed": run["seed"], "diverged": run["error"] if run["diverged"] else ""}
            if not run["diverged"]:
                stat, base, load = stats[variant, run["seed"]], baseline.get(run["seed"]), mean_load(run)
                row.update({
                    "test BLEU": run["test"]["bleu"], "bootstrap mean": stat["mean"], "95% CI ±": stat["ci"],
                    "vs baseline": run["test"]["bleu"] - base["test"]["bleu"] if base else math.nan,
                    "paired p": math.nan if stat["p_value"] is None else stat["p_value"],
                    "validation BLEU": run["chosen"]["valid_bleu"], "minutes": run["minutes"], "steps": run["steps"],
                    "load": math.nan if load is None else load,
                })
            rows.append(row)
    return pd.DataFrame(rows)


SHARED_LOAD = 0.5  # a mean load average more than this above the threads a run trains with: other work shared the CPU


def mean_load(record: dict) -> float | None:
    """The machine's mean 1-minute load average over a run's epochs; None for the first records, which have none."""
    loads = record.get("load_average")
    return sum(loads) / len(loads) if loads else None


SLOW_EPOCH = 1.5  # an epoch this many times the run's median epoch: other work held a third of the CPU through it


def slowest_epoch(record: dict) -> float | None:
    """The run's slowest epoch over its median epoch, in training minutes. Under one seed every epoch has the same
    batches' worth of steps, so on any machine a run alone reads close to 1; None with fewer than three epochs."""
    ends = [0.0] + [point["minutes"] for point in record.get("curve") or []]
    epochs = sorted(b - a for a, b in zip(ends, ends[1:]))
    if len(epochs) < 3:
        return None
    return epochs[-1] / epochs[len(epochs) // 2]


def had_the_machine(record: dict) -> bool:
    """Whether a run's training minutes are the recipe's own. On a GPU, yes: the CPU's load does not time it. On the
    CPU, when two things hold. The machine's mean 1-minute load average while it trained stayed within SHARED_LOAD
    of the threads its training keeps busy (torch_threads for each of its jobs): a run alone on 2 threads reads 2.0
    to 2.1, and half a core more, on average over the run, is other work. And no epoch took SLOW_EPOCH times the
    run's median epoch: the load is sampled once an epoch, and a burst of other work between two samples shows only in
    the epoch's minutes. A record without loads (the first ones) cannot tell: no."""
    if record["device"] != "cpu":
        return True
    load, slowest = mean_load(record), slowest_epoch(record)
    return (load is not None and load <= record["torch_threads"] * record["jobs"] + SHARED_LOAD
            and (slowest is None or slowest < SLOW_EPOCH))


def summary_table(records: list[dict]):
    """A pandas DataFrame, one row per variant in VARIANTS' order: runs, mean and spread (max - min) over seeds. Its
    "minutes" are the mean over the runs that had the machine to themselves (had_the_machine); "runs alone" counts
    them."""
    import pandas as pd

    rows = []
    for variant, (description, _) in VARIANTS.items():
        runs = [r for r in records if r["variant"] == variant]
        if not runs:
            continue
        trained = [r for r in runs if not r["diverged"]]
        row = {"variant": variant, "what changes": description, "seeds": len(runs),
               "diverged": len(runs) - len(trained)}
        alone = [r for r in trained if had_the_machine(r)]
        row["runs alone"] = len(alone)
        for key, label in (("test", "test BLEU"), ("valid_bleu_greedy", "validation BLEU (greedy)"),
                           ("final_valid_loss", "validation loss"), ("minutes", "minutes")):
            values = [r[key]["bleu"] if key == "test" else r[key] for r in (alone if key == "minutes" else trained)]
            values = [v for v in values if v is not None]
            row[label] = sum(values) / len(values) if values else math.nan
            row[f"{label} spread"] = max(values) - min(values) if len(values) > 1 else math.nan
        steps = {r["steps"] for r in trained}
        row["steps"] = steps.pop() if len(steps) == 1 else math.nan  # equal across seeds only by chance
        rows.append(row)
    baseline = list(baselines(records).values())
    for label, pick in (("greedy search, final weights", lambda r: r["test_greedy_final"]),
                        ("beam search, final weights", lambda r: r["test_beam_final"]),
                        ("beam search, chosen weights", lambda r: r["test"]["bleu"])):
        if baseline:
            values = [pick(r) for r in baseline]
            rows.append({"variant": f"baseline decoded by {label}", "what changes": "decoding only",
                         "seeds": len(baseline), "diverged": 0, "test BLEU": sum(values) / len(values),
                         "test BLEU spread": max(values) - min(values) if len(values) > 1 else math.nan})
    return pd.DataFrame(rows)


def plot_curves(records: list[dict], ax=None):
    """Greedy validation BLEU against steps, one line per run (its epochs that measured BLEU), a colour per variant,
    in VARIANTS' order; a diverged run is drawn up to where it stopped, dashed. Returns the axes."""
    import matplotlib.pyplot as plt

    if ax is None:
        ax = plt.subplots(figsize=(8, 4.5))[1]
    colours = plt.get_cmap("tab10")
    for number, variant in enumerate(VARIANTS):
        runs = sorted((r for r in records if r["variant"] == variant), key=lambda r: r["seed"])
        for index, run in enumerate(runs):
            points = [(p["step"], p["valid_bleu"]) for p in run["curve"] if p.get("valid_bleu") is not None]
            if not points:
                continue
            steps, bleu = zip(*points)
            ax.plot(steps, bleu, color=colours(number % 10), linestyle="--" if run["diverged"] else "-",
                    linewidth=1.2, label=variant if index == 0 else None)
    ax.set_xlabel("training step")
    ax.set_ylabel("validation BLEU (greedy)")
    ax.legend(fontsize="small", ncol=2)
    return ax


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
                        help="an existing folder for the runs' temporary folders (default: the system's)")
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
    todo, done = [], []
    for seed in dict.fromkeys(args.seeds):
        for variant in dict.fromkeys(args.variants):
            path = record_path(args.out, variant, seed)
            if args.overwrite or not (path.exists() or path.is_symlink()):
                todo.append((variant, seed))
                continue
            done.append(read_record(path))  # a corrupt record stops the sweep, named
            other = differs_from_sweep(done[-1], sweep_of_arguments(args))
            if other is not None:
                raise RecordError(f"ablation record {str(path)!r} is of another sweep: {other}; give another --out, "
                                  f"or --overwrite to run it again with this sweep's settings")
    if done:
        check_hypotheses(done, test2016_references(), args.out)
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
            log = open_log(log_path(args.out, variant, seed))
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
