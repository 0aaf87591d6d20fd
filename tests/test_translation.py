import json
import math
import os
import random
from pathlib import Path

import pytest
import sacrebleu
import torch

import transformer_lib as tl
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
    summary = tr.train_translator(tmp_path, preset="tiny", train_limit=2000, max_steps=120, progress=False)
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
    return tr.train_translator(out, preset="tiny", overrides=kwargs.pop("overrides", QUICK), max_steps=kwargs.pop(
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
        tr.train_translator(out, resume=True, seed=5, max_steps=4, progress=False)
    assert tr.train_translator(out, resume=True, max_steps=4, progress=False)["steps"] == 4
    summary = quick_run(out, overwrite=True, max_steps=2)
    assert summary["steps"] == 2 and tl.load_checkpoint(out / "checkpoint.pt")["state"]["step"] == 2
    history = json.loads((out / "history.json").read_text(encoding="utf-8"))  # strict JSON
    assert history["train_loss"][-1][0] == 2
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint.pt", "history.json", "tokenizer.json"]


def test_bad_settings_are_refused_before_anything_is_written(tmp_path, monkeypatch):
    monkeypatch.setenv(data.DATA_ENV, str(tiny_corpus(tmp_path / "data")))
    for overrides, message in [({"training": {"lr": 0.1}}, "did you mean 'lr_factor'"),
                               ({"training": {"warmup": 0}}, "training.warmup must be a positive integer"),
                               ({"model": {"norm_first": "no"}}, "model.norm_first must be true or false")]:
        with pytest.raises(ValueError, match=message):
            quick_run(tmp_path / "run", overrides=overrides)
        assert not (tmp_path / "run").exists()
    with pytest.raises(ValueError, match="preset must be one of"):
        tr.resolve_settings("huge")


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
    with pytest.raises(ValueError, match="without its tokenizer"):
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
    with pytest.raises(ValueError, match=r"setting model.scale_embeddings must be true or false, got 'no'"):
        tr.resolve_settings("tiny", {"model": {"scale_embeddings": "no"}})
