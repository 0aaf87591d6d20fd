"""The named check of chapter 4's coding exercise (book/04_masking.ipynb): the mask of a packed batch (several
sentences in one row)."""

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from .engine import _generator, _randint, _run


def _packed_segments(lengths: Sequence[Sequence[int]], g: torch.Generator, first_id: int = 1) -> Tensor:
    """Sentence ids (B, T) for rows packed with sentences of the given lengths: 0 = padding, equal ids = one sentence."""
    size = max(max(sum(row), 1) for row in lengths)
    segments = torch.zeros(len(lengths), size, dtype=torch.long)  # (B, T)
    for b, row in enumerate(lengths):
        start, sentence = 0, first_id + _randint(0, 3, g)
        for length in row:
            segments[b, start : start + length] = sentence
            start, sentence = start + length, sentence + 1 + _randint(0, 2, g)
    return segments


def _packed_causal_mask(segments: Tensor) -> Tensor:
    """The reference: True where key j is real, in the same sentence as query i, and j <= i; (B, T) -> (B, 1, T, T)."""
    size = segments.size(1)
    same = segments[:, :, None] == segments[:, None, :]  # (B, T, T): query i and key j in one sentence
    real = (segments != 0)[:, None, :]  # (B, 1, T): the key is not padding
    causal = torch.ones(size, size, dtype=torch.bool, device=segments.device).tril()  # (T, T)
    return (same & real & causal)[:, None]  # (B, 1, T, T)


def grade_packed_mask(fn: Callable[[Tensor], Tensor], seed: int | None = None) -> None:
    """Check fn(segments) -> the (B, 1, T, T) bool mask of a packed batch: same sentence, real key, no future."""
    g, seed = _generator(seed)
    layouts = [
        ("two sentences in one row", [[3, 4]]),
        ("one sentence per row, padded: the ordinary target mask", [[5], [2]]),
        ("three sentences and padding", [[2, 1, 3], [4, 2]]),
        ("a row of padding only", [[3, 3], []]),
        ("a single position", [[1]]),
        ("sentence ids that do not start at 1", [[2, 2, 2]]),
        ("a random batch", [[_randint(1, 4, g) for _ in range(_randint(1, 4, g))] for _ in range(_randint(1, 4, g))]),
    ]
    cases = [(note, {"segments": _packed_segments(rows, g, first_id=5 if "not start" in note else 1)})
             for note, rows in layouts]

    def square(segments: Tensor) -> Tensor:
        return torch.ones(segments.size(1), segments.size(1), dtype=torch.bool)

    def same(segments: Tensor) -> Tensor:
        return segments[:, :, None] == segments[:, None, :]  # (B, T, T)

    def real(segments: Tensor) -> Tensor:
        return (segments != 0)[:, None, :]  # (B, 1, T)

    hints = {
        "the sentences are ignored: a query must not see the keys of another sentence packed into its row "
        "(compare the sentence id of the query, segments[:, :, None], with that of the key, segments[:, None, :])":
            lambda segments: (real(segments) & square(segments).tril())[:, None],
        "the causal part is missing: within its sentence, a query must not see later positions (add & tril)":
            lambda segments: (same(segments) & real(segments))[:, None],
        "padded keys are allowed: the padded positions of a row share the id 0 and see one another; "
        "also require segments != 0 for the key":
            lambda segments: (same(segments) & square(segments).tril())[:, None],
        "the future is allowed and the past hidden: keep the lower triangle (tril), not the upper one (triu)":
            lambda segments: (same(segments) & real(segments) & square(segments).triu())[:, None],
        "the diagonal is excluded: a position must be allowed to attend to itself (tril with diagonal=0)":
            lambda segments: (same(segments) & real(segments) & square(segments).tril(-1))[:, None],
        "the mask is inverted: here True must mean 'may attend', the convention of "
        "torch.nn.functional.scaled_dot_product_attention":
            lambda segments: ~_packed_causal_mask(segments),
        "the singleton head dimension is missing: return (B, 1, T, T), e.g. mask[:, None]":
            lambda segments: _packed_causal_mask(segments)[:, 0],
    }
    _run("grade_packed_mask", fn, _packed_causal_mask, cases, seed, hints=hints, masks=True)
