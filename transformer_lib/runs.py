"""Safe run folders, settings and checkpoints (hand-written: plumbing the chapters call in one line each).

- `atomic_open`, `atomic_write_text`, `write_json`: a file is written beside its target under a new random name
  (created exclusively, never through a link), flushed to disk (fsync) and renamed over it with os.replace, so that
  a crash or Ctrl-C leaves either the old file or the new one, never half of one. A target that is a link or not a
  regular file is refused (`check_replaceable`): nothing is written through a link this module did not create.
- `merge_settings`, `validate_settings`: a run's settings checked in one place; an unknown key is refused with the
  closest valid name, a bad value with the key, the value and what is allowed.
- `check_run_folder`, `start_run_folder`: a finished run is never replaced unless the caller asks for it.
- `lock_run_folder`: one training per run folder at a time; a killed run's lock is released by the kernel.
- `checkpoint_errors`, `check_checkpoint`, `weights_checksum`: a corrupt or foreign checkpoint, or one whose weights
  no longer match their checksum, gives one clear line, not a traceback.
- `interrupt_guard`, `diverged`: Ctrl-C or SIGTERM ends a training step cleanly; a non-finite loss stops the run.
- `write_decoding`, `read_decoding`: the decoding settings chosen for a run (decoding.json in its folder).
"""

from __future__ import annotations

import datetime
import difflib
import hashlib
import inspect
import json
import math
import os
import pickle
import re
import secrets
import signal
import stat
import threading
import warnings
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import torch

# The files of a run folder: check_run_folder finds a run by them, start_run_folder(overwrite=True) removes them.
RUN_FILES = ("checkpoint.pt", "tokenizer.json", "history.json", "decoding.json")


# ---- files that are never half-written ----


def _fsync_folder(folder: Path) -> None:
    """Make a rename in folder durable (POSIX); Windows cannot open a folder, and needs no such step."""
    if os.name != "posix":
        return
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


_KINDS = {stat.S_IFDIR: "a folder", stat.S_IFIFO: "a FIFO", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket"}


def check_replaceable(path: str | Path, what: str = "file") -> Path:
    """Refuse a target that an atomic write would wrongly replace: a symbolic link, or anything but a regular file.

    A rename replaces a link by a regular file (a link to /dev/stdout would stop being one) and a FIFO by a file no
    reader waits on; writing through the link instead would write where the link's owner chose. So neither is done.
    """
    path = Path(path)
    try:
        mode = path.lstat().st_mode  # lstat: the link itself, not what it points to
    except FileNotFoundError:
        return path
    if stat.S_ISLNK(mode):
        raise ValueError(f"{what} {str(path)!r} is a symbolic link (to {os.readlink(path)!r}); it is never written "
                         f"through or replaced: give the path of a regular file, or remove the link")
    if not stat.S_ISREG(mode):
        kind = _KINDS.get(stat.S_IFMT(mode), "special")
        raise ValueError(f"{what} {str(path)!r} is {kind}, not a regular file; expected a regular file or a new name")
    return path


# O_EXCL creates the file or fails, and never follows a link (even a dangling one) at that name; O_NOFOLLOW too.
_EXCLUSIVE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)


def _create_temporary(path: Path) -> tuple[int, Path]:
    """A new, empty file beside path with an unguessable name (.NAME.RANDOM.tmp), created by this call alone."""
    for _ in range(100):
        temporary = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
        try:
            return os.open(temporary, _EXCLUSIVE, 0o666), temporary  # 0o666 less the umask, as open() would
        except FileExistsError:
            continue  # taken (by chance, or planted): draw another name
    raise FileExistsError(f"could not create a temporary file beside {path}: 100 random names were taken")


@contextmanager
def atomic_open(path: str | Path, mode: str = "wb", encoding: str | None = None) -> Iterator[IO]:
    """Write a new temporary file beside path; on success flush, fsync and os.replace it onto path; else remove it.

    The temporary file is created exclusively under a random name, so no link planted in the folder is followed and
    no file of the user's (such as path.tmp) is touched. A path that is a link or not a regular file is refused.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"mode must be 'w' or 'wb', got {mode!r}")
    path = check_replaceable(path)
    descriptor, temporary = _create_temporary(path)  # same folder, so that os.replace is a rename, not a copy
    try:
        with os.fdopen(descriptor, mode, encoding=encoding if mode == "w" else None) as file:
            yield file
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)
        _fsync_folder(path.parent)
    finally:
        temporary.unlink(missing_ok=True)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write text (UTF-8) to path atomically: readers see the old file or the new one, never a part."""
    with atomic_open(path, "w", encoding="utf-8") as file:
        file.write(text)


def strict_json(value: Any) -> Any:
    """value with every NaN or infinity replaced by None, so that json.dumps gives strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: strict_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict_json(item) for item in value]
    return value


def write_json(path: str | Path, value: Any) -> None:
    """Write value as strict JSON (non-finite numbers become null), atomically."""
    atomic_write_text(path, json.dumps(strict_json(value), allow_nan=False) + "\n")


# ---- settings ----


def is_count(value: Any, least: int = 1) -> bool:
    """An integer (not a bool) of at least least."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def is_number(value: Any) -> bool:
    """A finite int or float (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


SCORE_ROUNDING = 1e-9  # sacreBLEU's arithmetic may give a perfect score as 100.00000000000004
MAX_MINUTES = 60 * 24 * 365  # no run of this book trains for more than a year: more is a damaged or made-up record


def is_score(value: Any) -> bool:
    """A BLEU or chrF score: a number from 0 to 100 (and sacreBLEU's rounding above a perfect 100)."""
    return is_number(value) and 0 <= value <= 100 + SCORE_ROUNDING


def is_minutes(value: Any) -> bool:
    """A duration of a run in minutes: more than 0, at most MAX_MINUTES."""
    return is_number(value) and 0 < value <= MAX_MINUTES


CHOSEN_ON = "validation"  # the only split on which a decoding (or anything else) is chosen; test only reports


def check_chosen_on(chosen_on: Any, what: str = "chosen_on") -> str:
    """CHOSEN_ON itself, or one line saying that choices are made on the validation split."""
    if chosen_on != CHOSEN_ON:
        raise ValueError(f"{what} must be {CHOSEN_ON!r}, got {chosen_on!r}: decoding settings are chosen on the "
                         f"validation split, never on the test split they are reported on")
    return chosen_on


MAX_BEAM = 32  # wider beams multiply the decoding time and memory by the beam size

RULES: dict[str, dict[str, tuple]] = {
    # part -> key -> (test, what is allowed)
    "model": {
        "d_model": (is_count, "a positive integer"),
        "n_heads": (is_count, "a positive integer that divides d_model"),
        "n_layers": (is_count, "a positive integer"),
        "d_ff": (is_count, "a positive integer"),
        "dropout": (lambda v: is_number(v) and 0 <= v < 1, "a number in [0, 1)"),
        "max_len": (lambda v: is_count(v) and v >= 3, "an integer >= 3 (<bos>, a token, <eos>)"),
        "norm_first": (lambda v: isinstance(v, bool), "true or false"),
        "positional": (lambda v: v in ("sinusoidal", "learned"), "'sinusoidal' or 'learned'"),
        "tie_embeddings": (lambda v: isinstance(v, bool), "true or false"),
        "share_embeddings": (lambda v: isinstance(v, bool), "true or false"),
        "scale_embeddings": (lambda v: isinstance(v, bool), "true or false"),
    },
    "training": {
        "vocab_size": (lambda v: is_count(v) and v >= 5, "an integer >= 5 (4 special tokens and a word)"),
        "max_tokens": (is_count, "a positive integer, at least model.max_len"),
        "warmup": (is_count, "a positive integer (steps)"),
        "lr_factor": (lambda v: is_number(v) and v > 0, "a number > 0"),
        "epochs": (is_count, "a positive integer"),
        "label_smoothing": (lambda v: is_number(v) and 0 <= v < 1, "a number in [0, 1)"),
        "checkpoint_every": (is_count, "a positive integer (steps between checkpoints)"),
        "bleu_every": (lambda v: is_count(v, 0), "an integer >= 0 (epochs between BLEU scores; 0 for never)"),
        "tokenizer": (lambda v: v in ("bpe", "word"), "'bpe' or 'word'"),
        "keep_checkpoints": (is_count, "a positive integer (epochs whose weights are kept for averaging)"),
    },
    "decoding": {  # also what check_decoding applies to decoding.json
        "beam_size": (lambda v: is_count(v) and v <= MAX_BEAM, f"an integer from 1 (greedy) to {MAX_BEAM}"),
        "alpha": (lambda v: is_number(v) and 0 <= v <= 10, "a number from 0 (no length penalty) to 10"),
        "average_last": (is_count, "a positive integer (epochs averaged; 1 for the final weights)"),
    },
}


SIZE_BOUNDS = {  # generous: the paper's big model has d_model 1024, d_ff 4096 and 6 layers, a vocabulary of 37000
    "model": {"d_model": 2**16, "d_ff": 2**20, "n_layers": 1024, "max_len": 2**20},
    "training": {"vocab_size": 2**20},
}
MAX_PARAMETERS = 10**10


def estimate_parameters(model: dict, vocab_size: int) -> int:
    """About how many numbers a translator of these settings holds (without biases and LayerNorms, under 2%)."""
    d, d_ff, layers = model["d_model"], model["d_ff"], model["n_layers"]
    embeddings = (vocab_size + 2 * model.get("max_len", 0)) * d  # one shared, tied token table; two position tables
    encoder_layer = 4 * d * d + 2 * d * d_ff  # self-attention's W^Q, W^K, W^V, W^O; the feed-forward network
    decoder_layer = 8 * d * d + 2 * d * d_ff  # self- and cross-attention; the feed-forward network
    return embeddings + layers * (encoder_layer + decoder_layer)


def _suggest(name: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(name, choices, n=1) or [c for c in choices if c.startswith(name)]
    return f"did you mean {close[0]!r}? " if close else ""


def merge_settings(defaults: dict, overrides: Any, source: str = "overrides") -> dict:
    """defaults ({"model": {...}, "training": {...}}) with overrides applied; unknown parts and keys are refused."""
    settings = {part: dict(values) for part, values in defaults.items()}
    if overrides is None:
        return settings
    if not isinstance(overrides, dict):
        raise ValueError(
            f'{source} must be a JSON object like {{"model": {{"d_model": 256}}, "training": {{"epochs": 5}}}}, '
            f"got {type(overrides).__name__} {overrides!r:.60}"
        )
    for part, values in overrides.items():
        if part not in settings:
            raise ValueError(f"{source}: {part!r} is not a part of the settings; {_suggest(part, list(settings))}"
                             f"expected {' or '.join(map(repr, settings))}")
        if not isinstance(values, dict):
            raise ValueError(f"{source}: {part!r} must be an object of settings, got {type(values).__name__} "
                             f"{values!r:.60}")
        known = sorted(set(settings[part]) | set(RULES.get(part, {})))
        for key, value in values.items():
            if key not in known:
                raise ValueError(f"{source}: {part}.{key} is not a setting; {_suggest(key, known)}"
                                 f"the {part} settings are {', '.join(known)}")
            settings[part][key] = value
    return settings


def validate_settings(settings: dict, defaults: dict | None = None) -> dict:
    """Check every value of settings; the error names the key, the value and what is allowed. Returns settings."""
    for part, values in settings.items():
        for key, value in values.items():
            test, allowed = RULES.get(part, {}).get(key, (None, None))
            if test is None and defaults is not None and key in defaults.get(part, {}):
                default = defaults[part][key]  # a setting without a rule: keep the type of its default
                test = lambda v, d=default: type(v) is type(d) or (is_number(v) and is_number(d) and type(d) is float)
                allowed = f"a {type(default).__name__} like its default {default!r}"
            if test is not None and not test(value):
                raise ValueError(f"setting {part}.{key} must be {allowed}, got {value!r}")
    for part, values in settings.items():
        for key, value in values.items():
            bound = SIZE_BOUNDS.get(part, {}).get(key)
            if bound is not None and value > bound:
                raise ValueError(f"setting {part}.{key} must be at most {bound}, got {value} (the bounds are far "
                                 f"above any model this book trains; they stop a typo from exhausting memory)")
    model, training = settings.get("model", {}), settings.get("training", {})
    if {"d_model", "n_layers", "d_ff"} <= set(model):
        parameters = estimate_parameters(model, training.get("vocab_size", 0))
        if parameters > MAX_PARAMETERS:
            raise ValueError(f"settings model.d_model={model['d_model']}, n_layers={model['n_layers']} and "
                             f"d_ff={model['d_ff']} would have about {parameters:.1e} parameters, and training "
                             f"keeps 16 bytes of each (weights, gradient, Adam's two moments): at most "
                             f"{MAX_PARAMETERS:.0e} parameters (160 GB, more than one GPU holds) are allowed")
    if "d_model" in model and "n_heads" in model and model["d_model"] % model["n_heads"]:
        raise ValueError(f"setting model.d_model must be divisible by model.n_heads, got d_model={model['d_model']} "
                         f"and n_heads={model['n_heads']}")
    if "max_tokens" in training and "max_len" in model and training["max_tokens"] < model["max_len"]:
        raise ValueError(f"setting training.max_tokens must be at least model.max_len={model['max_len']} (a batch "
                         f"must hold the longest sentence), got {training['max_tokens']}")
    return settings


def read_settings_file(path: str | Path) -> Any:
    """The JSON of a settings file (--config), with the line and column of a syntax error."""
    text = read_text(path, "--config")
    try:
        value = json.loads(text)
    except RecursionError:
        raise ValueError(f"--config {str(path)!r} is nested too deeply to read; expected an object of two levels, "
                         f'like {{"training": {{"epochs": 5}}}}') from None
    except json.JSONDecodeError as error:
        raise ValueError(f"--config {str(path)!r} is not valid JSON (line {error.lineno}, column {error.colno}: "
                         f"{error.msg}); fix the file, e.g. check it with `python -m json.tool {path}`") from None
    if not isinstance(value, dict):
        raise ValueError(f'--config {str(path)!r} must hold a JSON object like {{"training": {{"epochs": 5}}}}, '
                         f"got {json.dumps(value)[:60]}")
    return value


def read_text(path: str | Path, what: str) -> str:
    """The UTF-8 text of a file, with an error naming the file and the first bad byte when it is not UTF-8."""
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise ValueError(f"{what} {str(path)!r} is not UTF-8 text (byte 0x{data[error.start]:02x} on line {line}); "
                         f"convert it, e.g. `iconv -f latin1 -t utf-8 {path} > fixed.txt`") from None


def check_data_file(path: str | Path) -> Path:
    """A local corpus file must be UTF-8 text with at least one line: say so, naming it, before datasets fails."""
    text = read_text(path, "data file")
    if not text.strip():
        raise ValueError(f"data file {str(path)!r} is empty; expected one JSON object per line, with a string for "
                         f"each language")
    for number, line in enumerate(text.split("\n"), 1):  # datasets' own error would be a long traceback
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as error:
            where = f" (line 1, column {error.colno}: {error.msg})" if isinstance(error, json.JSONDecodeError) else ""
            raise ValueError(f"data file {str(path)!r}: line {number} is not valid JSON{where}; expected one JSON "
                             f"object per line, with a string for each language: fix or remove that line") from None
        if not isinstance(row, dict):
            raise ValueError(f"data file {str(path)!r}: line {number} is not a JSON object but "
                             f"{type(row).__name__} {line.strip()[:60]!r}; expected one object per line, with a "
                             f"string for each language")
    return Path(path)


# ---- run folders ----


def check_run_folder(out_dir: str | Path, resume: bool, overwrite: bool) -> Path:
    """Refuse to start where a run would be lost or cannot be written; nothing is written here."""
    out = Path(out_dir)
    if resume and overwrite:
        raise ValueError(f"resume continues the run in {out} and overwrite replaces it; choose one")
    if out.exists() and not out.is_dir():
        raise NotADirectoryError(f"the run folder {str(out)!r} is a file; give a folder for checkpoint.pt, "
                                 f"tokenizer.json and history.json (a new one, or a run to resume)")
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
            if re.fullmatch(r"epoch-\d{3,}\.pt", path.name):
                path.unlink()
    return out


DECODING_FILE = "decoding.json"  # in a run folder: how its translations are made, as chosen on the validation split
DECODING_KEYS = ("beam_size", "alpha", "average_last")


def check_decoding(decoding: Any, what: str = "decoding") -> dict:
    """decoding as dict(beam_size=int 1..32, alpha=number 0..10, average_last=int >= 1, 1 for the final weights).

    One line naming the key, the value and what is allowed; an unknown key is refused, not dropped.
    """
    if not isinstance(decoding, dict):
        raise ValueError(f"{what} must be a dict like {{'beam_size': 4, 'alpha': 0.6, 'average_last': 1}}, got "
                         f"{type(decoding).__name__} {decoding!r:.60}")
    missing = [key for key in DECODING_KEYS if key not in decoding]
    unknown = [key for key in decoding if key not in DECODING_KEYS]
    problems = [f"it lacks {', '.join(missing)}"] * bool(missing) + [
        f"{', '.join(map(repr, unknown))} {'are' if len(unknown) > 1 else 'is'} not a decoding setting"] * bool(unknown)
    if problems:
        raise ValueError(f"{what} must hold exactly {', '.join(DECODING_KEYS)}; {' and '.join(problems)}")
    for key, (test, allowed) in RULES["decoding"].items():
        if not test(decoding[key]):
            raise ValueError(f"{what}: {key} must be {allowed}, got {decoding[key]!r}")
    return {key: decoding[key] for key in DECODING_KEYS}


def check_scores(scores: Any, what: str) -> dict:
    """A dict of corpus_scores: bleu and chrf numbers and their signatures at least; other keys are kept as they are."""
    if not isinstance(scores, dict):
        raise ValueError(f"{what} must be a dict of scores as corpus_scores returns it, got {type(scores).__name__} "
                         f"{scores!r:.60}")
    missing = [key for key in ("bleu", "chrf", "bleu_signature", "chrf_signature") if key not in scores]
    if missing:
        raise ValueError(f"{what} lacks {', '.join(missing)}; expected the dict corpus_scores returns")
    for key in ("bleu", "chrf"):
        if not is_score(scores[key]):
            raise ValueError(f"{what}: {key} must be a number from 0 to 100, got {scores[key]!r}")
    for key in ("bleu_signature", "chrf_signature"):
        if not (isinstance(scores[key], str) and scores[key]):
            raise ValueError(f"{what}: {key} must be sacreBLEU's signature, a non-empty string, got {scores[key]!r}")
    return dict(scores)


def write_decoding(run_folder: str | Path, decoding: dict, chosen_on: str, *, validation: dict | None = None) -> Path:
    """Write run_folder/decoding.json: beam_size, alpha, average_last, chosen_on ("validation", the only split on
    which decisions are made), the date, and optionally the validation scores (corpus_scores) they were chosen for.

    Atomic; a decoding.json that is a link or not a regular file is refused. The folder must exist. Returns the path.
    """
    folder = Path(run_folder)
    if not folder.is_dir():
        raise NotADirectoryError(f"run_folder {str(folder)!r} is not a folder; give the run folder that holds "
                                 f"checkpoint.pt")
    record = check_decoding(decoding)
    record["chosen_on"] = check_chosen_on(chosen_on)
    record["date"] = datetime.date.today().isoformat()
    if validation is not None:
        record["validation"] = check_scores(validation, "validation")
    path = folder / DECODING_FILE
    write_json(path, record)
    return path


def read_json(path: Path, what: str, writer: str) -> Any:
    """The JSON value of a file this package wrote; one line naming the file (and the place of a syntax error)."""
    try:
        return json.loads(read_text(path, what))
    except (json.JSONDecodeError, RecursionError) as error:
        where = f" (line {error.lineno}, column {error.colno}: {error.msg})" if isinstance(
            error, json.JSONDecodeError) else ""
        raise ValueError(f"{what} {str(path)!r} is not valid JSON{where}; write it again with {writer}, or remove "
                         f"it") from None


def read_decoding(run_folder: str | Path) -> dict | None:
    """The record of run_folder/decoding.json, checked; None when the run has none. One line for a malformed file."""
    path = Path(run_folder) / DECODING_FILE
    if not path.exists() and not path.is_symlink():
        return None
    check_replaceable(path, "decoding file")  # a link or a special file is not read either
    record = read_json(path, "decoding file", "write_decoding")
    if not isinstance(record, dict):
        raise ValueError(f"decoding file {str(path)!r} must hold a JSON object, got {json.dumps(record)[:60]}")
    where = f"decoding file {str(path)!r}"
    decoding = check_decoding({key: value for key, value in record.items() if key in DECODING_KEYS}, where)
    extra = sorted(set(record) - {*DECODING_KEYS, "chosen_on", "date", "validation"})
    if extra:
        raise ValueError(f"{where} holds {', '.join(extra)}, which decoding.json never holds; write it again with "
                         f"write_decoding")
    check_chosen_on(record.get("chosen_on"), f"{where}: chosen_on")
    if not isinstance(record.get("date"), str):
        raise ValueError(f"{where}: date must be an ISO date string, got {record.get('date')!r}")
    result = {**decoding, "chosen_on": record["chosen_on"], "date": record["date"]}
    if record.get("validation") is not None:
        result["validation"] = check_scores(record["validation"], f"{where}: validation")
    return result


LOCK_FILE = ".lock"  # inside the run folder; holds the pid of the process that trains there

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
        descriptor = os.open(lock, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o666)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the kernel drops it when its process dies
        except BlockingIOError:
            holder = os.read(descriptor, 32).decode("ascii", "replace").strip() or "unknown"
            os.close(descriptor)
            raise RunFolderInUseError(f"the run folder {str(out)!r} is in use by process {holder} (it holds "
                                      f"{lock}); wait until that run ends, or choose another folder") from None
        try:
            same = os.path.samestat(os.fstat(descriptor), os.lstat(lock))
        except FileNotFoundError:
            same = False
        if same:  # else the holder removed the file between our open and our lock: try again on the new one
            break
        os.close(descriptor)
    os.ftruncate(descriptor, 0)
    os.write(descriptor, f"{os.getpid()}\n".encode("ascii"))
    return descriptor


@contextmanager
def lock_run_folder(out_dir: str | Path) -> Iterator[Path]:
    """Hold the run folder (creating it) so that no second process trains there at the same time.

    A second process fails at once with RunFolderInUseError naming the folder and the holder's pid. The lock is an
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


# ---- checkpoints ----


class CheckpointError(ValueError):
    """A file that is not a readable transformer_lib checkpoint."""


@contextmanager
def checkpoint_errors(path: str | Path) -> Iterator[None]:
    """Turn the many ways torch.load fails on a bad file into one CheckpointError naming the file."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns about the pickle protocol of foreign files
            yield
    except pickle.UnpicklingError:
        raise CheckpointError(
            f"{path} is not a transformer_lib checkpoint: torch.load(weights_only=True) refused it, because it is not "
            f"a checkpoint or it holds Python objects whose loading could run code; use a file written by "
            f"save_checkpoint"
        ) from None
    except (EOFError, KeyError, ValueError, RuntimeError, zipfile.BadZipFile, UnicodeDecodeError) as error:
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


RUN_RECORD_KEYS = ("corpus", "src_lang", "tgt_lang", "corpus_config", "seed", "train_limit", "preset", "overrides",
                   "settings")


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
        raise CheckpointError(f"{path} holds {' and '.join(lacks)}: it was not written by train_translator (chapter "
                              f"7's train writes such files); resuming and --split need a run folder written by "
                              f"`python -m transformer_lib train`")
    return extra


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
