"""What guards a run while it trains (hand-written: plumbing the chapters call in one line each).

- `lock_run_folder`: one training per run folder at a time; a killed run's lock is released by the kernel, and a
  second process is told which command holds it.
- `interrupt_guard`, `diverged`: Ctrl-C or SIGTERM ends a training step cleanly; a non-finite loss stops the run.
"""

from __future__ import annotations

import os
import shlex
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from transformer_lib.runs import LOCK_FILE, RUN_FILES

try:
    import fcntl  # POSIX; Windows has no flock, and there run folders are not locked
except ImportError:  # pragma: no cover
    fcntl = None

_held: dict[Path, list] = {}  # run folder -> [lock file descriptor, depth]: the folders this process holds


class RunFolderInUseError(OSError):
    """Another process trains in this run folder."""


def _take_lock(out: Path) -> int:
    """The descriptor of out's lock file, locked by this process, or RunFolderInUseError naming the holder."""
    lock = out / LOCK_FILE
    while True:
        try:
            descriptor = os.open(lock, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o666)
        except OSError as error:  # a folder, a link (O_NOFOLLOW refuses it) or a file we may not open
            if lock.is_symlink() or lock.is_dir():
                kind = "a symbolic link" if lock.is_symlink() else "a folder"
                raise RunFolderInUseError(f"the lock file {lock} is {kind} ({error.strerror}); it must be a regular "
                                          f"file that only this library writes: move it away and run again") from None
            if not lock.exists():  # nothing foreign there: the folder itself may not be written
                refused = PermissionError(f"the run folder {str(out)!r} cannot be written ({error.strerror}: its "
                                          f"lock file cannot be created), and training and choosing a decoding write "
                                          f"into it: give a folder this user may write to (a copy of the run, e.g. "
                                          f"`cp -r {out} COPY`), or make it writable")
                refused.errno = error.errno
                raise refused from None
            raise RunFolderInUseError(f"the lock file {lock} cannot be opened for writing ({error.strerror}): another "
                                      f"user's process may hold the run folder, or a run of that user left it; wait "
                                      f"until it ends, or have that user remove the file") from None
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the kernel drops it when its process dies
        except BlockingIOError:
            pid, _, command = os.read(descriptor, 4096).decode("utf-8", "replace").strip().partition("\n")
            os.close(descriptor)
            holder = f"process {pid or 'unknown'}" + (f" ({command.strip()})" if command.strip() else "")
            raise RunFolderInUseError(f"the run folder {str(out)!r} is in use by {holder}, which holds {lock}; "
                                      f"wait until it ends, or choose another folder") from None
        try:
            same = os.path.samestat(os.fstat(descriptor), os.lstat(lock))
        except FileNotFoundError:
            same = False
        if same:  # else the holder removed the file between our open and our lock: try again on the new one
            break
        os.close(descriptor)
    os.ftruncate(descriptor, 0)
    os.write(descriptor, f"{os.getpid()}\n{this_command()}\n".encode("utf-8"))
    return descriptor


def this_command() -> str:
    """This process's command line, as the lock file records it for a second process to name: `python -m
    transformer_lib choose --checkpoint runs/t1`, `python train.py`, a notebook's kernel; one line, at most 300
    characters."""
    argv = list(sys.argv) or ["python"]
    main = Path(argv[0])
    if main.name in ("__main__.py", "cli.py") and main.parent.name == "transformer_lib":
        words = ["python", "-m", "transformer_lib", *argv[1:]]
    else:
        words = ["python", *argv]
    line = " ".join(shlex.quote(word) for word in words).replace("\n", " ")
    return line if len(line) <= 300 else line[:297] + "..."


@contextmanager
def lock_run_folder(out_dir: str | Path) -> Iterator[Path]:
    """Hold the run folder (creating it) so that no second process trains there at the same time.

    A second process fails at once with RunFolderInUseError naming the folder, the holder's pid and its command
    (this_command, which the lock file holds under the pid: `train`, `choose`, a notebook). The lock is an
    flock on out_dir/.lock, which the kernel releases when its process dies, so a killed run leaves no stale lock.
    The same process may enter again (a notebook re-running a cell). On entry, temporary files that a killed
    writer left (.checkpoint.pt.RANDOM.tmp, ...) are removed; on exit, the lock file goes, and so does the folder if
    this call created it and it is still empty. Without fcntl (Windows) the folder is created but not locked.
    """
    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"the run folder {str(out)!r} is a file; give a folder")
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    key = out.resolve()
    if fcntl is None or key in _held:
        if key in _held:
            _held[key][1] += 1
        try:
            yield out
        finally:
            if key in _held:
                _held[key][1] -= 1
        return
    descriptor = _take_lock(out)
    _held[key] = [descriptor, 1]
    for name in RUN_FILES:  # only a dead writer's: a live one would hold the lock
        for stale in out.glob(f".{name}.*.tmp"):
            stale.unlink(missing_ok=True)
    try:
        yield out
    finally:
        if _held[key][1] == 1:
            del _held[key]
            (out / LOCK_FILE).unlink(missing_ok=True)  # removed while still locked, then released
            os.close(descriptor)
            if created:
                try:
                    out.rmdir()  # only if empty: a start that failed before writing anything leaves no folder
                except OSError:
                    pass
        else:
            _held[key][1] -= 1


# ---- stopping a run ----


class DivergedError(FloatingPointError):
    """Training produced a non-finite loss or gradient."""


def diverged(step: int, what: str, value: Any, checkpoint_path: str | Path | None) -> DivergedError:
    """The error that stops a diverged run: what became non-finite, where, and what to do."""
    kept = ""  # no file to speak of (no checkpoints asked for, or not the process that writes them)
    if checkpoint_path and Path(checkpoint_path).is_file():
        kept = f"{checkpoint_path} keeps the last checkpoint written before it; "
    elif checkpoint_path:
        kept = f"no checkpoint was written before it, so {checkpoint_path} does not exist; "
    return DivergedError(
        f"training diverged at step {step}: the {what} is {float(value)}, so the weights in memory are not to be "
        f"trusted. {kept}"
        f"lower the learning rate (lr_factor) or lengthen the warm-up (warmup), then train again"
    )


class _Interrupt:
    requested: bool = False
    signal_name: str = ""  # which signal asked to stop: "Ctrl-C (SIGINT)" or "SIGTERM"

    def handle(self, signum: int, frame: Any) -> None:
        if self.requested:  # a second signal: stop at once
            raise KeyboardInterrupt
        self.requested = True
        self.signal_name = "Ctrl-C (SIGINT)" if signum == signal.SIGINT else signal.Signals(signum).name


# Ctrl-C, and the polite stop that `kill PID`, systemd and cluster schedulers send before SIGKILL (POSIX only).
_STOP_SIGNALS = (signal.SIGINT, *((signal.SIGTERM,) if os.name == "posix" else ()))


@contextmanager
def interrupt_guard(enabled: bool = True) -> Iterator[_Interrupt]:
    """While active, Ctrl-C (SIGINT) or SIGTERM sets .requested (and .signal_name) instead of stopping, so the loop
    can finish its step and save.

    A second signal raises KeyboardInterrupt at once. With enabled=False (several processes training together, which
    would stop at different steps) or outside the main thread, signals act as usual and .requested stays False.
    """
    interrupt = _Interrupt()
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield interrupt
        return
    previous = {number: signal.signal(number, interrupt.handle) for number in _STOP_SIGNALS}
    try:
        yield interrupt
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
