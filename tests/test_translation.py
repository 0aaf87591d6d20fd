import json
import math
import os
import random
import re
from pathlib import Path

import pytest
import sacrebleu
import torch

import transformer_lib as tl
from transformer_lib import recipe
from transformer_lib import data
from transformer_lib import scoring
from transformer_lib import translation as tr

DATA = Path(os.environ.get("TRANSFORMER_LIB_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


def write_multi30k(folder: Path, rows: list[dict]) -> Path:
    (folder / "multi30k").mkdir(parents=True)
    for split in data.SPLITS:
        with open(folder / "multi30k" / f"{split}.jsonl", "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return folder


def small_model():
    torch.manual_seed(0)
    cfg = tl.TransformerConfig(src_vocab_size=30, tgt_vocab_size=30, d_model=32, n_heads=4, n_layers=2, d_ff=64,
                               dropout=0.0, max_len=40)
    return tl.Transformer(cfg).eval()


def test_scores_use_sacrebleu_with_signatures_and_refuse_tiny_sets():
    hyps = [f"a small dog runs on the grass number {i}" for i in range(120)]
    scores = scoring.corpus_scores(hyps, hyps)
    assert scores["bleu"] == pytest.approx(100.0) and scores["chrf"] == pytest.approx(100.0)
    assert scores["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    with pytest.raises(ValueError, match="BLEU on 2 sentences is noise"):
        scoring.corpus_scores(hyps[:2], hyps[:2])
    with pytest.raises(ValueError, match="120 hypotheses but 119 references"):
        scoring.corpus_scores(hyps, hyps[:-1])


def test_tiny_end_to_end_run_on_offline_multi30k(tmp_path, monkeypatch):
    if not (DATA / "multi30k" / "train.jsonl").is_file():
        pytest.skip(f"the offline Multi30k copy is not at {DATA}")
    monkeypatch.setenv(data.DATA_ENV, str(DATA))
    summary = recipe.train_translator(tmp_path, preset="tiny", train_limit=2000, max_steps=120, progress=False)
    losses = [loss for _, loss, _ in summary["history"]]
    assert losses[-1] < 0.75 * losses[0], losses
    assert (tmp_path / "checkpoint.pt").is_file() and (tmp_path / "tokenizer.json").is_file()
    model, tokenizer = tr.load_translator(tmp_path)
    assert not model.training
    pairs = data.load_pairs("multi30k", "test")
    hyps = tr.translate(model, tokenizer, [s for s, _ in pairs[:150]], beam_size=1)
    scores = scoring.corpus_scores(hyps, [t for _, t in pairs[:150]])
    references = [t for _, t in pairs[:150]]
    assert scores["sentences"] == 150
    # sacreBLEU's scores of these translations against their references (not the other way round: chrF weighs
    # recall twice as much as precision, so swapping the two sides changes it).
    assert scores["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [references]).score)
    assert scores["chrf"] == pytest.approx(sacrebleu.corpus_chrf(hyps, [references]).score)
    assert scores["chrf"] != pytest.approx(sacrebleu.corpus_chrf(references, [hyps]).score)
    assert all(isinstance(h, str) for h in hyps)


# ---- reliability of a run: its folder, its settings, a diverged run ----

WORDS = ["Hund", "Katze", "Mann", "Frau", "läuft", "spielt", "im", "Park", "auf", "der", "Straße", "schnell"]
ENGLISH = ["dog", "cat", "man", "woman", "runs", "plays", "in", "park", "on", "the", "street", "fast"]


def tiny_corpus(folder: Path, rows: int = 60) -> Path:
    """A made-up Multi30k folder of short sentences: enough for a few training steps in seconds."""
    generator = random.Random(0)
    data = []
    for _ in range(rows):
        picks = [generator.randrange(len(WORDS)) for _ in range(generator.randint(2, 6))]
        data.append({"de": " ".join(WORDS[i] for i in picks) + ".", "en": " ".join(ENGLISH[i] for i in picks) + "."})
    return write_multi30k(folder, data)


QUICK = {"model": {"d_model": 32, "n_heads": 2, "n_layers": 1, "d_ff": 64, "max_len": 32},
         "training": {"vocab_size": 60, "max_tokens": 256, "checkpoint_every": 1}}


def quick_run(out: Path, **kwargs) -> dict:
    return recipe.train_translator(out, preset="tiny", overrides=kwargs.pop("overrides", QUICK), max_steps=kwargs.pop(
        "max_steps", 3), progress=False, **kwargs)


def test_a_finished_run_is_refused_resumed_or_overwritten_but_never_silently_replaced(tmp_path, monkeypatch):
    monkeypatch.setenv(data.DATA_ENV, str(tiny_corpus(tmp_path / "data")))
    out = tmp_path / "run"
    quick_run(out)
    before = (out / "checkpoint.pt").read_bytes()
    with pytest.raises(FileExistsError, match="already holds a run"):
        quick_run(out)
    assert (out / "checkpoint.pt").read_bytes() == before
    with pytest.raises(ValueError, match=r"seed=5 \(the run has 0\) would be ignored"):
        recipe.train_translator(out, resume=True, seed=5, max_steps=4, progress=False)
    assert recipe.train_translator(out, resume=True, max_steps=4, progress=False)["steps"] == 4
    summary = quick_run(out, overwrite=True, max_steps=2)
    assert summary["steps"] == 2 and tl.load_checkpoint(out / "checkpoint.pt")["state"]["step"] == 2
    history = json.loads((out / "history.json").read_text(encoding="utf-8"))  # strict JSON
    assert history["train_loss"][-1][0] == 2
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint.pt", "history.json", "tokenizer.json"]


def test_bad_settings_are_refused_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.setenv(data.DATA_ENV, str(tiny_corpus(tmp_path / "data")))
    for overrides, message in [({"training": {"lr": 0.1}}, "did you mean 'lr_factor'"),
                               ({"training": {"warmup": 0}}, "training.warmup must be a positive integer"),
                               ({"model": {"norm_first": "no"}}, "model.norm_first must be True or False")]:
        with pytest.raises(ValueError, match=message):
            quick_run(tmp_path / "run", overrides=overrides)
        assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match="preset must be one of"):
        recipe.resolve_settings("huge")


def test_a_diverged_run_stops_with_a_clear_error_and_keeps_its_last_good_checkpoint(tmp_path, monkeypatch):
    import transformer_lib.training as training

    monkeypatch.setenv(data.DATA_ENV, str(tiny_corpus(tmp_path / "data")))
    calls, original = [], training.translation_loss

    def diverging_loss(*args, **kwargs):  # what a far too high learning rate does, made certain: NaN from step 3
        calls.append(1)
        loss = original(*args, **kwargs)
        return loss * float("nan") if len(calls) >= 3 else loss

    monkeypatch.setattr(training, "translation_loss", diverging_loss)
    out = tmp_path / "run"
    with pytest.raises(FloatingPointError, match="training diverged at step 3: the loss is nan"):
        quick_run(out, max_steps=10)  # QUICK writes a checkpoint after every step
    checkpoint = tl.load_checkpoint(out / "checkpoint.pt")
    assert checkpoint["state"]["step"] == 2
    assert all(torch.isfinite(t).all() for t in checkpoint["model"].values())


def test_empty_sentences_are_refused_and_a_toy_checkpoint_is_not_a_translator(tmp_path):
    model = small_model()
    tokenizer = tl.train_bpe_tokenizer(["ein hund", "eine katze"] * 5, vocab_size=30, min_frequency=1)
    with pytest.raises(ValueError, match="sentence 1 is empty or only spaces"):
        tr.translate(model, tokenizer, ["ein hund", "   "])
    optimizer, scheduler = tl.make_optimizer(model, 32)
    tl.save_checkpoint(tmp_path / "toy.pt", model, optimizer, scheduler, None, tl.TrainState())
    with pytest.raises(ValueError, match="toy.pt holds no run record and no tokenizer: it was not written by "
                                         "this version.s train_translator"):
        tr.load_translator(tmp_path / "toy.pt", "cpu")


def test_the_model_settings_may_untie_and_unscale_the_embeddings_and_a_loaded_run_keeps_them(tmp_path, monkeypatch):
    # The ablations measure what tying and the sqrt(d_model) scale are worth: the settings must reach the model,
    # and the checkpoint must rebuild the same model, or the run would be scored as a different one.
    monkeypatch.setenv(data.DATA_ENV, str(tiny_corpus(tmp_path / "data")))
    quick_run(tmp_path / "paper", max_steps=2)
    paper, _ = tr.load_translator(tmp_path / "paper", device="cpu")
    assert paper.generator.weight is paper.tgt_embed.lookup.weight and paper.src_embed is paper.tgt_embed
    assert paper.src_embed.scale == math.sqrt(QUICK["model"]["d_model"])
    overrides = {"model": {**QUICK["model"], "tie_embeddings": False, "scale_embeddings": False},
                 "training": QUICK["training"]}
    quick_run(tmp_path / "variant", overrides=overrides, max_steps=2)
    variant, _ = tr.load_translator(tmp_path / "variant", device="cpu")
    assert variant.generator.weight is not variant.tgt_embed.lookup.weight
    assert variant.src_embed is variant.tgt_embed  # still one joint vocabulary, one embedding
    assert variant.src_embed.scale == 1.0
    ids = torch.tensor([[5, 6, 7]])
    assert torch.equal(variant.src_embed(ids), variant.src_embed.lookup(ids))
    with pytest.raises(ValueError, match=r"setting model.scale_embeddings must be True or False, got 'no'"):
        recipe.resolve_settings("tiny", {"model": {"scale_embeddings": "no"}})


# ---- sentences and lengths, checked at translate's door ----


def test_check_sentences_names_the_sentence_as_the_caller_does():
    tr.check_sentences(["Ein Hund.", "Eine Katze."])  # nothing to say: returns quietly
    with pytest.raises(ValueError, match=r"^sentence 1 is empty or only spaces; "):
        tr.check_sentences(["Ein Hund.", " \t"])  # by default the index in the list
    with pytest.raises(ValueError, match=r"^line 3 of standard input contains '<pad>', the text of a special token"):
        tr.check_sentences(["a", "b", "c <pad>"], ["line 1 of standard input", "line 2 of standard input",
                                                   "line 3 of standard input"])
    with pytest.raises(ValueError, match=r"^--src-file f.de: line 2 is empty"):
        tr.check_sentences(["a", ""], ["--src-file f.de: line 1", "--src-file f.de: line 2"])
    with pytest.raises(ValueError, match=r"^sentence 0 holds a lone surrogate, U\+DCFF, at character 4, which is "
                                         r"not text; give UTF-8 text$"):
        tr.check_sentences(["Ein\udcff Hund."])  # a byte 0xff read with errors="surrogateescape"


@pytest.mark.parametrize("batch_size", [0, -1, 2.5, True, "8"])
def test_translate_refuses_a_batch_size_that_is_not_a_count(batch_size):
    model = small_model()
    tokenizer = tl.train_bpe_tokenizer(["ein hund", "eine katze"] * 5, vocab_size=30, min_frequency=1)
    with pytest.raises(ValueError) as refused:
        tr.translate(model, tokenizer, ["ein hund"], batch_size=batch_size)
    assert str(refused.value) == (f"batch_size must be a positive integer (sentences decoded at once), got "
                                  f"{batch_size!r}")


@pytest.mark.parametrize("max_len", [40, 0, 2.5])
def test_beam_search_refuses_a_max_len_beyond_the_models_positions(max_len):
    with pytest.raises(ValueError, match=r"^max_len must be a positive integer of at most 39 for this model"):
        tl.beam_search(small_model(), torch.tensor([[5, 6, 7]]), max_len=max_len)


@pytest.mark.parametrize("max_len", [40, 1000, 0, -1, 2.5, True])
def test_translate_refuses_a_max_len_beyond_the_models_positions_in_one_line(max_len):
    model = small_model()  # max_len=40: <bos> and at most 39 tokens
    tokenizer = tl.train_bpe_tokenizer(["ein hund", "eine katze"] * 5, vocab_size=30, min_frequency=1)
    with pytest.raises(ValueError) as refused:
        tr.translate(model, tokenizer, ["ein hund"], max_len=max_len)
    assert str(refused.value) == ("max_len must be a positive integer of at most 39 for this model (its max_len is "
                                  f"40, and <bos> takes one position), got {max_len!r}")


def test_translate_accepts_every_max_len_the_positions_allow(monkeypatch):
    """max_len 1 and 39 (the model's 40 positions less <bos>) are taken, and each caps the tokens of the translation:
    beam search is asked for at most max_len tokens, gives no more, and the text is those tokens' (up to <eos>)."""
    model = small_model()
    tokenizer = tl.train_bpe_tokenizer(["ein hund", "eine katze"] * 5, vocab_size=30, min_frequency=1)
    searched = []

    def beam_search(*args, **kwargs):
        searched.append((kwargs["max_len"], tr_beam_search(*args, **kwargs)))
        return searched[-1][1]

    tr_beam_search = tr.beam_search
    monkeypatch.setattr(tr, "beam_search", beam_search)
    lengths = {}
    for max_len in (1, 39):
        [text] = tr.translate(model, tokenizer, ["ein hund"], beam_size=2, max_len=max_len)
        asked, out = searched[-1]
        assert asked == max_len and out.shape[0] == 1 and 1 <= out.shape[1] <= max_len
        assert text == tr.ids_to_text(out, tokenizer)[0]
        lengths[max_len] = out.shape[1]
    # the untrained model does not end with <eos> at once: 39 allows it more tokens than 1, so the cap is what binds
    assert lengths == {1: 1, 39: lengths[39]} and lengths[39] > 1


# ---- the weights a decoding uses: named, and only the run's own ----


def test_weights_label_names_the_final_weights_or_the_epochs_averaged(tmp_path):
    torch.save({"state": {"step": 1234, "epoch": 12}}, tmp_path / "checkpoint.pt")
    assert tr.weights_label(tmp_path, 1) == "the final weights (step 1,234)"
    assert tr.weights_label(tmp_path / "checkpoint.pt", 4) == "the average of epochs 9-12"
    assert tr.weights_label(tmp_path, 12) == "the average of epochs 1-12"


def epoch_run(folder: Path, epochs: int = 3, seed: int = 0) -> Path:
    """A quick run that keeps the weights of each of its epochs."""
    quick_run(folder, max_steps=None, epochs=epochs, seed=seed,
              overrides={**QUICK, "training": {**QUICK["training"], "keep_checkpoints": epochs}})
    return folder


def test_one_epoch_file_missing_in_the_middle_is_refused_not_skipped(tmp_path, monkeypatch):
    """With epoch-002.pt gone, "the last 3 epochs" would average epochs 1 and 3 without a word: refused in one line."""
    monkeypatch.setenv(data.DATA_ENV, str(tiny_corpus(tmp_path / "data")))
    out = epoch_run(tmp_path / "run")
    assert [p.name for p in tl.epoch_weights(out)] == ["epoch-001.pt", "epoch-002.pt", "epoch-003.pt"]
    tl.load_translator(out, "cpu", average_last=3)  # all three kept: it loads
    (out / "epoch-002.pt").unlink()
    for n in (3, 2):
        with pytest.raises(FileNotFoundError) as refused:
            tl.load_translator(out, "cpu", average_last=n)
        message = str(refused.value)
        assert message.startswith(f"average_last={n} averages the weights of the run's last {n} epochs, but the run "
                                  f"finished 3 epochs and {out} keeps those of epochs 1, 3; ")
        assert "\n" not in message
    assert tr.last_epochs(tl.load_checkpoint(out / "checkpoint.pt"), out, 1) == [3]
    with pytest.raises(FileNotFoundError, match=r"^average_last=1000000000000000000 averages the weights of the "):
        tr.last_epochs(tl.load_checkpoint(out / "checkpoint.pt"), out, 10**18)  # a line, not a list of 10**18
    tl.load_translator(out, "cpu", average_last=1)  # the final weights need no epoch file


def test_an_epoch_file_of_another_run_renamed_or_trained_further_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv(data.DATA_ENV, str(tiny_corpus(tmp_path / "data")))
    out, other = epoch_run(tmp_path / "run", epochs=2), epoch_run(tmp_path / "other", epochs=2, seed=1)
    mine = torch.load(out / "epoch-002.pt", weights_only=True)
    foreign = torch.load(other / "epoch-002.pt", weights_only=True)
    assert foreign["config"] == mine["config"] and foreign["step"] == mine["step"]  # the same shapes, the same step
    assert all(foreign["model"][name].shape == value.shape for name, value in mine["model"].items())
    assert foreign["run_id"] != mine["run_id"]
    checkpoint = tl.load_checkpoint(out / "checkpoint.pt")
    belong = f"does not belong to the run of its folder's checkpoint (run {mine['run_id']})"

    def refused(path: Path, contents: bytes) -> None:
        path.write_bytes(contents)
        with pytest.raises(tl.checkpoint_checks.CheckpointError, match=re.escape(f"{path} {belong}")):
            tl.load_translator(out, "cpu", average_last=2)
        with pytest.raises(tl.checkpoint_checks.CheckpointError, match=re.escape(belong)):
            tr.read_epoch_weights(path, checkpoint)

    original = (out / "epoch-002.pt").read_bytes()
    refused(out / "epoch-002.pt", (other / "epoch-002.pt").read_bytes())  # another run's, same shapes: refused
    refused(out / "epoch-002.pt", (out / "epoch-001.pt").read_bytes())  # epoch 1's weights under epoch 2's name
    further = {**mine, "step": mine["step"] + 1}  # weights of a later step than the checkpoint's
    further["checksum"] = tl.checkpoint_checks.weights_checksum(further)
    torch.save(further, tmp_path / "further.pt")
    refused(out / "epoch-002.pt", (tmp_path / "further.pt").read_bytes())
    for keys in ({**mine, "optimizer": {}}, {k: v for k, v in mine.items() if k != "run_id"}):  # EPOCH_KEYS, exactly
        torch.save(keys, out / "epoch-002.pt")
        with pytest.raises(tl.checkpoint_checks.CheckpointError, match="is not a file of epoch weights written by "
                                                                        "train_translator; remove it"):
            tl.load_translator(out, "cpu", average_last=2)
    (out / "epoch-002.pt").write_bytes(original)
    tl.load_translator(out, "cpu", average_last=2)  # its own file back: it loads
