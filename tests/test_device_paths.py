"""The GPU path, run on the CPU: every branch of chapter 7's training code that differs on a GPU.

The `meta` device stands in for CUDA where what matters is where tensors live and when the host reads them (a meta
tensor has a shape and no values, so any read of a value fails: exactly the reads that make a host wait for a GPU).
fp16 autocast with an enabled GradScaler runs on the CPU. What needs a real GPU is in tests/test_gpu.py (marked `gpu`).
"""

import random
import warnings

import pytest
import torch
from torch._dynamo.utils import counters

import transformer_lib as tl
from transformer_lib import guards, training
from transformer_lib.training import load_checkpoint, resume_training, save_checkpoint, train
from copy_task import CFG, copy_batches, fresh

# ---- checkpoints onto another device ----


def saved_checkpoint(tmp_path):
    model, optimizer, scheduler = fresh()
    train(model, copy_batches, optimizer, scheduler, max_steps=3, progress=False)
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, model, optimizer, scheduler, None, training.TrainState(step=3))
    return path


def test_a_checkpoint_loaded_onto_another_device_keeps_its_random_states_on_the_cpu(tmp_path):
    # map_location=<GPU> used to move the RNG states too, and torch.set_rng_state refused them:
    # "TypeError: RNG state must be a torch.ByteTensor" on every resume on a GPU. meta stands in for the GPU.
    path = saved_checkpoint(tmp_path)
    checkpoint = load_checkpoint(path, "meta")
    assert checkpoint["model"]["generator.weight"].device.type == "meta"  # the weights went where they were asked
    assert checkpoint["rng"]["torch"].device.type == "cpu"
    training._set_rng_states(checkpoint["rng"])  # raised TypeError before the fix
    expected = torch.rand(3)
    training._set_rng_states(load_checkpoint(path)["rng"])
    assert torch.equal(torch.rand(3), expected)  # the same state, whatever the device the weights went to


def test_resume_onto_another_device_builds_the_optimizer_state_there(tmp_path):
    path = saved_checkpoint(tmp_path)
    model, optimizer, scheduler = fresh(seed=5, device="meta")
    state = resume_training(load_checkpoint(path, "meta"), model, optimizer, scheduler)
    assert state.step == 3
    moments = [value for entry in optimizer.state.values() for key, value in entry.items() if key == "exp_avg"]
    assert moments and all(moment.device.type == "meta" for moment in moments)


def test_a_checkpoint_from_a_machine_with_more_gpus_resumes_on_one_with_fewer(monkeypatch):
    restored = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda states: restored.extend(states))
    states = {"torch": torch.get_rng_state(), "python": random.getstate(),
              "cuda": [torch.zeros(16, dtype=torch.uint8), torch.ones(16, dtype=torch.uint8)]}  # saved with 2 GPUs
    training._set_rng_states(states)
    assert len(restored) == 1 and torch.equal(restored[0], states["cuda"][0])


def test_a_fused_adam_checkpoint_resumes_into_the_plain_one(tmp_path):
    # make_optimizer fuses Adam on CUDA only; a GPU run's optimizer state must still resume on a CPU.
    model, optimizer, scheduler = fresh()
    fused = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9, fused=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(fused, lambda i: 0.25 * tl.noam_lr(i + 1, 32, 50))
    train(model, copy_batches, fused, scheduler, max_steps=3, progress=False)
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, model, fused, scheduler, None, training.TrainState(step=3))
    saved = fused.state_dict()["state"]
    model, optimizer, scheduler = fresh(seed=5)
    state = resume_training(load_checkpoint(path), model, optimizer, scheduler)
    assert state.step == 3 and not optimizer.defaults["fused"]
    for index, moments in saved.items():  # the plain Adam carries on with the fused one's moments, exactly
        for name in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(optimizer.state[optimizer.param_groups[0]["params"][index]][name],
                                       moments[name], atol=0, rtol=0)
    before = [p.detach().clone() for p in model.parameters()]
    state = train(model, copy_batches, optimizer, scheduler, max_steps=6, log_every=1, state=state, progress=False)
    assert state.step == 6 and all(torch.isfinite(torch.tensor(loss)) for _, loss, _ in state.history)
    assert any(not torch.equal(old, new) for old, new in zip(before, model.parameters()))  # and it took its steps
    # the same three steps taken by the fused Adam itself, resumed from the same file: the same losses
    model, _, _ = fresh(seed=6)
    fused = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9, fused=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(fused, lambda i: 0.25 * tl.noam_lr(i + 1, 32, 50))
    itself = train(model, copy_batches, fused, scheduler, max_steps=6, log_every=1, progress=False,
                   state=resume_training(load_checkpoint(path), model, fused, scheduler))
    assert [entry[0] for entry in state.history[-3:]] == [entry[0] for entry in itself.history[-3:]] == [4, 5, 6]
    torch.testing.assert_close([entry[1] for entry in state.history[-3:]], [entry[1] for entry in itself.history[-3:]],
                               rtol=1e-5, atol=1e-6)


def test_make_optimizer_fuses_adam_only_on_cuda():
    model, optimizer, _ = fresh()
    assert not optimizer.defaults["fused"]  # the CPU keeps the plain Adam (and the recorded runs' numbers)


# ---- no host read between settle points ----


def test_training_reads_no_value_from_the_device_between_settle_points():
    # On the meta device any read of a value raises, as a read of a GPU value would make the host wait. The first
    # read must be the settle at the first log entry, after log_every steps: none at the steps in between.
    model, optimizer, scheduler = fresh(dropout=0.1, device="meta")
    with pytest.raises(RuntimeError, match="meta"):
        train(model, copy_batches, optimizer, scheduler, max_steps=8, log_every=3, progress=False)
    assert scheduler.last_epoch == 3  # three steps taken, then the settle read the values and failed


def test_batch_to_device_checks_ids_on_the_host_when_the_model_cannot():
    cfg = tl.TransformerConfig(**CFG)
    src, tgt = torch.tensor([[5, 25]]), torch.tensor([[1, 5, 2]])  # 25 is outside src_vocab_size=20
    with pytest.raises(ValueError, match=r"src contains token id 25.*\[0, 19\]"):
        training.batch_to_device(src, tgt, torch.device("meta"), cfg)
    moved, _ = training.batch_to_device(torch.tensor([[5, 6]]), tgt, torch.device("meta"), cfg)
    assert moved.device.type == "meta"
    tl.check_token_ids(torch.tensor([[25]], device="meta"), 20)  # off the CPU the model does not read the values


# ---- fp16 with a GradScaler, as on a T4 ----


@pytest.fixture
def fp16_on_the_cpu(monkeypatch):
    """autocast_dtype answers float16 for the CPU, as it does for a GPU older than compute capability 8.0."""
    monkeypatch.setattr(training, "autocast_dtype", lambda device: torch.float16)


def poisoned(model, steps):
    """A hook that makes the forward pass overflow (inf logits) at the given 1-based steps."""
    calls = {"n": 0}

    def hook(module, inputs, output):
        calls["n"] += 1
        return output * float("inf") if calls["n"] in steps else output

    model.generator.register_forward_hook(hook)
    return calls


def test_fp16_a_forward_overflow_is_a_step_the_scaler_skips_not_the_end_of_the_run(fp16_on_the_cpu):
    model, optimizer, scheduler = fresh()
    poisoned(model, steps={1, 5})  # the first step too: that one made PyTorch warn about the scheduler's order
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        state = train(model, copy_batches, optimizer, scheduler, max_steps=8, log_every=4, scaler=scaler,
                      progress=False)
    assert state.step == 8
    assert scaler.get_scale() == 2.0**8  # halved at each of the two skipped steps
    assert all(torch.isfinite(torch.tensor(loss)) for _, loss, _ in state.history)  # skipped steps are not averaged
    assert not [w for w in caught if "lr_scheduler" in str(w.message)], [str(w.message) for w in caught]


def test_fp16_a_window_in_which_every_step_overflows_is_a_divergence(fp16_on_the_cpu):
    model, optimizer, scheduler = fresh()
    poisoned(model, steps=set(range(1, 100)))
    scaler = torch.amp.GradScaler("cpu")
    with pytest.raises(guards.DivergedError, match=r"diverged at step 1: the loss of all 4 steps from it is (inf|nan)"):
        train(model, copy_batches, optimizer, scheduler, max_steps=8, log_every=4, scaler=scaler, progress=False)


def test_fp16_without_an_enabled_scaler_is_refused(fp16_on_the_cpu):
    model, optimizer, scheduler = fresh()
    for scaler in (None, torch.amp.GradScaler("cpu", enabled=False)):
        with pytest.raises(ValueError, match="fp16 training needs an enabled GradScaler"):
            train(model, copy_batches, optimizer, scheduler, max_steps=2, scaler=scaler, progress=False)


def test_fp16_resume_continues_the_scaler_where_it_stood(fp16_on_the_cpu, tmp_path):
    model, optimizer, scheduler = fresh()
    poisoned(model, steps={2})
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    path = tmp_path / "checkpoint.pt"
    train(model, copy_batches, optimizer, scheduler, max_steps=4, scaler=scaler, checkpoint_path=path,
          progress=False)
    model, optimizer, scheduler = fresh(seed=3)
    resumed = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    state = resume_training(load_checkpoint(path), model, optimizer, scheduler, resumed)
    assert resumed.get_scale() == 2.0**9 and state.step == 4


# ---- the autocast override that lets a newer GPU try a T4's path ----


@pytest.mark.parametrize(("value", "expected"), [("", "natural"), ("fp16", torch.float16),
                                                 ("bf16", torch.bfloat16), ("fp32", None)])
def test_the_autocast_override_names_the_type(monkeypatch, value, expected):
    monkeypatch.setenv("TRANSFORMER_LIB_AUTOCAST", value)
    assert tl.runtime.autocast_override("natural") == expected


def test_an_unknown_autocast_override_is_one_clear_error(monkeypatch):
    monkeypatch.setenv("TRANSFORMER_LIB_AUTOCAST", "half")
    with pytest.raises(ValueError, match=r"TRANSFORMER_LIB_AUTOCAST must be one of .*fp16.*got 'half'"):
        tl.runtime.autocast_override(torch.bfloat16)


# ---- torch.compile with batches of varying shapes ----


def varied_batches(seed: int, count: int = 6):
    """Batches whose batch size and both lengths vary, as token-budget batches do."""
    generator = torch.Generator().manual_seed(seed)
    batches = []
    for _ in range(count):
        b, s, t = (int(torch.randint(low, high, (1,), generator=generator)) for low, high in [(2, 9), (3, 20), (4, 20)])
        tgt = torch.randint(4, 20, (b, t), generator=generator)
        tgt[:, 0] = tl.BOS_ID
        batches.append((torch.randint(4, 20, (b, s), generator=generator), tgt))
    return batches


def test_compiled_training_stops_compiling_after_the_first_epoch_and_validation():
    # Dynamo compiles the first shape, recompiles once with symbolic sizes when a second shape comes (automatic
    # dynamic shapes), and once for evaluation mode; after that no batch, and no validation pass, compiles again.
    # ("eager" compiles graphs without generating kernels: what is counted is Dynamo's graphs, the same on a GPU.)
    torch._dynamo.reset()
    counters.clear()
    model, optimizer, scheduler = fresh()
    model.compile(backend="eager")
    graphs = []

    def validate(state):
        model.eval()
        with torch.no_grad():
            for src, tgt in varied_batches(100 + state.epoch):
                model(src, tgt[:, :-1])
        graphs.append(counters["stats"]["unique_graphs"])

    train(model, varied_batches, optimizer, scheduler, max_steps=24, progress=False, on_epoch_end=validate)
    assert len(graphs) == 4
    assert graphs[0] <= 4, graphs  # train (static, then dynamic) and evaluation
    assert graphs[1:] == [graphs[0]] * 3, graphs  # 18 more batches of new shapes and three validations: no compile
