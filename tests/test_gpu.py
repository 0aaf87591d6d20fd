"""The GPU path on a real GPU (marked `gpu`: skipped, with the reason, where CUDA is absent).

tools/gpu_kit.py --stage 1 runs these first wherever a GPU is at hand. tests/test_device_paths.py runs the same branches on
the CPU with the `meta` device and fp16 autocast; what is here needs CUDA itself: pinned memory, fused Adam, the
host waiting for the GPU, bf16 and fp16 kernels, NCCL. (The key/value cache on CUDA is a `gpu` case of
tests/test_decoding.py::test_cached_and_uncached_decoding_agree.)
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import transformer_lib as tl
from transformer_lib import training
from transformer_lib.training import load_checkpoint, resume_training, train
from copy_task import copy_batches, fresh

pytestmark = pytest.mark.gpu

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("TRANSFORMER_LIB_DATA", ROOT.parent / "shared" / "data"))
def needs_data():
    if not (DATA / "multi30k" / "train.jsonl").is_file():
        pytest.skip(f"the offline Multi30k copy is not at {DATA}; set TRANSFORMER_LIB_DATA")


@pytest.fixture(params=["bf16", "fp16"])
def autocast(request, monkeypatch):
    """Each test runs in bf16 (what an A100/H100 picks) and in fp16 with a GradScaler (what a T4 runs)."""
    if request.param == "bf16" and torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("bf16 needs compute capability 8.0 or newer")
    monkeypatch.setenv("TRANSFORMER_LIB_AUTOCAST", request.param)
    return request.param


def test_the_gpu_setup_is_what_training_expects():
    model, optimizer, _ = fresh(device="cuda")
    assert optimizer.defaults["fused"]  # one fused Adam kernel per step
    src, tgt = training.batch_to_device(*copy_batches(0)[0], torch.device("cuda"), model.cfg)
    assert src.is_cuda and tgt.is_cuda


def test_no_host_sync_between_settle_points(autocast, monkeypatch):
    # Between two log entries the host must never wait for the GPU: PyTorch raises at any synchronising call.
    model, optimizer, scheduler = fresh(device="cuda")
    scaler = torch.amp.GradScaler("cuda") if autocast == "fp16" else None
    real_settle = training.settle

    def settle_allowed_to_sync(*args, **kwargs):
        torch.cuda.set_sync_debug_mode("default")
        try:
            return real_settle(*args, **kwargs)
        finally:
            torch.cuda.set_sync_debug_mode("error")

    monkeypatch.setattr(training, "settle", settle_allowed_to_sync)
    train(model, copy_batches, optimizer, scheduler, max_steps=2, scaler=scaler, progress=False)  # warm up kernels
    torch.cuda.set_sync_debug_mode("error")
    try:
        state = train(model, copy_batches, optimizer, scheduler, max_steps=22, log_every=10, scaler=scaler,
                      state=training.TrainState(step=2), progress=False)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert state.step == 22 and [step for step, *_ in state.history] == [10, 20, 22]


def test_a_checkpoint_saved_on_cuda_resumes_on_the_cpu_and_back(tmp_path):
    path = tmp_path / "checkpoint.pt"
    model, optimizer, scheduler = fresh(device="cuda")
    state = train(model, copy_batches, optimizer, scheduler, max_steps=3, checkpoint_path=path, progress=False)
    model, optimizer, scheduler = fresh(seed=1)
    state = resume_training(load_checkpoint(path, "cpu"), model, optimizer, scheduler)
    state = train(model, copy_batches, optimizer, scheduler, max_steps=6, state=state, checkpoint_path=path,
                  progress=False)
    model, optimizer, scheduler = fresh(seed=2, device="cuda")
    state = resume_training(load_checkpoint(path, "cuda"), model, optimizer, scheduler)
    state = train(model, copy_batches, optimizer, scheduler, max_steps=9, state=state, progress=False)
    assert state.step == 9 and all(p.is_cuda for p in model.parameters())


def test_train_ctrl_c_resume_evaluate_on_cuda(autocast, tmp_path):
    needs_data()
    out = tmp_path / "run"

    def press_ctrl_c(record):
        if record["epoch"] == 1:
            os.kill(os.getpid(), signal.SIGINT)  # the loop stops after the current step and saves

    common = dict(preset="tiny", overrides={"training": {"bleu_every": 0}}, train_limit=3000, progress=False)
    with pytest.raises(KeyboardInterrupt, match="stopped by Ctrl-C"):
        tl.train_translator(out, max_steps=200, on_record=press_ctrl_c, **common)
    stopped = load_checkpoint(out / "checkpoint.pt")
    assert (stopped["scaler"] is not None) == (autocast == "fp16")
    summary = tl.train_translator(out, resume=True, max_steps=200, progress=False)
    assert summary["steps"] == 200 and summary["device"].startswith("cuda")
    model, tokenizer = tl.load_translator(out)
    hypotheses = tl.translate(model, tokenizer, ["Ein Hund läuft über die Wiese.", "Zwei Männer spielen."])
    assert len(hypotheses) == 2


def test_compiled_training_does_not_compile_per_batch_on_cuda():
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model, optimizer, scheduler = fresh(device="cuda")
    model.compile()
    graphs = []

    def count(state):
        graphs.append(counters["stats"]["unique_graphs"])

    batches = [copy_batches(0)[0], copy_batches(1)[1]]
    # contiguous, as a collated batch is: a strided slice would add a stride guard, and one recompile, of its own
    varied = lambda epoch: [(s[: 4 + epoch % 5, : 3 + epoch % 4].contiguous(), t[: 4 + epoch % 5])  # noqa: E731
                            for s, t in batches]
    train(model, varied, optimizer, scheduler, max_steps=16, progress=False, on_epoch_end=count)
    assert graphs[-1] == graphs[1], graphs  # after the first shapes, nothing new compiles


def test_torchrun_with_nccl_trains_two_steps(tmp_path):
    needs_data()
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", TRANSFORMER_LIB_DATA=str(DATA))
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1", "-m", "transformer_lib",
         "train", "--preset", "tiny", "--train-limit", "500", "--max-steps", "2", "--out", str(tmp_path / "ddp"),
         "--no-progress"],
        env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "trained 2 steps" in result.stdout and "cuda" in result.stdout, result.stdout
    history = json.loads((tmp_path / "ddp" / "history.json").read_text())
    assert history["train_loss"][-1][0] == 2
