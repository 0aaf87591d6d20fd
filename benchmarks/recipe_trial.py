"""One recipe trial for the CPU translator, measured on the validation split only (never the test set).

Trains a Multi30k German->English translator with transformer_lib.train_translator (chapter 8's code) for a preset
with optional overrides, keeps the weights at the end of every epoch, and measures on the validation split:
greedy BLEU after every epoch (the curve), then, for the final weights and for the average of the last N epochs'
weights (checkpoint averaging), beam-search BLEU with each length-penalty exponent asked for, with sacreBLEU's
brevity penalty and length ratio. The report grows as the run goes, so an interrupted trial still leaves its points.

    python benchmarks/recipe_trial.py --preset multi30k-cpu --epochs 10 --average 2 3 4 --alpha 0.6 1.0 \
        --json benchmarks/results/recipe/multi30k-cpu-10-epochs.json

It is a measurement, run by hand on an otherwise idle machine (minutes depend on the machine and its load, which the
report records); the recipe for issue 22 is chosen from such reports.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

WHAT = "a recipe trial on the validation split of Multi30k de->en (test set never decoded)"
WRITER = "benchmarks/recipe_trial.py"


def is_report(path: Path) -> bool:
    """Whether path holds a report of this script (checksum intact), which --json may replace."""
    from transformer_lib.files import read_checked_json

    try:
        return str(read_checked_json(path, "recipe report", WRITER).get("what")).startswith(WHAT)  # or annotated
    except (ValueError, OSError):
        return False


def read_overrides(args: argparse.Namespace) -> dict:
    """The settings overrides of --config, checked against the preset; one line naming the file otherwise."""
    from transformer_lib import recipe
    from transformer_lib.files import read_settings_file

    if args.config is None:
        return {}
    if not args.config.is_file():
        raise FileNotFoundError(f"--config {str(args.config)!r} does not exist or is not a file; give a JSON file of "
                                f'settings overrides like {{"training": {{"epochs": 5}}}}, or leave --config out')
    overrides = read_settings_file(args.config)
    source = f"--config {str(args.config)!r}"
    try:
        recipe.resolve_settings(args.preset, overrides, source)
    except (TypeError, ValueError) as error:  # whatever the settings refuse: one line that names the file
        raise ValueError(str(error) if str(error).startswith(source) else f"{source}: {error}") from error
    return overrides


def run(args: argparse.Namespace, overrides: dict) -> dict:
    import torch

    import transformer_lib as tl
    from transformer_lib import recipe, split_decoding, translation
    from transformer_lib.data import load_pairs
    from transformer_lib.files import write_checked_json

    # BLEU after every epoch (the curve), and the weights of as many last epochs as the largest average needs
    training = {**overrides.get("training", {}), "bleu_every": 1, "keep_checkpoints": max([1, *args.average])}
    if args.epochs is not None:  # --epochs is the run's length, so the settings the report records say so too
        training["epochs"] = args.epochs
    overrides = {"model": dict(overrides.get("model", {})), "training": training}
    settings = recipe.resolve_settings(args.preset, overrides)
    report = {
        "what": WHAT, "preset": args.preset, "overrides": overrides,
        "settings": settings, "epochs": settings["training"]["epochs"],
        "device": str(tl.get_device()), "cpu": tl.runtime.cpu_name(), "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(), "torch": torch.__version__, "python": platform.python_version(),
        "date": datetime.date.today().isoformat(), "load_average_at_start": os.getloadavg(), "points": [],
        "decodes": [],
    }
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        write_checked_json(out, report, indent=1)

    def on_record(record: dict) -> None:
        report["points"].append(record)
        report["load_average_now"] = os.getloadavg()
        save()

    save()
    run_dir = Path(tempfile.mkdtemp(prefix="recipe_trial_"))
    try:
        started = time.perf_counter()
        summary = tl.train_translator(run_dir / "run", preset=args.preset, overrides=overrides, on_record=on_record,
                                      progress=not args.no_progress)  # as many epochs as the settings say
        report["wall_minutes_training_and_validation"] = (time.perf_counter() - started) / 60
        report["training_minutes"] = report["points"][-1]["minutes"]
        report["steps"] = summary["steps"]
        pairs = load_pairs("multi30k", "validation", "de", "en")
        kept = len(translation.epoch_weights(run_dir / "run"))
        averages = [n for n in [1, *args.average] if n <= kept or n == 1]  # a trial shorter than an average skips it
        for n in averages:
            decode_started = time.perf_counter()
            rows = split_decoding.sweep(run_dir / "run", pairs, beam_size=args.beam, alphas=args.alpha,
                                        average_lasts=[n], device="cpu", progress=False, print_rows=False)
            minutes = (time.perf_counter() - decode_started) / 60 / len(rows)  # the mean of this weights' decodings
            for row in rows:
                scores = row["scores"]
                report["decodes"].append({
                    "weights": "final" if n == 1 else f"average of the last {n} epochs", "beam": args.beam,
                    "alpha": row["alpha"], "valid_bleu": scores["bleu"], "valid_chrf": scores["chrf"],
                    "brevity_penalty": scores["bp"], "length_ratio": scores["ratio"],
                    "bleu_signature": scores["bleu_signature"], "decode_minutes": minutes})
            report["load_average_now"] = os.getloadavg()
            save()
        report["load_average_at_end"] = os.getloadavg()
        save()
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    return report


def main(argv: list[str] | None = None) -> int:
    from transformer_lib.cli import alpha_value, beam_size, positive_int
    from transformer_lib.recipe import PRESETS
    from transformer_lib.runs import check_output_file

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="multi30k-cpu", choices=sorted(PRESETS), help="default: %(default)s")
    parser.add_argument("--config", type=Path, help='JSON overrides, as for the command line: {"model": {...}, ...}')
    parser.add_argument("--epochs", type=positive_int, help="default: --config's training.epochs, else the preset's")
    parser.add_argument("--average", type=positive_int, nargs="*", default=[2, 3, 4], help="average the last N epochs")
    parser.add_argument("--alpha", type=alpha_value, nargs="+", default=[0.6, 1.0], help="length-penalty exponents")
    parser.add_argument("--beam", type=beam_size, default=4, help="default: %(default)s")
    parser.add_argument("--json", type=Path, required=True, help="report to write")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    args = parser.parse_args(argv)
    if any(n < 2 for n in args.average):
        parser.error(f"--average takes counts of 2 or more (the final weights are always decoded), got {args.average}")
    try:
        # never through a link, over a folder, a run's file or a file that is not a report of this script
        check_output_file(args.json, "--json", replaces=is_report, kind=f"a report of {WRITER}")
        report = run(args, read_overrides(args))
    except (ValueError, OSError) as error:
        if args.debug:
            raise
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(json.dumps({k: v for k, v in report.items() if k not in ("settings", "points")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
