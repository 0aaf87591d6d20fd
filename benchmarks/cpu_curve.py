"""What an hour of a laptop buys: validation BLEU against training minutes for one preset, on this machine.

Trains a Multi30k German->English translator with transformer_lib.train_translator (the code chapter 8 teaches),
measures greedy-search BLEU on the validation split after every epoch, and beam-search BLEU (k = 4, alpha = 0.6)
at the end, and writes the curve to a JSON report as it grows, so an interrupted run still leaves its points.
It never looks at the test split: the preset's settings were chosen on this curve, and test2016 is scored only in
chapter 8. This is a benchmark, not a test: run it by hand, on an otherwise idle machine, and commit the report.

    python benchmarks/cpu_curve.py --preset multi30k-cpu --epochs 9 --json benchmarks/results/cpu_curve.json
    python benchmarks/cpu_curve.py --plot benchmarks/results/cpu_curve.json   # draw a report

Minutes are wall-clock minutes of training (the validation itself excluded), so they depend on the machine and on
whatever else runs on it: the report records the CPU, the thread count, torch's version and the load average.
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


def write_json(path: Path, report: dict) -> None:
    """Write the report atomically, never through a link (transformer_lib.runs.atomic_write_text)."""
    from transformer_lib.runs import atomic_write_text

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(report, indent=1) + "\n")


def run(args: argparse.Namespace) -> dict:
    import torch

    import transformer_lib as tl
    from transformer_lib.data import load_pairs
    from transformer_lib.scoring import corpus_scores
    from transformer_lib.translation import load_translator, translate

    if args.threads:
        torch.set_num_threads(args.threads)
    report = {
        "what": "validation BLEU (sacreBLEU, cased, detokenized) against training minutes, Multi30k de->en",
        "preset": args.preset,
        "settings": tl.translation.resolve_settings(args.preset),
        "epochs": args.epochs,
        "device": str(tl.get_device()),
        "cpu": tl.runtime.cpu_name(),
        "cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": datetime.date.today().isoformat(),
        "load_average_at_start": os.getloadavg(),
        "points": [],
    }
    out = Path(args.json)
    write_json(out, report)

    def on_record(record: dict) -> None:
        report["points"].append(record)
        report["load_average_now"] = os.getloadavg()
        write_json(out, report)

    run_dir = Path(tempfile.mkdtemp(prefix="cpu_curve_"))
    started = time.perf_counter()
    try:
        summary = tl.train_translator(run_dir / "run", preset=args.preset, epochs=args.epochs,
                                      overrides={"training": {"bleu_every": 1}}, on_record=on_record,
                                      progress=not args.no_progress)
        report["wall_minutes_training_and_validation"] = (time.perf_counter() - started) / 60
        report["steps"] = summary["steps"]
        model, tokenizer = load_translator(run_dir / "run")
        pairs = load_pairs("multi30k", "validation", "de", "en")
        decode_started = time.perf_counter()
        hypotheses = translate(model, tokenizer, [de for de, _ in pairs], beam_size=4)
        scores = corpus_scores(hypotheses, [en for _, en in pairs])
        report["final_beam4"] = {"valid_bleu": scores["bleu"], "valid_chrf": scores["chrf"],
                                 "bleu_signature": scores["bleu_signature"],
                                 "decode_minutes": (time.perf_counter() - decode_started) / 60}
        report["load_average_at_end"] = os.getloadavg()
        write_json(out, report)
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)
    return report


def report_sha256(path: Path) -> str:
    """The hash of a report, stored in the PNG drawn from it so that a test can tell the two apart."""
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def plot(path: Path, png: Path | None = None) -> None:
    """Draw a report's curve: validation BLEU against training minutes, each point labelled with its epoch."""
    import matplotlib

    if png:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    report = json.loads(path.read_text(encoding="utf-8"))
    points = [p for p in report["points"] if p["valid_bleu"] is not None]
    fig, ax = plt.subplots(figsize=(7, 3.6))
    ax.plot([p["minutes"] for p in points], [p["valid_bleu"] for p in points], marker="o")
    for p in points:
        ax.annotate(f"epoch {p['epoch']}", (p["minutes"], p["valid_bleu"]), fontsize=7, xytext=(4, -10),
                    textcoords="offset points")
    ax.set_xlabel("training minutes (validation excluded)")
    ax.set_ylabel("validation BLEU, greedy search")
    ax.set_title(f"{report['preset']} on {report['cpu']}, {report['torch_threads']} threads, torch {report['torch']}",
                 fontsize=9)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    if png:
        fig.savefig(png, dpi=100, metadata={"Description": f"report sha256 {report_sha256(path)}"})
    else:
        plt.show()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="multi30k-cpu", help="default: %(default)s")
    parser.add_argument("--epochs", type=int, default=9, help="default: %(default)s")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    parser.add_argument("--json", default="benchmarks/results/cpu_curve.json", help="report to write")
    parser.add_argument("--plot", type=Path, help="draw this report instead of running")
    parser.add_argument("--png", type=Path, help="with --plot: save the figure here")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    if args.plot:
        plot(args.plot, args.png)
        return 0
    if args.epochs < 1:
        parser.error(f"--epochs must be a positive integer, got {args.epochs}")
    report = run(args)
    print(json.dumps({k: v for k, v in report.items() if k != "settings"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
