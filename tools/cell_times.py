"""How long each cell of the book's notebooks takes, against the build's cell time limit.

    python tools/cell_times.py [--json FILE] [--margin 3] [NOTEBOOK ...]

It executes each notebook (by default every notebook the build executes: book/_config.yml's exclude_patterns left
out) top to bottom in book/, as `jupyter-book build book` does (the same kernel, working folder and environment: set
TRANSFORMER_BOOK_SMOKE and TRANSFORMER_LIB_DATA as the build you mean would; the notebook files are not changed),
with nbclient's timing of every cell, and prints the slowest cells with the machine's load average. Exit status 1 when a cell took
more than the limit (`execute.timeout` in book/_config.yml) divided by --margin, or raised; 0 otherwise.

The build gives every cell `execute.timeout` seconds, and a cell past it costs the reader that page. A cell that
takes a third of the limit on an idle laptop takes it all on a laptop whose cores are shared (torch's threads slow
down several-fold beside other work: the performance appendix measures it), hence a margin of 3, measured under load
(CONTRIBUTING.md, 'Running the tests and building the book').
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "book"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from student_edition import executed_at_build  # noqa: E402

from transformer_lib.files import write_json  # noqa: E402


def cell_limit(config: Path = BOOK / "_config.yml") -> int:
    """The build's time limit for one cell, in seconds (execute.timeout)."""
    return int(yaml.safe_load(config.read_text(encoding="utf-8"))["execute"]["timeout"])


def cell_seconds(cell) -> float | None:
    """Seconds a cell ran, from nbclient's record_timing metadata; None for a cell that did not run."""
    timing = cell.get("metadata", {}).get("execution", {})
    started, ended = timing.get("iopub.execute_input"), timing.get("shell.execute_reply")
    if not (started and ended):
        return None
    from datetime import datetime

    def parse(stamp: str) -> datetime:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00"))

    return (parse(ended) - parse(started)).total_seconds()


def time_notebook(notebook: Path, limit: int) -> dict:
    """Execute `notebook` in its folder, as the build does (the file itself is not changed), and return the seconds
    of each code cell."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError

    nb = nbformat.read(notebook, as_version=4)  # executed where the build executes it: in its own folder
    started = time.perf_counter()
    error = None
    try:
        NotebookClient(nb, timeout=limit, kernel_name="python3", record_timing=True,
                       resources={"metadata": {"path": str(notebook.parent)}}).execute()
    except (CellExecutionError, CellTimeoutError) as failure:
        error = f"{type(failure).__name__}: {str(failure).strip().splitlines()[-1][:300]}"
    cells = [{"index": index, "seconds": cell_seconds(cell), "first_line": cell.source.split("\n", 1)[0][:80]}
             for index, cell in enumerate(nb.cells) if cell.cell_type == "code"]
    return {"notebook": notebook.name, "seconds": round(time.perf_counter() - started, 1), "error": error,
            "cells": cells}


def slow_cells(reports: list[dict], budget: float) -> list[str]:
    """One line per cell over `budget` seconds, and per notebook that stopped with an error."""
    problems = []
    for report in reports:
        if report["error"]:
            problems.append(f"{report['notebook']}: {report['error']}")
        for cell in report["cells"]:
            if cell["seconds"] is not None and cell["seconds"] > budget:
                problems.append(f"{report['notebook']} cell {cell['index']} ({cell['first_line']!r}): "
                                f"{cell['seconds']:.0f} s, over {budget:.0f} s")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("notebooks", nargs="*", type=Path, help="default: every notebook the build executes")
    parser.add_argument("--margin", type=float, default=3.0, help="a cell may take limit / margin (default: 3)")
    parser.add_argument("--json", type=Path, help="write every cell's time here")
    args = parser.parse_args(argv)
    if args.margin < 1:
        parser.error(f"argument --margin: expected a number >= 1, got {args.margin}")
    notebooks = args.notebooks or sorted(path for path in BOOK.glob("*.ipynb") if executed_at_build(BOOK, path))
    for path in notebooks:
        if not path.is_file() or path.suffix != ".ipynb":
            parser.error(f"notebook {str(path)!r} is not a notebook file (.ipynb)")
    limit = cell_limit()
    load_before = os.getloadavg()[0]
    reports = []
    for path in notebooks:
        report = time_notebook(path.resolve(), limit)
        reports.append(report)
        slowest = max((c for c in report["cells"] if c["seconds"] is not None), key=lambda c: c["seconds"],
                      default=None)
        print(f"{report['notebook']}: {report['seconds']:.0f} s"
              + (f"; slowest cell {slowest['index']}, {slowest['seconds']:.0f} s" if slowest else "")
              + (f"; {report['error']}" if report["error"] else "") + f"; load {os.getloadavg()[0]:.1f}", flush=True)
    budget = limit / args.margin
    problems = slow_cells(reports, budget)
    if args.json:
        write_json(args.json, {"limit_s": limit, "margin": args.margin, "load_average_before": round(load_before, 2),
                               "load_average_after": round(os.getloadavg()[0], 2), "cpu_count": os.cpu_count(),
                               "smoke": os.environ.get("TRANSFORMER_BOOK_SMOKE", ""), "notebooks": reports})
    for line in problems:
        print(f"too slow: {line}", file=sys.stderr)
    print(f"{len(problems)} cell(s) over limit / margin = {budget:.0f} s", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
