import pytest
import torch

import transformer_lib as tl


def test_the_device_is_the_best_one_available(monkeypatch):
    mps = getattr(torch.backends, "mps", None)
    expected = "cuda" if torch.cuda.is_available() else "mps" if mps is not None and mps.is_available() else "cpu"
    assert tl.get_device().type == expected
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert tl.get_device().type == "cuda"  # CUDA first, whatever else there is
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    if mps is not None:
        monkeypatch.setattr(mps, "is_available", lambda: False)
    assert tl.get_device().type == "cpu"


@pytest.mark.parametrize("value, expected", [("", False), ("0", False), ("1", True), ("true", True), ("No", False)])
def test_smoke_switch(monkeypatch, value, expected):
    monkeypatch.setenv(tl.runtime.SMOKE_ENV, value)
    assert tl.is_smoke() is expected
    assert tl.smoke_or("full", "smoke") == ("smoke" if expected else "full")


def test_smoke_switch_rejects_nonsense(monkeypatch):
    monkeypatch.setenv(tl.runtime.SMOKE_ENV, "maybe")
    with pytest.raises(ValueError, match="TRANSFORMER_BOOK_SMOKE must be 1 or 0.*'maybe'"):
        tl.is_smoke()
