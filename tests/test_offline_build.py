"""The book builds without the Hugging Face Hub and without TRANSFORMER_LIB_DATA: the scaling-out appendix then runs on
the made-up Multi30k stand-in (tests/fixtures/multi30k), read by the book's loader, and says so."""

import importlib.util
import json
import os
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from transformer_lib.data import load_pairs

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures"
STAND_IN = FIXTURES / "multi30k"
APPENDIX = ROOT / "book" / "appendix_scaling_out.ipynb"
SIZES = {"train": 1000, "validation": 200, "test": 200}
ENV = ("TRANSFORMER_LIB_DATA", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


def make_fixture():
    spec = importlib.util.spec_from_file_location("make_multi30k_fixture", STAND_IN / "make_fixture.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def clean_env(monkeypatch):
    """None of the data variables set; whatever a test or the appendix's cell sets is undone afterwards."""
    for name in ENV:
        monkeypatch.setenv(name, "x")  # recorded first, so that a value the cell sets is removed again
        monkeypatch.delenv(name)
    return monkeypatch


def test_the_stand_in_is_what_make_fixture_writes():
    for split, pairs in make_fixture().splits().items():
        rows = [json.loads(line) for line in (STAND_IN / f"{split}.jsonl").read_text(encoding="utf-8").splitlines()]
        assert rows == [{"en": en, "de": de} for en, de in pairs], f"{split}.jsonl: run make_fixture.py again"
    assert sum(path.stat().st_size for path in STAND_IN.glob("*.jsonl")) < 300_000


def test_the_loader_reads_the_stand_in_in_the_layout_of_multi30k(clean_env):
    clean_env.setenv("TRANSFORMER_LIB_DATA", str(FIXTURES))
    clean_env.setenv("HF_HUB_OFFLINE", "1")  # should the loader ever reach for the Hub, fail at once
    splits = {split: load_pairs("multi30k", split) for split in SIZES}
    assert {split: len(pairs) for split, pairs in splits.items()} == SIZES
    english = [{en for _, en in pairs} for pairs in splits.values()]
    assert not english[0] & english[1] and not english[0] & english[2] and not english[1] & english[2]
    german, english_0 = splits["train"][0]
    assert german.endswith(".") and english_0.endswith(".") and german != english_0
    assert load_pairs("multi30k", "test", src_lang="en", tgt_lang="de") == [(en, de) for de, en in splits["test"]]
    lengths = [len(en.split()) for _, en in splits["train"]]
    assert max(lengths) > 2 * min(lengths)  # the appendix's shards need sentences of different lengths


def data_source_cell() -> str:
    cells = json.loads(APPENDIX.read_text(encoding="utf-8"))["cells"]
    (cell,) = [c for c in cells if c.get("id") == "data-source"]
    assert "hide-input" in cell["metadata"].get("tags", [])
    return "".join(cell["source"])


def run_cell(monkeypatch, hub: bool) -> dict:
    """Run the appendix's data-source cell from book/, as the build does, with the Hub answering or not."""

    def urlopen(url, timeout):
        assert timeout <= 5
        if not hub:
            raise urllib.error.URLError("no network")
        return open(os.devnull)  # a context manager, as urlopen's answer is

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    monkeypatch.chdir(ROOT / "book")
    namespace = {"os": os, "Path": Path, "urllib": urllib}
    exec(data_source_cell(), namespace)
    return namespace


def test_without_hub_or_data_the_appendix_runs_on_the_stand_in_and_says_so(clean_env, capsys):
    namespace = run_cell(clean_env, hub=False)
    assert "MADE-UP STAND-IN tests/fixtures/multi30k" in capsys.readouterr().out
    assert Path(os.environ["TRANSFORMER_LIB_DATA"]) == FIXTURES
    assert os.environ["HF_HUB_OFFLINE"] == os.environ["HF_DATASETS_OFFLINE"] == "1"
    assert "STAND-IN" in namespace["SOURCE"]


def test_a_local_copy_is_kept_and_a_folder_without_multi30k_gives_way_to_the_hub(clean_env, capsys, tmp_path):
    (tmp_path / "multi30k").mkdir()
    for split in SIZES:
        (tmp_path / "multi30k" / f"{split}.jsonl").write_text('{"en": "A dog.", "de": "Ein Hund."}\n')
    clean_env.setenv("TRANSFORMER_LIB_DATA", str(tmp_path))
    run_cell(clean_env, hub=False)
    out = capsys.readouterr().out
    assert "from the local copy" in out and str(tmp_path) not in out  # no path of the build machine on the page
    assert os.environ["TRANSFORMER_LIB_DATA"] == str(tmp_path) and "HF_HUB_OFFLINE" not in os.environ

    clean_env.setenv("TRANSFORMER_LIB_DATA", str(tmp_path / "elsewhere"))  # e.g. a folder for opus_books only
    run_cell(clean_env, hub=True)
    assert "from the Hugging Face Hub" in capsys.readouterr().out
    assert "TRANSFORMER_LIB_DATA" not in os.environ  # else the loader would refuse the folder
