"""Run the heavy chapters (8, then 9) for real and store their outputs, with a record of the run.

    python tools/run_heavy_chapters.py                 # both chapters, full mode, on the best device here
    python tools/run_heavy_chapters.py --check         # exit 1 if a stored record does not match its notebook
    python tools/run_heavy_chapters.py --notes         # rewrite only the notes from the stored records
    python tools/run_heavy_chapters.py --into /tmp/copy --cell-times times.json   # into a copy; book/ untouched

Chapters 8 and 9 train and read a real translator, which takes too long to run whenever the book is built, so the
book shows the outputs of their latest full run instead (CONTRIBUTING.md, 'Stored outputs of chapters 8 and 9').
This tool is the only way those outputs get into the notebooks: it executes each notebook top to bottom with
nbclient, in full mode (it refuses to run with TRANSFORMER_BOOK_SMOKE set), writes the outputs into the notebook,
and records in the notebook's metadata, under "transformer_book" -> "run": the hardware (CPU model and cores, GPU
name if one was used), the Python, torch and transformer_lib versions, the date, the wall time and a hash of the
notebook's code cells. It also rewrites the note at the top of the chapter (the markdown cell tagged "provenance")
from that record, so a reader sees where the outputs come from. tests/test_heavy_chapters.py fails when a code cell
changes after the run: run this tool again, never edit outputs by hand.

Chapter 9 reads chapter 8's checkpoint from book/runs/, so the two run in that order, in the book folder.
Progress bars are stored as a terminal would show them: each carriage-return update replaces the line it rewrites.

No cell may store an error; an untouched exercise stub prints one line ("Exercise not attempted yet ...") instead.

--into DIR copies book/ (without _build/ and runs/) into DIR, a new or empty folder outside book/, and runs the
chapters there: the book's notebooks and book/runs/ are not touched, and chapter 8's scoreboard record stays in the
copy (its ../benchmarks/results does not exist there). A copy this tool made (it holds COPY_MARK) is used again as it
is, so that chapter 9 can run after chapter 8 in a call of its own and read chapter 8's run there. tools/gpu_kit.py
runs the chapters on a GPU that way. Only into a copy may TRANSFORMER_BOOK_SMOKE be set (a rehearsal: its outputs
never reach the book, and the smoke markers they hold are not checked). --cell-times FILE rewrites FILE (JSON,
atomically) after every cell: for each chapter, each code cell's index, first line and seconds, and the chapter's
wall time once it ends, so that a run stopped part-way still tells where its time went (a file that exists is added
to: chapter by chapter).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "book"
HEAVY_CHAPTERS = ("08_translation.ipynb", "09_attention_heatmaps.ipynb")
RECORD_KEY = "transformer_book"
PROVENANCE_TAG = "provenance"
SMOKE_MARKERS = ("TRANSFORMER_BOOK_SMOKE=1", "smoke run: True", "smoke run of this chapter")  # never in a full run
MAX_STREAM_OUTPUTS, MAX_STREAM_LINES = 60, 300  # per cell: a collapsed progress bar is one line per epoch
NOT_RECORDED = (
    ":::{note}\n"
    "This chapter's outputs have not been recorded yet. `python tools/run_heavy_chapters.py` runs chapters 8 and 9 in\n"
    "full and stores their outputs here, with the hardware, versions and wall time of that run.\n"
    ":::"
)


def code_hash(notebook: dict) -> str:
    """sha256 of the notebook's code cells, in order: what the stored outputs were computed from (the same hash
    that chapter 8's scoreboard record carries, computed by transformer_lib.scoreboard.code_hash)."""
    from transformer_lib.scoreboard import code_hash as cells_hash

    return cells_hash(notebook)


def hardware() -> dict:
    """What the notebooks will run on: the device transformer_lib picks, the CPU, and the GPU if there is one."""
    import torch

    import transformer_lib as tl

    device = tl.get_device()
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return {"device": device.type, "gpu": gpu, "cpu": tl.runtime.cpu_name(), "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads()}


def duration(minutes: float) -> str:
    """A run's wall time in words: 'under a minute', '1 minute', '46 minutes'."""
    if minutes < 0.95:
        return "under a minute"
    whole = round(minutes)
    return "1 minute" if whole == 1 else f"{whole} minutes"


def provenance_note(record: dict) -> str:
    """The note at the top of a heavy chapter, generated from its run record."""
    hw = record["hardware"]
    if hw["gpu"]:
        where = f"one {hw['gpu']} GPU"
    else:
        where = f"a CPU only, no GPU: {hw['cpu']}, {hw['cores']} cores"
    return (
        ":::{note}\n"
        f"The outputs on this page come from a full run of this notebook on {where}, on {record['date']}, "
        f"which took {duration(record['wall_minutes'])} (Python {record['python']}, torch {record['torch']}, "
        f"transformer_lib {record['transformer_lib']}). They were stored by `python tools/run_heavy_chapters.py`, "
        "which also recorded these facts in the notebook; a test checks that no code cell changed since. Run the "
        "notebook yourself (in Colab, *Runtime → Change runtime type* offers a GPU) and your numbers will differ "
        "somewhat.\n"
        ":::"
    )


def collapse_carriage_returns(text: str) -> str:
    """Render progress-bar output as a terminal shows it: the text after a line's last carriage return wins."""
    lines = text.split("\n")
    return "\n".join(line.rsplit("\r", 1)[-1] if "\r" in line.rstrip("\r") else line.rstrip("\r") for line in lines)


def merge_streams(outputs: list) -> list:
    """Join consecutive stream outputs into one, as a terminal shows them: one box on the page, not one per write.

    The kernel sends every write of a progress bar as an output of its own (thousands for one training run); only
    once they are joined can the carriage returns between them be collapsed. stdout and stderr are joined too
    (tqdm writes its bars to stderr, print to stdout, so the training log would otherwise alternate between the two
    in a dozen boxes), into stdout, and a line that a bar left open is ended before the next stream's text.
    """
    merged, last_name = [], None  # last_name: the stream that wrote the end of merged[-1]'s text
    for output in outputs:
        previous = merged[-1] if merged else None
        if output.get("output_type") == "stream" and previous is not None and previous.get("output_type") == "stream":
            text = previous["text"]
            if last_name != output.get("name") and text and not text.endswith("\n"):
                text += "\n"  # a bar that stopped mid-line (its next update would have started with \r)
            previous["text"] = text + output["text"]
            if previous.get("name") != output.get("name"):
                previous["name"] = "stdout"
        else:
            merged.append(dict(output))
        last_name = output.get("name")
    return merged


_FINISHED_BAR = re.compile(r"^(?P<bar>.*?100%\|[^|]*\|\s*(?P<n>\d[\d,]*)/(?P=n)) ")


def drop_repeated_bars(text: str) -> str:
    """Keep the first finished line of a progress bar: tqdm prints the 100% bar again when it is closed."""
    seen, kept = set(), []
    for line in text.split("\n"):
        match = _FINISHED_BAR.match(line)
        if match and match["bar"] in seen:
            continue
        if match:
            seen.add(match["bar"])
        kept.append(line)
    return "\n".join(kept)


def tidy_outputs(notebook) -> None:
    """Join each cell's consecutive stream outputs, collapse carriage-return updates (tqdm) and drop the repeated
    finished bar, in place."""
    import nbformat

    for cell in notebook.cells:
        if cell.cell_type != "code":
            continue
        # merge_streams builds plain dicts; nbformat.write needs its own node type, or it fails after the whole run
        cell["outputs"] = [nbformat.from_dict(output) for output in merge_streams(cell.get("outputs", []))]
        for output in cell["outputs"]:
            if output.get("output_type") == "stream":
                output["text"] = drop_repeated_bars(collapse_carriage_returns(output["text"]))


def set_provenance(notebook, note: str) -> None:
    """Replace the text of the markdown cell tagged 'provenance' (there must be exactly one)."""
    cells = [c for c in notebook.cells if PROVENANCE_TAG in c.get("metadata", {}).get("tags", [])]
    if len(cells) != 1:
        raise SystemExit(f"error: expected one markdown cell tagged {PROVENANCE_TAG!r}, found {len(cells)}")
    cells[0].source = note


class CellTimes:
    """The seconds of each executed code cell, per chapter, rewritten to a JSON file after every cell (the chapters
    an existing file holds are kept)."""

    def __init__(self, path: Path | None):
        self.path, self.chapters = path, {}
        if path is not None and path.is_file():
            self.chapters = json.loads(path.read_text(encoding="utf-8"))

    def start(self, chapter: str) -> None:
        self.chapters[chapter] = {"cells": [], "wall_seconds": None, "finished": False}
        self.started = time.perf_counter()
        self.cell_started = None
        self.write()

    def cell_start(self, cell, cell_index: int, **_) -> None:
        self.cell_started = time.perf_counter()

    def cell_done(self, chapter: str, cell, cell_index: int, **_) -> None:
        seconds = time.perf_counter() - (self.cell_started or time.perf_counter())
        first = next((line for line in cell.source.splitlines() if line.strip()), "")
        self.chapters[chapter]["cells"].append({"index": cell_index, "first_line": first[:100],
                                                "seconds": round(seconds, 2)})
        self.chapters[chapter]["wall_seconds"] = round(time.perf_counter() - self.started, 1)
        self.write()

    def finish(self, chapter: str) -> None:
        self.chapters[chapter].update(finished=True, wall_seconds=round(time.perf_counter() - self.started, 1))
        self.write()

    def write(self) -> None:
        if self.path is not None:
            from transformer_lib.files import atomic_write_text

            atomic_write_text(self.path, json.dumps(self.chapters, indent=1) + "\n")


def run_chapter(path: Path, timeout: int, cell_times: CellTimes | None = None) -> dict:
    """Execute one notebook in full mode (in its own folder), store its outputs and its run record; return the
    record. cell_times, if given, hears of every code cell as it ends."""
    import nbformat
    import torch
    from nbclient import NotebookClient

    import transformer_lib as tl

    notebook = nbformat.read(path, as_version=4)
    record = {
        "hardware": hardware(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformer_lib": tl.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d"),
        "started_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "code_hash": code_hash(notebook),
        "tool": "tools/run_heavy_chapters.py",
    }
    print(f"{path.name}: running on {record['hardware']} ...", flush=True)
    started = time.perf_counter()
    client = NotebookClient(notebook, timeout=timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    if cell_times is not None:
        cell_times.start(path.name)
        client.on_cell_execute = cell_times.cell_start
        client.on_cell_executed = lambda **kwargs: cell_times.cell_done(path.name, **kwargs)
    client.execute()
    if cell_times is not None:
        cell_times.finish(path.name)
    record["wall_minutes"] = round((time.perf_counter() - started) / 60, 1)
    tidy_outputs(notebook)
    notebook.metadata.setdefault(RECORD_KEY, {})["run"] = record
    set_provenance(notebook, provenance_note(record))
    try:
        nbformat.write(notebook, path)
    except Exception:  # never lose a run of most of an hour to a failed write: keep its outputs as plain JSON
        rescue = path.with_name(f".{path.stem}.rescued.json")
        rescue.write_text(json.dumps(notebook, ensure_ascii=False, default=str), encoding="utf-8")
        print(f"{path.name}: writing the notebook failed; its executed form is in {rescue}", flush=True)
        raise
    print(f"{path.name}: done in {record['wall_minutes']} min; outputs stored", flush=True)
    return record


def check(paths: list[Path]) -> list[str]:
    """Problems with the stored runs: a missing record, changed code, an error output, a smoke-run marker."""
    problems = []
    for path in paths:
        notebook = json.loads(path.read_text(encoding="utf-8"))
        record = notebook["metadata"].get(RECORD_KEY, {}).get("run")
        if record is None:
            problems.append(f"{path.name}: no run recorded; run python tools/run_heavy_chapters.py")
            continue
        if record["code_hash"] != code_hash(notebook):
            problems.append(f"{path.name}: a code cell changed after the recorded run; run the tool again")
        for index, cell in enumerate(notebook["cells"]):
            if cell["cell_type"] != "code":
                continue
            for output in cell.get("outputs", []):
                if output["output_type"] == "error":
                    problems.append(f"{path.name}: cell {index} stored an error ({output.get('ename')})")
                text = json.dumps(output)
                if any(marker in text for marker in SMOKE_MARKERS):
                    problems.append(f"{path.name}: cell {index} shows a smoke-run marker")
            streams = [o for o in cell.get("outputs", []) if o["output_type"] == "stream"]
            lines = sum("".join(o["text"]).count("\n") + 1 for o in streams)
            if len(streams) > MAX_STREAM_OUTPUTS or lines > MAX_STREAM_LINES:
                problems.append(f"{path.name}: cell {index} stores {len(streams)} stream outputs of {lines} lines "
                                f"(at most {MAX_STREAM_OUTPUTS} and {MAX_STREAM_LINES}): a progress bar was not "
                                "collapsed")
    return problems


COPY_MARK = ".copy-of-the-book"  # in a copy that make_copy made


def make_copy(into: Path) -> Path:
    """Copy book/ into `into` (new, or an empty folder outside book/), without its build and runs; return the copy.
    A copy that make_copy made earlier is returned as it is, with what earlier runs left in it."""
    into = into.resolve()
    if into == BOOK or BOOK in into.parents:
        raise ValueError(f"--into {str(into)!r} is inside book/; give a folder outside it, so that the book's "
                         f"notebooks stay as they are")
    if into.is_dir() and not into.is_symlink() and (into / COPY_MARK).is_file():
        return into
    if into.is_symlink() or (into.exists() and (not into.is_dir() or any(into.iterdir()))):
        raise ValueError(f"--into {str(into)!r} exists and is not an empty folder; give a new folder (nothing is "
                         f"overwritten)")
    into.mkdir(parents=True, exist_ok=True)
    shutil.copytree(BOOK, into, dirs_exist_ok=True, ignore=shutil.ignore_patterns("_build", "runs"))
    (into / COPY_MARK).write_text("a copy of book/ made by tools/run_heavy_chapters.py --into\n", encoding="utf-8")
    return into


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chapters", nargs="*", default=list(HEAVY_CHAPTERS), help="notebooks in book/ (default: both)")
    parser.add_argument("--timeout", type=int, default=3 * 3600, help="seconds per cell (default: %(default)s)")
    parser.add_argument("--check", action="store_true", help="only check the stored records")
    parser.add_argument("--notes", action="store_true",
                        help="only rewrite the note at the top of each chapter from its stored record (after a change "
                             "to the note's wording); runs nothing")
    parser.add_argument("--into", type=Path, metavar="DIR",
                        help="run in a copy of book/ made in DIR (new or empty, outside book/); book/ is not touched")
    parser.add_argument("--cell-times", type=Path, metavar="FILE",
                        help="rewrite FILE (JSON) after every cell with each code cell's seconds, per chapter")
    args = parser.parse_args(argv)
    if args.timeout < 1:
        parser.error(f"--timeout must be a positive number of seconds per cell, got {args.timeout}")
    paths = [BOOK / Path(name).name for name in args.chapters]
    for path in paths:
        if path.name not in HEAVY_CHAPTERS or not path.is_file():
            parser.error(f"chapter {path.name!r} is not one of the heavy chapters {HEAVY_CHAPTERS}")
    if (args.into or args.cell_times) and (args.check or args.notes):
        parser.error("--into and --cell-times run the chapters; they do not go with --check or --notes")
    if args.check:
        problems = check(paths)
        print("\n".join(problems) or "the stored runs match their notebooks")
        return 1 if problems else 0
    if args.notes:
        import nbformat

        for path in paths:
            notebook = nbformat.read(path, as_version=4)
            record = notebook.metadata.get(RECORD_KEY, {}).get("run")
            if record is None:
                parser.error(f"{path.name} has no stored run to write a note from; run the tool without --notes")
            set_provenance(notebook, provenance_note(record))
            nbformat.write(notebook, path)
            print(f"{path.name}: note rewritten from the run of {record['date']}")
        return 0
    smoke = bool(os.environ.get("TRANSFORMER_BOOK_SMOKE"))
    if smoke and args.into is None:
        parser.error("TRANSFORMER_BOOK_SMOKE is set: this tool stores full runs only; unset it (or run into a copy "
                     "with --into DIR, which never reaches the book)")
    if args.cell_times is not None and (args.cell_times.is_dir() or args.cell_times.is_symlink()):
        parser.error(f"--cell-times {str(args.cell_times)!r} is a folder or a link; give a file to write")
    if args.into is not None:
        try:
            copy = make_copy(args.into)
        except ValueError as error:
            parser.error(str(error))
        paths = [copy / path.name for path in paths]
        print(f"running in a copy of the book: {copy}", flush=True)
    cell_times = CellTimes(args.cell_times) if args.cell_times is not None else None
    for path in paths:
        run_chapter(path, args.timeout, cell_times)
    if smoke:
        print("smoke run into a copy (TRANSFORMER_BOOK_SMOKE is set): its outputs are not checked as a full run's")
        return 0
    problems = check(paths)
    if problems:
        print("\n".join(problems), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
