"""Chapters 8 and 9 store the outputs of their latest full run
(CONTRIBUTING.md, 'Stored outputs of chapters 8 and 9'). These tests keep those outputs honest: they must come from
the code as it is now, record where they ran, hold no error and no trace of a smoke run, show output wherever a cell
prints or draws, say at the top where they come from, and stay small."""

import ast
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

import run_heavy_chapters as heavy

PATHS = [ROOT / "book" / name for name in heavy.HEAVY_CHAPTERS]


def load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def code_cells(notebook: dict) -> list[tuple[int, dict]]:
    return [(i, c) for i, c in enumerate(notebook["cells"]) if c["cell_type"] == "code"]


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.stem)
def test_outputs_come_from_the_code_as_it_is(path):
    record = load(path)["metadata"].get(heavy.RECORD_KEY, {}).get("run")
    assert record, f"{path.name} has no run record: run python tools/run_heavy_chapters.py"
    assert heavy.check([path]) == [], heavy.check([path])
    for key in ("hardware", "python", "torch", "transformer_lib", "date", "wall_minutes", "code_hash"):
        assert key in record, f"the run record lacks {key!r}"
    assert {"device", "gpu", "cpu", "cores"} <= set(record["hardware"])


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.stem)
def test_the_top_of_the_chapter_says_where_the_outputs_come_from(path):
    notebook = load(path)
    record = notebook["metadata"][heavy.RECORD_KEY]["run"]
    notes = [c for c in notebook["cells"] if heavy.PROVENANCE_TAG in c.get("metadata", {}).get("tags", [])]
    assert len(notes) == 1
    assert "".join(notes[0]["source"]) == heavy.provenance_note(record)
    first_code = next(i for i, c in code_cells(notebook) if "remove-cell" not in c.get("metadata", {}).get("tags", []))
    assert notebook["cells"].index(notes[0]) < first_code, "the note must come before the chapter's code"
    if record["hardware"]["gpu"] is None:  # a CPU run must never read as a GPU run
        shown = [c["source"] if c["cell_type"] == "markdown" else c.get("outputs", []) for c in notebook["cells"]]
        assert not re.search(r"\bGPU run\b", json.dumps(shown)), "a CPU run that reads as a GPU run"  # text, outputs
        assert "on a GPU:" not in "".join(notes[0]["source"])


def shows_something(source: str) -> bool:
    """Whether a cell's own statements (not the bodies of the functions and classes it defines) print or draw."""
    tree = ast.parse("\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))))
    pending = [node for node in tree.body if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name in {"print", "show", "show_heads", "display"}:
                return True
        pending.extend(child for child in ast.iter_child_nodes(node)
                       if not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)))
    return False


def test_shows_something_looks_at_the_cell_not_at_its_functions():
    assert shows_something("for i in range(3):\n    print(i)") and shows_something("plt.show()")
    assert not shows_something("def f():\n    print(1)\n\n\nx = f")


@pytest.mark.parametrize("path", PATHS, ids=lambda p: p.stem)
def test_every_cell_that_prints_or_draws_has_output(path):
    for index, cell in code_cells(load(path)):
        tags = cell.get("metadata", {}).get("tags", [])  # switched-off: an optional cell that prints only when on
        if shows_something("".join(cell["source"])) and not {"remove-cell", "switched-off"} & set(tags):
            assert cell["outputs"], f"{path.name}, cell {index} prints or draws but stored no output"


def test_the_recorded_run_is_one_run_and_stays_small():
    records = [load(path)["metadata"][heavy.RECORD_KEY]["run"] for path in PATHS]
    assert records[0]["hardware"] == records[1]["hardware"], "chapter 9 must read chapter 8's run, on one machine"
    total = sum(path.stat().st_size for path in PATHS)
    assert total < 5 * 2**20, f"the two notebooks hold {total / 2**20:.1f} MB; keep them under 5 MB"
    for path in PATHS:
        for _, cell in code_cells(load(path)):
            for output in cell["outputs"]:
                text = "".join(output.get("text", ""))
                assert "\r" not in text, "progress bars must be stored as a terminal shows them"
                assert len(text.splitlines()) < 200, "an output of hundreds of lines: a progress bar not collapsed?"


def test_the_check_catches_what_it_must(tmp_path):
    notebook = load(PATHS[0])
    broken = tmp_path / PATHS[0].name
    first = code_cells(notebook)[1][1]
    first["source"] = "".join(first["source"]) + "\n# changed after the run"
    first["outputs"] = first["outputs"] + [{"output_type": "stream", "name": "stdout", "text": "smoke run of this chapter"}]
    broken.write_text(json.dumps(notebook), encoding="utf-8")
    bar = [{"output_type": "stream", "name": "stderr", "text": f"training: {i}%"} for i in range(100)]
    code_cells(notebook)[2][1]["outputs"] += bar
    broken.write_text(json.dumps(notebook), encoding="utf-8")
    problems = " ".join(heavy.check([broken]))
    assert "changed after the recorded run" in problems and "smoke-run marker" in problems
    assert "a progress bar was not collapsed" in problems


def test_a_progress_bar_sent_in_many_outputs_is_stored_as_one_line():
    import nbformat

    cell = nbformat.v4.new_code_cell("train()")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="start\n")]
    cell.outputs += [nbformat.v4.new_output("stream", name="stderr", text=f"\rtraining: {i}%") for i in range(0, 101, 10)]
    cell.outputs += [nbformat.v4.new_output("stream", name="stderr", text="\n"),
                     nbformat.v4.new_output("stream", name="stdout", text="done\n")]
    notebook = nbformat.v4.new_notebook(cells=[cell])
    heavy.tidy_outputs(notebook)
    assert [(o["name"], o["text"]) for o in notebook.cells[0].outputs] == [("stdout", "start\ntraining: 100%\ndone\n")]


def test_a_training_log_is_one_box_with_each_line_on_its_own_and_one_finished_bar():
    import nbformat

    bar = "training: {}%|##| {}/4 [00:0{}<00:00]"
    cell = nbformat.v4.new_code_cell("train()")
    cell.outputs = [nbformat.v4.new_output("stream", name="stderr", text="\r" + bar.format(50, 2, 1)),
                    nbformat.v4.new_output("stream", name="stdout", text="epoch 1\n"),
                    nbformat.v4.new_output("stream", name="stderr", text="\r" + bar.format(100, 4, 2)),
                    nbformat.v4.new_output("stream", name="stdout", text="epoch 2\n"),
                    nbformat.v4.new_output("stream", name="stderr", text="\r" + bar.format(100, 4, 3) + "\n"),
                    nbformat.v4.new_output("stream", name="stdout", text="done\n")]
    notebook = nbformat.v4.new_notebook(cells=[cell])
    heavy.tidy_outputs(notebook)
    assert [(o["name"], o["text"]) for o in notebook.cells[0].outputs] == [
        ("stdout", f"{bar.format(50, 2, 1)}\nepoch 1\n{bar.format(100, 4, 2)}\nepoch 2\ndone\n")]
    # ... and the notebook can still be written: the run of chapter 8 once ended in nbformat.write, because the
    # merged outputs were plain dicts
    nbformat.validate(nbformat.reads(nbformat.writes(notebook), as_version=4))


def test_carriage_returns_collapse_like_a_terminal():
    assert heavy.collapse_carriage_returns("a 1%\ra 50%\ra 100%\nnext\n") == "a 100%\nnext\n"
    assert heavy.collapse_carriage_returns("plain\n") == "plain\n"


@pytest.mark.parametrize(
    "minutes, words",
    [(0.6, "under a minute"), (1.0, "1 minute"), (1.4, "1 minute"), (1.6, "2 minutes"), (45.5, "46 minutes")],
)
def test_the_note_says_the_wall_time_in_words(minutes, words):
    assert heavy.duration(minutes) == words


SCOREBOARD = ROOT / "benchmarks" / "results" / "scoreboard"


def cell_text(cell: dict) -> str:
    """Everything a stored code cell shows as text: its streams and the text/plain and text/html of its results."""
    parts = []
    for output in cell.get("outputs", []):
        parts.append("".join(output.get("text", "")))
        for kind in ("text/plain", "text/html"):
            parts.append("".join(output.get("data", {}).get(kind, "")))
    return "\n".join(parts)


def test_the_scoreboard_and_chapter_8_tell_the_same_run():
    """Chapter 8's full run writes benchmarks/results/scoreboard/<preset>-<device>.json and shows the table of the
    records; the record it wrote must be the run whose outputs the chapter stores, and the table must show it."""
    from transformer_lib.scoreboard import read_scoreboard, scoreboard_table

    notebook = load(ROOT / "book" / "08_translation.ipynb")
    run = notebook["metadata"][heavy.RECORD_KEY]["run"]
    records = read_scoreboard(SCOREBOARD)
    ours = [r for r in records if r["code_hash"] == run["code_hash"]]
    assert len(ours) == 1, f"no scoreboard record (or several) carries chapter 8's code hash {run['code_hash']}"
    record = ours[0]
    assert record["device"] == run["hardware"]["device"] and record["chosen_on"] == "validation"
    cells = {"".join(c["source"]).split("\n")[0]: c for _, c in code_cells(notebook)}
    table = cell_text(next(c for first, c in cells.items() if first.startswith("in_repository = ")))
    shown = scoreboard_table(records)  # the table the chapter drew, from the records as they are now
    for value in (record["test"]["bleu"], record["test"]["chrf"], record["validation"]["bleu"]):
        assert f"{value:.2f}"[:-1] in table, f"the scoreboard table in chapter 8 does not show {value}"
    assert len(shown) == len(records) + 1  # one row per record, and the tutorial's
    assert f"{record['training_minutes']:.1f}" in table, "the table does not show the record's training minutes"
    curves = cell_text(next(c for first, c in cells.items() if first.startswith("records = ")))
    assert f"step {record['steps']:,}, {record['training_minutes']:5.1f} min)" in curves, (
        "the record's training minutes are not those of the last epoch record (validation excluded)")
    scores = cell_text(next(c for first, c in cells.items() if first.startswith("GOALS = ")))
    assert record["test"]["bleu_line"] in scores  # the test score the chapter printed is the one recorded
    assert f"alpha {record['decoding']['alpha']}, {record['weights']}" in scores  # the epochs named, as recorded


def test_a_timeout_that_is_not_positive_is_refused(capsys):
    with pytest.raises(SystemExit) as stop:
        heavy.main(["--timeout", "0", "--check"])
    assert stop.value.code == 2 and "--timeout must be a positive number of seconds" in capsys.readouterr().err
