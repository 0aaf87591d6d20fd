import pytest
import torch

import transformer_lib as tl


def test_padding_mask_shape_and_meaning():
    ids = torch.tensor([[4, 5, 6], [7, 0, 0]])
    mask = tl.padding_mask(ids, pad_id=0)
    assert mask.shape == (2, 1, 1, 3) and mask.dtype == torch.bool
    assert mask[1, 0, 0].tolist() == [True, False, False]  # True = may be attended to


def test_causal_mask_lets_position_i_see_only_up_to_i():
    mask = tl.causal_mask(4)
    assert mask.shape == (1, 1, 4, 4) and mask.dtype == torch.bool
    for i in range(4):
        for j in range(4):
            assert bool(mask[0, 0, i, j]) == (j <= i)


def test_target_mask_combines_padding_and_causality():
    tgt = torch.tensor([[1, 2, 3], [1, 2, 0]])
    mask = tl.target_mask(tgt, pad_id=0)
    assert mask.shape == (2, 1, 3, 3)
    assert mask[1, 0, 2].tolist() == [True, True, False]
    assert mask[0, 0, 0].tolist() == [True, False, False]


def test_bad_inputs_are_named():
    with pytest.raises(ValueError, match=r"ids must be a 2-D tensor.*\(3,\)"):
        tl.padding_mask(torch.tensor([1, 2, 0]), 0)
    with pytest.raises(TypeError, match="integer token ids.*float32"):
        tl.padding_mask(torch.zeros(2, 3), 0)
    with pytest.raises(ValueError, match="size must be a positive integer, got 0"):
        tl.causal_mask(0)
    with pytest.raises(ValueError, match="size must be a positive integer, got 2.5"):  # was torch's TypeError
        tl.causal_mask(2.5)
