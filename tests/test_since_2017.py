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
