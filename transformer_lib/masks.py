import torch
from torch import Tensor


def padding_mask(ids: Tensor, pad_id: int) -> Tensor:
    """True where a token is real and may be attended to, False at padding; (B, S) -> (B, 1, 1, S)."""
    if not isinstance(ids, Tensor) or ids.dim() != 2:
        shape = tuple(ids.shape) if isinstance(ids, Tensor) else type(ids).__name__
        raise ValueError(f"ids must be a 2-D tensor of token ids (batch, length), got {shape}")
    if ids.dtype.is_floating_point or ids.dtype == torch.bool:
        raise TypeError(f"ids must hold integer token ids, got dtype {ids.dtype}")
    return (ids != pad_id)[:, None, None, :]  # (B, S) -> (B, 1, 1, S)


def causal_mask(size: int, device: torch.device | str | None = None) -> Tensor:
    """True on and below the diagonal: query i may attend to keys 0..i only; (1, 1, size, size)."""
    if size < 1:
        raise ValueError(f"size must be a positive integer, got {size}")
    allowed = torch.ones(size, size, dtype=torch.bool, device=device).tril()  # (T, T), lower triangle True
    return allowed[None, None]  # (1, 1, T, T)


def target_mask(tgt: Tensor, pad_id: int) -> Tensor:
    """The decoder's self-attention mask: no padding and no future positions; (B, T) -> (B, 1, T, T)."""
    return padding_mask(tgt, pad_id) & causal_mask(tgt.size(1), device=tgt.device)  # (B, 1, T, T)
