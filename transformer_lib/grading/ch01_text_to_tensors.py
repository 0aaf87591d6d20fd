"""The named check of chapter 1's coding exercise (book/01_text_to_tensors.ipynb): the scaled token embedding."""

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
