"""transformer_lib.files: writes that are atomic (a kill, a full disk or a size limit leaves the old file), never
through a link or into a special file, strict JSON, and reading settings and data files in one-line errors."""

import json
import os
import random
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from transformer_lib import files, runs
from transformer_lib.training import load_checkpoint, resume_training, train

from copy_task import copy_batches, fresh

ROOT = Path(__file__).resolve().parents[1]


# ---- a kill, a full disk or a size limit leaves the old file ----


def test_a_failure_inside_a_save_keeps_the_old_checkpoint(tmp_path, monkeypatch):
    path = tmp_path / "checkpoint.pt"
    model, optimizer, scheduler = fresh()
    train(model, copy_batches, optimizer, scheduler, max_steps=3, checkpoint_path=path, progress=False)
    before = path.read_bytes()

    def half_then_crash(obj, file, *args, **kwargs):
        file.write(b"PK\x03\x04 half a zip")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", half_then_crash)
    with pytest.raises(OSError, match=f"could not write {re.escape(str(path))}: the disk is full") as caught:
        train(model, copy_batches, optimizer, scheduler, max_steps=5, checkpoint_path=path, progress=False,
              state=resume_training(load_checkpoint(path), model, optimizer, scheduler))
    assert caught.value.errno == 28 and "checkpoint.pt is as it was before" in str(caught.value)
    monkeypatch.undo()
    assert path.read_bytes() == before  # the old checkpoint, byte for byte
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt"]  # no temporary file left behind
    assert load_checkpoint(path)["state"]["step"] == 3


SIZE_LIMIT_SCRIPT = """
import json, resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # so that a write past the limit fails with EFBIG, as on a full disk
from transformer_lib.files import atomic_open
limit = int(sys.argv[2])
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
try:
    with atomic_open(sys.argv[1], sys.argv[3]) as file:
        file.write(b"x" * (limit + 1) if sys.argv[3] == "wb" else "x" * (limit + 1))
except OSError as error:
    print(json.dumps({"errno": error.errno, "message": str(error)}))
"""


@pytest.mark.parametrize("mode", ["wb", "w"])
def test_a_write_past_a_real_file_size_limit_is_one_line_and_leaves_the_old_file(tmp_path, mode):
    path = tmp_path / "checkpoint.pt"
    path.write_bytes(b"the old checkpoint")
    result = subprocess.run([sys.executable, "-c", SIZE_LIMIT_SCRIPT, str(path), "100000", mode], capture_output=True,
                            text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0 and result.stdout, result.stderr
    failure = json.loads(result.stdout)
    assert failure["errno"] == 27 and "\n" not in failure["message"]  # EFBIG, in one line
    assert failure["message"].startswith(f"could not write {path}: it is larger than this process's file-size limit "
                                         f"of 100.0 kB (ulimit -f); it needs more than the 100.0 kB written"), failure
    assert "checkpoint.pt is as it was before" in failure["message"]
    assert path.read_bytes() == b"the old checkpoint" and [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


def _under_size_limit(limit: int):
    """For subprocess's preexec_fn: a real file-size limit (RLIMIT_FSIZE), past which a write fails with EFBIG."""
    def limit_files() -> None:
        import resource

        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # (Python ignores it too; a signal would kill the process)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return limit_files


@pytest.fixture(scope="module")
def checkpoint_past_a_size_limit(tmp_path_factory):
    """A run of one epoch, resumed for three with a file-size limit between an epoch file's size and the checkpoint's:
    the epoch files fit, the checkpoint does not (it holds Adam's moments beside the weights)."""
    from test_translation import QUICK, tiny_corpus

    folder = tmp_path_factory.mktemp("size_limit")
    env = dict(os.environ, TRANSFORMER_LIB_DATA=str(tiny_corpus(folder / "data")), HF_HUB_OFFLINE="1",
               HF_DATASETS_OFFLINE="1", OMP_NUM_THREADS="1")
    config = folder / "quick.json"
    config.write_text(json.dumps({**QUICK, "training": {**QUICK["training"], "checkpoint_every": 1000}}),
                      encoding="utf-8")
    run = folder / "run"

    def cli(*args: str, limit: int | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "transformer_lib", "train", "--out", str(run), "--no-progress",
                               "--no-validation", *args], env=env, capture_output=True, text=True, cwd=ROOT,
                              timeout=300, preexec_fn=None if limit is None else _under_size_limit(limit))

    first = cli("--preset", "tiny", "--config", str(config), "--epochs", "1")
    assert first.returncode == 0, first.stderr
    before = {p.name: p.read_bytes() for p in run.iterdir()}
    epoch_size, checkpoint_size = len(before["epoch-001.pt"]), len(before["checkpoint.pt"])
    assert 2 * epoch_size < checkpoint_size, (epoch_size, checkpoint_size)
    limit = (epoch_size + checkpoint_size) // 2
    resumed = cli("--resume", "--epochs", "3", limit=limit)
    return run, before, limit, resumed


def test_a_checkpoint_past_a_real_size_limit_is_one_line_naming_the_file_and_the_limit(checkpoint_past_a_size_limit):
    run, before, limit, resumed = checkpoint_past_a_size_limit
    assert resumed.returncode == 1, (resumed.stdout, resumed.stderr)
    err = resumed.stderr.strip().splitlines()
    assert "Traceback" not in resumed.stderr and "a bug in transformer_lib" not in resumed.stderr, resumed.stderr
    assert err[-1].startswith(f"error: could not write {run / 'checkpoint.pt'}: it is larger than this process's "
                              f"file-size limit of {limit / 1e3:.1f} kB (ulimit -f)"), err
    assert "checkpoint.pt is as it was before" in err[-1]
    assert (run / "checkpoint.pt").read_bytes() == before["checkpoint.pt"]  # the old checkpoint, byte for byte
    assert not [p.name for p in run.iterdir() if p.name.endswith(".tmp")]


def test_a_checkpoint_past_a_real_size_limit_leaves_the_run_folder_as_it_was(checkpoint_past_a_size_limit):
    run, before, _, resumed = checkpoint_past_a_size_limit
    assert resumed.returncode == 1
    assert sorted(p.name for p in run.iterdir()) == sorted(before)  # no epoch file written or pruned
    runs.kept_epochs(run)  # the epochs its checkpoint names are there


KILL_SCRIPT = """
import os, sys, torch
import transformer_lib as tl
from transformer_lib.training import load_checkpoint, make_optimizer, resume_training, train

path = os.path.join(sys.argv[1], "checkpoint.pt")
torch.manual_seed(0)
model = tl.Transformer(tl.TransformerConfig(src_vocab_size=2000, tgt_vocab_size=2000, d_model=64, n_heads=4,
                                            n_layers=2, d_ff=256, max_len=16, dropout=0.0))
optimizer, scheduler = make_optimizer(model, 64, warmup=10)
state = resume_training(load_checkpoint(path), model, optimizer, scheduler) if os.path.exists(path) else None
data = torch.randint(4, 2000, (8, 6), generator=torch.Generator().manual_seed(0))
batches = [(data, torch.cat([torch.ones(8, 1, dtype=torch.long), data, torch.full((8, 1), 2)], dim=1))] * 4
print("ready", state.step if state else 0, flush=True)
train(model, lambda epoch: batches, optimizer, scheduler, max_steps=10**6, state=state, checkpoint_path=path,
      checkpoint_every=1, progress=False)
"""


def test_sigkill_at_random_moments_of_saving_every_step_always_leaves_a_run_that_loads_and_resumes(tmp_path):
    # A checkpoint of about 1.5 MB is written after every step, so a good share of the run's time is spent saving,
    # and SIGKILL (which no program can catch) lands at random moments: inside torch.save, between fsync and rename,
    # or between saves. Every time, the folder must hold a checkpoint that loads and resumes.
    script = tmp_path / "kill_me.py"
    script.write_text(KILL_SCRIPT, encoding="utf-8")
    folder = tmp_path / "run"
    folder.mkdir()
    rng = random.Random(0)
    steps = []
    for _ in range(6):
        process = subprocess.Popen([sys.executable, str(script), str(folder)], stdout=subprocess.PIPE, text=True,
                                   cwd=ROOT, env=dict(os.environ, OMP_NUM_THREADS="1"))
        ready = process.stdout.readline()
        assert ready.startswith("ready"), ready  # it loaded the folder the previous kill left
        steps.append(int(ready.split()[1]))
        deadline = time.monotonic() + 60
        while not (folder / "checkpoint.pt").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.4))
        process.send_signal(signal.SIGKILL)
        process.wait()
        process.stdout.close()
        checkpoint = load_checkpoint(folder / "checkpoint.pt")  # never half a file
        assert checkpoint["state"]["step"] >= steps[-1]
        left = {p.name for p in folder.iterdir()} - {"checkpoint.pt"}
        assert all(name.startswith(".checkpoint.pt.") and name.endswith(".tmp") for name in left), left
    assert steps == sorted(steps) and steps[-1] > 0  # each run resumed where the last one was killed



# ---- strict JSON, and no write through a link or into another kind of file ----


def test_history_json_is_strict():
    value = {"history": [(1, 2.5), (2, float("nan"))], "bleu": float("inf")}
    text = json.dumps(files.strict_json(value), allow_nan=False)
    assert json.loads(text) == {"history": [[1, 2.5], [2, None]], "bleu": None}


def test_write_json_replaces_atomically(tmp_path):
    path = tmp_path / "history.json"
    files.write_json(path, [(1, 0.5)])
    files.write_json(path, [(1, 0.5), (2, float("nan"))])
    assert json.loads(path.read_text(encoding="utf-8")) == [[1, 0.5], [2, None]]
    assert [p.name for p in tmp_path.iterdir()] == ["history.json"]


def test_a_link_planted_at_the_old_temporary_name_is_never_written_through(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious", encoding="utf-8")
    (tmp_path / "history.json.tmp").symlink_to(victim)  # the fixed name atomic writes used to open, following links
    files.write_json(tmp_path / "history.json", [1])
    assert victim.read_text(encoding="utf-8") == "precious"
    assert (tmp_path / "history.json.tmp").is_symlink()  # not renamed away either
    assert json.loads((tmp_path / "history.json").read_text(encoding="utf-8")) == [1]


def test_a_users_own_tmp_file_is_never_touched(tmp_path):
    (tmp_path / "hyp.en.tmp").write_text("my notes", encoding="utf-8")
    files.atomic_write_text(tmp_path / "hyp.en", "a translation\n")
    assert (tmp_path / "hyp.en.tmp").read_text(encoding="utf-8") == "my notes"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hyp.en", "hyp.en.tmp"]


def test_the_temporary_file_is_created_exclusively_even_when_its_name_was_guessed(tmp_path, monkeypatch):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious", encoding="utf-8")
    names = iter(["guessed", "fresh"])
    monkeypatch.setattr(files.secrets, "token_hex", lambda n: next(names))
    (tmp_path / ".out.txt.guessed.tmp").symlink_to(victim)  # an attacker who guessed the first name
    files.atomic_write_text(tmp_path / "out.txt", "new")
    assert victim.read_text(encoding="utf-8") == "precious"
    assert (tmp_path / "out.txt").read_text(encoding="utf-8") == "new"
    assert (tmp_path / ".out.txt.guessed.tmp").is_symlink()


def test_the_written_file_has_the_usual_permissions(tmp_path):
    umask = os.umask(0o022)
    os.umask(umask)
    files.atomic_write_text(tmp_path / "out.txt", "new")
    assert (tmp_path / "out.txt").stat().st_mode & 0o777 == 0o666 & ~umask  # not mkstemp's 0o600


@pytest.mark.parametrize("kind", ["link", "fifo", "folder"])
def test_a_target_that_is_a_link_or_not_a_regular_file_is_refused_not_replaced(tmp_path, kind):
    target, victim = tmp_path / "out.txt", tmp_path / "victim.txt"
    victim.write_text("precious", encoding="utf-8")
    if kind == "link":
        target.symlink_to(victim)
    elif kind == "fifo":
        os.mkfifo(target)
    else:
        target.mkdir()
    message = {"link": "is a symbolic link", "fifo": "is a FIFO, not a regular file",
               "folder": "is a folder, not a regular file"}[kind]
    with pytest.raises(ValueError, match=message) as error:
        files.atomic_write_text(target, "new")
    assert "\n" not in str(error.value) and str(target) in str(error.value)
    assert victim.read_text(encoding="utf-8") == "precious"
    assert target.is_symlink() if kind == "link" else not target.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt", "victim.txt"]  # no temporary file left



# ---- settings and data files read in one-line errors ----


def test_a_deeply_nested_config_is_one_line(tmp_path):
    path = tmp_path / "config.json"
    path.write_text("[" * 100_000 + "]" * 100_000, encoding="utf-8")
    with pytest.raises(ValueError, match="nested too deeply") as error:
        files.read_settings_file(path)
    assert str(path) in str(error.value)


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"de": "Ein Hund.", "en": "A dog."', r"line 2 is not valid JSON \(line 1, column"),
        ('["Ein Hund.", "A dog."]', "line 2 is not a JSON object"),
    ],
)
def test_a_malformed_data_line_is_named(tmp_path, line, message):
    path = tmp_path / "train.jsonl"
    path.write_text('{"de": "Zwei Katzen.", "en": "Two cats."}\n' + line + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match=message) as error:
        files.check_data_file(path)
    assert str(path) in str(error.value) and "\n" not in str(error.value)
