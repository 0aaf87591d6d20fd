"""The offline stand-in for opus_books en-it (tests/fixtures/opus_books) through the book's loader, the word-level
tokenizer on it, and a tiny end-to-end training run with each tokenizer; the word-level tokenizer as a training
setting, and a local opus_books file."""

import json
from pathlib import Path

import pytest

import transformer_lib as tl
from transformer_lib import data
from transformer_lib.embedding import train_bpe_tokenizer, train_word_tokenizer
from transformer_lib.data import load_pairs
from transformer_lib.scoring import corpus_scores
from transformer_lib.translation import load_translator

from test_validation import TINY, write_corpus

FIXTURES = Path(__file__).resolve().parent / "fixtures"


@pytest.fixture
def fixture_data(monkeypatch):
    monkeypatch.setenv("TRANSFORMER_LIB_DATA", str(FIXTURES))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # should the loader ever reach for the Hub, fail at once
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")


def test_the_loader_reads_the_stand_in_and_holds_out_fixed_disjoint_sets(fixture_data):
    splits = {split: load_pairs("opus_books", split, src_lang="en", tgt_lang="it", config="en-it")
              for split in ("train", "validation", "test")}
    assert {split: len(pairs) for split, pairs in splits.items()} == {"train": 1000, "validation": 1000, "test": 1000}
    assert not set(splits["train"]) & set(splits["test"]) and not set(splits["validation"]) & set(splits["test"])
    assert splits["test"] == load_pairs("opus_books", "test", src_lang="en", tgt_lang="it", config="en-it")
    english, italian = splits["train"][0]
    assert english.endswith((".", "?")) and italian.endswith((".", "?")) and english != italian
    reversed_pairs = load_pairs("opus_books", "test", src_lang="it", tgt_lang="en", config="en-it")
    assert reversed_pairs == [(it, en) for en, it in splits["test"]]


def test_word_tokenizer_round_trip_and_unknown_words(fixture_data):
    train = load_pairs("opus_books", "train", src_lang="en", tgt_lang="it", config="en-it")
    texts = [text for pair in train for text in pair]
    tokenizer = train_word_tokenizer(texts, vocab_size=1000)
    vocab = tokenizer.get_vocab()
    # Round trip: a sentence of known words decodes to its words and punctuation marks joined by spaces.
    encoding = tokenizer.encode("L'uomo vede il cane.")
    assert encoding.ids[0] == tl.BOS_ID and encoding.ids[-1] == tl.EOS_ID and tl.UNK_ID not in encoding.ids
    assert tokenizer.decode(encoding.ids, skip_special_tokens=True) == "L ' uomo vede il cane ."
    # <unk> rate: exactly one <unk> per word outside the vocabulary, and a word seen once in training is outside.
    counts: dict[str, int] = {}
    for text in texts:
        for word, _ in tokenizer.pre_tokenizer.pre_tokenize_str(text):
            counts[word] = counts.get(word, 0) + 1
    rare = sorted(word for word, n in counts.items() if n == 1)
    assert rare and not set(rare) & set(vocab)  # min_frequency=2
    test = [text for pair in load_pairs("opus_books", "test", "en", "it", "en-it") for text in pair]
    encodings = tokenizer.encode_batch(test)
    unknown = sum(e.ids.count(tl.UNK_ID) for e in encodings)
    missing = sum(word not in vocab for text in test for word, _ in tokenizer.pre_tokenizer.pre_tokenize_str(text))
    assert unknown == missing > 0
    assert 0 < unknown / sum(len(e.ids) - 2 for e in encodings) < 0.1  # the first names, a small share
    # BPE on the same texts: an <unk> only for a character never seen in training, one per occurrence.
    bpe = train_bpe_tokenizer(texts, vocab_size=1000)
    assert sum(bpe.encode(text).ids.count(tl.UNK_ID) for text in test) == 0
    assert bpe.encode("Marco vede ж e ж.").ids.count(tl.UNK_ID) == 2


@pytest.mark.parametrize("kind", ["bpe", "word"])
def test_a_tiny_training_run_on_the_stand_in_end_to_end(fixture_data, tmp_path, kind):
    overrides = {"model": {"n_layers": 1, "d_ff": 64}, "training": {"tokenizer": kind, "bleu_every": 0}}
    result = tl.train_translator(tmp_path, corpus="opus_books", src_lang="en", tgt_lang="it", corpus_config="en-it",
                                 preset="tiny", overrides=overrides, max_steps=6, progress=False)
    assert result["steps"] == 6 and result["pairs"] == 1000
    model, tokenizer = load_translator(tmp_path, device="cpu")
    assert ("<unk>" in tokenizer.get_vocab()) and (tokenizer.get_vocab_size() < 1000 if kind == "word" else True)
    test = load_pairs("opus_books", "test", src_lang="en", tgt_lang="it", config="en-it")[:100]
    hypotheses = tl.translate(model, tokenizer, [src for src, _ in test], beam_size=1, max_len=8)
    scores = corpus_scores(hypotheses, [tgt for _, tgt in test])
    assert scores["sentences"] == 100 and 0.0 <= scores["bleu"] <= 100.0


# ---- the word-level tokenizer as a training setting, and a local opus_books file ----


def test_the_word_level_tokenizer_is_a_training_setting(tmp_path, monkeypatch):
    monkeypatch.setenv(data.DATA_ENV, str(write_corpus(tmp_path / "data")))
    overrides = {"model": TINY["model"], "training": {**TINY["training"], "tokenizer": "word", "bleu_every": 0}}
    tl.train_translator(tmp_path / "run", preset="tiny", overrides=overrides, max_steps=3, progress=False)
    _, tokenizer = tl.load_translator(tmp_path / "run", "cpu")
    assert tokenizer.encode("Ein Hund läuft .").tokens == ["<bos>", "Ein", "Hund", "läuft", ".", "<eos>"]
    assert tokenizer.encode("Ein Elefant läuft .").ids.count(tl.UNK_ID) == 1  # an unseen word is <unk>, not spelled


def test_word_tokenizer_refuses_a_vocabulary_without_room():
    with pytest.raises(ValueError, match="vocab_size must exceed"):
        tl.train_word_tokenizer(["a b"], vocab_size=4)


def test_opus_books_reads_a_local_file(tmp_path, monkeypatch):
    rows = [{"id": str(i), "translation": {"en": f"sentence {i}", "it": f"frase {i}"}} for i in range(2100)]
    (tmp_path / "opus_books").mkdir()
    (tmp_path / "opus_books" / "en-it.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    monkeypatch.setenv(data.DATA_ENV, str(tmp_path))
    test = data.load_pairs("opus_books", "test", "en", "it", config="en-it")
    assert len(test) == 1000 and test[0][0].startswith("sentence") and test[0][1].startswith("frase")
