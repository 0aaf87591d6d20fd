"""Run folders and the files they hold (hand-written: plumbing the chapters call in one line each).

- `check_run_folder`, `start_run_folder`: a finished run is never replaced unless the caller asks for it;
  `refuse_ignored_arguments`: a resumed run refuses arguments it would ignore; `check_output_file`: what a tool
  writes never replaces a run's file or a file of another kind (`check_save_hyp`: nor one of its inputs);
  `kept_epochs`, `remove_epochs_after`: the epoch files a run keeps, checked against its checkpoint.
- `write_decoding`, `read_decoding`: the decoding settings chosen for a run (decoding.json in its folder).
- `read_run_record`, `steps_trained`: the run record of a run's checkpoint, and the steps it has trained, read
  without loading its weights; `last_loss`: its history's last logged loss, in words.
"""

from __future__ import annotations

import datetime
import inspect
import os
import re
from pathlib import Path
from typing import Any, Callable

import torch

from transformer_lib.checkpoint_checks import CheckpointError, check_checkpoint, checkpoint_errors
from transformer_lib.files import check_replaceable, is_text_lines, read_checked_json, write_checked_json
from transformer_lib.settings import DECODING_KEYS, check_chosen_on, check_decoding, check_scores, check_weights


# The names of the files of a run folder, all spelled here. check_run_folder finds a run by RUN_FILES, and
# start_run_folder(overwrite=True) removes them with the epoch files; only the code that owns a file writes it.
RUN_FILES = ("checkpoint.pt", "tokenizer.json", "history.json", "decoding.json")
LOCK_FILE = ".lock"  # holds the pid of the process that trains in the folder (guards.lock_run_folder)
EPOCH_FILE = re.compile(r"epoch-(\d{3,})\.pt")  # the weights at an epoch's end: epoch-001.pt, epoch-002.pt, ...


def epoch_file(run_folder: str | Path, epoch: int) -> Path:
    """Where a run keeps the weights of the end of epoch `epoch`."""
    return Path(run_folder) / f"epoch-{epoch:03d}.pt"


def is_run_file(name: str) -> bool:
    """Whether a file of this name in a run folder is one of the run's own, which only training writes."""
    return name in RUN_FILES or name == LOCK_FILE or EPOCH_FILE.fullmatch(name) is not None


def check_output_file(path: str | Path, argument: str, replaces: Callable[[Path], bool] | None = None,
                      kind: str = "file") -> Path:
    """Refuse an output path that is not the caller's to write: a link, a folder or a special file; a run's own file
    (by its name, or anything in a folder that holds a checkpoint.pt), which only training writes; or an existing
    file that replaces(path) does not recognise as one of `kind` (what this output writes). Nothing is written here.
    """
    path = Path(path)
    check_replaceable(path, argument)  # a link is never written through, a folder or FIFO never replaced
    if is_run_file(path.name) or (path.parent / "checkpoint.pt").exists():
        raise ValueError(f"{argument} {str(path)!r} is {'a' if is_run_file(path.name) else 'in a'} run folder's "
                         f"file (checkpoint, tokenizer, history, decoding, lock or epoch weights), which only "
                         f"training writes; give a path outside run folders")
    if path.exists() and not (replaces is not None and replaces(path)):
        raise FileExistsError(f"{argument} {str(path)!r} already exists and is not {kind}; it is not overwritten: "
                              f"give a new file name, or remove that file first if it is yours to lose")
    return path


def check_save_hyp(path: str | Path | None, inputs: dict[str, Path | None]) -> None:
    """evaluate's --save-hyp must be a new file or translations saved before: not one of its inputs (inputs: each
    input's argument, like "--ref-file", and the path given, or None), a run's file or a file of another kind."""
    if path is None:
        return
    target = check_output_file(path, "--save-hyp", replaces=is_text_lines,  # no link, FIFO, folder, run's
                               kind="a file of translations (text lines, not a record, weights, a notebook or code)")
    if not target.parent.is_dir():
        raise FileNotFoundError(f"--save-hyp {str(target)!r} is in a folder that does not exist; create "
                                f"{str(target.parent)!r} first")
    for argument, given in inputs.items():
        if given is not None and target.exists() and target.samefile(given):
            raise ValueError(f"--save-hyp {str(target)!r} is the {argument} and would be overwritten; give another "
                             f"file name for the translations")


def check_run_folder(out_dir: str | Path, resume: bool, overwrite: bool) -> Path:
    """Refuse to start where a run would be lost or cannot be written; nothing is written here."""
    out = Path(out_dir)
    if resume and overwrite:
        raise ValueError(f"resume continues the run in {out} and overwrite replaces it; choose one")
    if out.is_symlink():
        raise ValueError(f"the run folder {str(out)!r} is a symbolic link (to {os.readlink(out)!r}); a run is never "
                         f"written, resumed or replaced through a link: give the folder's real path")
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"the run folder {str(out)!r} is a file; give a folder for checkpoint.pt, "
                                 f"tokenizer.json and history.json (a new one, or a run to resume)")
    for path in sorted(out.iterdir()) if out.is_dir() else []:  # before anything is read, trained or removed
        if is_run_file(path.name) and (path.is_symlink() or not path.is_file()):
            kind = f"a symbolic link (to {os.readlink(path)!r})" if path.is_symlink() else "not a regular file"
            raise ValueError(f"{out} holds {path.name}, which is {kind}: a run's files are its own regular files, "
                             f"never written or removed through a link; move it away (or put the real file in its "
                             f"place) and run again")
    # A run is a folder with a checkpoint. Other run files without one are what a start that failed before its
    # first checkpoint leaves: nothing to resume, so both messages below point to overwrite, never to each other.
    existing = [name for name in RUN_FILES if (out / name).exists()]
    cause = ("its checkpoint.pt was removed" if "decoding.json" in existing  # written after training, not at a start
             else f"a start that stopped before its first checkpoint left {'them' if len(existing) > 1 else 'it'}")
    leftovers = (f"{out} holds {' and '.join(existing)} but no checkpoint.pt: {cause}, and there is no run to resume; "
                 f"replace {'them' if len(existing) > 1 else 'it'} with overwrite (--overwrite), or choose another "
                 f"folder")
    if resume and not (out / "checkpoint.pt").is_file():
        raise FileNotFoundError(f"resume needs {out / 'checkpoint.pt'}, which does not exist; " + (
            leftovers if existing else "start a new run there without resume"))
    if existing and not resume and not overwrite:
        if "checkpoint.pt" not in existing:
            raise FileExistsError(leftovers)
        raise FileExistsError(f"{out} already holds a run ({', '.join(existing)}); continue it with resume "
                              f"(--resume), replace it with overwrite (--overwrite), or choose another folder")
    return out


def refuse_ignored_arguments(run: dict, function: Any, given: dict) -> None:
    """Refuse arguments of function that a resumed run would ignore: changed from their default and unlike the run's."""
    defaults = {name: p.default for name, p in inspect.signature(function).parameters.items()}
    ignored = [f"{key}={value!r} (the run has {run[key]!r})" for key, value in given.items()
               if key in run and value != defaults.get(key) and value != run[key]]
    if ignored:
        raise ValueError(f"resume continues the saved run with its own data, seed and settings, so "
                         f"{', '.join(ignored)} would be ignored; drop {'them' if len(ignored) > 1 else 'it'}, or start a new run (another "
                         f"folder, or overwrite=True)")


def start_run_folder(out_dir: str | Path, overwrite: bool) -> Path:
    """Create the run folder; with overwrite, remove the files of the run it replaces (after validation passed)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if overwrite:
        for name in RUN_FILES:
            (out / name).unlink(missing_ok=True)
        for path in out.iterdir():  # the weights kept from the end of the old run's epochs (train_translator)
            if EPOCH_FILE.fullmatch(path.name):
                path.unlink()
    return out


def remove_epochs_after(run_folder: str | Path, epoch: int) -> list[str]:
    """Remove the epoch files of epochs after `epoch`, the checkpoint's, before a resumed run trains them again:
    a run stopped before its checkpoint caught up leaves them, and keeping them would have the new epochs pruned
    in their place. Returns the names removed, for the caller to say."""
    folder = Path(run_folder)
    lost = sorted(p for p in folder.iterdir() if (m := EPOCH_FILE.fullmatch(p.name)) and int(m[1]) > epoch)
    for path in lost:
        path.unlink()
    return [path.name for path in lost]


DECODING_FILE = "decoding.json"  # in a run folder: how its translations are made, as chosen on the validation split


def write_decoding(run_folder: str | Path, decoding: dict, chosen_on: str, *, weights: str,
                   validation: dict | None = None) -> Path:
    """Write run_folder/decoding.json: beam_size, alpha, average_last, the weights named (which epochs, e.g. "the
    average of epochs 9-12"), chosen_on ("validation", the only split on which decisions are made), the date, the
    id of the run whose checkpoint the folder holds, and optionally the validation scores (corpus_scores) they were
    chosen for.

    Atomic, with the checksum of its content (files.write_checked_json); a decoding.json that is a link or not a
    regular file is refused. The folder must hold a run's checkpoint. Returns the path.
    """
    folder = Path(run_folder)
    if not folder.is_dir():
        raise NotADirectoryError(f"run_folder {str(folder)!r} is not a folder; give the run folder that holds "
                                 f"checkpoint.pt")
    record = check_decoding(decoding)
    record["weights"] = check_weights(weights, record["average_last"])
    record["chosen_on"] = check_chosen_on(chosen_on)
    record["date"] = datetime.date.today().isoformat()
    record["run_id"] = read_run_record(folder / "checkpoint.pt")["run"]["id"]  # the run the choice was made for
    if validation is not None:
        record["validation"] = check_scores(validation, "validation")
    path = folder / DECODING_FILE
    write_checked_json(path, record)
    return path


DECODING_RECORD_KEYS = {*DECODING_KEYS, "weights", "chosen_on", "date", "run_id", "validation"}


def read_decoding(run_folder: str | Path, run_id: str) -> dict | None:
    """The record of run_folder/decoding.json, checked, and made for the run run_id; None when the run has none.

    One line for a malformed file, one changed since it was written (its checksum), or the choice of another run
    (copied in, or left by a replaced run).
    """
    path = Path(run_folder) / DECODING_FILE
    if not path.exists() and not path.is_symlink():
        return None
    check_replaceable(path, "decoding file")  # a link or a special file is not read either
    record = read_checked_json(path, "decoding file", "`python -m transformer_lib choose` (write_decoding)")
    where = f"decoding file {str(path)!r}"
    decoding = check_decoding({key: value for key, value in record.items() if key in DECODING_KEYS}, where)
    extra = sorted(set(record) - DECODING_RECORD_KEYS)
    missing = sorted(DECODING_RECORD_KEYS - {"validation"} - set(record))
    if extra or missing:
        problem = f"holds {', '.join(extra)}, which decoding.json never holds" if extra else \
            f"lacks {', '.join(missing)}"
        raise ValueError(f"{where} {problem}; choose again on validation (python -m transformer_lib choose), which "
                         f"writes it with write_decoding")
    check_chosen_on(record["chosen_on"], f"{where}: chosen_on")
    for key in ("date", "run_id"):
        if not (isinstance(record[key], str) and record[key]):
            raise ValueError(f"{where}: {key} must be a non-empty string, got {record[key]!r}")
    check_weights(record["weights"], decoding["average_last"], f"{where}: weights")
    if record["run_id"] != run_id:
        raise ValueError(f"{where} was chosen for another run (run {record['run_id']}, and this folder's checkpoint "
                         f"is run {run_id}); remove it and choose again on validation")
    result = {**decoding, **{key: record[key] for key in ("weights", "chosen_on", "date", "run_id")}}
    if record.get("validation") is not None:
        result["validation"] = check_scores(record["validation"], f"{where}: validation")
    return result


RUN_RECORD_KEYS = ("id", "corpus", "src_lang", "tgt_lang", "corpus_config", "seed", "train_limit", "valid_limit",
                   "validate", "max_steps", "epochs", "preset", "overrides", "settings")


def read_run_record(path: str | Path) -> dict:
    """The "extra" of a checkpoint written by train_translator, read without loading its weights (mmap).

    It must hold the run record (what train_translator resumes and `evaluate --split` scores) and the tokenizer;
    else one CheckpointError naming the file, instead of a KeyError deep in the training code.
    """
    with checkpoint_errors(path):
        checkpoint = torch.load(path, map_location="cpu", weights_only=True, mmap=True)  # tensors stay on disk
    extra = check_checkpoint(checkpoint, path, ("config", "model", "extra"))["extra"]
    run = extra.get("run") if isinstance(extra, dict) else None
    lacks = []
    if not isinstance(run, dict):
        lacks.append("no run record")
    elif any(key not in run for key in RUN_RECORD_KEYS):
        lacks.append(f"a run record without {', '.join(repr(k) for k in RUN_RECORD_KEYS if k not in run)}")
    if not isinstance(extra, dict) or not isinstance(extra.get("tokenizer"), str):
        lacks.append("no tokenizer")
    if lacks:
        raise CheckpointError(f"{path} holds {' and '.join(lacks)}: it was not written by this version's "
                              f"train_translator (chapter 7's train and older versions write such files); translating, "
                              f"evaluating and resuming need a run folder written by `python -m transformer_lib train`")
    return extra


def steps_trained(path: str | Path) -> int:
    """The optimizer steps a run's checkpoint file has trained, read without loading its weights (mmap)."""
    with checkpoint_errors(path):
        saved = torch.load(path, map_location="cpu", weights_only=True, mmap=True)  # tensors stay on disk
    return check_checkpoint(saved, path, ("state",))["state"]["step"]


def last_loss(history: list) -> str:
    """The last logged mean training loss of a run's history in words; entries are (step, mean loss, steps averaged)."""
    if not history:
        return "no loss logged"
    step, loss, steps = history[-1]
    return f"last logged loss {loss:.3f} (mean of {steps} step{'s' if steps != 1 else ''})"


def kept_epochs(run_folder: str | Path) -> list[int]:
    """The epochs whose weights run_folder keeps (epoch-NNN.pt), oldest first, checked against its checkpoint: the
    last min(keep_checkpoints, epochs finished) epochs, every one there and none beyond; else one line."""
    folder = Path(run_folder)
    path = folder / "checkpoint.pt"
    with checkpoint_errors(path):
        saved = torch.load(path, map_location="cpu", weights_only=True, mmap=True)  # tensors stay on disk
    finished = check_checkpoint(saved, path, ("state", "extra"))["state"]["epoch"]
    keep = read_run_record(path)["run"]["settings"]["training"].get("keep_checkpoints", finished)
    expected = list(range(max(finished - keep, 0) + 1, finished + 1))
    kept = sorted(int(m.group(1)) for entry in folder.iterdir() if (m := EPOCH_FILE.fullmatch(entry.name)))
    if kept != expected:
        shown = ", ".join(map(str, kept)) or "none"
        missing = [epoch for epoch in expected if epoch not in kept]
        if missing:  # removed (or lost): training again would not bring back the weights of epochs it has trained
            why = (f"the file{'s' if len(missing) > 1 else ''} of epoch{'s' if len(missing) > 1 else ''} "
                   f"{', '.join(map(str, missing))} {'were' if len(missing) > 1 else 'was'} removed; restore "
                   f"{'them' if len(missing) > 1 else 'it'} (epoch-NNN.pt), or decode with the final weights alone, "
                   f"which need no epoch file (average_last=1; python -m transformer_lib choose --average 1)")
        else:  # only epochs after the checkpoint's: a run stopped before its checkpoint caught up
            why = (f"the files of epochs after the checkpoint's were left by a run stopped before its checkpoint "
                   f"caught up; resume the training, which removes them (python -m transformer_lib train --resume "
                   f"--out {folder}), or remove them")
        raise FileNotFoundError(f"{folder} finished {finished} epochs and keeps {keep} of them, so it should hold the "
                                f"weights of epochs {', '.join(map(str, expected)) or 'none'}, but holds those of "
                                f"epochs {shown}: {why}")
    return kept

