"""The corpora (transformer_lib.data): load_pairs on a local folder, on the shared offline copy and on the Hub's
schemas (Multi30k's columns, opus_books's fixed held-out splits), the arguments, folders and files it refuses and the
message when the Hub is out of reach; then encode_pairs and token_budget_batches: too long pairs counted, not cut,
and every pair in exactly one batch."""

import os
import subprocess
import sys

import pytest
import torch

import transformer_lib as tl
from transformer_lib import data

from test_translation import DATA, write_multi30k


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
