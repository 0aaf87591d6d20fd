"""The library's Transformer rebuilt around torch.nn.Transformer, with the same weights: the benchmark's baseline.

Only the encoder and decoder stacks are PyTorch's own; the token embeddings, positional encodings and output
projection are copies of the library model's modules, so that both models compute the same function and the
benchmark times the part where the two implementations differ.
"""

import copy

import torch
from torch import Tensor, nn

import transformer_lib as tl


def copy_attention(ours: tl.MultiHeadAttention, theirs: nn.MultiheadAttention) -> None:
    """Our four projections into nn.MultiheadAttention's packed in_proj and its out_proj."""
    with torch.no_grad():
        theirs.in_proj_weight.copy_(torch.cat([ours.w_q.weight, ours.w_k.weight, ours.w_v.weight]))
        theirs.in_proj_bias.copy_(torch.cat([ours.w_q.bias, ours.w_k.bias, ours.w_v.bias]))
        theirs.out_proj.weight.copy_(ours.w_o.weight)
        theirs.out_proj.bias.copy_(ours.w_o.bias)


def _copy_layer(ours: nn.Module, theirs: nn.Module, attention: list, norms: list) -> None:
    for mine, torch_attn in attention:
        copy_attention(mine, torch_attn)
    theirs.linear1.load_state_dict(ours.feed_forward.linear1.state_dict())
    theirs.linear2.load_state_dict(ours.feed_forward.linear2.state_dict())
    for mine, torch_norm in norms:
        torch_norm.load_state_dict(mine.norm.state_dict())


class TorchTransformer(nn.Module):
    """torch.nn.Transformer between copies of a library model's embeddings and output projection."""

    def __init__(self, model: tl.Transformer) -> None:
        super().__init__()
        cfg = self.cfg = model.cfg
        layer = dict(d_model=cfg.d_model, nhead=cfg.n_heads, dim_feedforward=cfg.d_ff, dropout=cfg.dropout,
                     batch_first=True, norm_first=cfg.norm_first)
        # nn.Transformer ends each stack with a LayerNorm; the paper's post-norm model has none.
        encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(**layer), cfg.n_layers,
                                        nn.LayerNorm(cfg.d_model) if cfg.norm_first else None,
                                        enable_nested_tensor=False)
        decoder = nn.TransformerDecoder(nn.TransformerDecoderLayer(**layer), cfg.n_layers,
                                        nn.LayerNorm(cfg.d_model) if cfg.norm_first else None)
        self.transformer = nn.Transformer(d_model=cfg.d_model, nhead=cfg.n_heads, custom_encoder=encoder,
                                          custom_decoder=decoder, batch_first=True)
        for mine, theirs in zip(model.encoder.layers, encoder.layers):
            _copy_layer(mine, theirs, [(mine.self_attn, theirs.self_attn)],
                        [(mine.attn_block, theirs.norm1), (mine.ff_block, theirs.norm2)])
        for mine, theirs in zip(model.decoder.layers, decoder.layers):
            _copy_layer(mine, theirs,
                        [(mine.self_attn, theirs.self_attn), (mine.cross_attn, theirs.multihead_attn)],
                        [(mine.self_attn_block, theirs.norm1), (mine.cross_attn_block, theirs.norm2),
                         (mine.ff_block, theirs.norm3)])
        if cfg.norm_first:
            encoder.norm.load_state_dict(model.encoder.norm.state_dict())
            decoder.norm.load_state_dict(model.decoder.norm.state_dict())
        # Embeddings, positional encodings and the output projection: copies, tied as in the library model.
        self.src_embed = copy.deepcopy(model.src_embed)
        self.tgt_embed = self.src_embed if cfg.share_embeddings else copy.deepcopy(model.tgt_embed)
        self.src_positional = copy.deepcopy(model.src_positional)
        self.tgt_positional = copy.deepcopy(model.tgt_positional)
        self.generator = copy.deepcopy(model.generator)
        if cfg.tie_embeddings:
            self.generator.weight = self.tgt_embed.lookup.weight

    def forward(self, src: Tensor, tgt: Tensor) -> Tensor:
        """(B, S) and (B, T) ids -> (B, T, tgt_vocab) logits; nn.Transformer's masks say True = ignore."""
        src_padding = src == self.cfg.pad_id  # (B, S): True where padding, the opposite of tl.padding_mask
        tgt_padding = tgt == self.cfg.pad_id  # (B, T)
        causal = torch.ones(tgt.size(1), tgt.size(1), dtype=torch.bool, device=tgt.device).triu(1)  # True = future
        x = self.src_positional(self.src_embed(src))  # (B, S, d_model)
        y = self.tgt_positional(self.tgt_embed(tgt))  # (B, T, d_model)
        out = self.transformer(x, y, tgt_mask=causal, src_key_padding_mask=src_padding,
                               tgt_key_padding_mask=tgt_padding, memory_key_padding_mask=src_padding,
                               tgt_is_causal=True)  # (B, T, d_model)
        return self.generator(out)  # (B, T, tgt_vocab)
