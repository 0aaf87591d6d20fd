"""The graders of chapter 1's coding exercises (book/01_text_to_tensors.ipynb): segmenting a word with learned BPE
merges, and the scaled token embedding."""

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from .engine import _generator, _randint, _run


def grade_token_embedding(fn: Callable[..., Tensor], seed: int | None = None) -> None:
    """Check fn(ids, weight) -> scaled embeddings (..., d_model) against TokenEmbedding on fresh random ids."""
    from transformer_lib.embedding import TokenEmbedding

    g, seed = _generator(seed)

    def reference(ids: Tensor, weight: Tensor) -> Tensor:
        vocab_size, d_model = weight.shape
        with torch.random.fork_rng(devices=[]):  # the layer's random initialisation is overwritten below
            layer = TokenEmbedding(vocab_size, d_model)
        with torch.no_grad():
            layer.lookup.weight.copy_(weight)
            return layer(ids)  # (...) -> (..., d_model)

    cases = []
    sizes = [("a single token", (1,), 5, 4), ("a batch of 2 sentences", (2, 7), 50, 16),
             ("sentences of one token", (3, 1), 11, 8), ("ids with three dimensions", (2, 3, 4), 30, 32),
             ("a random size", (_randint(1, 4, g), _randint(1, 12, g)), _randint(2, 100, g), _randint(1, 64, g))]
    for note, shape, vocab_size, d_model in sizes:
        ids = torch.randint(0, vocab_size, shape, generator=g)
        ids.view(-1)[0] = vocab_size - 1  # the last row of the table is used
        cases.append((note, {"ids": ids, "weight": torch.randn(vocab_size, d_model, generator=g)}))
    cases.append(("ids that use only the first 10 of the table's 40 rows",
                  {"ids": torch.randint(0, 10, (2, 6), generator=g), "weight": torch.randn(40, 9, generator=g)}))

    def lookup(ids: Tensor, weight: Tensor) -> Tensor:
        return weight[ids]  # (...) -> (..., d_model)

    hints = {
        "the embeddings are not scaled: multiply them by sqrt(d_model)": lookup,
        "the embeddings are multiplied by d_model; the paper multiplies them by sqrt(d_model)":
            lambda ids, weight: lookup(ids, weight) * weight.size(1),
        "the embeddings are divided by sqrt(d_model) instead of multiplied by it":
            lambda ids, weight: lookup(ids, weight) / math.sqrt(weight.size(1)),
    }

    def diagnose(case: Mapping[str, Any], received: Any, expected: Any) -> str | None:
        if isinstance(received, Tensor) and received.shape[:-1] == case["ids"].shape and (
            received.size(-1) == case["weight"].size(0) != case["weight"].size(1)
        ):
            return ("Likely cause: the result still has one entry per word of the vocabulary (V); multiply the "
                    "one-hot vectors (..., V) by the table (V, d_model) to get (..., d_model).")
        return None

    def explain_crash(case: Mapping[str, Any], error: Exception) -> str | None:
        ids, weight = case["ids"], case["weight"]
        if isinstance(error, RuntimeError) and "cannot be multiplied" in str(error) and ids.max() + 1 < weight.size(0):
            return (f"F.one_hot(ids) without num_classes makes vectors of length ids.max() + 1 = {int(ids.max()) + 1} "
                    f"here, the largest id it happens to see, not one entry per row of the table "
                    f"(V = {weight.size(0)}); pass num_classes=weight.size(0).")
        return None

    _run("grade_token_embedding", fn, reference, cases, seed, hints=hints, diagnose=diagnose,
         explain_crash=explain_crash)


END = "</w>"  # the end-of-word marker of the merge loop in chapter 1, as in Sennrich et al. (2016)


def learn_merges(word_counts: Mapping[str, int], n_merges: int) -> list[tuple[str, str]]:
    """The merge loop of chapter 1: merge the most frequent adjacent pair, n_merges times (ties: the first seen)."""
    words = {tuple(word) + (END,): count for word, count in word_counts.items()}
    merges = []
    for _ in range(n_merges):
        pairs: dict[tuple[str, str], int] = {}
        for symbols, count in words.items():
            for pair in zip(symbols, symbols[1:]):
                pairs[pair] = pairs.get(pair, 0) + count
        if not pairs:
            break
        best = max(pairs, key=pairs.get)
        merges.append(best)
        words = {_merge(symbols, best): count for symbols, count in words.items()}
    return merges


def _merge(symbols: tuple[str, ...], pair: tuple[str, str]) -> tuple[str, ...]:
    out, i = [], 0
    while i < len(symbols):
        if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == pair:
            out.append(symbols[i] + symbols[i + 1])
            i += 2
        else:
            out.append(symbols[i])
            i += 1
    return tuple(out)


def _segment(word: str, merges: list[tuple[str, str]], order: str = "learned", end: bool = True,
             every: bool = True) -> list[str]:
    """Segment word with merges; the options reproduce known mistakes."""
    symbols = tuple(word) + ((END,) if end else ())
    if order == "leftmost":  # merge the leftmost known pair first, whatever its rank
        known = set(merges)
        while True:
            hit = next((p for p in zip(symbols, symbols[1:]) if p in known), None)
            if hit is None:
                return list(symbols)
            symbols = _merge(symbols, hit)
    for pair in merges:
        if every:
            symbols = _merge(symbols, pair)
        else:  # only the first occurrence of each pair
            for i in range(len(symbols) - 1):
                if (symbols[i], symbols[i + 1]) == pair:
                    symbols = symbols[:i] + (pair[0] + pair[1],) + symbols[i + 2:]
                    break
    return list(symbols)


def grade_bpe_segment(fn: Callable[..., list], seed: int | None = None) -> None:
    """Check fn(word, merges) -> the list of symbols BPE makes of word, applying merges in the order learned."""
    g, seed = _generator(seed)
    paper = learn_merges({"low": 5, "lower": 2, "newest": 6, "widest": 3}, 10)
    letters = "abcd"

    def random_word(low: int, high: int) -> str:
        return "".join(letters[_randint(0, len(letters) - 1, g)] for _ in range(_randint(low, high, g)))

    random_counts = {random_word(2, 7): _randint(1, 9, g) for _ in range(8)}
    random_merges = learn_merges(random_counts, _randint(4, 12, g))
    cases = [
        ("a word of the corpus", {"word": "newest", "merges": paper}),
        ("a new word: no merge makes it whole", {"word": "lowest", "merges": paper}),
        ("the order matters: the merges of 'es' and 'st' compete", {"word": "nest", "merges": paper}),
        ("a pair that occurs twice", {"word": "abab", "merges": [("a", "b"), ("ab", "ab")]}),
        ("a single letter", {"word": "w", "merges": paper}),
        ("no merges at all", {"word": "lower", "merges": []}),
        ("merges learned from random words", {"word": random_word(3, 9), "merges": random_merges}),
    ]
    hints = {
        "the merges are applied to the leftmost known pair first; apply them in the order they were learned, "
        "the first merge everywhere it fits, then the second, and so on":
            lambda word, merges: _segment(word, merges, order="leftmost"),
        "the end-of-word marker '</w>' is missing: the merge loop learned its merges on words that end in it":
            lambda word, merges: _segment(word, merges, end=False),
        "each merge is applied only where its pair first occurs; apply it at every place in the word":
            lambda word, merges: _segment(word, merges, every=False),
    }
    _run("grade_bpe_segment", fn, lambda word, merges: _segment(word, merges), cases, seed, hints=hints)
