import math

import pytest
import torch

import transformer_lib as tl


def test_sinusoidal_table_matches_the_paper_element_by_element():
    max_len, d_model = 50, 16
    pe = tl.sinusoidal_encoding(max_len, d_model)
    assert pe.shape == (max_len, d_model)
    for pos in range(max_len):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)  # PE(pos, 2i) = sin(pos / 10000^(2i/d_model))
            assert pe[pos, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert pe[pos, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_module_adds_the_table_and_checks_length():
    module = tl.SinusoidalPositionalEncoding(d_model=8, max_len=10).eval()
    x = torch.randn(2, 6, 8)
    torch.testing.assert_close(module(x), x + tl.sinusoidal_encoding(10, 8)[:6])
    with pytest.raises(ValueError, match=r"sequence length is 11, longer than max_len=10"):
        module(torch.randn(1, 11, 8))


def test_learned_positions_are_trained_and_checked():
    module = tl.LearnedPositionalEncoding(d_model=8, max_len=10)
    assert module.table.weight.requires_grad
    assert module(torch.zeros(2, 10, 8)).shape == (2, 10, 8)
    with pytest.raises(ValueError, match="longer than max_len=10"):
        module(torch.zeros(1, 12, 8))


def test_odd_d_model_is_rejected():
    with pytest.raises(ValueError, match="d_model must be a positive even number.*got 7"):
        tl.sinusoidal_encoding(10, 7)
