import subprocess
import sys
from pathlib import Path

import pytest
import torch

import transformer_lib as tl
from transformer_lib.decoding import greedy_decode
from transformer_lib.training import (
    autocast_dtype,
    load_checkpoint,
    make_optimizer,
    noam_lr,
    resume_training,
    teacher_forcing_pair,
    train,
    translation_loss,
)

CFG = dict(src_vocab_size=20, tgt_vocab_size=20, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_len=32)


def test_teacher_forcing_shifts_by_one():
    tgt = torch.tensor([[1, 7, 8, 2], [1, 9, 2, 0]])
    decoder_input, labels = teacher_forcing_pair(tgt)
    assert decoder_input.tolist() == [[1, 7, 8], [1, 9, 2]]
    assert labels.tolist() == [[7, 8, 2], [9, 2, 0]]  # position t predicts the token after it
    with pytest.raises(ValueError, match=r"length >= 2.*\(2, 1\)"):
        teacher_forcing_pair(torch.ones(2, 1, dtype=torch.long))


def test_label_smoothing_loss_matches_a_hand_computation():
    torch.manual_seed(1)
    logits = torch.randn(2, 3, 5)
    labels = torch.tensor([[1, 4, 0], [2, 0, 0]])  # 0 is padding
    eps, vocab = 0.1, 5
    total, count = 0.0, 0
    for b in range(2):
        for t in range(3):
            if labels[b, t] == 0:
                continue
            log_p = torch.log_softmax(logits[b, t], -1)
            target = torch.full((vocab,), eps / vocab)  # torch spreads eps over every class, the true one included
            target[labels[b, t]] += 1 - eps
            total += -(target * log_p).sum().item()
            count += 1
    assert translation_loss(logits, labels, pad_id=0, label_smoothing=eps).item() == pytest.approx(total / count, rel=1e-6)


def test_padding_does_not_change_the_loss():
    logits = torch.randn(1, 4, 6)
    labels = torch.tensor([[3, 4, 0, 0]])
    changed = logits.clone()
    changed[0, 2:] = torch.randn(2, 6) * 10  # whatever the model says at padded positions
    assert translation_loss(logits, labels, 0).item() == pytest.approx(translation_loss(changed, labels, 0).item())


def test_the_loss_of_labels_that_are_all_padding_is_zero_not_nan():
    logits = torch.randn(2, 3, 20, requires_grad=True)
    loss = tl.translation_loss(logits, torch.zeros(2, 3, dtype=torch.long), pad_id=0)
    assert loss.item() == 0.0
    loss.backward()
    assert torch.equal(logits.grad, torch.zeros_like(logits))  # nothing to learn from, and no NaN in the gradient


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_the_loss_is_the_mean_over_the_real_tokens(smoothing):
    logits, labels = torch.randn(3, 5, 20), torch.randint(1, 20, (3, 5))
    labels[0, 3:] = 0
    expected = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=0,
                                                 label_smoothing=smoothing)  # PyTorch's own mean
    # the same sum divided by the same count, possibly in another order: float32 rounding, a few ulps
    torch.testing.assert_close(tl.translation_loss(logits, labels, 0, smoothing), expected, rtol=1e-6, atol=0)


def test_schedule_follows_equation_3():
    d_model, warmup = 512, 4000
    assert noam_lr(1, d_model, warmup) == pytest.approx(512**-0.5 * 4000**-1.5)
    assert noam_lr(warmup, d_model, warmup) == pytest.approx(512**-0.5 * 4000**-0.5)  # the peak
    assert noam_lr(16000, d_model, warmup) == pytest.approx(512**-0.5 * 16000**-0.5)
    values = [noam_lr(s, d_model, warmup) for s in range(1, 20000, 50)]
    peak = max(range(len(values)), key=values.__getitem__)
    assert all(a < b for a, b in zip(values[:peak], values[1 : peak + 1]))
    assert all(a > b for a, b in zip(values[peak + 1 :], values[peak + 2 :]))
    with pytest.raises(ValueError, match="step must be >= 1, got 0"):
        noam_lr(0, d_model, warmup)
    for bad in (0, -1, 2.5):  # were a ZeroDivisionError and a comparison of a complex number
        with pytest.raises(ValueError, match=f"warmup must be a positive integer \\(steps\\), got {bad}"):
            noam_lr(5, d_model, bad)
    model = torch.nn.Linear(2, 2)
    optimizer, scheduler = make_optimizer(model, d_model, warmup)
    lrs = []
    for _ in range(3):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs == pytest.approx([noam_lr(s, d_model, warmup) for s in (1, 2, 3)])


def copy_batches(epoch: int):
    """A deterministic toy task: copy the source. Different batches each epoch, the same for the same epoch."""
    generator = torch.Generator().manual_seed(1000 + epoch)
    batches = []
    for _ in range(4):
        body = torch.randint(4, 20, (32, 6), generator=generator)
        src = body
        tgt = torch.cat([torch.full((32, 1), tl.BOS_ID), body, torch.full((32, 1), tl.EOS_ID)], dim=1)
        batches.append((src, tgt))
    return batches


def fresh(seed=0, dropout=0.1):
    torch.manual_seed(seed)
    model = tl.Transformer(tl.TransformerConfig(**CFG, dropout=dropout))
    optimizer, scheduler = make_optimizer(model, 32, warmup=50, factor=0.25)  # peak learning rate 8.8e-3
    return model, optimizer, scheduler


def test_resume_continues_the_same_trajectory(tmp_path):
    model, optimizer, scheduler = fresh()
    straight = train(model, copy_batches, optimizer, scheduler, max_steps=10, log_every=1, progress=False)

    model, optimizer, scheduler = fresh()
    path = tmp_path / "checkpoint.pt"
    half = train(model, copy_batches, optimizer, scheduler, max_steps=5, log_every=1, progress=False,
                 checkpoint_path=path)
    assert half.step == 5 and half.epoch == 1 and half.batch_in_epoch == 1
    torch.manual_seed(123)  # disturb the RNG: resuming must restore it
    model, optimizer, scheduler = fresh(seed=7)  # and different initial weights, which the checkpoint replaces
    state = resume_training(load_checkpoint(path), model, optimizer, scheduler)
    resumed = train(model, copy_batches, optimizer, scheduler, max_steps=10, state=state, log_every=1, progress=False)
    assert resumed.history == straight.history  # identical losses, step by step, dropout included
    reference, optimizer, scheduler = fresh()
    train(reference, copy_batches, optimizer, scheduler, max_steps=10, progress=False)
    for a, b in zip(model.state_dict().values(), reference.state_dict().values()):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_a_run_killed_between_log_entries_resumes_with_the_same_means(tmp_path, monkeypatch):
    import transformer_lib.training as training

    model, optimizer, scheduler = fresh()
    straight = train(model, copy_batches, optimizer, scheduler, max_steps=9, log_every=3, progress=False)

    path, original = tmp_path / "checkpoint.pt", training.save_checkpoint

    def save_and_keep(path, *args):  # keep a copy of every checkpoint, as if the run had been killed after it
        original(path, *args)
        (tmp_path / f"step{args[-2].step}.pt").write_bytes(Path(path).read_bytes())

    monkeypatch.setattr(training, "save_checkpoint", save_and_keep)
    model, optimizer, scheduler = fresh()
    train(model, copy_batches, optimizer, scheduler, max_steps=9, log_every=3, progress=False, checkpoint_path=path,
          checkpoint_every=5)
    model, optimizer, scheduler = fresh(seed=3)
    state = resume_training(load_checkpoint(tmp_path / "step5.pt"), model, optimizer, scheduler)
    assert state.running_steps == 2  # steps 4 and 5, not yet logged
    resumed = train(model, copy_batches, optimizer, scheduler, max_steps=9, log_every=3, state=state, progress=False)
    assert resumed.history == straight.history


def test_a_missing_checkpoint_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"checkpoint '.*nothing.pt' does not exist"):
        load_checkpoint(tmp_path / "nothing.pt")


def test_toy_model_learns_to_copy_and_greedy_decoding_is_right():
    model, optimizer, scheduler = fresh(dropout=0.0)
    state = train(model, copy_batches, optimizer, scheduler, max_steps=320, log_every=40, progress=False,
                  label_smoothing=0.0)
    assert state.history[-1][1] < 0.25 * state.history[0][1]
    src = copy_batches(99)[0][0]
    out = greedy_decode(model, src, max_len=10, bos_id=tl.BOS_ID, eos_id=tl.EOS_ID)
    assert (out[:, :6] == src).float().mean().item() > 0.9
    with pytest.raises(ValueError, match="max_len must be a positive integer of at most 31 for this model \\(its "
                                         "max_len is 32, and <bos> takes one position\\), got 50"):
        greedy_decode(model, src, max_len=50, bos_id=tl.BOS_ID, eos_id=tl.EOS_ID)  # said up front, not at step 32
    assert (out[:, 6] == tl.EOS_ID).float().mean().item() > 0.9


def test_importing_the_library_does_not_import_tqdm_auto():
    """tqdm.auto prints a warning ("IProgress not found") in every notebook without ipywidgets: every page of the
    book showed it, with a path of the machine that built it. The library uses tqdm's text bar instead."""
    code = "import sys, transformer_lib; print(sorted(m for m in sys.modules if m.startswith('tqdm.auto')))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


# ---- mixed precision by compute capability ----


@pytest.mark.parametrize("capability, expected", [((7, 5), torch.float16), ((7, 0), torch.float16),
                                                  ((8, 0), torch.bfloat16), ((9, 0), torch.bfloat16)])
def test_autocast_dtype_follows_compute_capability_not_is_bf16_supported(monkeypatch, capability, expected):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: True)  # what a T4 answers
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert autocast_dtype(torch.device("cuda")) == expected
    assert autocast_dtype(torch.device("cpu")) is None
