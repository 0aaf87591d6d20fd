import os

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


@pytest.mark.parametrize("cores, load, expected", [(2, 0.0, 2), (2, 0.49, 2), (2, 0.5, 1), (2, 3.7, 1), (16, 0.2, 16),
                                                   (1, 0.0, 1)])
def test_training_threads_uses_every_core_only_when_nothing_else_runs(cores, load, expected):
    assert tl.runtime.training_threads(cores=cores, load=load) == expected


def test_training_threads_reads_this_machine_by_default():
    threads = tl.runtime.training_threads()
    assert 1 <= threads <= (os.cpu_count() or 1)
