import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
import sacrebleu
import torch

import transformer_lib as tl
from transformer_lib import data
from transformer_lib import decoding
from transformer_lib import scoring
from transformer_lib import translation as tr
from transformer_lib.decoding import greedy_decode

DATA = Path(os.environ.get("TRANSFORMER_LIB_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))


def write_multi30k(folder: Path, rows: list[dict]) -> Path:
    (folder / "multi30k").mkdir(parents=True)
    for split in data.SPLITS:
        with open(folder / "multi30k" / f"{split}.jsonl", "w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
    return folder


def test_local_multi30k_folder_in_either_direction(tmp_path, monkeypatch):
    rows = [{"en": "A dog runs.", "de": "Ein Hund läuft."}, {"en": "Two cats.", "de": "Zwei Katzen."}]
    monkeypatch.setenv(data.DATA_ENV, str(write_multi30k(tmp_path, rows)))
    assert data.load_pairs("multi30k", "train", "de", "en") == [("Ein Hund läuft.", "A dog runs."), ("Zwei Katzen.", "Two cats.")]
    assert data.load_pairs("multi30k", "test", "en", "de")[0] == ("A dog runs.", "Ein Hund läuft.")


def test_the_shared_offline_copy_has_every_split(monkeypatch):
    if not (DATA / "multi30k" / "test.jsonl").is_file():
        pytest.skip(f"the offline Multi30k copy is not at {DATA}")
    monkeypatch.setenv(data.DATA_ENV, str(DATA))
    sizes = {split: len(data.load_pairs("multi30k", split)) for split in data.SPLITS}
    assert sizes == {"train": 29000, "validation": 1014, "test": 1000}


def test_opus_books_schema_and_fixed_held_out_splits(monkeypatch):
    import datasets

    rows = [{"id": str(i), "translation": {"en": f"sentence {i}", "it": f"frase {i}"}} for i in range(2500)]
    calls = []

    def fake_load_dataset(path, name=None, split=None, **kwargs):
        calls.append((path, name, split))
        return datasets.Dataset.from_list(rows)

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    monkeypatch.delenv(data.DATA_ENV, raising=False)
    splits = {split: data.load_pairs("opus_books", split, "it", "en", config="en-it") for split in data.SPLITS}
    assert calls[0] == ("Helsinki-NLP/opus_books", "en-it", "train")
    assert splits["test"][0][0].startswith("frase") and splits["test"][0][1].startswith("sentence")
    assert [len(splits[s]) for s in data.SPLITS] == [500, 1000, 1000]
    every = sorted(pair for split in splits.values() for pair in split)
    assert every == sorted((r["translation"]["it"], r["translation"]["en"]) for r in rows)  # disjoint and complete
    assert splits == {split: data.load_pairs("opus_books", split, "it", "en", config="en-it") for split in data.SPLITS}


def test_multi30k_hub_id_and_columns(monkeypatch):
    import datasets

    calls = []

    def fake_load_dataset(path, name=None, split=None, **kwargs):
        calls.append((path, name, split))
        return datasets.Dataset.from_list([{"en": "Hello.", "de": "Hallo."}])

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    monkeypatch.delenv(data.DATA_ENV, raising=False)
    assert data.load_pairs("multi30k", "validation", "en", "de") == [("Hello.", "Hallo.")]
    assert calls == [("bentrevett/multi30k", None, "validation")]
    with pytest.raises(ValueError, match=r"language 'fr' is not a column.*\['en', 'de'\]"):
        data.load_pairs("multi30k", "validation", "fr", "en")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(corpus="wmt14"), "corpus must be one of"),
        (dict(split="dev"), "split must be one of"),
        (dict(src_lang="en", tgt_lang="en"), "must differ"),
        (dict(corpus="opus_books"), "opus_books needs config"),
    ],
)
def test_bad_loader_arguments(kwargs, message, monkeypatch):
    monkeypatch.delenv(data.DATA_ENV, raising=False)
    with pytest.raises(ValueError, match=message):
        data.load_pairs(**kwargs)


def test_a_folder_without_the_split_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv(data.DATA_ENV, str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"multi30k/train.jsonl"):
        data.load_pairs()


def test_unreachable_hub_says_both_ways_to_fix_it(tmp_path):
    code = "from transformer_lib.data import load_pairs; load_pairs('multi30k', 'test')"
    env = {k: v for k, v in os.environ.items() if k != data.DATA_ENV}
    env.update(HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(tmp_path))
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "could not load 'bentrevett/multi30k'" in result.stderr
    assert "connect to the internet" in result.stderr and "TRANSFORMER_LIB_DATA" in result.stderr


def test_every_pair_lands_in_exactly_one_batch_and_nothing_is_cut():
    torch.manual_seed(0)
    encoded = [([1] + [5] * int(n) + [2], [1] + [6] * int(m) + [2]) for n, m in torch.randint(1, 30, (500, 2))]
    for seed in (None, 0, 1):
        batches = data.token_budget_batches(encoded, max_tokens=256, seed=seed)
        seen = []
        for src, tgt in batches:
            assert src.numel() <= 256 and tgt.numel() <= 256
            for row_src, row_tgt in zip(src.tolist(), tgt.tolist()):
                seen.append((tuple(x for x in row_src if x != tl.PAD_ID), tuple(x for x in row_tgt if x != tl.PAD_ID)))
        assert sorted(seen) == sorted((tuple(s), tuple(t)) for s, t in encoded)
    assert [b[0].tolist() for b in data.token_budget_batches(encoded, 256, seed=3)] == [
        b[0].tolist() for b in data.token_budget_batches(encoded, 256, seed=3)
    ]
    with pytest.raises(ValueError, match="more than max_tokens=10"):
        data.token_budget_batches(encoded, max_tokens=10)


def test_too_long_pairs_are_counted_not_cut():
    tokenizer = tl.train_bpe_tokenizer(["a b c d e f g h"] * 5, vocab_size=30, min_frequency=1)
    pairs = [("a b", "c d"), ("a b c d e f g h a b c d", "e"), ("f", "g h")]
    kept, too_long = data.encode_pairs(pairs, tokenizer, max_len=8)
    assert too_long == 1 and len(kept) == 2
    assert all(src[0] == tl.BOS_ID and src[-1] == tl.EOS_ID for src, _ in kept)


def small_model():
    torch.manual_seed(0)
    cfg = tl.TransformerConfig(src_vocab_size=30, tgt_vocab_size=30, d_model=32, n_heads=4, n_layers=2, d_ff=64,
                               dropout=0.0, max_len=40)
    return tl.Transformer(cfg).eval()


def test_beam_size_one_equals_greedy_and_cache_changes_nothing():
    model = small_model()
    src = torch.randint(4, 30, (6, 9))
    src[2, 5:] = tl.PAD_ID
    greedy = greedy_decode(model, src, 15, tl.BOS_ID, tl.EOS_ID)
    beam1 = decoding.beam_search(model, src, beam_size=1, max_len=15)
    assert torch.equal(beam1, greedy[:, : beam1.size(1)])
    for k in (2, 4):
        assert torch.equal(decoding.beam_search(model, src, k, 15), decoding.beam_search(model, src, k, 15, use_cache=False))


def test_beam_search_uses_the_models_special_ids_not_the_defaults():
    """A model whose <pad>, <bos> and <eos> are not ids 0, 2, 3: beam 1 must still be greedy search, exactly."""
    torch.manual_seed(0)
    pad, bos, eos = 7, 5, 6
    model = tl.Transformer(tl.TransformerConfig(src_vocab_size=24, tgt_vocab_size=24, d_model=32, n_heads=4,
                                                n_layers=2, d_ff=64, dropout=0.1, max_len=48, pad_id=pad))
    src = torch.randint(8, 24, (4, 9))
    src[1, 6:] = pad  # one padded sentence
    greedy = greedy_decode(model, src, 20, bos, eos)
    for k in (1, 3):
        model.train()
        out = decoding.beam_search(model, src, beam_size=k, max_len=20, bos_id=bos, eos_id=eos)
        assert model.training, "beam_search must leave the model in the mode it found it"
        if k == 1:
            assert torch.equal(out, greedy)
        for row in out.tolist():  # after <eos> only the model's <pad>, never the default PAD_ID
            if eos in row:
                assert set(row[row.index(eos) + 1:]) <= {pad}
    with torch.no_grad():  # the special ids change the result: the defaults would start from another token
        assert not torch.equal(decoding.beam_search(model, src, beam_size=1, max_len=20), greedy)


def test_beam_search_finds_a_sequence_at_least_as_likely_as_greedy():
    model = small_model()
    src = torch.randint(4, 30, (8, 7))

    def log_prob(out):
        tgt = torch.cat([torch.full((out.size(0), 1), tl.BOS_ID), out], dim=1)
        logits = model(src, tgt[:, :-1]).log_softmax(-1)
        token_lp = logits.gather(-1, tgt[:, 1:, None])[..., 0]
        return token_lp.masked_fill(tgt[:, 1:] == tl.PAD_ID, 0).sum(-1)

    greedy = decoding.beam_search(model, src, 1, 12, alpha=0.0)
    beam = decoding.beam_search(model, src, 5, 12, alpha=0.0)
    assert (log_prob(beam) >= log_prob(greedy) - 1e-4).all()


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


# ---- reliability of a run: its folder, its settings, a diverged run, bad data ----

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


@pytest.mark.parametrize(
    "content, message",
    [(b"", "is empty"), ('{"de": "M\u00e4dchen.", "en": "Girl."}\n'.encode("latin-1"), "is not UTF-8 text"),
     (b'{"de": null, "en": "A dog."}\n', "row 0 of the corpus has de=None")],
)
def test_bad_corpus_files_are_named(tmp_path, monkeypatch, content, message):
    (tmp_path / "multi30k").mkdir()
    for split in data.SPLITS:
        (tmp_path / "multi30k" / f"{split}.jsonl").write_bytes(content)
    monkeypatch.setenv(data.DATA_ENV, str(tmp_path))
    with pytest.raises(ValueError, match=message):
        data.load_pairs("multi30k", "train")


def test_empty_sentences_are_refused_and_a_toy_checkpoint_is_not_a_translator(tmp_path):
    model = small_model()
    tokenizer = tl.train_bpe_tokenizer(["ein hund", "eine katze"] * 5, vocab_size=30, min_frequency=1)
    with pytest.raises(ValueError, match="sentence 1 is empty or only spaces"):
        tr.translate(model, tokenizer, ["ein hund", "   "])
    optimizer, scheduler = tl.make_optimizer(model, 32)
    tl.save_checkpoint(tmp_path / "toy.pt", model, optimizer, scheduler, None, tl.TrainState())
    with pytest.raises(ValueError, match="without its tokenizer"):
        tr.load_translator(tmp_path / "toy.pt", "cpu")


def test_decode_step_refuses_a_cache_or_memory_that_does_not_fit():
    torch.manual_seed(0)
    model = tl.Transformer(tl.TransformerConfig(src_vocab_size=20, tgt_vocab_size=20, d_model=16, n_heads=2,
                                                n_layers=2, d_ff=32, dropout=0.0)).eval()
    src = torch.randint(4, 20, (3, 5))
    src_mask = tl.padding_mask(src, 0)
    memory = model.encode(src, src_mask)
    bos = torch.full((3, 1), tl.BOS_ID)
    with pytest.raises(ValueError, match=r"cache holds 3 layers but the decoder has 2; expected KVCache\(len"):
        tl.decode_step(model, bos, memory, src_mask, tl.KVCache(3))
    with pytest.raises(ValueError, match=r"same batch size, got shapes \(2, 1\) and \(3, 5, 16\)"):
        tl.decode_step(model, bos[:2], memory, src_mask, tl.KVCache(2))
    cache = tl.KVCache(2)
    assert tl.decode_step(model, bos, memory, src_mask, cache).shape == (3, 1, 20) and cache.length == 1


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
