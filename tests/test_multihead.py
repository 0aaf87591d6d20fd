
import pytest
import torch
from torch import nn

import transformer_lib as tl

from torch_baseline import copy_attention  # (the benchmark's nn.Transformer baseline copies our weights)


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("causal", [False, True])
def test_matches_torch_multihead_attention(fused, causal):
    d_model, n_heads = 32, 4
    ours = tl.MultiHeadAttention(d_model, n_heads)
    theirs = nn.MultiheadAttention(d_model, n_heads, batch_first=True)
    copy_attention(ours, theirs)
    query = torch.randn(3, 6, d_model)
    memory = query if causal else torch.randn(3, 7, d_model)
    ids = torch.randint(1, 9, (3, memory.size(1)))
    ids[1, 4:] = 0
    mask = tl.padding_mask(ids, 0)
    attn_mask = None
    if causal:
        mask = mask & tl.causal_mask(6)
        attn_mask = ~tl.causal_mask(6)[0, 0]  # torch's bool attn_mask: True = may NOT attend
    out, weights = ours(query, memory, memory, mask, need_weights=True)
    with tl.explicit_attention(ours, enabled=not fused):
        fast, _ = ours(query, memory, memory, mask)  # the fused kernel, or the explicit path
    ref, ref_weights = theirs(
        query, memory, memory, key_padding_mask=(ids == 0), attn_mask=attn_mask, average_attn_weights=False
    )
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(fast, ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights, ref_weights, atol=1e-5, rtol=1e-5)


def test_forward_is_attend_over_the_heads_that_query_heads_and_key_value_heads_make():
    """The one place where queries, keys and values are made: what forward attends over, and what a caller that keeps
    heads between calls (the key/value cache) gets; start, the position of the first row, changes nothing here."""
    torch.manual_seed(0)
    mha = tl.MultiHeadAttention(16, 4).eval()
    x, memory = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    q = mha.query_heads(x)
    k, v = mha.key_value_heads(memory, memory)
    assert q.shape == (2, 4, 5, 4) and k.shape == v.shape == (2, 4, 7, 4)
    torch.testing.assert_close(q, mha.split_heads(mha.w_q(x)), atol=0, rtol=0)
    torch.testing.assert_close(v, mha.split_heads(mha.w_v(memory)), atol=0, rtol=0)
    torch.testing.assert_close(mha.query_heads(x, start=3), q, atol=0, rtol=0)
    out, _ = mha(x, memory, memory)
    torch.testing.assert_close(out, mha.attend(q, k, v)[0], atol=0, rtol=0)


def test_parameter_count_is_four_d_model_squared_plus_biases():
    mha = tl.MultiHeadAttention(512, 8)
    assert tl.count_parameters(mha) == 4 * 512 * 512 + 4 * 512


def test_d_model_not_divisible_by_n_heads():
    with pytest.raises(ValueError, match=r"d_model must be divisible by n_heads, got d_model=100 and n_heads=8"):
        tl.MultiHeadAttention(100, 8)


def test_wrong_feature_size_and_bad_mask_on_both_paths():
    mha = tl.MultiHeadAttention(16, 4)
    x = torch.randn(2, 5, 16)
    with pytest.raises(ValueError, match=r"d_model=16.*\(2, 5, 8\)"):
        mha(torch.randn(2, 5, 8), x, x)
    for need_weights in (False, True):
        with pytest.raises(ValueError, match=r"mask has shape \(2, 1, 1, 4\)"):
            mha(x, x, x, torch.ones(2, 1, 1, 4, dtype=torch.bool), need_weights=need_weights)
        with pytest.raises(TypeError, match="torch.bool"):
            mha(x, x, x, torch.ones(2, 1, 1, 5, dtype=torch.long), need_weights=need_weights)


def test_fully_masked_rows_are_finite_on_both_paths():
    mha = tl.MultiHeadAttention(16, 4)
    x = torch.randn(2, 5, 16, requires_grad=True)
    mask = torch.zeros(2, 1, 1, 5, dtype=torch.bool)
    mask[0] = True
    for need_weights in (False, True):
        out, _ = mha(x, x, x, mask, need_weights=need_weights)
        out.sum().backward()
        assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()
