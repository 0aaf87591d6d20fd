"""The tiny preset's numbers, bit for bit, before and after a refactor of the upper floors (issue 31).

A short run of the `tiny` preset on the offline Multi30k (three epochs of 2,000 pairs, BLEU on 100 validation pairs after
each), then the decodings the book makes with it (on 10 test and 100 validation sentences, at most 20 tokens each): greedy and beam search with the final and the averaged weights, and
the validation sweep of chapter 8. Every loss, score and translation is compared with tests/fixtures/golden_tiny.json,
recorded before the refactor by `python tests/test_golden_tiny.py --record`.

Floating-point sums depend on the CPU's instructions, the thread count and torch's kernels, so the comparison is exact
only where those match the recording's (`machine()`). The thread count the test sets itself, to the recording's, for
the run and no longer (pytest-xdist's workers start with one thread each, conftest.py); where the CPU, torch or Python
differ the test skips and says how to record the fixture on that machine (before changing the code, from the commit
the refactor starts at).
"""

import json
import os
import platform
import sys
from pathlib import Path

import pytest
import torch

FIXTURE = Path(__file__).parent / "fixtures" / "golden_tiny.json"
DATA = Path(os.environ.get("TRANSFORMER_LIB_DATA", Path(__file__).resolve().parents[2] / "shared" / "data"))
MAX_LEN = 20  # output tokens: enough to tell translations apart, short enough for seconds of decoding
SETTINGS = {"model": {"max_len": 64}, "training": {"bleu_every": 1, "keep_checkpoints": 2}}


def machine() -> dict:
    import transformer_lib as tl

    return {"cpu": tl.runtime.cpu_name(), "torch": torch.__version__, "threads": torch.get_num_threads(),
            "python": platform.python_version()}


def run(folder: Path) -> dict:
    """Train, decode and sweep as the book does; every number that a refactor must leave unchanged."""
    import transformer_lib as tl
    from transformer_lib.data import load_pairs

    summary = tl.train_translator(folder, preset="tiny", overrides=SETTINGS, train_limit=2000, valid_limit=100,
                                  epochs=3, progress=False)
    test = [de for de, _ in load_pairs("multi30k", "test")[:10]]
    valid = load_pairs("multi30k", "validation")[:100]
    decodes = {}
    for average_last in (1, 2):
        model, tokenizer = tl.load_translator(folder, device="cpu", average_last=average_last)
        decodes[f"greedy, average_last {average_last}"] = tl.translate(model, tokenizer, test, beam_size=1, max_len=MAX_LEN)
        decodes[f"beam 4, alpha 0.6, average_last {average_last}"] = tl.translate(model, tokenizer, test, beam_size=4,
                                                                                  alpha=0.6, max_len=MAX_LEN)
    sweep = sweep_rows(folder, valid)
    return {"history": summary["history"], "validation": [{k: v for k, v in r.items() if k != "minutes"}
                                                          for r in summary["validation"]],
            "steps": summary["steps"], "decodes": decodes, "sweep": sweep}


def sweep_rows(folder: Path, pairs: list) -> list:
    """Chapter 8's validation sweep: beam 4, the final and the averaged weights, two values of alpha."""
    import transformer_lib as tl

    rows = tl.validation_sweep(folder, pairs, beam_size=4, alphas=(0.6, 1.0), average_lasts=(1, 2), max_len=MAX_LEN,
                               device="cpu",
                               progress=False)
    return [{"average_last": r["average_last"], "alpha": r["alpha"], "bleu": r["scores"]["bleu"],
             "hypotheses": r["hypotheses"]} for r in rows]


def test_the_tiny_presets_numbers_are_those_recorded_before_the_refactor(tmp_path, monkeypatch):
    if not (DATA / "multi30k" / "train.jsonl").is_file():
        pytest.skip(f"the offline Multi30k copy is not at {DATA}")
    golden = json.loads(FIXTURE.read_text(encoding="utf-8"))
    here = dict(machine(), threads=golden["machine"]["threads"])  # the thread count is set below, not compared
    if golden["machine"] != here:
        pytest.skip(f"recorded on {golden['machine']}, and this is {here}: floating-point sums differ between "
                    f"machines; to check a refactor here, record the fixture first from the commit it starts at "
                    f"(python tests/test_golden_tiny.py --record)")
    monkeypatch.setenv("TRANSFORMER_LIB_DATA", str(DATA))
    threads = torch.get_num_threads()
    torch.set_num_threads(golden["machine"]["threads"])  # the recording's: reductions split as they were then
    try:
        assert torch.get_num_threads() == golden["machine"]["threads"]
        now = json.loads(json.dumps(run(tmp_path / "run")))  # tuples as lists, as in the file
    finally:
        torch.set_num_threads(threads)
    for key in ("history", "validation", "steps", "decodes", "sweep"):
        assert now[key] == golden[key], key


if __name__ == "__main__":
    if sys.argv[1:] != ["--record"]:
        sys.exit("usage: python tests/test_golden_tiny.py --record  (writes tests/fixtures/golden_tiny.json)")
    import tempfile

    os.environ.setdefault("TRANSFORMER_LIB_DATA", str(DATA))
    with tempfile.TemporaryDirectory() as folder:
        result = {"machine": machine(), **run(Path(folder) / "run")}
    FIXTURE.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {FIXTURE}: {result['steps']} steps, sweep BLEU {[r['bleu'] for r in result['sweep']]}")
