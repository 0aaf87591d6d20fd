"""The benchmark script (benchmarks/benchmark.py): its FLOP formula, its nn.Transformer baseline and a tiny run.

These check that the benchmark measures the right things; its timings are reported, never asserted.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import transformer_lib as tl

ROOT = Path(__file__).resolve().parent.parent
import benchmark
import tables
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
    text = tables.APPENDIX.read_text(encoding="utf-8")
    names = [match["name"] for match in tables.BLOCK.finditer("".join(
        "".join(cell["source"]) for cell in json.loads(text)["cells"] if cell["cell_type"] == "markdown"))]
    assert len(names) >= 4, names
    for name in names:
        if "*" in name:  # a group of benchmarks/threads.py reports
            files = sorted(tables.RESULTS.glob(name))
            assert files, name
            for path in files:
                report = json.loads(path.read_text())
                assert report["results"] and all(by_threads for by_threads in report["results"].values()), path
            continue
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


@pytest.mark.parametrize("device", ["meta", "xpu", "hpu", "ipu", "cuda:x"])
def test_a_device_the_benchmark_cannot_time_is_refused_before_anything_runs(capsys, device):
    with pytest.raises(SystemExit) as stop:
        benchmark.parse_args(["--device", device])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and "--device must be a device such as cpu, cuda, cuda:1 or mps" in err, err


@pytest.mark.skipif(torch.cuda.is_available(), reason="refusing cuda needs a machine without CUDA")
def test_cuda_is_refused_where_there_is_none(capsys):
    with pytest.raises(SystemExit) as stop:
        benchmark.parse_args(["--device", "cuda:1"])
    assert stop.value.code == 2 and "torch sees no CUDA GPU here; use cpu" in capsys.readouterr().err


def test_json_replaces_only_a_report_of_the_benchmark(tmp_path, capsys):
    report = tmp_path / "report.json"
    report.write_text((tables.RESULTS / "cpu-small-fp32.json").read_text(encoding="utf-8"), encoding="utf-8")
    assert benchmark.parse_args(["--json", str(report)]).json == report  # its own kind: replaced by the new one
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoint.pt").write_bytes(b"weights")
    (run / "notes.json").write_text("{}\n", encoding="utf-8")
    (tmp_path / "other.json").write_text('{"x": 1}\n', encoding="utf-8")
    for path, kind in [(run / "checkpoint.pt", "is a run folder's file"), (run / "notes.json", "is in a run folder"),
                       (tmp_path / "other.json", "is not a report of benchmarks/benchmark.py")]:
        before = path.read_bytes()
        with pytest.raises(SystemExit) as stop:
            benchmark.parse_args(["--json", str(path)])
        err = capsys.readouterr().err
        assert stop.value.code == 2 and str(path) in err and kind in err, err
        assert path.read_bytes() == before


@pytest.mark.parametrize("text, message", [('{"x": 1}', "has environment null, not an object"),
                                           ('{"environment": {', "is not valid JSON (line 1, column"),
                                           ("[1]", "holds a JSON list, not a report")])
def test_tables_refuse_a_report_that_is_not_one_in_one_line(tmp_path, monkeypatch, capsys, text, message):
    import shutil

    for path in tables.RESULTS.glob("*.json"):
        shutil.copy(path, tmp_path / path.name)
    (tmp_path / "cpu-small-fp32.json").write_text(text, encoding="utf-8")
    monkeypatch.setattr(tables, "RESULTS", tmp_path)
    assert tables.main(["--check"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: benchmark report") and "\n" not in err and message in err, err
    assert str(tmp_path / "cpu-small-fp32.json") in err
    (tmp_path / "cpu-small-fp32.json").unlink()
    assert tables.main(["--check"]) == 1 and "is not a file" in capsys.readouterr().err


def test_the_threads_benchmark_times_each_thread_count_and_refuses_a_bad_count(tmp_path, capsys):
    spec = importlib.util.spec_from_file_location("threads_benchmark", ROOT / "benchmarks" / "threads.py")
    threads = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(threads)
    report = threads.main(["--models", "tiny", "--windows", "1", "--steps", "1", "--json", str(tmp_path / "t.json")])
    timed = report["results"]["tiny"]
    assert set(timed) == {str(n) for n in range(1, (os.cpu_count() or 1) + 1)}
    assert all(0 < value["min_s"] <= value["median_s"] <= value["max_s"] for value in timed.values())
    assert json.loads((tmp_path / "t.json").read_text())["busy_processes"] == 0
    with pytest.raises(SystemExit) as stop:
        threads.main(["--busy", "-1"])
    assert stop.value.code == 2 and "--busy: expected an integer >= 0, got -1" in capsys.readouterr().err
