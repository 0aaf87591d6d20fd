"""Chapter 10's parts (transformer_lib.since_2017): each against its reference, and as options of chapter 6's model
that train, save and load like the paper's parts."""

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import transformer_lib as tl

SMALL = dict(src_vocab_size=40, tgt_vocab_size=40, d_model=32, n_heads=4, n_layers=2, d_ff=48, max_len=20,
             dropout=0.0)


def test_rms_norm_equals_torch_rms_norm_and_layer_norm_on_centred_vectors():
    torch.manual_seed(0)
    ours = tl.RMSNorm(16)
    with torch.no_grad():
        ours.weight.uniform_(0.5, 1.5)
    reference = nn.RMSNorm(16, eps=1e-6)
    reference.load_state_dict(ours.state_dict())
    x = 3 * torch.randn(4, 7, 16)
    torch.testing.assert_close(ours(x), reference(x))  # the same float32 arithmetic: float32's default tolerance
    centred = x - x.mean(-1, keepdim=True)
    layer_norm = nn.LayerNorm(16, eps=1e-6, bias=False)
    layer_norm.weight.data.copy_(ours.weight.data)
    torch.testing.assert_close(ours(centred), layer_norm(centred), atol=1e-5, rtol=1e-5)


def test_rms_norm_by_hand_and_of_a_zero_vector():
    norm = tl.RMSNorm(4)
    out = norm(torch.tensor([3.0, -1.0, 1.0, 1.0]))
    torch.testing.assert_close(out, torch.tensor([3.0, -1.0, 1.0, 1.0]) / math.sqrt(3))
    assert torch.equal(norm(torch.zeros(2, 4)), torch.zeros(2, 4))  # eps keeps 0 / 0 away


def test_rms_norm_in_float16_does_not_overflow_and_keeps_the_dtype():
    norm = tl.RMSNorm(8).half()
    x = torch.full((1, 8), 300.0, dtype=torch.float16)  # 300^2 = 90,000 > 65,504, float16's largest number
    out = norm(x)
    assert out.dtype == torch.float16 and torch.isfinite(out).all()
    torch.testing.assert_close(out, torch.ones(1, 8, dtype=torch.float16))


def test_swiglu_is_its_formula_and_costs_the_relu_networks_parameters():
    torch.manual_seed(0)
    ffn = tl.SwiGLUFeedForward(16, 48)
    x = torch.randn(2, 3, 16)
    expected = (F.silu(x @ ffn.w.weight.T) * (x @ ffn.v.weight.T)) @ ffn.w_2.weight.T
    torch.testing.assert_close(ffn(x), expected)
    assert tl.swiglu_width(48) == 32 and tl.swiglu_width(512) == 341 and tl.swiglu_width(1) == 1
    for d_model, d_ff in ((256, 512), (512, 2048), (64, 96), (10, 7)):
        relu = tl.count_parameters(tl.PositionwiseFeedForward(d_model, d_ff))
        gated = tl.count_parameters(tl.SwiGLUFeedForward(d_model, d_ff))
        assert gated == 3 * d_model * tl.swiglu_width(d_ff)  # three matrices, no biases
        # 3 d (2/3 d_ff) = 2 d d_ff: what is left is the ReLU network's biases and the rounding of 2/3 d_ff (by at
        # most 1/2, times 3 d)
        assert abs((relu - gated) - (d_ff + d_model)) <= 1.5 * d_model, (d_model, d_ff, relu, gated)


def test_swiglu_applies_dropout_to_the_gated_hidden_features_only_in_training():
    ffn = tl.SwiGLUFeedForward(8, 12, dropout=0.5)
    x = torch.randn(3, 8)
    ffn.eval()
    assert torch.equal(ffn(x), ffn(x))
    ffn.train()
    torch.manual_seed(1)
    assert not torch.equal(ffn(x), ffn.eval()(x))


@pytest.mark.parametrize("options", [dict(norm="rms"), dict(norm="rms", norm_first=True), dict(ffn="swiglu"),
                                     dict(norm="rms", norm_first=True, ffn="swiglu")], ids=str)
def test_the_options_build_their_parts_everywhere_and_train(options):
    torch.manual_seed(0)
    model = tl.Transformer(tl.TransformerConfig(**SMALL, **options))
    norms = [m for m in model.modules() if isinstance(m, (nn.LayerNorm, tl.RMSNorm))]
    ffns = [m for m in model.modules() if isinstance(m, (tl.PositionwiseFeedForward, tl.SwiGLUFeedForward))]
    expected_norm = tl.RMSNorm if options.get("norm") == "rms" else nn.LayerNorm
    expected_ffn = tl.SwiGLUFeedForward if options.get("ffn") == "swiglu" else tl.PositionwiseFeedForward
    assert norms and all(type(m) is expected_norm for m in norms)
    assert len(norms) == 2 * 2 + 2 * 3 + (2 if options.get("norm_first") else 0)  # the final norms of pre-norm
    assert len(ffns) == 4 and all(type(m) is expected_ffn for m in ffns)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    src, tgt = torch.randint(4, 40, (8, 6)), torch.randint(4, 40, (8, 7))
    losses = []
    for _ in range(30):  # the copy of a fixed batch: a model whose parts are wired right learns it
        loss = F.cross_entropy(model(src, tgt[:, :-1]).flatten(0, 1), tgt[:, 1:].flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses


def test_a_checkpoint_keeps_the_options_and_an_old_one_without_them_loads(tmp_path):
    from transformer_lib.checkpoint_checks import weights_checksum
    from transformer_lib.training import model_from_checkpoint

    def saved(cfg: tl.TransformerConfig, path):
        model = tl.Transformer(cfg)
        optimizer, scheduler = tl.make_optimizer(model, cfg.d_model)
        tl.save_checkpoint(path, model, optimizer, scheduler, None, tl.TrainState())
        return model

    model = saved(tl.TransformerConfig(**SMALL, norm="rms", ffn="swiglu", norm_first=True), tmp_path / "new.pt")
    loaded = model_from_checkpoint(tl.load_checkpoint(tmp_path / "new.pt"))
    assert (loaded.cfg.norm, loaded.cfg.ffn) == ("rms", "swiglu")
    assert all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values()))
    old = saved(tl.TransformerConfig(**SMALL), tmp_path / "old.pt")
    checkpoint = torch.load(tmp_path / "old.pt", weights_only=True)
    del checkpoint["config"]["norm"], checkpoint["config"]["ffn"]  # as saved before chapter 10 existed
    checkpoint["checksum"] = weights_checksum(checkpoint)
    torch.save(checkpoint, tmp_path / "old.pt")
    loaded = model_from_checkpoint(tl.load_checkpoint(tmp_path / "old.pt"))
    assert (loaded.cfg.norm, loaded.cfg.ffn) == ("layer", "relu")
    assert all(torch.equal(a, b) for a, b in zip(old.state_dict().values(), loaded.state_dict().values()))


def test_rotary_positions_keep_lengths_and_make_scores_depend_on_the_offset_only():
    torch.manual_seed(0)
    rope = tl.RotaryPositions(d_k=16, max_len=64)
    x = torch.randn(2, 3, 20, 16)
    torch.testing.assert_close(rope(x).norm(dim=-1), x.norm(dim=-1))
    q, k = torch.randn(1, 1, 1, 16), torch.randn(1, 1, 1, 16)
    for offset in (-4, 0, 9):
        scores = torch.tensor([(rope(q, m) * rope(k, m + offset)).sum() for m in range(4, 50, 5)])
        # float32 tables of cos and sin (rounded from float64): about 1e-6 of error per product, 16 of them
        assert scores.max() - scores.min() < 1e-4, (offset, scores)
    torch.testing.assert_close(rope(x, 0)[..., 0, :], x[..., 0, :])  # position 0 is not turned


def test_rotary_positions_at_a_start_are_the_rows_of_a_longer_sequence():
    rope = tl.RotaryPositions(d_k=8, max_len=32)
    x = torch.randn(1, 2, 12, 8)
    torch.testing.assert_close(rope(x[:, :, 5:], start=5), rope(x)[:, :, 5:])  # what a cache's newest rows get


def test_rotary_positions_keep_the_dtype_and_refuse_what_they_cannot_rotate():
    rope = tl.RotaryPositions(d_k=8, max_len=10)
    assert rope(torch.randn(1, 1, 3, 8, dtype=torch.bfloat16)).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="d_k must be a positive even number for rotary positions .* got 7"):
        tl.RotaryPositions(d_k=7)
    with pytest.raises(ValueError, match=r"start must be the position of x's first row, an int >= 0, got -1"):
        rope(torch.randn(1, 1, 3, 8), start=-1)
    with pytest.raises(ValueError, match="sequence length is 11, longer than max_len=10"):
        rope(torch.randn(1, 1, 3, 8), start=8)


def test_rotate_half_turns_each_pair_by_a_right_angle():
    assert torch.equal(tl.rotate_half(torch.tensor([1.0, 2.0, 3.0, 4.0])), torch.tensor([-3.0, -4.0, 1.0, 2.0]))


def test_grouped_query_attention_is_multi_head_attention_with_every_head_and_multi_query_with_one():
    torch.manual_seed(0)
    d_model, heads = 24, 6
    x, memory = torch.randn(2, 5, d_model), torch.randn(2, 4, d_model)
    mask = torch.ones(2, 1, 1, 4, dtype=torch.bool)
    mask[1, ..., 3:] = False
    mha = tl.MultiHeadAttention(d_model, heads)
    same = tl.GroupedQueryAttention(d_model, heads, n_kv_heads=heads)
    same.load_state_dict(mha.state_dict())
    torch.testing.assert_close(same(x, memory, memory, mask)[0], mha(x, memory, memory, mask)[0])
    for kv_heads in (1, 2, 3):  # each key/value head repeated for its group equals a full layer with copied heads
        gqa = tl.GroupedQueryAttention(d_model, heads, n_kv_heads=kv_heads)
        full = tl.MultiHeadAttention(d_model, heads)
        group, d_k = heads // kv_heads, d_model // heads
        with torch.no_grad():
            for name in ("w_q", "w_o"):
                getattr(full, name).load_state_dict(getattr(gqa, name).state_dict())
            for name in ("w_k", "w_v"):
                weight = getattr(gqa, name).weight.view(kv_heads, d_k, d_model).repeat_interleave(group, dim=0)
                bias = getattr(gqa, name).bias.view(kv_heads, d_k).repeat_interleave(group, dim=0)
                getattr(full, name).weight.copy_(weight.reshape(d_model, d_model))
                getattr(full, name).bias.copy_(bias.reshape(d_model))
        out, weights = gqa(x, memory, memory, mask, need_weights=True)
        expected, expected_weights = full(x, memory, memory, mask, need_weights=True)
        torch.testing.assert_close(out, expected)
        torch.testing.assert_close(weights, expected_weights)
        k, v = gqa.key_value_heads(memory, memory)
        assert k.shape == v.shape == (2, kv_heads, 4, d_k)  # what a cache would hold: kv_heads heads, not 6
        assert tl.count_parameters(gqa) == 2 * (d_model * d_model + d_model) + 2 * (d_model + 1) * kv_heads * d_k


def test_grouped_query_attention_refuses_heads_that_do_not_divide():
    with pytest.raises(ValueError, match=r"n_kv_heads must be a positive divisor of n_heads=8, got 3"):
        tl.GroupedQueryAttention(32, 8, n_kv_heads=3)
    with pytest.raises(ValueError, match=r"n_kv_heads must be a positive divisor of n_heads=8, got 0"):
        tl.GroupedQueryAttention(32, 8, n_kv_heads=0)


def test_grouped_query_attention_rotates_queries_and_keys_from_their_start():
    torch.manual_seed(0)
    attention = tl.GroupedQueryAttention(16, 4, n_kv_heads=2, rotary=tl.RotaryPositions(4, max_len=20))
    x = torch.randn(1, 9, 16)
    q_all, (k_all, _) = attention.query_heads(x), attention.key_value_heads(x, x)
    torch.testing.assert_close(attention.query_heads(x[:, 6:], start=6), q_all[:, :, 6:])
    torch.testing.assert_close(attention.key_value_heads(x[:, 6:], x[:, 6:], start=6)[0], k_all[:, :, 6:])


def test_rotary_and_shared_heads_are_options_built_where_they_belong():
    cfg = tl.TransformerConfig(**SMALL, positional="rotary", n_kv_heads=2)
    model = tl.Transformer(cfg)
    for layer in model.encoder.layers:  # rotated, every head: the encoder keeps nothing in a cache
        assert isinstance(layer.self_attn, tl.GroupedQueryAttention) and layer.self_attn.n_kv_heads == 4
        assert layer.self_attn.rotary is not None
    for layer in model.decoder.layers:
        assert layer.self_attn.n_kv_heads == 2 and layer.self_attn.rotary is not None
        assert layer.cross_attn.n_kv_heads == 2 and layer.cross_attn.rotary is None  # two sequences: not rotated
    x = torch.randn(1, 5, 32)
    assert torch.equal(model.src_positional.eval()(x), x)  # nothing added to the embeddings
    paper = tl.Transformer(tl.TransformerConfig(**SMALL))
    assert all(type(m) is tl.MultiHeadAttention for m in paper.modules() if isinstance(m, tl.MultiHeadAttention))
    only_grouped = tl.Transformer(tl.TransformerConfig(**SMALL, n_kv_heads=2))
    assert type(only_grouped.encoder.layers[0].self_attn) is tl.MultiHeadAttention


def test_a_rotary_model_has_no_position_tables_and_reads_the_same_sentence_anywhere_in_a_batch():
    torch.manual_seed(0)
    model = tl.Transformer(tl.TransformerConfig(**SMALL, positional="rotary")).eval()
    assert not [name for name in model.state_dict() if "positional" in name or "rotary" in name]
    src = torch.randint(4, 40, (1, 6))
    padded = torch.cat([src, torch.zeros(1, 3, dtype=torch.long)], dim=1)  # the same sentence with padding after it
    tgt = torch.randint(4, 40, (1, 5))
    torch.testing.assert_close(model(padded, tgt), model(src, tgt), atol=1e-5, rtol=1e-5)
