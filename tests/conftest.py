import pytest
import torch


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def pytest_collection_modifyitems(config, items):
    """Tests marked `gpu` skip, saying why and what runs them, where there is no CUDA GPU."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; on a machine with one, run python tools/gpu_kit.py --stage 1 "
                                   "(CONTRIBUTING.md, 'The GPU plan')")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def browser():
    """Headless Chromium for the browser tests (tests/test_browser.py, tests/test_interactive.py), which skip, saying
    why, where Chromium or playwright is missing."""
    from offline_cdn import CHROMIUM, CHROMIUM_ARGS
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()
