"""Keep the performance appendix's tables equal to the benchmark reports in benchmarks/results/.

    python benchmarks/tables.py          # rewrite every table block of book/appendix_performance.ipynb
    python benchmarks/tables.py --check  # exit 1, naming the block, when a table differs from its report

A block is a Markdown cell region between `<!-- benchmark-table: NAME.json -->` and `<!-- end benchmark-table -->`;
it is replaced by the report's caption and tables, so every number there comes from a file the script wrote.
"""

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
APPENDIX = ROOT / "book" / "appendix_performance.ipynb"
BLOCK = re.compile(r"(<!-- benchmark-table: (?P<name>[\w.*-]+\.json) -->\n)(?P<body>.*?)(<!-- end benchmark-table -->)", re.S)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchmark import read_report, table  # noqa: E402


def caption(report: dict, name: str) -> str:
    """One sentence saying what ran where: model, precision, batch, device, threads, versions, date, load."""
    env, settings = report["environment"], report["settings"]
    batch, src_len, tgt_len = settings["shape"]
    load = ""
    if env.get("load_average_at_start") is not None:
        load = (f"; load average {env['load_average_at_start']:.1f} at the start and "
                f"{env.get('load_average_at_end', float('nan')):.1f} at the end")
    return (f"*{settings['size'].capitalize()} model, {settings['dtype']}{', torch.compile' if settings['compile'] else ''}, "
            f"batches of {batch} sentences of up to {src_len} source and {tgt_len} target tokens, "
            f"{settings['repeats']} windows of {settings['steps']} steps per model; {env['device_name']}, "
            f"{env['torch_threads']} threads, torch {env['torch']}, {env['date']}{load}. "
            f"MFU against the measured {settings['dtype']} matrix-multiply rate of "
            f"{report['matmul_flops_per_s'] / 1e9:,.1f} GFLOP/s. File: `benchmarks/results/{name}`.*")


def threads_table(names: list[str]) -> str:
    """The reports of benchmarks/threads.py, one row per (report, model): seconds per step at each thread count."""
    reports = [(name, json.loads((RESULTS / name).read_text(encoding="utf-8"))) for name in names]
    counts = sorted({int(n) for _, report in reports for model in report["results"].values() for n in model})
    head = ("| spinning processes started beside it | load average (start → end) | model | "
            + " | ".join(f"{n} thread{'s' * (n > 1)}" for n in counts) + " | fastest |")
    lines = [head, "|" + "---|" * (4 + len(counts))]
    for name, report in sorted(reports, key=lambda item: item[1]["busy_processes"]):
        env, busy = report["environment"], report["busy_processes"]
        beside = "none" if busy == 0 else str(busy)
        for model, by_threads in report["results"].items():
            medians = {int(n): value["median_s"] for n, value in by_threads.items()}
            best = min(medians, key=medians.get)
            cells = " | ".join(f"{medians[n]:.3f} s" if n in medians else "–" for n in counts)
            lines.append(f"| {beside} | {env['load_average_before']:.1f} → {env['load_average_after']:.1f} | "
                         f"`{model}` | {cells} | {best} |")
    first = reports[0][1]
    env = first["environment"]
    files = ", ".join(f"`benchmarks/results/{name}`" for name, _ in reports)
    return (f"*The load average says what else ran (the spinning processes count in it). Median seconds per training step (forward, backward, Adam) over {first['windows']} windows of "
            f"{first['steps_per_window']} steps, thread counts interleaved, on random batches of each preset's token "
            f"budget in sentences of {first['sentence_tokens']} tokens; {env['cpu']}, {env['cpu_count']} cores, torch "
            f"{env['torch']}, {env['date']}. Files: {files}.*\n\n" + "\n".join(lines) + "\n")


def render(name: str) -> str:
    if "*" in name:  # a group of benchmarks/threads.py reports
        names = sorted(path.name for path in RESULTS.glob(name))
        if not names:
            raise ValueError(f"{APPENDIX.name} has a table of {name}, but no file in {RESULTS} matches it; write "
                             f"them with benchmarks/threads.py --json, or remove the table's block")
        return threads_table(names)
    path = RESULTS / name
    if not path.is_file():
        raise ValueError(f"{APPENDIX.name} has a table of {name}, but {path} is not a file; write it with "
                         f"benchmarks/benchmark.py --json {path}, or remove the table's block")
    report = read_report(path)  # checked: one line naming the file and the field when it is not a report
    return f"{caption(report, name)}\n\n{table(report)}\n"


def sync(check: bool) -> list[str]:
    """Rewrite (or, with check, compare) every block; return the names of blocks that differ(ed)."""
    notebook = json.loads(APPENDIX.read_text(encoding="utf-8"))
    differing = []
    for cell in notebook["cells"]:
        if cell["cell_type"] != "markdown":
            continue
        source = "".join(cell["source"])

        def replace(match: re.Match) -> str:
            body = render(match["name"])
            if match["body"] != body:
                differing.append(match["name"])
            return match.group(1) + body + match.group(4)

        new = BLOCK.sub(replace, source)
        cell["source"] = new.splitlines(keepends=True)
    if differing and not check:
        APPENDIX.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return differing


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Keep the appendix's benchmark tables equal to benchmarks/results/.")
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 when a table differs")
    args = parser.parse_args(argv)
    try:
        differing = sync(args.check)
    except (ValueError, OSError) as error:  # a report that is missing, not JSON or not a report: one line
        print(f"error: {error}", file=sys.stderr)
        return 1
    if differing:
        print(("differs from its report: " if args.check else "rewrote: ") + ", ".join(differing))
    return 1 if args.check and differing else 0


if __name__ == "__main__":
    sys.exit(main())
