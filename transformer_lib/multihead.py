import torch
from torch import Tensor, nn

from transformer_lib.attention import check_mask, scaled_dot_product_attention


class MultiHeadAttention(nn.Module):
    """MultiHead(Q, K, V) = Concat(head_1, ..., head_h) W^O, with head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V)."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True) -> None:
        super().__init__()
        if n_heads < 1 or d_model % n_heads != 0:
            raise ValueError(
                f"d_model must be divisible by n_heads, got d_model={d_model} and n_heads={n_heads}; "
                f"expected e.g. d_model=512 with n_heads=8 (d_k = d_model / n_heads = 64)"
            )
        self.d_model = d_model
        self.n_heads = n_heads
        self.d_k = d_model // n_heads
        self.dropout_p = dropout
        self.fused = True  # use torch's fused kernel when no weights are asked for
        self.w_q = nn.Linear(d_model, d_model, bias=bias)  # all heads' W_i^Q side by side
        self.w_k = nn.Linear(d_model, d_model, bias=bias)
        self.w_v = nn.Linear(d_model, d_model, bias=bias)
        self.w_o = nn.Linear(d_model, d_model, bias=bias)

    def split_heads(self, x: Tensor) -> Tensor:
        """(B, T, d_model) -> (B, n_heads, T, d_k): give each head its own slice of the features."""
        batch, length, _ = x.shape
        return x.view(batch, length, self.n_heads, self.d_k).transpose(1, 2)  # (B, h, T, d_k)

    def merge_heads(self, x: Tensor) -> Tensor:
        """(B, n_heads, T, d_k) -> (B, T, d_model): concatenate the heads' outputs."""
        batch, _, length, _ = x.shape
        return x.transpose(1, 2).reshape(batch, length, self.d_model)  # (B, T, d_model)

    def forward(
        self, query: Tensor, key: Tensor, value: Tensor, mask: Tensor | None = None, need_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        """Attend from query (B, T_q, d_model) to key/value (B, T_k, d_model); returns (output, weights or None)."""
        if query.size(-1) != self.d_model:
            raise ValueError(f"query must have last dimension d_model={self.d_model}, got shape {tuple(query.shape)}")
        q = self.split_heads(self.w_q(query))  # (B, h, T_q, d_k)
        k = self.split_heads(self.w_k(key))  # (B, h, T_k, d_k)
        v = self.split_heads(self.w_v(value))  # (B, h, T_k, d_k)
        dropout_p = self.dropout_p if self.training else 0.0
        if need_weights or not self.fused:
            heads, weights = scaled_dot_product_attention(q, k, v, mask, dropout_p)  # (B, h, T_q, d_k)
        else:
            if mask is not None:
                check_mask(mask, torch.Size((q.size(0), self.n_heads, q.size(2), k.size(2))))
            heads = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p)
            weights = None
        return self.w_o(self.merge_heads(heads)), weights  # (B, T_q, d_model)
