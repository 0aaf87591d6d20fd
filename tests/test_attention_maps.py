import matplotlib

matplotlib.use("Agg")

import pytest
import torch

import transformer_lib as tl
from transformer_lib.attention_maps import collect_attention, plot_attention, plot_heads
from transformer_lib.multihead import explicit_attention


def small_model():
    torch.manual_seed(0)
    cfg = tl.TransformerConfig(src_vocab_size=30, tgt_vocab_size=30, d_model=32, n_heads=4, n_layers=2, d_ff=64)
    return tl.Transformer(cfg)


def test_collects_every_head_of_every_layer_with_the_masks_applied():
    model = small_model()
    model.train()
    src = torch.randint(4, 30, (2, 7))
    src[1, 5:] = tl.PAD_ID
    tgt = torch.randint(4, 30, (2, 5))
    maps = collect_attention(model, src, tgt)
    assert set(maps) == {f"encoder.{i}.self" for i in range(2)} | {
        f"decoder.{i}.{kind}" for i in range(2) for kind in ("self", "cross")
    }
    assert maps["encoder.0.self"].shape == (2, 4, 7, 7)
    assert maps["decoder.1.self"].shape == (2, 4, 5, 5)
    assert maps["decoder.1.cross"].shape == (2, 4, 5, 7)
    for weights in maps.values():
        torch.testing.assert_close(weights.sum(-1), torch.ones(weights.shape[:-1]))
    assert (maps["decoder.0.cross"][1, :, :, 5:] == 0).all()  # no attention to source padding
    assert (maps["decoder.0.self"][0].triu(1) == 0).all()  # none to the future
    assert model.training  # the mode is restored
    assert all(m.fused for m in model.modules() if isinstance(m, tl.MultiHeadAttention))


def test_explicit_attention_restores_the_fused_path_after_an_error():
    model = small_model()
    with pytest.raises(RuntimeError):
        with explicit_attention(model):
            assert not any(m.fused for m in model.modules() if isinstance(m, tl.MultiHeadAttention))
            raise RuntimeError("boom")
    assert all(m.fused for m in model.modules() if isinstance(m, tl.MultiHeadAttention))


def test_plots_label_the_axes_with_tokens_and_check_shapes():
    weights = torch.softmax(torch.randn(2, 3, 4, 5), dim=-1)
    ax = plot_attention(weights[0, 0], ["a", "b", "c", "d"], ["v", "w", "x", "y", "z"], title="t")
    assert [t.get_text() for t in ax.get_xticklabels()] == ["v", "w", "x", "y", "z"]
    fig = plot_heads(weights, ["a", "b", "c", "d"], ["v", "w", "x", "y", "z"])
    assert len(fig.axes) == 6
    with pytest.raises(ValueError, match=r"weights has shape \(4, 5\), expected \(3, 5\)"):
        plot_attention(weights[0, 0], ["a", "b", "c"], ["v", "w", "x", "y", "z"])


def test_explicit_attention_with_enabled_false_changes_nothing():
    model = small_model()
    attention = [m for m in model.modules() if isinstance(m, tl.MultiHeadAttention)]
    with explicit_attention(model, enabled=False):
        assert all(m.fused for m in attention)
    with explicit_attention(model, enabled=True):
        assert not any(m.fused for m in attention)
    assert all(m.fused for m in attention)
