import pytest
import torch


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` skip, saying why and what runs them, where there is no CUDA GPU."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; on a machine with one, run python tools/gpu_check.py")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
