import pytest
import torch
from torch import nn

import transformer_lib as tl

from copy_task import CFG
from torch_baseline import TorchTransformer  # (the benchmark's nn.Transformer baseline copies our weights)

SMALL = dict(src_vocab_size=40, tgt_vocab_size=50, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_len=20)


def small_model(norm_first: bool = False, dropout: float = 0.0, **changes) -> tl.Transformer:
    return tl.Transformer(tl.TransformerConfig(**{**SMALL, **changes}, dropout=dropout, norm_first=norm_first))


def torch_transformer_like(model: tl.Transformer) -> nn.Transformer:
    """An nn.Transformer holding a copy of our encoder and decoder weights: the benchmark's baseline's stacks."""
    return TorchTransformer(model).transformer


def batch(pad_src: int = 3, pad_tgt: int = 2):
    src = torch.randint(1, SMALL["src_vocab_size"], (3, 9))
    tgt = torch.randint(1, SMALL["tgt_vocab_size"], (3, 7))
    src[1, -pad_src:] = 0
    tgt[2, -pad_tgt:] = 0
    return src, tgt


@pytest.mark.parametrize("norm_first", [False, True])
def test_matches_torch_transformer(norm_first):
    model = small_model(norm_first)
    theirs = torch_transformer_like(model)
    src, tgt = batch()
    src_x = model.src_positional(model.src_embed(src))
    tgt_x = model.tgt_positional(model.tgt_embed(tgt))
    ref = theirs(src_x, tgt_x, tgt_mask=~tl.causal_mask(tgt.size(1))[0, 0], src_key_padding_mask=(src == 0),
                 tgt_key_padding_mask=(tgt == 0), memory_key_padding_mask=(src == 0))
    src_mask = tl.padding_mask(src, 0)
    memory = model.encode(src, src_mask)
    ours = model.decoder(tgt_x, memory, src_mask, tl.target_mask(tgt, 0))
    real = tgt != 0  # torch gives padded target rows no meaning; compare the real ones
    torch.testing.assert_close(ours[real], ref[real], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(model.generator(ours), model(src, tgt))


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("fused", [True, False])
def test_decoder_never_sees_the_future(norm_first, fused):
    model = small_model(norm_first).eval()
    with tl.explicit_attention(model, enabled=not fused):
        src, tgt = batch()
        src_mask = tl.padding_mask(src, 0)
        memory = model.encode(src, src_mask)
        tgt = tgt.clone()
        tgt[2] = torch.randint(1, SMALL["tgt_vocab_size"], (7,))  # no padding: only the causal mask protects it
        y = model.tgt_positional(model.tgt_embed(tgt)).detach().requires_grad_()
        out = model.decoder(y, memory, src_mask, tl.target_mask(tgt, 0))
        probe = torch.randn_like(out)  # a plain .sum() of a LayerNorm output has zero gradient
        for t in range(tgt.size(1)):
            (grad,) = torch.autograd.grad((out[:, t] * probe[:, t]).sum(), y, retain_graph=True)
            assert (grad[:, t + 1 :] == 0).all(), f"position {t} receives gradient from later positions"
            assert (grad[:, : t + 1].abs().sum() > 0), f"position {t} should depend on positions 0..{t}"
        # and by perturbation, through the public forward: changing token t+1.. leaves logits 0..t unchanged
        logits = model(src, tgt)
        changed = tgt.clone()
        changed[:, 4:] = torch.randint(1, SMALL["tgt_vocab_size"], (3, 3))
        torch.testing.assert_close(model(src, changed)[:, :4], logits[:, :4], atol=0, rtol=0)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("fused", [True, False])
def test_no_information_flows_from_padding(norm_first, fused):
    model = small_model(norm_first).eval()
    with tl.explicit_attention(model, enabled=not fused):
        src, tgt = batch(pad_src=4)
        src_mask = tl.padding_mask(src, 0)
        x = model.src_positional(model.src_embed(src)).detach().requires_grad_()
        memory = model.encoder(x, src_mask)
        logits = model.decode(tgt, memory, src_mask)
        (grad,) = torch.autograd.grad((logits * torch.randn_like(logits)).sum(), x)
        assert (grad[1, -4:] == 0).all(), "source padding leaked into the output (encoder or cross-attention)"
        assert (grad[1, :-4] != 0).any()
        # and the padded sentence translates as it does alone, without padding. The two are the same arithmetic in
        # another order (other matrix shapes, so other blockings of each sum): float32 rounding, eps 1.2e-7 times
        # sqrt(64) for a sum of 64 terms, about 1e-6 of the value per matrix product, a dozen products in sequence and
        # logits up to about 5, so some 1e-5 at the very worst. Seen: at most 1.8e-6 (40 seeds x 4 settings, 1 and 2
        # threads, AMD EPYC). 1e-4 leaves a margin of over 50; leaked padding moves logits by orders of magnitude more.
        alone = model(src[1:2, :-4], tgt[1:2])
        torch.testing.assert_close(model(src, tgt)[1:2], alone, atol=1e-4, rtol=1e-4)


def test_all_padding_source_gives_no_nan():
    model = small_model()
    src, tgt = batch()
    src[0] = 0
    logits = model(src, tgt)
    logits.sum().backward()
    assert torch.isfinite(logits).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_base_model_has_the_papers_parameter_count():
    model = tl.Transformer(tl.TransformerConfig(src_vocab_size=37000, tgt_vocab_size=37000, share_embeddings=True))
    d, d_ff, n = 512, 2048, 6
    attention = 4 * (d * d + d)  # W^Q, W^K, W^V, W^O with biases
    ffn = d * d_ff + d_ff + d_ff * d + d
    norm = 2 * d
    encoder_layer = attention + ffn + 2 * norm
    decoder_layer = 2 * attention + ffn + 3 * norm
    assert n * encoder_layer + n * decoder_layer == 44_138_496
    assert tl.count_parameters(model.encoder) + tl.count_parameters(model.decoder) == 44_138_496
    # one 37000 x 512 matrix shared by both embeddings and the output projection (section 3.4)
    assert tl.count_parameters(model) == 44_138_496 + 37000 * 512


def test_weight_tying_shares_one_matrix():
    model = small_model()
    assert model.generator.weight is model.tgt_embed.lookup.weight
    untied = small_model(tie_embeddings=False)
    assert untied.generator.weight is not untied.tgt_embed.lookup.weight
    assert tl.count_parameters(untied) - tl.count_parameters(model) == 50 * 32


def test_dropout_is_off_in_eval_and_on_in_train():
    model = small_model(dropout=0.3)
    src, tgt = batch()
    model.eval()
    torch.testing.assert_close(model(src, tgt), model(src, tgt), atol=0, rtol=0)
    model.train()
    assert not torch.allclose(model(src, tgt), model(src, tgt))


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(d_model=30, n_heads=4), "d_model must be divisible by n_heads, got d_model=30 and n_heads=4"),
        (dict(dropout=1.5), r"dropout must be a number in \[0, 1\), got 1.5"),
        (dict(dropout="0.1"), r"dropout must be a number in \[0, 1\), got '0.1'"),  # not a TypeError
        (dict(pad_id=None), "pad_id must be a token id of both vocabularies, got None"),
        (dict(positional="spiral"), "positional must be one of 'sinusoidal', 'learned', 'rotary', got 'spiral'"),
        (dict(share_embeddings=True), "share_embeddings needs one joint vocabulary"),
        (dict(pad_id=40), "pad_id must be a token id of both vocabularies, got 40"),
        (dict(n_layers=0), "n_layers must be a positive integer, got 0"),
        (dict(d_model=True, n_heads=1), "d_model must be a positive integer, got True"),  # bool is an int subclass
        (dict(n_heads=2.0), "n_heads must be a positive integer, got 2.0"),
        (dict(norm_first="no"), "norm_first must be True or False, got 'no'"),  # 'no' is truthy: it meant pre-norm
        (dict(tie_embeddings=1), "tie_embeddings must be True or False, got 1"),
        (dict(share_embeddings=None), "share_embeddings must be True or False, got None"),
        (dict(norm="batch"), "norm must be one of 'layer', 'rms', got 'batch'"),  # chapter 10 adds 'rms'
        (dict(ffn="gelu"), "ffn must be one of 'relu', 'swiglu', got 'gelu'"),
        (dict(n_kv_heads=3), r"n_kv_heads must be a positive divisor of n_heads=4 \(or None for n_heads\), got 3"),
        (dict(n_kv_heads=0), "n_kv_heads must be a positive divisor of n_heads=4"),
    ],
)
def test_bad_configurations(changes, message):
    with pytest.raises(ValueError, match=message):
        tl.TransformerConfig(**{**SMALL, **changes})


# What a checkpoint saved before the model was composed from parts (issue 47) holds, for one layer of each kind:
# a renamed or reordered module would make those checkpoints unloadable.
ONE_LAYER_PRE_NORM_KEYS = [
    "src_embed.lookup.weight", "tgt_embed.lookup.weight",
    *(f"encoder.layers.0.self_attn.w_{w}.{p}" for w in "qkvo" for p in ("weight", "bias")),
    *(f"encoder.layers.0.feed_forward.linear{i}.{p}" for i in (1, 2) for p in ("weight", "bias")),
    *(f"encoder.layers.0.{b}.norm.{p}" for b in ("attn_block", "ff_block") for p in ("weight", "bias")),
    "encoder.norm.weight", "encoder.norm.bias",
    *(f"decoder.layers.0.{a}.w_{w}.{p}" for a in ("self_attn", "cross_attn") for w in "qkvo" for p in ("weight", "bias")),
    *(f"decoder.layers.0.feed_forward.linear{i}.{p}" for i in (1, 2) for p in ("weight", "bias")),
    *(f"decoder.layers.0.{b}.norm.{p}" for b in ("self_attn_block", "cross_attn_block", "ff_block")
      for p in ("weight", "bias")),
    "decoder.norm.weight", "decoder.norm.bias", "generator.weight",
]


def test_the_state_dict_keeps_the_names_and_order_checkpoints_were_saved_with():
    assert list(small_model(norm_first=True, n_layers=1).state_dict()) == ONE_LAYER_PRE_NORM_KEYS


def test_each_layer_holds_the_parts_it_was_given_and_no_two_places_share_one():
    attn, ffn = tl.MultiHeadAttention(8, 2), tl.PositionwiseFeedForward(8, 16)
    blocks = [tl.SublayerConnection(nn.LayerNorm(8)) for _ in range(2)]
    layer = tl.EncoderLayer(attn, ffn, *blocks)
    assert (layer.self_attn, layer.feed_forward, layer.attn_block, layer.ff_block) == (attn, ffn, *blocks)
    model = small_model(norm_first=True)
    parts = [m for m in model.modules() if isinstance(m, (tl.MultiHeadAttention, tl.PositionwiseFeedForward,
                                                           nn.LayerNorm))]
    assert len(parts) == len({id(m) for m in parts}) == 2 * (1 + 1 + 2) + 2 * (2 + 1 + 3) + 2  # + the final norms


def test_a_positional_encoding_added_to_the_table_is_one_the_config_accepts_and_the_model_builds(monkeypatch):
    """A later chapter adds a position scheme by adding it to POSITIONAL_ENCODINGS, without a change to chapter 6."""

    class NoPositions(nn.Module):  # stands in for an encoding that lives in the attention (rotary positions)
        def __init__(self, d_model: int, max_len: int, dropout: float) -> None:
            super().__init__()
            self.dropout = nn.Dropout(dropout)

        def forward(self, x: torch.Tensor, start: int = 0) -> torch.Tensor:
            return self.dropout(x)

    with pytest.raises(ValueError, match="positional must be one of 'sinusoidal', 'learned', 'rotary', got 'none'"):
        small_model(positional="none")
    monkeypatch.setitem(tl.POSITIONAL_ENCODINGS, "none", NoPositions)
    model = small_model(positional="none")
    assert isinstance(model.src_positional, NoPositions) and isinstance(model.tgt_positional, NoPositions)
    assert model.src_positional is not model.tgt_positional


def test_bad_inputs_to_the_model():
    model = small_model()
    src, tgt = batch()
    with pytest.raises(ValueError, match=r"src contains|ids contains token id 40, outside the vocabulary"):
        model(torch.full((1, 3), 40), tgt[:1])
    with pytest.raises(ValueError, match="sequence length is 21, longer than max_len=20"):
        model(torch.ones(1, 21, dtype=torch.long), tgt[:1])
    with pytest.raises(TypeError, match="integer token ids"):
        model(src.float(), tgt)
    with pytest.raises(ValueError, match=r"same batch size, got shapes \(3, 9\) and \(2, 7\)"):
        model(src, tgt[:2])


def test_decode_refuses_a_memory_of_another_batch_size():
    torch.manual_seed(0)
    model = tl.Transformer(tl.TransformerConfig(**CFG)).eval()
    src = torch.randint(4, 20, (1, 5))
    memory = model.encode(src)  # (1, S, d_model)
    with pytest.raises(ValueError, match=r"memory must be \(batch, S, d_model\) with tgt's batch size 2, got shape \(1, 5, 32\)"):
        model.decode(torch.randint(4, 20, (2, 3)), memory, tl.padding_mask(src, 0))


def test_encode_refuses_an_empty_source():
    model = tl.Transformer(tl.TransformerConfig(**CFG)).eval()
    with pytest.raises(ValueError, match=r"length >= 1, got shape \(2, 0\)"):
        model.encode(torch.zeros(2, 0, dtype=torch.long))


def test_the_model_traces_into_one_graph_for_torch_compile():
    # A graph break (e.g. reading a tensor's values in Python) would split the compiled model and cost speed.
    import torch._dynamo

    model = small_model()
    src, tgt = batch()
    explanation = torch._dynamo.explain(model)(src, tgt)
    assert explanation.graph_break_count == 0, [str(reason.reason) for reason in explanation.break_reasons]
    assert explanation.graph_count == 1
