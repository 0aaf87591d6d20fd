"""The graders of chapter 1's coding exercises (book/01_text_to_tensors.ipynb): reading token ids back from their
scaled embeddings, and segmenting a word with learned BPE merges."""

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from .engine import _generator, _randint, _run


def _nearest_rows(vectors: Tensor, weight: Tensor, scale: bool = True) -> Tensor:
    """The id of the row of weight nearest to each vector (divided by sqrt(d_model) first when scale)."""
    x = vectors.double() / (math.sqrt(weight.size(1)) if scale else 1.0)  # (..., d_model)
    distance = (x.unsqueeze(-2) - weight.double()).pow(2).sum(-1)  # (..., 1, d_model) - (V, d_model) -> (..., V)
    return distance.argmin(dim=-1)  # (..., V) -> (...)


def grade_embedding_inverse(fn: Callable[..., Tensor], seed: int | None = None) -> None:
    """Check fn(vectors, weight) -> the ids (...) whose scaled embeddings weight[ids] * sqrt(d_model) are vectors."""
    g, seed = _generator(seed)

    def table(vocab_size: int, d_model: int) -> Tensor:
        weight = torch.randn(vocab_size, d_model, generator=g) * d_model**-0.5  # rows of length about 1, as in the book
        weight[0] = 0.0  # the <pad> row
        return weight

    def case(ids: Tensor, weight: Tensor) -> dict[str, Tensor]:
        return {"vectors": weight[ids] * math.sqrt(weight.size(1)), "weight": weight}  # (...) -> (..., d_model)

    cases = []
    for note, shape, vocab_size, d_model in [
        ("a batch of 2 sentences", (2, 7), 50, 16), ("a single token", (1,), 5, 4),
        ("ids with three dimensions", (2, 3, 4), 30, 8),
        ("a random size", (_randint(1, 4, g), _randint(1, 12, g)), _randint(3, 100, g), _randint(2, 64, g)),
    ]:
        weight = table(vocab_size, d_model)
        ids = torch.randint(1, vocab_size, shape, generator=g)
        ids.view(-1)[0] = vocab_size - 1  # the last row of the table is used
        cases.append((note, case(ids, weight)))
    weight = table(12, 8).roll(-1, dims=0)  # the row of zeros moves to id 11
    cases.append(("a row of zeros (id 11, like a <pad> row) among the ids",
                  case(torch.tensor([[3, 11, 11], [11, 7, 0]]), weight)))
    weight = table(20, 8)
    weight[5] *= 6.0  # one row six times longer than the others
    cases.append(("a table with one long row (id 5)", case(torch.arange(20).view(4, 5), weight)))
    weight = table(10, 9)
    weight[4] = 3.0 * weight[2]  # row 4 = sqrt(d_model) * row 2, so 3 * row 2 is row 4 itself
    cases.append(("row 4 is 3 = sqrt(d_model) times row 2", case(torch.tensor([2, 4, 2, 1]), weight)))

    hints = {
        "you picked the row with the largest dot product, the score of the tied output projection `h @ E.T`; a "
        "longer row can score higher than the token's own row: pick the nearest row (the smallest distance) instead":
            lambda vectors, weight: (vectors @ weight.T).argmax(dim=-1),
        "the vectors were compared with the rows without undoing the sqrt(d_model) scale; divide them by "
        "sqrt(d_model) first": lambda vectors, weight: _nearest_rows(vectors, weight, scale=False),
    }

    def diagnose(case: Mapping[str, Any], received: Any, expected: Any) -> str | None:
        if not (isinstance(received, Tensor) and received.shape == expected.shape and received.dtype == torch.long):
            return None
        weight, wrong = case["weight"], received != expected
        if not wrong.any() or not ((received >= 0) & (received < weight.size(0))).all():
            return None
        if (case["vectors"][wrong].norm(dim=-1) == 0).any():
            return ("Likely cause: a vector of zeros (the row of zeros, like <pad>) got another id. A comparison by "
                    "direction, such as cosine similarity, ignores length, and a vector of zeros has no direction: "
                    "compare distances.")
        cos = torch.nn.functional.cosine_similarity(weight[received[wrong]], weight[expected[wrong]], dim=-1)
        if (cos > 1 - 1e-4).any():
            return ("Likely cause: the id you return has a row in the same direction as the right one but of another "
                    "length. A comparison by direction, such as cosine similarity, cannot tell them apart: compare "
                    "distances.")
        return None

    _run("grade_embedding_inverse", fn, _nearest_rows, cases, seed, hints=hints, diagnose=diagnose)


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
        if order == "right to left":  # each merge applied scanning from the end of the word: "aaa" -> "a aa"
            out, i = list(symbols), len(symbols) - 2
            while i >= 0:
                if (out[i], out[i + 1]) == pair:
                    out[i : i + 2] = [pair[0] + pair[1]]
                i -= 1
            symbols = tuple(out)
        elif every:
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
        ("a run of three equal letters: the merge (a, a) takes the first two",
         {"word": "aaab", "merges": [("a", "a"), ("aa", "b")]}),
    ]
    hints = {
        "the merges are applied to the leftmost known pair first; apply them in the order they were learned, "
        "the first merge everywhere it fits, then the second, and so on":
            lambda word, merges: _segment(word, merges, order="leftmost"),
        "the end-of-word marker '</w>' is missing: the merge loop learned its merges on words that end in it":
            lambda word, merges: _segment(word, merges, end=False),
        "each merge is applied only where its pair first occurs; apply it at every place in the word":
            lambda word, merges: _segment(word, merges, every=False),
        "each merge is applied from the right end of the word; apply it from left to right, as the merge loop "
        "does: (a, a) makes 'aa a' of 'aaa', not 'a aa'":
            lambda word, merges: _segment(word, merges, order="right to left"),
    }
    _run("grade_bpe_segment", fn, lambda word, merges: _segment(word, merges), cases, seed, hints=hints)
