"""transformer_lib: the encoder-decoder Transformer built piece by piece in the book "Transformer, Piece by Piece".

The modules named after chapters (embedding, positional, attention, masks, multihead, model) are generated from
the book's notebooks by tools/export.py; runtime and checks are written by hand.
"""

from transformer_lib.attention import check_mask, scaled_dot_product_attention
from transformer_lib.embedding import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    SPECIAL_TOKENS,
    UNK_ID,
    TokenEmbedding,
    check_token_ids,
    pad_batch,
    train_bpe_tokenizer,
)
from transformer_lib.masks import causal_mask, padding_mask, target_mask
from transformer_lib.model import (
    Decoder,
    DecoderLayer,
    Encoder,
    EncoderLayer,
    PositionwiseFeedForward,
    SublayerConnection,
    Transformer,
    TransformerConfig,
    count_parameters,
)
from transformer_lib.multihead import MultiHeadAttention
from transformer_lib.positional import LearnedPositionalEncoding, SinusoidalPositionalEncoding, sinusoidal_encoding
from transformer_lib.runtime import get_device, is_smoke, smoke_or

__version__ = "0.1.0"

__all__ = [
    "BOS_ID",
    "EOS_ID",
    "PAD_ID",
    "SPECIAL_TOKENS",
    "UNK_ID",
    "Decoder",
    "DecoderLayer",
    "Encoder",
    "EncoderLayer",
    "LearnedPositionalEncoding",
    "MultiHeadAttention",
    "PositionwiseFeedForward",
    "SinusoidalPositionalEncoding",
    "SublayerConnection",
    "TokenEmbedding",
    "Transformer",
    "TransformerConfig",
    "causal_mask",
    "check_mask",
    "check_token_ids",
    "count_parameters",
    "get_device",
    "is_smoke",
    "pad_batch",
    "padding_mask",
    "scaled_dot_product_attention",
    "sinusoidal_encoding",
    "smoke_or",
    "target_mask",
    "train_bpe_tokenizer",
]
