"""The named check of chapter 9's coding exercise (book/09_attention_heatmaps.ipynb): attention rollout."""

from collections.abc import Callable

import torch
from torch import Tensor

from .engine import _generator, _randint, _run


def _rollout(weights: Tensor, identity_share: float = 0.5, renormalise: bool = True, reverse: bool = False) -> Tensor:
    """Attention rollout of (L, S, S) weights, layer 1 first -> (S, S); the options give the usual mistakes."""
    identity = torch.eye(weights.size(-1), dtype=weights.dtype, device=weights.device)  # (S, S)
    rollout = identity
    for attention in weights:  # (S, S) each
        mixed = (1 - identity_share) * attention + identity_share * identity
        if renormalise:
            mixed = mixed / mixed.sum(dim=-1, keepdim=True)
        rollout = rollout @ mixed if reverse else mixed @ rollout  # (S, S)
    return rollout


def grade_attention_rollout(fn: Callable[[Tensor], Tensor], seed: int | None = None) -> None:
    """Check fn(weights) -> (S, S) attention rollout of (L, S, S) head-averaged weights, on fresh random weights."""
    g, seed = _generator(seed)

    def weights(layers: int, size: int, shrink: bool = False, dtype: torch.dtype = torch.float32) -> dict:
        w = torch.softmax(2 * torch.randn(layers, size, size, generator=g, dtype=torch.float64), dim=-1)
        if shrink:  # rows that sum to less than 1, as when some keys were dropped before averaging
            w = w * (0.3 + 0.7 * torch.rand(layers, size, 1, generator=g, dtype=torch.float64))
        return {"weights": w.to(dtype)}

    cases = [
        ("3 layers, rows summing to 1", weights(3, 5)),
        ("a single layer", weights(1, 4)),
        ("rows summing to less than 1", weights(4, 6, shrink=True)),
        ("a single source piece", weights(2, 1)),
        ("float64, rows summing to less than 1", weights(3, 7, shrink=True, dtype=torch.float64)),
        ("a random size", weights(_randint(2, 6, g), _randint(2, 9, g), shrink=True)),
    ]
    hints = {
        "the matrices are multiplied in the wrong order (layer 1 last): multiply each new layer on the left, "
        "R = A_l @ R": lambda weights: _rollout(weights, reverse=True),
        "the identity term (the residual connection) is left out: use 0.5 A + 0.5 I":
            lambda weights: _rollout(weights, identity_share=0.0),
        "the rows of 0.5 A + 0.5 I are not renormalised to sum to 1":
            lambda weights: _rollout(weights, renormalise=False),
        "the first layer is skipped": lambda weights: _rollout(weights[1:]),
        "the last layer is skipped": lambda weights: _rollout(weights[:-1]),
        "only the last layer is used, not the product over the layers": lambda weights: _rollout(weights[-1:]),
    }
    _run("grade_attention_rollout", fn, _rollout, cases, seed, hints=hints)
