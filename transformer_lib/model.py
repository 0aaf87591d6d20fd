from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from transformer_lib.embedding import TokenEmbedding
from transformer_lib.masks import padding_mask, target_mask
from transformer_lib.multihead import MultiHeadAttention
from transformer_lib.positional import LearnedPositionalEncoding, SinusoidalPositionalEncoding


class PositionwiseFeedForward(nn.Module):
    """FFN(x) = max(0, x W_1 + b_1) W_2 + b_2, applied to every position separately and identically."""

    def __init__(self, d_model: int, d_ff: int, dropout: float = 0.0) -> None:
        super().__init__()
        self.linear1 = nn.Linear(d_model, d_ff)
        self.linear2 = nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        hidden = torch.relu(self.linear1(x))  # (B, T, d_model) -> (B, T, d_ff)
        return self.linear2(self.dropout(hidden))  # (B, T, d_ff) -> (B, T, d_model)


class SublayerConnection(nn.Module):
    """Residual connection and LayerNorm around a sublayer: post-norm LayerNorm(x + Sublayer(x)) or pre-norm."""

    def __init__(self, d_model: int, dropout: float = 0.0, norm_first: bool = False) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d_model)
        self.dropout = nn.Dropout(dropout)
        self.norm_first = norm_first

    def forward(self, x: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        if self.norm_first:
            return x + self.dropout(sublayer(self.norm(x)))  # pre-norm: x + Sublayer(LayerNorm(x))
        return self.norm(x + self.dropout(sublayer(x)))  # post-norm (the paper): LayerNorm(x + Sublayer(x))


class EncoderLayer(nn.Module):
    """One encoder layer: self-attention over the source, then the feed-forward network."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.0, norm_first: bool = False) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout)
        self.feed_forward = PositionwiseFeedForward(d_model, d_ff, dropout)
        self.attn_block = SublayerConnection(d_model, dropout, norm_first)
        self.ff_block = SublayerConnection(d_model, dropout, norm_first)

    def forward(self, x: Tensor, src_mask: Tensor) -> Tensor:
        x = self.attn_block(x, lambda y: self.self_attn(y, y, y, src_mask)[0])  # (B, S, d_model)
        return self.ff_block(x, self.feed_forward)  # (B, S, d_model)


class DecoderLayer(nn.Module):
    """One decoder layer: masked self-attention, cross-attention to the encoder's output, feed-forward."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int, dropout: float = 0.0, norm_first: bool = False) -> None:
        super().__init__()
        self.self_attn = MultiHeadAttention(d_model, n_heads, dropout)
        self.cross_attn = MultiHeadAttention(d_model, n_heads, dropout)
        self.feed_forward = PositionwiseFeedForward(d_model, d_ff, dropout)
        self.self_attn_block = SublayerConnection(d_model, dropout, norm_first)
        self.cross_attn_block = SublayerConnection(d_model, dropout, norm_first)
        self.ff_block = SublayerConnection(d_model, dropout, norm_first)

    def forward(self, x: Tensor, memory: Tensor, src_mask: Tensor, tgt_mask: Tensor) -> Tensor:
        x = self.self_attn_block(x, lambda y: self.self_attn(y, y, y, tgt_mask)[0])  # (B, T, d_model)
        x = self.cross_attn_block(x, lambda y: self.cross_attn(y, memory, memory, src_mask)[0])  # (B, T, d_model)
        return self.ff_block(x, self.feed_forward)  # (B, T, d_model)


class Encoder(nn.Module):
    """A stack of n_layers encoder layers (with a final LayerNorm when the layers are pre-norm)."""

    def __init__(
        self, d_model: int, n_heads: int, d_ff: int, n_layers: int, dropout: float = 0.0, norm_first: bool = False
    ) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            EncoderLayer(d_model, n_heads, d_ff, dropout, norm_first) for _ in range(n_layers)
        )
        self.norm = nn.LayerNorm(d_model) if norm_first else nn.Identity()

    def forward(self, x: Tensor, src_mask: Tensor) -> Tensor:
        for layer in self.layers:
            x = layer(x, src_mask)  # (B, S, d_model)
        return self.norm(x)


class Decoder(nn.Module):
    """A stack of n_layers decoder layers (with a final LayerNorm when the layers are pre-norm)."""

    def __init__(
        self, d_model: int, n_heads: int, d_ff: int, n_layers: int, dropout: float = 0.0, norm_first: bool = False
    ) -> None:
        super().__init__()
        self.layers = nn.ModuleList(
            DecoderLayer(d_model, n_heads, d_ff, dropout, norm_first) for _ in range(n_layers)
        )
        self.norm = nn.LayerNorm(d_model) if norm_first else nn.Identity()

    def forward(self, x: Tensor, memory: Tensor, src_mask: Tensor, tgt_mask: Tensor) -> Tensor:
        for layer in self.layers:
            x = layer(x, memory, src_mask, tgt_mask)  # (B, T, d_model)
        return self.norm(x)


@dataclass
class TransformerConfig:
    """Every size and switch of the model; the defaults are the paper's base model."""

    src_vocab_size: int
    tgt_vocab_size: int
    d_model: int = 512
    n_heads: int = 8
    n_layers: int = 6
    d_ff: int = 2048
    dropout: float = 0.1
    max_len: int = 256
    pad_id: int = 0
    norm_first: bool = False  # False: post-norm as in the paper; True: pre-norm
    positional: str = "sinusoidal"  # or "learned"
    tie_embeddings: bool = True  # the output projection reuses the target embedding matrix
    share_embeddings: bool = False  # source and target share one embedding (needs one joint vocabulary)

    def __post_init__(self) -> None:
        for name in ("src_vocab_size", "tgt_vocab_size", "d_model", "n_heads", "n_layers", "d_ff", "max_len"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.d_model % self.n_heads != 0:
            raise ValueError(
                f"d_model must be divisible by n_heads, got d_model={self.d_model} and n_heads={self.n_heads}"
            )
        if not 0 <= self.pad_id < min(self.src_vocab_size, self.tgt_vocab_size):
            raise ValueError(f"pad_id must be a token id of both vocabularies, got {self.pad_id}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {self.dropout}")
        if self.positional not in ("sinusoidal", "learned"):
            raise ValueError(f"positional must be 'sinusoidal' or 'learned', got {self.positional!r}")
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ValueError(
                f"share_embeddings needs one joint vocabulary, got src_vocab_size={self.src_vocab_size} "
                f"and tgt_vocab_size={self.tgt_vocab_size}"
            )


def count_parameters(module: nn.Module) -> int:
    """The number of distinct trainable numbers in a module (a tied matrix counts once)."""
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


class Transformer(nn.Module):
    """The encoder-decoder Transformer of Vaswani et al. (2017): (B, S) and (B, T) token ids -> (B, T, tgt_vocab)."""

    def __init__(self, cfg: TransformerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        positional = SinusoidalPositionalEncoding if cfg.positional == "sinusoidal" else LearnedPositionalEncoding
        self.src_embed = TokenEmbedding(cfg.src_vocab_size, cfg.d_model, cfg.pad_id)
        self.tgt_embed = self.src_embed if cfg.share_embeddings else TokenEmbedding(cfg.tgt_vocab_size, cfg.d_model, cfg.pad_id)
        self.src_positional = positional(cfg.d_model, cfg.max_len, cfg.dropout)
        self.tgt_positional = positional(cfg.d_model, cfg.max_len, cfg.dropout)
        self.encoder = Encoder(cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.n_layers, cfg.dropout, cfg.norm_first)
        self.decoder = Decoder(cfg.d_model, cfg.n_heads, cfg.d_ff, cfg.n_layers, cfg.dropout, cfg.norm_first)
        self.generator = nn.Linear(cfg.d_model, cfg.tgt_vocab_size, bias=False)  # the pre-softmax projection
        for name, param in self.named_parameters():
            if param.dim() > 1 and "embed" not in name and "positional" not in name:
                nn.init.xavier_uniform_(param)
        if cfg.tie_embeddings:
            self.generator.weight = self.tgt_embed.lookup.weight  # one matrix, (tgt_vocab, d_model)

    def encode(self, src: Tensor, src_mask: Tensor | None = None) -> Tensor:
        """Source ids (B, S) -> memory (B, S, d_model); src_mask defaults to the source's padding mask."""
        if src_mask is None:
            src_mask = padding_mask(src, self.cfg.pad_id)  # (B, 1, 1, S)
        x = self.src_positional(self.src_embed(src))  # (B, S) -> (B, S, d_model)
        return self.encoder(x, src_mask)  # (B, S, d_model)

    def decode(self, tgt: Tensor, memory: Tensor, src_mask: Tensor, tgt_mask: Tensor | None = None) -> Tensor:
        """Target ids (B, T) and memory (B, S, d_model) -> logits (B, T, tgt_vocab)."""
        if tgt_mask is None:
            tgt_mask = target_mask(tgt, self.cfg.pad_id)  # (B, 1, T, T)
        y = self.tgt_positional(self.tgt_embed(tgt))  # (B, T) -> (B, T, d_model)
        y = self.decoder(y, memory, src_mask, tgt_mask)  # (B, T, d_model)
        return self.generator(y)  # (B, T, d_model) -> (B, T, tgt_vocab)

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        """Teacher-forced pass: source ids (B, S) and decoder input ids (B, T) -> logits (B, T, tgt_vocab)."""
        if src.dim() != 2 or tgt.dim() != 2 or src.size(0) != tgt.size(0):
            raise ValueError(
                f"src and tgt must be 2-D (batch, length) with the same batch size, "
                f"got shapes {tuple(src.shape)} and {tuple(tgt.shape)}"
            )
        src_mask = padding_mask(src, self.cfg.pad_id)  # (B, 1, 1, S)
        memory = self.encode(src, src_mask)  # (B, S, d_model)
        return self.decode(tgt, memory, src_mask)  # (B, T, tgt_vocab)
