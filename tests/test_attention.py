import math

import pytest
import torch
import torch.nn.functional as F

import transformer_lib as tl


@pytest.mark.parametrize("shape", [(2, 5, 8), (3, 4, 6, 16), (1, 2, 1, 7, 32)])
def test_matches_torch_sdpa_without_mask(shape):
    q, k, v = (torch.randn(shape) for _ in range(3))
    out, weights = tl.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights.sum(-1), torch.ones(shape[:-1]))


def test_matches_torch_sdpa_with_padding_and_causal_masks():
    q, k, v = (torch.randn(2, 4, 6, 16) for _ in range(3))
    ids = torch.tensor([[5, 6, 7, 8, 9, 3], [5, 6, 7, 0, 0, 0]])
    mask = tl.padding_mask(ids, pad_id=0) & tl.causal_mask(6)
    out, weights = tl.scaled_dot_product_attention(q, k, v, mask)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=mask), atol=1e-5, rtol=1e-5)
    assert (weights[~mask.expand_as(weights)] == 0).all()


def test_scale_is_sqrt_dk_not_sqrt_d_model():
    # With 8 heads of d_k = 8 (d_model = 64), scaling by sqrt(64) would flatten the softmax.
    q, k, v = (torch.randn(1, 8, 5, 8) for _ in range(3))
    _, weights = tl.scaled_dot_product_attention(q, k, v)
    by_hand = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(8), dim=-1)
    wrong = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(64), dim=-1)
    torch.testing.assert_close(weights, by_hand)
    assert not torch.allclose(weights, wrong, atol=1e-3)


def test_fully_masked_rows_give_zeros_and_finite_gradients():
    q, k, v = (torch.randn(1, 2, 3, 4, requires_grad=True) for _ in range(3))
    mask = torch.tensor([[True, False, False], [False, False, False], [True, True, True]])[None, None]
    out, weights = tl.scaled_dot_product_attention(q, k, v, mask)
    assert torch.isfinite(out).all() and torch.isfinite(weights).all()
    assert (out[:, :, 1] == 0).all()
    out.sum().backward()
    for tensor in (q, k, v):
        assert torch.isfinite(tensor.grad).all()


def test_masked_keys_get_no_gradient():
    q, k, v = (torch.randn(1, 1, 4, 8, requires_grad=True) for _ in range(3))
    mask = torch.tensor([True, True, False, False])[None, None, None]
    out, _ = tl.scaled_dot_product_attention(q, k, v, mask)
    out.sum().backward()
    assert (k.grad[..., 2:, :] == 0).all() and (v.grad[..., 2:, :] == 0).all()
    assert (k.grad[..., :2, :] != 0).any()


def test_mask_must_be_boolean():
    q = torch.randn(1, 1, 3, 4)
    with pytest.raises(TypeError, match=r"mask must have dtype torch.bool.*got torch.float32"):
        tl.scaled_dot_product_attention(q, q, q, torch.ones(1, 1, 3, 3))


def test_mask_of_wrong_shape_is_named():
    q = torch.randn(2, 1, 3, 4)
    with pytest.raises(ValueError, match=r"mask has shape \(2, 3\).*\(2, 1, 3, 3\)"):
        tl.scaled_dot_product_attention(q, q, q, torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"mask has shape \(2, 1, 1, 5\)"):
        tl.scaled_dot_product_attention(q, q, q, torch.ones(2, 1, 1, 5, dtype=torch.bool))


def test_a_mask_with_fewer_dimensions_is_refused_even_where_it_would_broadcast():
    # A (B, S) padding mask against scores (B, h, T_q, S) lines its batch axis up with the queries when B == T_q:
    # broadcasting succeeds, and sentence i's padding would hide keys from query i of every sentence.
    q = torch.randn(3, 2, 3, 4)  # (B, h, T_q, d_k) with B == T_q
    with pytest.raises(ValueError, match=r"mask has shape \(3, 3\), which does not fit .* \(3, 2, 3, 3\)"):
        tl.scaled_dot_product_attention(q, q, q, torch.ones(3, 3, dtype=torch.bool))


def test_a_key_padding_mask_is_refused_with_the_way_to_make_it_4d():
    q = torch.randn(2, 4, 3, 8)  # (B, h, T, d_k)
    keep = torch.tensor([[True, True, False], [True, True, True]])  # (B, T_k): True = a real token
    with pytest.raises(ValueError, match=r"key-padding mask must be made 4-D, mask\[:, None, None, :\].*~key_padding_mask"):
        tl.scaled_dot_product_attention(q, q, q, keep)
    out, _ = tl.scaled_dot_product_attention(q, q, q, keep[:, None, None, :])  # what the message says works
    expected, _ = tl.scaled_dot_product_attention(q, q, q, tl.padding_mask(torch.tensor([[5, 6, 0], [5, 6, 7]]), 0))
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_an_empty_d_k_is_refused_not_nan():
    empty = torch.randn(1, 3, 0)  # (B, T, d_k = 0): the scores would be 0 / sqrt(0)
    with pytest.raises(ValueError, match="d_k must be at least 1, got 0"):
        tl.scaled_dot_product_attention(empty, empty, torch.randn(1, 3, 4))


def test_mismatched_dimensions_are_named():
    with pytest.raises(ValueError, match="d_k"):
        tl.scaled_dot_product_attention(torch.randn(1, 3, 4), torch.randn(1, 3, 5), torch.randn(1, 3, 5))
    with pytest.raises(ValueError, match="same number of positions"):
        tl.scaled_dot_product_attention(torch.randn(1, 3, 4), torch.randn(1, 3, 4), torch.randn(1, 2, 4))
