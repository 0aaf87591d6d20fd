"""Chapter 8's recipe pieces: the loss history's windows, the weights kept at the end of epochs and their average,
the recorded decoding settings, the run's length, validation limits, and the checks at the library's doors."""

import json
import math
from pathlib import Path

import pytest
import sacrebleu
import torch

import transformer_lib as tl
from transformer_lib import data
from transformer_lib import runs
from transformer_lib import training
from transformer_lib import translation as tr
from transformer_lib.grading import grade_average_checkpoints

from copy_task import copy_batches, fresh
from test_translation import QUICK, quick_run, small_model, tiny_corpus


def test_history_entries_say_how_many_steps_their_mean_covers():
    # 23 steps logged every 10: the last entry is the mean of 3 steps, and says so (it used to look like 10).
    model, optimizer, scheduler = fresh()
    state = tl.train(model, lambda epoch: copy_batches(epoch), optimizer, scheduler, max_steps=23, log_every=10,
                     progress=False)
    assert [(step, n) for step, _, n in state.history] == [(10, 10), (20, 10), (23, 3)]
    assert all(math.isfinite(loss) for _, loss, _ in state.history)


def test_the_last_checkpoint_is_written_once(tmp_path, monkeypatch):
    writes = []
    real = training.save_checkpoint
    monkeypatch.setattr(training, "save_checkpoint", lambda path, *args: writes.append(path) or real(path, *args))
    model, optimizer, scheduler = fresh()
    # 4 batches an epoch: step 18 is in the middle of epoch 5, so nothing changes between its save and the end
    state = tl.train(model, lambda epoch: copy_batches(epoch), optimizer, scheduler, max_steps=18,
                     checkpoint_path=tmp_path / "c.pt", checkpoint_every=9, progress=False)
    assert len(writes) == 2  # steps 9 and 18; the final save found step 18 already written
    assert tl.load_checkpoint(tmp_path / "c.pt")["state"]["step"] == state.step == 18


def test_a_checkpoint_written_before_an_epoch_ended_is_written_again_after(tmp_path):
    # When a checkpoint step is also the last step of an epoch, on_epoch_end changes the state after that save.
    model, optimizer, scheduler = fresh()
    seen = []
    tl.train(model, copy_batches, optimizer, scheduler, max_steps=4, checkpoint_path=tmp_path / "c.pt",
             checkpoint_every=4, on_epoch_end=lambda state: seen.append(state.epoch) or state.epochs.append({"e": 1}),
             progress=False)
    saved = tl.load_checkpoint(tmp_path / "c.pt")["state"]
    assert seen == [1] and saved["epoch"] == 1 and saved["epochs"] == [{"e": 1}]


def test_average_checkpoints_passes_the_exercise_grader_and_refuses_nothing_to_average():
    grade_average_checkpoints(tl.average_checkpoints)
    with pytest.raises(ValueError, match="state_dicts is empty"):
        tl.average_checkpoints([])


def test_translate_refuses_the_text_of_a_special_token():
    model = small_model()
    tokenizer = tl.train_bpe_tokenizer(["ein hund", "eine katze"] * 5, vocab_size=30, min_frequency=1)
    with pytest.raises(ValueError, match="sentence 1 contains '<eos>'"):
        tr.translate(model, tokenizer, ["ein hund", "eine <eos> katze"])


def test_corpus_scores_refuses_strings_and_reports_sacrebleus_line():
    refs = [f"a dog runs in the park number {i} today" for i in range(100)]
    hyps = [f"a dog runs in the park {i}" for i in range(100)]
    with pytest.raises(TypeError, match="hypotheses must be a list of sentences, got one string"):
        tl.corpus_scores("a dog", refs)
    with pytest.raises(TypeError, match="references must be a list"):
        tl.corpus_scores(hyps, "a dog")
    scores = tl.corpus_scores(hyps, refs)
    reference = sacrebleu.metrics.BLEU().corpus_score(hyps, [refs])
    assert scores["bleu_line"] == str(reference) and scores["bleu"] == reference.score
    assert scores["ratio"] == reference.sys_len / reference.ref_len < 1
    assert scores["bp"] == pytest.approx(math.exp(1 - 1 / scores["ratio"]))  # BP = e^(1 - r/c) for short output


def test_epochs_keep_their_weights_and_the_average_is_what_loads(tmp_path, monkeypatch):
    monkeypatch.setenv(data.DATA_ENV, str(tiny_corpus(tmp_path / "data")))
    out = tmp_path / "run"
    summary = quick_run(out, max_steps=None, epochs=3, overrides={**QUICK, "training": {
        **QUICK["training"], "keep_checkpoints": 2}})
    assert summary["epochs"] == 3
    kept = tl.epoch_weights(out)
    assert [p.name for p in kept] == ["epoch-002.pt", "epoch-003.pt"]  # the newest 2; epoch-001.pt deleted
    states = [torch.load(p, weights_only=True)["model"] for p in kept]
    averaged, _ = tl.load_translator(out, "cpu", average_last=2)
    for name, value in averaged.state_dict().items():
        expected = (states[0][name] + states[1][name]) / 2 if value.is_floating_point() else states[1][name]
        torch.testing.assert_close(value, expected, rtol=0, atol=1e-7)
    final, _ = tl.load_translator(out, "cpu", average_last=1)
    assert any(not torch.equal(a, b) for a, b in zip(final.state_dict().values(), averaged.state_dict().values()))
    with pytest.raises(FileNotFoundError, match="average_last=3 needs the weights of the run's last 3 epochs"):
        tl.load_translator(out, "cpu", average_last=3)
    with pytest.raises(ValueError, match="average_last must be a positive integer"):
        tl.load_translator(out, "cpu", average_last=0)
    # overwrite removes the old run's epoch weights with its other files
    quick_run(out, overwrite=True, max_steps=1)
    assert tl.epoch_weights(out) == []


def test_a_damaged_or_foreign_epoch_file_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv(data.DATA_ENV, str(tiny_corpus(tmp_path / "data")))
    out = tmp_path / "run"
    quick_run(out, max_steps=None, epochs=2)
    newest = tl.epoch_weights(out)[-1]
    weights = torch.load(newest, weights_only=True)
    weights["model"][next(iter(weights["model"]))].add_(1.0)  # a changed weight: the checksum no longer fits
    torch.save(weights, newest)
    with pytest.raises(runs.CheckpointError, match="do not match the checksum"):
        tl.load_translator(out, "cpu", average_last=2)
    newest.write_bytes(b"not a checkpoint")
    with pytest.raises(runs.CheckpointError, match="epoch-002.pt is not a transformer_lib checkpoint"):
        tl.load_translator(out, "cpu", average_last=2)


def test_decoding_settings_come_from_decoding_json_then_the_preset_then_the_defaults(tmp_path, monkeypatch):
    monkeypatch.setenv(data.DATA_ENV, str(tiny_corpus(tmp_path / "data")))
    out = tmp_path / "run"
    quick_run(out, max_steps=None, epochs=2, overrides={**QUICK, "decoding": {"alpha": 1.0, "average_last": 2}})
    run = tl.load_checkpoint(out / "checkpoint.pt")["extra"]["run"]
    assert tl.decoding_settings(out, run) == {"beam_size": 4, "alpha": 1.0, "average_last": 2}
    assert tl.decoding_settings(out) == tr.DEFAULT_DECODING  # without the run record
    runs.write_decoding(out, {"beam_size": 2, "alpha": 0.8, "average_last": 1}, chosen_on="validation")
    assert tl.decoding_settings(out, run) == {"beam_size": 2, "alpha": 0.8, "average_last": 1}
    with pytest.raises(ValueError, match="setting decoding.alpha must be a number from 0"):
        quick_run(tmp_path / "other", overrides={"decoding": {"alpha": -1}})


def test_the_recorded_average_falls_back_to_the_final_weights_with_a_warning(tmp_path, monkeypatch):
    monkeypatch.setenv(data.DATA_ENV, str(tiny_corpus(tmp_path / "data")))
    out = tmp_path / "run"
    quick_run(out, max_steps=None, epochs=2, overrides={**QUICK, "decoding": {"average_last": 2}})
    for path in tl.epoch_weights(out):
        path.unlink()  # e.g. only checkpoint.pt was copied to another machine
    with pytest.warns(UserWarning, match="loading the final weights instead"):
        model, _ = tl.load_translator(out, "cpu")
    final = tl.load_checkpoint(out / "checkpoint.pt")["model"]
    assert all(torch.equal(a, final[name]) for name, a in model.state_dict().items())


def test_a_resumed_run_keeps_its_length_unless_given_a_new_one(tmp_path, monkeypatch):
    monkeypatch.setenv(data.DATA_ENV, str(tiny_corpus(tmp_path / "data")))
    out = tmp_path / "run"
    quick_run(out, max_steps=6)
    checkpoint = tl.load_checkpoint(out / "checkpoint.pt")
    assert checkpoint["extra"]["run"]["max_steps"] == 6
    # As if Ctrl-C had stopped it at step 4: the saved state goes back, the saved length stays 6.
    checkpoint["state"] = {**checkpoint["state"], "step": 4}
    path = out / "checkpoint.pt"
    model = tl.Transformer(tl.TransformerConfig(**checkpoint["config"]))
    model.load_state_dict(checkpoint["model"])
    optimizer, scheduler = tl.make_optimizer(model, model.cfg.d_model)
    optimizer.load_state_dict(checkpoint["optimizer"])
    scheduler.load_state_dict(checkpoint["scheduler"])
    state = training.TrainState(**{**checkpoint["state"], "history": [tuple(h) for h in checkpoint["state"]["history"]
                                                                      if h[0] <= 4]})
    tl.save_checkpoint(path, model, optimizer, scheduler, None, state, checkpoint["extra"])
    assert tr.train_translator(out, resume=True, progress=False)["steps"] == 6  # not the preset's epochs
    assert tr.train_translator(out, resume=True, max_steps=8, progress=False)["steps"] == 8  # a new length is used
    assert tl.load_checkpoint(path)["extra"]["run"]["max_steps"] == 8


def test_validation_can_be_limited_or_skipped(tmp_path, monkeypatch):
    monkeypatch.setenv(data.DATA_ENV, str(tiny_corpus(tmp_path / "data", rows=80)))
    seen = []
    real = tr.validation_loss
    monkeypatch.setattr(tr, "validation_loss", lambda model, batches, eps: seen.append(
        sum(int((tgt != 0).any(dim=1).sum()) for _, tgt in batches)) or real(model, batches, eps))
    quick_run(tmp_path / "limited", max_steps=None, epochs=1, valid_limit=7)
    assert seen == [7]  # 7 validation pairs measured, not 80
    summary = quick_run(tmp_path / "skipped", max_steps=None, epochs=1, validate=False)
    assert seen == [7] and summary["validation"][0]["valid_loss"] is None
    assert summary["validation"][0]["train_loss"] is not None


def test_an_epochs_training_loss_weights_each_window_by_its_steps():
    state = training.TrainState(history=[(10, 4.0, 10), (20, 2.0, 10), (23, 1.0, 3)])
    hook_records = []
    run = {"settings": {"training": {"bleu_every": 0, "label_smoothing": 0.1, "max_tokens": 64},
                        "model": {"max_len": 16}}, "validate": False}
    on_epoch_end = tr.validation_hook(None, None, run, progress=False, on_record=hook_records.append)
    state.step, state.epoch = 23, 1
    on_epoch_end(state)
    assert hook_records[0]["train_loss"] == pytest.approx((40 + 20 + 3) / 23)  # not the mean of 4, 2 and 1


def test_a_training_folder_in_use_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv(data.DATA_ENV, str(tiny_corpus(tmp_path / "data")))
    out = tmp_path / "run"
    out.mkdir()
    import subprocess
    import sys
    import textwrap

    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from transformer_lib.runs import lock_run_folder
        with lock_run_folder({str(out)!r}):
            print("locked", flush=True)
            time.sleep(30)
        """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(runs.RunFolderInUseError):
            quick_run(out)
    finally:
        holder.kill()
        holder.wait()
    assert not (out / "checkpoint.pt").exists()


def test_training_pairs_with_an_empty_side_are_named(tmp_path, monkeypatch):
    from test_translation import write_multi30k

    rows = [{"de": "ein hund.", "en": "a dog."}, {"de": "", "en": "a cat."}] * 20
    monkeypatch.setenv(data.DATA_ENV, str(write_multi30k(tmp_path / "data", rows)))
    with pytest.warns(UserWarning, match="20 of the 40 training pairs of multi30k have an empty side"):
        quick_run(tmp_path / "run", max_steps=1)
    monkeypatch.setenv(data.DATA_ENV, str(write_multi30k(tmp_path / "empty", [{"de": " ", "en": "a"}] * 5)))
    with pytest.raises(ValueError, match="all 5 training pairs of multi30k have an empty side"):
        quick_run(tmp_path / "run2", max_steps=1)


def test_the_google_drive_cell_does_nothing_outside_colab_when_switched_on(capsys):
    # Chapter 8's optional cell, as a reader in Colab would switch it on; here google.colab does not exist.
    notebook = json.loads((Path(__file__).resolve().parents[1] / "book" / "08_translation.ipynb").read_text())
    [source] = ["".join(c["source"]) for c in notebook["cells"]
                if c["cell_type"] == "code" and "".join(c["source"]).startswith("USE_GOOGLE_DRIVE = False")]
    settings = {"run_dir": "runs/multi30k-cpu-de-en"}
    namespace = {"SETTINGS": settings}
    exec(source, namespace)  # off by default: nothing happens
    assert capsys.readouterr().out == "" and settings["run_dir"] == "runs/multi30k-cpu-de-en"
    exec(source.replace("USE_GOOGLE_DRIVE = False", "USE_GOOGLE_DRIVE = True", 1), namespace)
    assert "USE_GOOGLE_DRIVE is for Colab" in capsys.readouterr().out
    assert settings["run_dir"] == "runs/multi30k-cpu-de-en"


def test_resuming_training_removes_the_decoding_chosen_for_the_older_weights(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(data.DATA_ENV, str(tiny_corpus(tmp_path / "data")))
    out = tmp_path / "run"
    quick_run(out, max_steps=None, epochs=1)
    chosen = {"beam_size": 2, "alpha": 0.8, "average_last": 1}
    runs.write_decoding(out, chosen, chosen_on="validation")
    quick_run(out, max_steps=None, epochs=1, resume=True)  # nothing left to train: the weights stay, and so does it
    assert tl.decoding_settings(out) == chosen
    capsys.readouterr()
    quick_run(out, max_steps=None, epochs=2, resume=True)  # one more epoch changes the weights it was chosen for
    assert not (out / runs.DECODING_FILE).exists()
    assert "removed" in capsys.readouterr().out and tl.decoding_settings(out) == tr.DEFAULT_DECODING
