"""transformer_lib.guards: a diverged run stops and keeps its last good checkpoint, Ctrl-C and SIGTERM stop a run
after a saved step, and one process at a time trains in a run folder (its lock)."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from transformer_lib import guards
from transformer_lib.training import load_checkpoint, resume_training, train

from copy_task import copy_batches, fresh

ROOT = Path(__file__).resolve().parents[1]


# ---- a diverged run stops ----


def test_a_nan_loss_stops_training_and_keeps_the_last_good_checkpoint(tmp_path):
    path = tmp_path / "checkpoint.pt"
    model, optimizer, scheduler = fresh()
    poisoned = {"from_step": 4, "calls": 0}

    def poison(module, inputs, output):
        poisoned["calls"] += 1
        return output * float("nan") if poisoned["calls"] >= poisoned["from_step"] else output

    model.generator.register_forward_hook(poison)
    with pytest.raises(guards.DivergedError, match=r"diverged at step 4: the loss is nan.*checkpoint.*lr_factor"):
        train(model, copy_batches, optimizer, scheduler, max_steps=10, checkpoint_path=path, checkpoint_every=1,
              progress=False)
    checkpoint = load_checkpoint(path)  # checkpoint_every=1: each checkpoint is written only after its step settled
    assert checkpoint["state"]["step"] == 3
    assert all(torch.isfinite(t).all() for t in checkpoint["model"].values())


def test_a_nan_loss_is_noticed_at_the_next_settle_and_named_by_the_step_where_it_appeared(tmp_path):
    # train reads the losses only every log_every steps (a GPU would wait at every read); the NaN of step 7 is seen
    # at step 10, reported as step 7, and the checkpoint of step 5 is the one kept on disk.
    path = tmp_path / "checkpoint.pt"
    model, optimizer, scheduler = fresh()
    calls = {"n": 0}

    def poison(module, inputs, output):
        calls["n"] += 1
        return output * float("nan") if calls["n"] == 7 else output

    model.generator.register_forward_hook(poison)
    with pytest.raises(guards.DivergedError, match=r"diverged at step 7: the loss is nan") as error:
        train(model, copy_batches, optimizer, scheduler, max_steps=20, log_every=10, checkpoint_path=path,
              checkpoint_every=5, progress=False)
    assert calls["n"] == 10  # it ran on to the settle point, and not further
    assert load_checkpoint(path)["state"]["step"] == 5
    assert "not to be trusted" in str(error.value)


def test_the_divergence_message_says_a_checkpoint_was_kept_only_when_one_exists(tmp_path):
    path = tmp_path / "checkpoint.pt"
    message = str(guards.diverged(3, "loss", float("nan"), path))
    assert "no checkpoint was written before it" in message and "keeps" not in message
    path.write_bytes(b"a checkpoint")
    assert f"{path} keeps the last checkpoint written before it" in str(guards.diverged(3, "loss", float("nan"), path))
    assert "keeps" not in str(guards.diverged(3, "loss", float("nan"), None))


def test_a_non_finite_gradient_stops_training_even_without_clipping():
    model, optimizer, scheduler = fresh()
    model.generator.weight.register_hook(lambda grad: grad * float("inf"))
    with pytest.raises(guards.DivergedError, match="diverged at step 1: the gradient norm is (inf|nan)"):
        train(model, copy_batches, optimizer, scheduler, max_steps=3, clip_norm=None, progress=False)



# ---- Ctrl-C and SIGTERM ----


def test_ctrl_c_during_the_last_save_lets_it_finish(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.pt"
    model, optimizer, scheduler = fresh()
    real_save = torch.save

    def save_then_press_ctrl_c(obj, file, *args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # arrives while the checkpoint is being written
        real_save(obj, file, *args, **kwargs)

    monkeypatch.setattr(torch, "save", save_then_press_ctrl_c)
    with pytest.raises(KeyboardInterrupt, match=r"stopped by Ctrl-C \(SIGINT\) at step 3; saved"):
        train(model, copy_batches, optimizer, scheduler, max_steps=3, checkpoint_path=path, progress=False)
    monkeypatch.setattr(torch, "save", real_save)
    assert load_checkpoint(path)["state"]["step"] == 3


def test_ctrl_c_saves_a_checkpoint_that_resumes_the_same_run(tmp_path):
    model, optimizer, scheduler = fresh()
    straight = train(model, copy_batches, optimizer, scheduler, max_steps=12, log_every=3, progress=False)

    path = tmp_path / "checkpoint.pt"
    model, optimizer, scheduler = fresh()
    handler_before = signal.getsignal(signal.SIGINT)  # default_int_handler, or SIG_IGN under nohup

    def press_ctrl_c(state):
        if state.epoch == 1:
            os.kill(os.getpid(), signal.SIGINT)  # arrives while the next step runs; the loop ends after it

    with pytest.raises(KeyboardInterrupt, match=r"stopped by Ctrl-C \(SIGINT\) at step \d+; saved"):
        train(model, copy_batches, optimizer, scheduler, max_steps=12, log_every=3, progress=False,
              checkpoint_path=path, on_epoch_end=press_ctrl_c)
    checkpoint = load_checkpoint(path)
    assert 4 <= checkpoint["state"]["step"] < 12
    assert signal.getsignal(signal.SIGINT) is handler_before  # the handler is put back

    model, optimizer, scheduler = fresh(seed=9)
    state = resume_training(checkpoint, model, optimizer, scheduler)
    resumed = train(model, copy_batches, optimizer, scheduler, max_steps=12, log_every=3, state=state, progress=False)
    assert resumed.history == straight.history  # the same means, the loss window included


SIGTERM_SCRIPT = """
import os, signal
from transformer_lib import guards
before = signal.getsignal(signal.SIGTERM)
with guards.interrupt_guard() as interrupt:
    os.kill(os.getpid(), signal.SIGTERM)  # as `kill PID` or a cluster's scheduler would
    for _ in range(1000):  # the handler runs between bytecodes of the main thread
        if interrupt.requested:
            break
print("requested" if interrupt.requested else "not requested", signal.getsignal(signal.SIGTERM) is before,
      interrupt.signal_name)
with guards.interrupt_guard(enabled=False) as interrupt:  # several processes: the signal acts as usual
    print(signal.getsignal(signal.SIGTERM) is before)
"""


def test_sigterm_is_handled_like_ctrl_c():
    result = subprocess.run([sys.executable, "-c", SIGTERM_SCRIPT], capture_output=True, text=True, cwd=ROOT)
    assert result.returncode == 0, f"killed by signal {-result.returncode}" if result.returncode < 0 else result.stderr
    # named as the signal it was (the message says "stopped by SIGTERM", not "by Ctrl-C"); the previous handler is
    # back afterwards, and a disabled guard leaves it in place
    assert result.stdout.split() == ["requested", "True", "SIGTERM", "True"]



# ---- the run folder's lock ----


@pytest.mark.parametrize("kind", ["folder", "link"])
def test_a_lock_file_that_is_a_folder_or_a_link_is_one_line(tmp_path, kind):
    run = tmp_path / "run"
    run.mkdir()
    if kind == "folder":
        (run / ".lock").mkdir()
    else:
        (run / ".lock").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(guards.RunFolderInUseError, match=f"the lock file .* is a {'folder' if kind == 'folder' else 'symbolic link'}"):
        with guards.lock_run_folder(run):
            pass
    assert not (tmp_path / "elsewhere").exists()


def test_a_run_folder_that_cannot_be_written_is_named_as_such_not_as_a_foreign_lock(tmp_path, monkeypatch):
    run = tmp_path / "run"
    run.mkdir()
    if os.geteuid() != 0:  # a real read-only folder (root may write anyway: then the refusal of the OS is made up)
        run.chmod(0o555)
    else:
        real_open = os.open

        def refused(path, *args, **kwargs):
            if Path(path).name == ".lock":
                raise PermissionError(13, "Permission denied", str(path))
            return real_open(path, *args, **kwargs)

        monkeypatch.setattr(guards.os, "open", refused)
    try:
        with pytest.raises(PermissionError) as caught:
            with guards.lock_run_folder(run):
                pass
    finally:
        run.chmod(0o755)
    message = str(caught.value)
    assert message.startswith(f"the run folder {str(run)!r} cannot be written (Permission denied: its lock file "
                              f"cannot be created)") and "\n" not in message, message
    assert "move it away" not in message and "foreign" not in message and caught.value.errno == 13
    assert sorted(p.name for p in run.iterdir()) == []


HOLD_SCRIPT = """
import sys
from transformer_lib import guards
with guards.lock_run_folder(sys.argv[1]):
    print("locked", flush=True)
    sys.stdin.read()  # hold the lock until the test closes stdin (or kills this process)
"""


def hold_lock(folder: Path) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", HOLD_SCRIPT, str(folder)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True, cwd=ROOT)
    assert process.stdout.readline() == "locked\n"
    return process


def test_a_run_folder_in_use_is_refused_naming_the_holder_and_a_dead_holders_lock_is_stale(tmp_path):
    folder = tmp_path / "run"
    holder = hold_lock(folder)
    try:
        with pytest.raises(guards.RunFolderInUseError,
                           match=f"{folder}.* is in use by process {holder.pid} \\(python -c {folder}\\), which "
                                 f"holds") as error:
            with guards.lock_run_folder(folder):
                pass
        assert "\n" not in str(error.value)
    finally:
        holder.send_signal(signal.SIGKILL)  # dies holding the lock: the kernel releases it, the file stays
        holder.wait()
        holder.stdout.close()
        holder.stdin.close()
    assert (folder / guards.LOCK_FILE).exists()
    with guards.lock_run_folder(folder):  # the stale lock is no obstacle
        assert (folder / guards.LOCK_FILE).read_text() == f"{os.getpid()}\n{guards.this_command()}\n"
    assert list(folder.iterdir()) == []  # the lock file goes; the folder existed before, so it stays
    with guards.lock_run_folder(tmp_path / "new"):
        assert (tmp_path / "new").is_dir()
    assert not (tmp_path / "new").exists()  # created by the lock and still empty: a failed start leaves nothing


def test_the_lock_file_names_the_holders_command_as_it_was_typed(monkeypatch):
    """What a second process shows of the holder: python -m transformer_lib and its arguments, quoted as a shell would
    need them, in one line of at most 300 characters."""
    monkeypatch.setattr(guards.sys, "argv", ["/venv/lib/transformer_lib/__main__.py", "choose", "--checkpoint",
                                             "runs/my run"])
    assert guards.this_command() == "python -m transformer_lib choose --checkpoint 'runs/my run'"
    monkeypatch.setattr(guards.sys, "argv", ["train.py", "x" * 400])
    assert guards.this_command().startswith("python train.py xxx") and len(guards.this_command()) == 300


def test_the_lock_is_reentrant_and_clears_what_a_dead_writer_left(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / ".checkpoint.pt.0123abcd.tmp").write_bytes(b"half a checkpoint of a killed run")
    (folder / "checkpoint.pt.tmp").write_bytes(b"the user's own file")
    with guards.lock_run_folder(folder):
        with guards.lock_run_folder(folder / "."):  # a notebook re-running a cell in the same process
            pass
        assert (folder / guards.LOCK_FILE).exists()  # still held by the outer block
        holder = subprocess.run([sys.executable, "-c", HOLD_SCRIPT, str(folder)], input="", capture_output=True,
                                text=True, cwd=ROOT)
        assert holder.returncode == 1 and f"is in use by process {os.getpid()}" in holder.stderr
    assert sorted(p.name for p in folder.iterdir()) == ["checkpoint.pt.tmp"]  # the folder existed before: it stays
