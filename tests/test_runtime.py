import pytest
import torch

import transformer_lib as tl


def test_device_is_a_real_device():
    device = tl.get_device()
    assert device.type in {"cuda", "mps", "cpu"}
    assert torch.zeros(1, device=device).device.type == device.type


@pytest.mark.parametrize("value, expected", [("", False), ("0", False), ("1", True), ("true", True), ("No", False)])
def test_smoke_switch(monkeypatch, value, expected):
    monkeypatch.setenv(tl.runtime.SMOKE_ENV, value)
    assert tl.is_smoke() is expected
    assert tl.smoke_or("full", "smoke") == ("smoke" if expected else "full")


def test_smoke_switch_rejects_nonsense(monkeypatch):
    monkeypatch.setenv(tl.runtime.SMOKE_ENV, "maybe")
    with pytest.raises(ValueError, match="TRANSFORMER_BOOK_SMOKE must be 1 or 0.*'maybe'"):
        tl.is_smoke()
