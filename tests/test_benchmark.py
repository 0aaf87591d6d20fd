"""The benchmark script (benchmarks/benchmark.py): its FLOP formula, its nn.Transformer baseline and a tiny run.

These check that the benchmark measures the right things; its timings are reported, never asserted.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import transformer_lib as tl

ROOT = Path(__file__).resolve().parent.parent
import benchmark
from torch_baseline import TorchTransformer


@pytest.mark.parametrize("shape", [(3, 10, 7), (2, 5, 13)])
def test_flop_formula_matches_torch_flop_counter(shape):
    batch, src_len, tgt_len = shape
    model = benchmark.make_model("tiny", dropout=0.0)
    src, tgt = benchmark.random_batches(1, "tiny", shape)[0]
    # The explicit path: plain matmuls, which torch's FLOP counter sees on every device.
    with tl.explicit_attention(model), FlopCounterMode(display=False) as forward:
        logits = model(src, tgt[:, :-1])
    assert forward.get_total_flops() == benchmark.flops_per_step("tiny", batch, src_len, tgt_len, training=False)
    with tl.explicit_attention(model), FlopCounterMode(display=False) as training:
        model(src, tgt[:, :-1]).sum().backward()
    assert training.get_total_flops() == benchmark.flops_per_step("tiny", batch, src_len, tgt_len)
    assert logits.shape == (batch, tgt_len, benchmark.SIZES["tiny"]["vocab"])


@pytest.mark.parametrize("norm_first", [False, True])
def test_baseline_computes_the_same_function_and_trains_the_same(norm_first):
    torch.manual_seed(0)
    cfg = tl.TransformerConfig(src_vocab_size=60, tgt_vocab_size=60, d_model=32, n_heads=4, n_layers=2, d_ff=64,
                               dropout=0.0, max_len=32, norm_first=norm_first, share_embeddings=True,
                               tie_embeddings=True)
    ours = tl.Transformer(cfg)
    theirs = TorchTransformer(ours)
    assert tl.count_parameters(theirs) == tl.count_parameters(ours)
    src, tgt = benchmark.random_batches(1, "tiny", (3, 9, 8))[0]
    src, tgt = src % 60, tgt % 60  # into this model's vocabulary, keeping pad/bos/eos (ids below 4)
    torch.testing.assert_close(theirs(src, tgt[:, :-1]), ours(src, tgt[:, :-1]), atol=1e-5, rtol=1e-5)
    # One Adam step on each from the same weights and the same batch: the same weights afterwards. Adam moves each
    # weight by ~lr = 1e-3 along its gradient's sign, so a gradient that is zero up to rounding (the key biases': the
    # softmax ignores a shift of all scores) may step either way, without changing the logits. The other gradients
    # agree to float32 rounding, and so do the logits: seen 9.5e-7 on 1 and 2 threads; 1e-4 leaves 100x.
    for model in (ours, theirs):
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        tl.translation_loss(model(src, tgt[:, :-1]), tgt[:, 1:], tl.PAD_ID).backward()
        optimizer.step()
    torch.testing.assert_close(theirs(src, tgt[:, :-1]), ours(src, tgt[:, :-1]), atol=1e-4, rtol=1e-4)


def test_random_batches_have_padding_bos_and_eos():
    for src, tgt in benchmark.random_batches(3, "tiny", (6, 12, 10)):
        assert src.shape == (6, 12) and tgt.shape == (6, 11)
        assert (tgt[:, 0] == tl.BOS_ID).all() and ((tgt == tl.EOS_ID).sum(1) == 1).all()
        assert (src == tl.PAD_ID).any() and (src[:, : 12 // 2] != tl.PAD_ID).all()


def test_a_tiny_run_reports_every_model_and_the_cache(tmp_path):
    out = tmp_path / "report.json"
    result = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "benchmark.py"), "--size", "tiny", "--device", "cpu", "--steps", "2",
         "--warmup", "1", "--repeats", "2", "--decode-tokens", "5", "--decode-batch", "2", "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert set(report["training"]) == set(benchmark.MODELS)
    for row in report["training"].values():
        assert len(row["tokens_per_s"]["runs"]) == 2 and row["tokens_per_s"]["median"] > 0
        assert row["peak_memory_mib"] > 0 and row["model_flops_per_s"] > 0
    assert set(report["decoding"]) == {"with KV cache", "without KV cache"}
    assert report["settings"]["logit_difference_vs_torch"] < 1e-4
    assert report["environment"]["torch"] == torch.__version__
    assert "| torch.nn.Transformer |" in result.stdout and "with KV cache" in result.stdout


@pytest.mark.parametrize("argv, message", [
    (["--batch", "4,8"], "--batch must be three integers"),
    (["--steps", "0"], "--steps must be at least 1"),
    (["--size", "huge"], "invalid choice: 'huge'"),
])
def test_bad_arguments_are_named(argv, message, capsys):
    with pytest.raises(SystemExit):
        benchmark.parse_args(argv)
    assert message in capsys.readouterr().err


def test_the_appendix_tables_are_the_committed_reports():
    import tables

    text = tables.APPENDIX.read_text(encoding="utf-8")
    names = [match["name"] for match in tables.BLOCK.finditer("".join(
        "".join(cell["source"]) for cell in json.loads(text)["cells"] if cell["cell_type"] == "markdown"))]
    assert len(names) >= 4, names
    for name in names:
        report = json.loads((tables.RESULTS / name).read_text())
        assert set(report["training"]) == set(benchmark.MODELS) and report["environment"]["device_name"]
    assert tables.sync(check=True) == [], "run `python benchmarks/tables.py` after changing a report"


@pytest.mark.parametrize("argv, message", [(["--threads", "-3"], "--threads must be at least 1"),
                                           (["--json", "."], "is a folder, not a regular file"),
                                           (["--device", "gpuu"], "--device must be a device such as cpu")])
def test_a_bad_argument_is_one_line_before_anything_runs(capsys, argv, message):
    with pytest.raises(SystemExit) as stop:
        benchmark.parse_args(argv)
    assert stop.value.code == 2 and message in capsys.readouterr().err
