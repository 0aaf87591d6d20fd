"""Checks of checkpoint files (hand-written: chapter 7's save_checkpoint and load_checkpoint, in training.py, call them).

- `checkpoint_errors`, `check_checkpoint`, `weights_checksum`: a corrupt or foreign checkpoint, or one whose weights
  no longer match their checksum, gives one clear line (`CheckpointError`), not a traceback. The checksum covers
  everything a checkpoint holds.
"""

from __future__ import annotations

import hashlib
import json
import pickle
import struct
import warnings
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch


class CheckpointError(ValueError):
    """A file that is not a readable transformer_lib checkpoint."""


@contextmanager
def checkpoint_errors(path: str | Path) -> Iterator[None]:
    """Turn the many ways torch.load fails on a bad file into one CheckpointError naming the file."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns about the pickle protocol of foreign files
            yield
    except IsADirectoryError:
        raise CheckpointError(f"{path} is a folder, not a checkpoint file; move it away (a run's files are regular "
                              f"files written by train_translator)") from None
    except pickle.UnpicklingError:
        raise CheckpointError(
            f"{path} is not a transformer_lib checkpoint: torch.load(weights_only=True) refused it, because it is not "
            f"a checkpoint or it holds Python objects whose loading could run code; use a file written by "
            f"save_checkpoint"
        ) from None
    except (EOFError, KeyError, IndexError, TypeError, AttributeError, ValueError, OverflowError, RuntimeError,
            struct.error, zipfile.BadZipFile, UnicodeDecodeError) as error:  # a flipped byte can raise any of them
        first = str(error).splitlines()[0].split(". ")[0] if str(error) else ""
        raise CheckpointError(f"{path} is corrupt or not a checkpoint ({type(error).__name__}{': ' * bool(first)}"
                              f"{first}); use another copy or train again") from None


def check_checkpoint(checkpoint: Any, path: str | Path, keys: tuple[str, ...]) -> dict:
    """checkpoint itself when it is a dict holding keys; else a CheckpointError naming the file and what is missing."""
    if not isinstance(checkpoint, dict):
        raise CheckpointError(f"{path} is not a transformer_lib checkpoint: it holds a {type(checkpoint).__name__}, "
                              f"not the dictionary save_checkpoint writes")
    missing = [key for key in keys if key not in checkpoint]
    if missing:
        raise CheckpointError(f"{path} is not a transformer_lib checkpoint: it lacks {', '.join(map(repr, missing))}; "
                              f"use a file written by save_checkpoint")
    if "checksum" not in checkpoint:
        raise CheckpointError(f"{path} is not a transformer_lib checkpoint: it has no checksum, which save_checkpoint "
                              f"always writes; use a file written by save_checkpoint")
    if checkpoint["checksum"] != _checksum_or_none(checkpoint):
        raise CheckpointError(f"{path} fails its checksum: its weights, config or training state changed since the "
                              f"file was written (damaged on disk, or edited); use another copy or train again")
    return checkpoint


def weights_checksum(checkpoint: dict) -> str:
    """sha256 of everything a checkpoint holds but its "checksum": the config, every tensor of the weights, and
    (where the file has them) the optimizer's moments, the schedule, the GradScaler, the training state, the random
    states and the run record with its tokenizer.

    Deterministic (dict keys in sorted order, each tensor's name, dtype, shape and raw bytes read on the CPU, plain
    values as JSON), so a file can be checked against the sum stored beside its contents: a flipped bit anywhere
    that would change a resumed run or a translation shows, not only one in the weights.
    """
    digest = hashlib.sha256()
    _digest(digest, "config", checkpoint["config"])  # a file without config or weights is not a checkpoint
    _digest(digest, "model", checkpoint["model"])
    for key in sorted(set(checkpoint) - {"config", "model", "checksum"}, key=repr):
        _digest(digest, repr(key), checkpoint[key])
    return digest.hexdigest()


def _digest(digest: Any, name: str, value: Any) -> None:
    """Feed value, under its name, to digest: tensors by dtype, shape and bytes, containers item by item."""
    if isinstance(value, torch.Tensor):
        tensor = value.detach().cpu().contiguous()
        digest.update(f"\n{name} {tensor.dtype} {tuple(tensor.shape)}\n".encode("utf-8"))
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())  # the raw bytes, whatever the dtype
    elif isinstance(value, dict):
        digest.update(f"\n{name} dict {len(value)}".encode("utf-8"))
        for key in sorted(value, key=repr):
            _digest(digest, f"{name}.{key!r}", value[key])
    elif isinstance(value, (list, tuple)):  # pickling may turn one into the other: the same sum for both
        digest.update(f"\n{name} list {len(value)}".encode("utf-8"))
        for index, item in enumerate(value):
            _digest(digest, f"{name}[{index}]", item)
    else:
        digest.update(f"\n{name} {json.dumps(value, sort_keys=True, default=repr)}".encode("utf-8"))


def _checksum_or_none(checkpoint: dict) -> str | None:
    """The checksum of a checkpoint, or None when its config or weights are not what save_checkpoint writes."""
    try:
        return weights_checksum(checkpoint)
    except (AttributeError, KeyError, TypeError, RuntimeError):
        return None
