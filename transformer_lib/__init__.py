"""transformer_lib: the encoder-decoder Transformer built piece by piece in the book "Transformer, Piece by Piece".

The modules of the chapters (embedding, positional, attention, masks, multihead, model, training, decoding, data,
scoring, translation, validation, recipe, attention_maps) are generated from the book's notebooks by tools/export.py; runtime, grading
(the exercise graders), distributed (training under torchrun), the helpers of a run with their clear errors (files:
safe writes and reads; settings: settings checks; checkpoint_checks; runs: run folders; guards: the lock, Ctrl-C and
divergence), split_decoding (a split decoded and scored, its progress shown), explorers (the interactive figures of
chapters 8 and 9) and cli (the command line, `python -m transformer_lib`) are written by hand.
"""

from transformer_lib.attention import check_mask, scaled_dot_product_attention
from transformer_lib.data import load_pairs
from transformer_lib.decoding import KVCache, beam_search, decode_step, greedy_decode
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
    train_word_tokenizer,
)
from transformer_lib.explorers import attention_explorer, beam_explorer
from transformer_lib.masks import causal_mask, padding_mask, target_mask
from transformer_lib.model import (
    FEED_FORWARDS,
    NORMS,
    POSITIONAL_ENCODINGS,
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
from transformer_lib.multihead import MultiHeadAttention, explicit_attention
from transformer_lib.since_2017 import (  # fills NORMS and FEED_FORWARDS
    GroupedQueryAttention,
    RMSNorm,
    RotaryPositions,
    SwiGLUFeedForward,
    rotate_half,
    swiglu_width,
)
from transformer_lib.positional import LearnedPositionalEncoding, SinusoidalPositionalEncoding, sinusoidal_encoding
from transformer_lib.runtime import get_device, is_smoke, smoke_or  # the smoke switch: the book's, not in __all__
from transformer_lib.scoring import bootstrap_interval, corpus_scores, paired_bootstrap, tutorial_bleu
from transformer_lib.training import (
    TrainState,
    load_checkpoint,
    make_optimizer,
    noam_lr,
    save_checkpoint,
    train,
    translation_loss,
)
from transformer_lib.recipe import train_translator
from transformer_lib.translation import average_checkpoints, decoding_settings, epoch_weights, load_translator, translate
from transformer_lib.validation import best_decoding, validation_sweep

from transformer_lib import scoreboard  # the records of full runs: tl.scoreboard
from transformer_lib._version import __version__  # written once, in _version.py

__all__ = [
    "BOS_ID",
    "Decoder",
    "DecoderLayer",
    "EOS_ID",
    "Encoder",
    "EncoderLayer",
    "FEED_FORWARDS",
    "GroupedQueryAttention",
    "KVCache",
    "LearnedPositionalEncoding",
    "MultiHeadAttention",
    "NORMS",
    "PAD_ID",
    "POSITIONAL_ENCODINGS",
    "PositionwiseFeedForward",
    "RMSNorm",
    "RotaryPositions",
    "SPECIAL_TOKENS",
    "SinusoidalPositionalEncoding",
    "SublayerConnection",
    "SwiGLUFeedForward",
    "TokenEmbedding",
    "TrainState",
    "Transformer",
    "TransformerConfig",
    "UNK_ID",
    "attention_explorer",
    "average_checkpoints",
    "beam_explorer",
    "beam_search",
    "best_decoding",
    "bootstrap_interval",
    "causal_mask",
    "check_mask",
    "check_token_ids",
    "corpus_scores",
    "count_parameters",
    "decode_step",
    "decoding_settings",
    "epoch_weights",
    "explicit_attention",
    "get_device",
    "greedy_decode",
    "load_checkpoint",
    "load_pairs",
    "load_translator",
    "make_optimizer",
    "noam_lr",
    "pad_batch",
    "padding_mask",
    "paired_bootstrap",
    "rotate_half",
    "save_checkpoint",
    "swiglu_width",
    "scaled_dot_product_attention",
    "sinusoidal_encoding",
    "target_mask",
    "train",
    "train_bpe_tokenizer",
    "train_word_tokenizer",
    "train_translator",
    "translate",
    "validation_sweep",
    "translation_loss",
    "tutorial_bleu",
]
