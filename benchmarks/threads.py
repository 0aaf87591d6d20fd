"""How many CPU threads should a training use? Training steps timed at each thread count, idle and beside busy work.

    python benchmarks/threads.py --json benchmarks/results/threads.json            # idle: nothing else running
    python benchmarks/threads.py --busy 1 --json benchmarks/results/threads-busy1.json   # beside one busy process

For each model (the `tiny` preset's translator, the book's small models' size, and the `multi30k-cpu` preset's), it
times training steps (forward, backward, Adam) on random batches of that preset's token budget, at 1 thread and at
every thread count up to the cores, the thread counts interleaved window by window so that a change in the machine's
load falls on all of them alike. `--busy K` starts K processes that spin on the CPU (pure Python, one core each) for
the length of the measurement, as a reader's laptop, a CI runner or Colab's shared CPU has other work beside the
book. The report gives the median seconds per step and its range per (model, threads); the performance appendix
shows it (benchmarks/tables.py) and `transformer_lib.runtime.training_threads` follows it.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import transformer_lib as tl  # noqa: E402
from transformer_lib.files import write_json  # noqa: E402
from transformer_lib.recipe import PRESETS, translator_config  # noqa: E402
from transformer_lib.runtime import cpu_name  # noqa: E402
from transformer_lib.training import teacher_forcing_pair, translation_loss  # noqa: E402

SENTENCE = 16  # tokens per source and target sentence in the random batches: about a Multi30k sentence in BPE


def model_for(preset: str) -> tuple[torch.nn.Module, int, int]:
    """The preset's translator (seeded), its vocabulary size and the sentences in a batch of its token budget."""
    settings = PRESETS[preset]
    vocab = settings["training"]["vocab_size"]
    torch.manual_seed(0)
    model = tl.Transformer(translator_config(settings, vocab))
    return model, vocab, settings["training"]["max_tokens"] // SENTENCE


def step_seconds(preset: str, threads: list[int], windows: int, steps: int) -> dict[int, list[float]]:
    """Seconds per training step at each thread count: `windows` windows of `steps` steps each, interleaved."""
    model, vocab, batch = model_for(preset)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)
    generator = torch.Generator().manual_seed(1)
    src = torch.randint(len(tl.SPECIAL_TOKENS), vocab, (batch, SENTENCE), generator=generator)  # (B, S)
    tgt = torch.randint(len(tl.SPECIAL_TOKENS), vocab, (batch, SENTENCE + 1), generator=generator)  # (B, T + 1)
    decoder_input, labels = teacher_forcing_pair(tgt)

    def one_step() -> None:
        loss = translation_loss(model(src, decoder_input), labels, tl.PAD_ID, 0.1)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    times: dict[int, list[float]] = {n: [] for n in threads}
    for n in threads:  # warm-up at each thread count: the first steps allocate
        torch.set_num_threads(n)
        for _ in range(2):
            one_step()
    for _ in range(windows):
        for n in threads:
            torch.set_num_threads(n)
            started = time.perf_counter()
            for _ in range(steps):
                one_step()
            times[n].append((time.perf_counter() - started) / steps)
    return times


def spinners(count: int) -> list[subprocess.Popen]:
    """count processes that each keep one core busy until killed."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--busy", type=int, default=0, help="processes spinning on the CPU beside the measurement")
    parser.add_argument("--models", nargs="+", default=["tiny", "multi30k-cpu"], choices=sorted(PRESETS))
    parser.add_argument("--windows", type=int, default=3, help="timed windows per thread count (default: 3)")
    parser.add_argument("--steps", type=int, default=5, help="training steps per window (default: 5)")
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args(argv)
    for name in ("busy", "windows", "steps"):
        if getattr(args, name) < (0 if name == "busy" else 1):
            parser.error(f"argument --{name}: expected an integer >= {0 if name == 'busy' else 1}, "
                         f"got {getattr(args, name)}")
    cores = os.cpu_count() or 1
    threads = list(range(1, cores + 1))
    load_before = os.getloadavg()[0]
    busy = spinners(args.busy)
    try:
        time.sleep(1 if args.busy else 0)  # let the spinners start
        results = {}
        for preset in args.models:
            seconds = step_seconds(preset, threads, args.windows, args.steps)
            results[preset] = {str(n): {"median_s": statistics.median(v), "min_s": min(v), "max_s": max(v)}
                               for n, v in seconds.items()}
            best = min(seconds, key=lambda n: statistics.median(seconds[n]))
            print(f"{preset}: " + ", ".join(f"{n} thread{'s' * (n > 1)} {statistics.median(v):.3f} s/step"
                                             for n, v in seconds.items()) + f"; fastest: {best}", flush=True)
    finally:
        for process in busy:
            process.kill()
            process.wait()
    report = {"busy_processes": args.busy, "sentence_tokens": SENTENCE, "steps_per_window": args.steps,
              "windows": args.windows, "results": results,
              "environment": {"cpu": cpu_name(), "cpu_count": cores, "torch": torch.__version__,
                              "python": platform.python_version(), "date": datetime.date.today().isoformat(),
                              "load_average_before": round(load_before, 2),
                              "load_average_after": round(os.getloadavg()[0], 2)}}
    if args.json:
        write_json(args.json, report)
    return report


if __name__ == "__main__":
    main()
