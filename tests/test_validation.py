"""Chapter 8's validation (transformer_lib.validation): after every epoch, the loss on the validation split, and BLEU
every bleu_every epochs, in a line of its own; kept in the checkpoint so that a resumed run has the same curves; the
validation sweep that chooses the decoding."""

import contextlib
import io
import json
import random
import re

import pytest

import transformer_lib as tl
from transformer_lib import data
from transformer_lib import scoring
from transformer_lib import validation

WORDS_DE = ["Ein", "Hund", "Mann", "Frau", "läuft", "sitzt", "im", "Park", "am", "Strand", "rot", "groß"]
WORDS_EN = ["A", "dog", "man", "woman", "runs", "sits", "in", "the", "park", "on", "beach", "red", "big"]


def write_corpus(folder, train=240, validation=110):
    """A small offline Multi30k look-alike: enough sentences for corpus_scores (at least 100) and two epochs."""
    rng = random.Random(0)
    (folder / "multi30k").mkdir(parents=True)
    for split, n in (("train", train), ("validation", validation), ("test", 100)):
        with open(folder / "multi30k" / f"{split}.jsonl", "w", encoding="utf-8") as f:
            for _ in range(n):
                k = rng.randint(2, 6)
                f.write(json.dumps({"de": " ".join(rng.choices(WORDS_DE, k=k)) + ".",
                                    "en": " ".join(rng.choices(WORDS_EN, k=k)) + "."}, ensure_ascii=False) + "\n")
    return folder


TINY = {"model": {"d_model": 32, "n_heads": 2, "n_layers": 1, "d_ff": 64, "max_len": 32},
        "training": {"vocab_size": 120, "max_tokens": 64, "warmup": 20, "bleu_every": 2}}  # >= 10 steps an epoch


def test_every_epoch_leaves_a_record_and_bleu_comes_every_bleu_every(tmp_path, monkeypatch):
    monkeypatch.setenv(data.DATA_ENV, str(write_corpus(tmp_path / "data")))
    seen = []
    summary = tl.train_translator(tmp_path / "run", preset="tiny", overrides=TINY, epochs=3, progress=False,
                                  on_record=seen.append)
    records = summary["validation"]
    assert [r["epoch"] for r in records] == [1, 2, 3] and seen == records
    assert [r["valid_bleu"] is None for r in records] == [True, False, True]  # bleu_every = 2
    assert 0 <= records[1]["valid_bleu"] <= 100
    assert all(r["valid_loss"] > 0 and r["train_loss"] > 0 for r in records)
    assert [r["step"] for r in records] == sorted(r["step"] for r in records) and records[-1]["step"] == summary["steps"]
    assert 0 < records[0]["minutes"] <= records[1]["minutes"] <= records[2]["minutes"]
    history = json.loads((tmp_path / "run" / "history.json").read_text())
    assert history["epochs"] == records


def test_a_resumed_run_keeps_its_records(tmp_path, monkeypatch):
    monkeypatch.setenv(data.DATA_ENV, str(write_corpus(tmp_path / "data")))
    straight = tl.train_translator(tmp_path / "a", preset="tiny", overrides=TINY, epochs=2, progress=False)
    tl.train_translator(tmp_path / "b", preset="tiny", overrides=TINY, epochs=1, progress=False)
    resumed = tl.train_translator(tmp_path / "b", resume=True, epochs=2, progress=False)
    # the validation measurements are the same; training-loss means may not be, since a run that stops logs its last
    # steps early (the short first run logged step 29, the straight run did not)
    keep = lambda records: [{k: r[k] for k in ("epoch", "step", "valid_loss", "valid_bleu")} for r in records]  # noqa: E731
    assert keep(resumed["validation"]) == keep(straight["validation"]) and len(resumed["validation"]) == 2


# ---- the epoch line, printed above the progress bar ----


def test_each_epoch_line_starts_a_line_of_its_own_above_the_progress_bar(tmp_path, monkeypatch):
    """stdout and stderr into one stream, as a terminal shows them: the bar (on stderr) never has an epoch line glued
    to its end, because the line is printed with tqdm.write, which clears the bar first."""
    monkeypatch.setenv(data.DATA_ENV, str(write_corpus(tmp_path / "data")))
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown), contextlib.redirect_stderr(shown):
        summary = tl.train_translator(tmp_path / "run", preset="tiny", overrides=TINY, epochs=2, progress=True)
    text = shown.getvalue()
    assert "training:" in text  # the bar was drawn into the same stream
    found = [(match.start(), match.group(1)) for match in re.finditer(r"epoch (\d+): step", text)]
    assert [epoch for _, epoch in found] == ["1", "2"], text
    for start, _ in found:
        assert start == 0 or text[start - 1] in "\r\n", repr(text[max(0, start - 80):start + 20])
    lines = [line for line in re.split(r"[\r\n]", text) if line.startswith("epoch ")]
    assert lines == [validation.epoch_line(record) for record in summary["validation"]]


def test_the_epoch_line_says_what_was_measured():
    record = {"epoch": 3, "step": 1234, "minutes": 2.345, "train_loss": 4.56789, "valid_loss": None, "valid_bleu": None}
    assert validation.epoch_line(record) == "epoch 3: step 1,234, 2.3 min, training loss 4.568"
    record.update(valid_loss=3.21, valid_bleu=12.345)
    assert validation.epoch_line(record) == ("epoch 3: step 1,234, 2.3 min, training loss 4.568, validation loss "
                                             "3.210, validation BLEU 12.35 (greedy)")


# ---- the validation sweep and the choice it leads to ----


def test_the_validation_sweep_decodes_each_weights_and_alpha_once_and_scores_each(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(data.DATA_ENV, str(write_corpus(tmp_path / "data")))
    folder = tmp_path / "run"
    tl.train_translator(folder, preset="tiny", overrides=TINY, epochs=2, progress=False)
    pairs = data.load_pairs("multi30k", "validation")
    sources, references = [src for src, _ in pairs], [tgt for _, tgt in pairs]
    capsys.readouterr()
    rows = tl.validation_sweep(folder, pairs, beam_size=2, alphas=(0.6, 1.0, 0.6), max_len=10, device="cpu",
                               progress=False)
    assert capsys.readouterr().out == ""  # progress=False prints nothing
    final = f"the final weights (step {tl.load_checkpoint(folder / 'checkpoint.pt')['state']['step']:,})"
    assert [(row["average_last"], row["weights"], row["alpha"]) for row in rows] == [
        (1, final, 0.6), (1, final, 1.0), (2, "the average of epochs 1-2", 0.6), (2, "the average of epochs 1-2", 1.0)]
    for row in rows:  # the default weights: the final ones and the average of the 2 epochs kept; each alpha once
        assert set(row) == {"average_last", "weights", "beam_size", "alpha", "scores", "hypotheses"}
        model, tokenizer = tl.load_translator(folder, "cpu", average_last=row["average_last"])
        assert row["beam_size"] == 2 and row["hypotheses"] == tl.translate(
            model, tokenizer, sources, beam_size=2, max_len=10, alpha=row["alpha"])
        assert row["scores"] == scoring.corpus_scores(row["hypotheses"], references)
    assert not (folder / ".lock").exists()  # the folder's lock, held during the sweep, is released

    greedy = tl.validation_sweep(folder, pairs, beam_size=1, average_lasts=[2, 1, 2], max_len=10, device="cpu")
    assert [(row["average_last"], row["alpha"]) for row in greedy] == [(2, 0.0), (1, 0.0)]  # no length penalty
    assert len([line for line in capsys.readouterr().out.splitlines() if "BLEU" in line]) == 2  # a line per row
    with pytest.raises(FileNotFoundError, match="average_last=3 averages the weights of the run's last 3 epochs"):
        tl.validation_sweep(folder, pairs, beam_size=1, average_lasts=[1, 3], max_len=10, device="cpu")


def test_best_decoding_takes_the_highest_bleu_and_the_first_of_equal_scores():
    rows = [{"name": name, "scores": {"bleu": bleu}} for name, bleu in (("a", 10.0), ("b", 12.5), ("c", 12.5),
                                                                         ("d", 12.4999))]
    assert tl.best_decoding(rows)["name"] == "b"
    assert tl.best_decoding(rows[::-1])["name"] == "c"
    assert tl.best_decoding([{"name": n, "scores": {"bleu": 7.0}} for n in "xyz"])["name"] == "x"
