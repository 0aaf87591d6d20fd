import math

import torch
from torch import Tensor


def check_mask(mask: Tensor, scores_shape: torch.Size, name: str = "mask") -> None:
    """Raise a clear error unless mask is boolean and broadcasts to the scores' shape (..., T_q, T_k)."""
    if not isinstance(mask, Tensor):
        raise TypeError(f"{name} must be a boolean torch.Tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise TypeError(
            f"{name} must have dtype torch.bool (True = may be attended to), got {mask.dtype}; "
            f"build it with padding_mask() or causal_mask()"
        )
    try:
        fits = torch.broadcast_shapes(mask.shape, scores_shape) == scores_shape
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(
            f"{name} has shape {tuple(mask.shape)}, which does not broadcast to the attention scores' shape "
            f"{tuple(scores_shape)} (batch, heads, query length, key length); expected e.g. (B, 1, 1, T_k) "
            f"for padding or (1, 1, T_q, T_k) for a causal mask"
        )


def scaled_dot_product_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, dropout_p: float = 0.0
) -> tuple[Tensor, Tensor]:
    """Attention(Q, K, V) = softmax(Q K^T / sqrt(d_k)) V; returns (output, weights). mask: True = may attend."""
    if q.size(-1) != k.size(-1):
        raise ValueError(f"q and k must share their last dimension d_k, got {q.size(-1)} and {k.size(-1)}")
    if k.size(-2) != v.size(-2):
        raise ValueError(f"k and v must hold the same number of positions, got {k.size(-2)} and {v.size(-2)}")
    d_k = q.size(-1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)  # (..., T_q, d_k) @ (..., d_k, T_k) -> (..., T_q, T_k)
    if mask is not None:
        check_mask(mask, scores.shape)
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)  # (..., T_q, T_k), each row sums to 1
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)  # a row with no allowed key is NaN after softmax: make it 0
    if dropout_p > 0.0:
        weights = torch.nn.functional.dropout(weights, p=dropout_p)
    return weights @ v, weights  # (..., T_q, T_k) @ (..., T_k, d_v) -> (..., T_q, d_v)
