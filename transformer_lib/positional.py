import math

import torch
from torch import Tensor, nn


def sinusoidal_encoding(max_len: int, d_model: int) -> Tensor:
    """The paper's table PE[pos, 2i] = sin(pos / 10000^(2i/d_model)), PE[pos, 2i+1] = cos(same), (max_len, d_model)."""
    if d_model < 2 or d_model % 2 != 0:
        raise ValueError(f"d_model must be a positive even number for sinusoidal encodings, got {d_model}")
    if max_len < 1:
        raise ValueError(f"max_len must be a positive integer, got {max_len}")
    pos = torch.arange(max_len, dtype=torch.float64).unsqueeze(1)  # (max_len, 1)
    two_i = torch.arange(0, d_model, 2, dtype=torch.float64)  # (d_model/2,)
    angle = pos / torch.pow(10000.0, two_i / d_model)  # (max_len, d_model/2)
    pe = torch.zeros(max_len, d_model, dtype=torch.float64)  # (max_len, d_model)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle)
    return pe.float()


def check_length(length: int, max_len: int, name: str = "sequence length") -> None:
    """Raise a clear error when a sequence is longer than the positions the model knows."""
    if length > max_len:
        raise ValueError(
            f"{name} is {length}, longer than max_len={max_len}; expected at most {max_len} tokens "
            f"(shorten the input or build the model with a larger max_len)"
        )


class SinusoidalPositionalEncoding(nn.Module):
    """Add the fixed sinusoidal position table to a batch of embeddings, then apply dropout."""

    def __init__(self, d_model: int, max_len: int = 256, dropout: float = 0.0) -> None:
        super().__init__()
        self.max_len = max_len
        self.register_buffer("pe", sinusoidal_encoding(max_len, d_model), persistent=False)  # (max_len, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        check_length(x.size(1), self.max_len)
        return self.dropout(x + self.pe[: x.size(1)])  # (B, T, d_model)


class LearnedPositionalEncoding(nn.Module):
    """Add a trained vector for each position (as in BERT and GPT), then apply dropout."""

    def __init__(self, d_model: int, max_len: int = 256, dropout: float = 0.0) -> None:
        super().__init__()
        self.max_len = max_len
        self.table = nn.Embedding(max_len, d_model)
        nn.init.normal_(self.table.weight, mean=0.0, std=0.02)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        check_length(x.size(1), self.max_len)
        positions = torch.arange(x.size(1), device=x.device)  # (T,)
        return self.dropout(x + self.table(positions))  # (B, T, d_model)
