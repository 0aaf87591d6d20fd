"""The scoreboard: one record per full training run, and the table that compares them (hand-written; issue 22).

A record is benchmarks/results/scoreboard/<preset>-<device>.json (device "cpu" or "cuda"; <preset>-cuda-fp16.json
for a run trained in float16 with a GradScaler, a T4's path, beside the same preset in bf16): where the run trained
(the CPU's model and its cores, or the GPU's name), the torch and transformer_lib versions, the date, the training
minutes and steps, the decoding settings and the split they were chosen on (always "validation"), and the scores of
transformer_lib.scoring.corpus_scores on the validation and test splits, and, where spaCy was installed, the test score
of greedy search with the final weights measured as Trevett's tutorial measures it (scoring.tutorial_bleu), the one
number comparable with the tutorial's. `scoreboard_table` lays the records out beside published tutorials
(`TUTORIAL_ROWS`), each score in the column of its metric.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import os
import re
from pathlib import Path
from typing import Any

import torch

from transformer_lib._version import __version__
from transformer_lib.checkpoint_checks import check_checkpoint, checkpoint_errors
from transformer_lib.files import read_checked_json, read_text, write_checked_json
from transformer_lib.runtime import cpu_name
from transformer_lib.settings import (
    MAX_MINUTES,
    check_chosen_on,
    check_decoding,
    check_scores,
    check_weights,
    is_count,
    is_minutes,
    is_score,
)

DEVICES = ("cpu", "cuda")
RECORD_KEYS = ("preset", "device", "device_name", "cores", "torch", "transformer_lib", "date", "training_minutes",
               "steps", "decoding", "weights", "chosen_on", "validation", "test", "test_lowercase_tokenized_bleu", "code_hash",
               "notes")
OPTIONAL_KEYS = ("precision", "test_tutorial_bleu")  # in a record only where they say something
PRECISIONS = ("fp16",)  # the optional "precision" of a record: fp16 = float16 autocast with a GradScaler (a T4's path)
SACREBLEU_METRIC = "sacreBLEU, cased, detokenized"  # what corpus_scores measures; its signature says the rest

TUTORIAL_COLUMN = "tutorial's BLEU, greedy, one set of weights"  # torchtext's BLEU on lower-cased spaCy tokens
COLUMNS = ("system", "trained", "decoding", "validation BLEU", "test BLEU", "test chrF", TUTORIAL_COLUMN)
METRICS = {  # what each score column measures, for the line under the table
    "test BLEU": "sacreBLEU, cased, detokenized (the record's signature)",
    "test chrF": "sacreBLEU's chrF, cased, detokenized",
    TUTORIAL_COLUMN: "as Trevett's tutorial scores: greedy search with one set of weights, torchtext's BLEU on "
                     "lower-cased spaCy tokens (transformer_lib.scoring.tutorial_bleu)",
}

# Published results on Multi30k de-en beside which the book's runs are shown. Their metric differs from ours, so
# their score sits only in the column of their metric.
TUTORIAL_ROWS: tuple[dict, ...] = (
    {
        "system": "Trevett, pytorch-seq2seq 6: Attention is All You Need",
        "trained": "a GPU: 10 epochs",
        "decoding": "greedy, the epoch of lowest validation loss",
        TUTORIAL_COLUMN: 36.52,
        "reference": "trevett2020seq2seq",  # book/references.bib; not a column
    },
)


MAX_CORES = 65536  # more than any one machine has: a larger count is a damaged record
MAX_STEPS = 10**10  # a year of a thousand steps a second is 3 * 10**10: more is a damaged record
def _check_preset(preset: Any) -> str:
    # The name becomes part of a file name: no separators, no '..'
    if not isinstance(preset, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", preset):
        raise ValueError(f"preset must be a preset's name like 'multi30k-cpu' (letters, digits, '.', '_', '-'), "
                         f"got {preset!r}")
    return preset


def _check_device(device: Any) -> str:
    if device not in DEVICES:
        raise ValueError(f"device must be 'cpu' or 'cuda' (where the run trained), got {device!r}")
    return device


def _check_precision(precision: Any) -> str | None:
    if precision is not None and precision not in PRECISIONS:
        raise ValueError(f"precision must be None (the device's own: bf16 autocast on a GPU of compute capability 8 "
                         f"or more, float32 on a CPU) or one of {', '.join(map(repr, PRECISIONS))}, got {precision!r}")
    return precision


def _check_tutorial_bleu(value: Any) -> float | None:
    if value is not None and not is_score(value):
        raise ValueError(f"test_tutorial_bleu must be a number from 0 to 100 (greedy search with the final weights, "
                         f"scored with scoring.tutorial_bleu) or None, got {value!r}")
    return value


def _check_fields(*, preset, device, training_minutes, steps, validation, test, decoding, weights, chosen_on,
                  test_lowercase_tokenized_bleu, code_hash, notes) -> dict:
    """The caller's part of a record, checked; one line naming the argument, the value and what was expected."""
    if not is_minutes(training_minutes):
        raise ValueError(f"training_minutes must be a number of minutes above 0 and at most a year ({MAX_MINUTES}), "
                         f"the run's training time; got {training_minutes!r}")
    if not (is_count(steps) and steps <= MAX_STEPS):
        raise ValueError(f"steps must be an integer from 1 to {MAX_STEPS:.0e} (the run's optimizer steps), got "
                         f"{steps!r}")
    low = test_lowercase_tokenized_bleu
    if low is not None and not is_score(low):
        raise ValueError(f"test_lowercase_tokenized_bleu must be a number from 0 to 100 or None, got {low!r}")
    for name, value in (("code_hash", code_hash), ("notes", notes)):
        if value is not None and not isinstance(value, str):
            raise ValueError(f"{name} must be a string or None, got {type(value).__name__} {value!r:.60}")
    decoding = check_decoding(decoding)
    return {
        "preset": _check_preset(preset), "device": _check_device(device),
        "training_minutes": float(training_minutes), "steps": steps,
        "decoding": decoding, "weights": check_weights(weights, decoding["average_last"]),
        "chosen_on": check_chosen_on(chosen_on),
        "validation": None if validation is None else check_scores(validation, "validation"),
        "test": check_scores(test, "test"), "test_lowercase_tokenized_bleu": low, "code_hash": code_hash,
        "notes": notes,
    }


def scoreboard_record(*, preset: str, device: str, training_minutes: float, steps: int, validation: dict | None,
                      test: dict, decoding: dict, weights: str, chosen_on: str,
                      test_lowercase_tokenized_bleu: float | None = None,
                      code_hash: str | None = None, notes: str | None = None, precision: str | None = None,
                      test_tutorial_bleu: float | None = None) -> dict:
    """The scoreboard record of one full run, made on the machine that trained it.

    validation and test are dicts of transformer_lib.scoring.corpus_scores (bleu, chrf, bleu_signature and
    chrf_signature at least; further keys such as bp, ratio, hyp_len, ref_len are kept); validation may be None when
    the run's validation scores were not kept. decoding is dict(beam_size=int, alpha=float, average_last=int) and
    weights names the weights decoded, as translation.weights_label names them ("the average of epochs 9-12"), so
    that the record says which epochs, not only how many; chosen_on must be "validation". device_name (the CPU's model, or the GPU's name), cores, the torch and
    transformer_lib versions and the date are filled in here. precision="fp16" marks a run trained in float16 with a
    GradScaler (a T4, or a newer GPU with the T4's path forced): such a record has a file of its own, beside the
    record of the same preset in the device's own precision. test_tutorial_bleu is the test BLEU of greedy search with
    the final weights scored as Trevett's tutorial scores it (scoring.tutorial_bleu, which needs spaCy); notes says
    what a reader must know to trust the scores, such as every earlier look at the test set.
    """
    record = _check_fields(preset=preset, device=device, training_minutes=training_minutes, steps=steps,
                           validation=validation, test=test, decoding=decoding, weights=weights, chosen_on=chosen_on,
                           test_lowercase_tokenized_bleu=test_lowercase_tokenized_bleu, code_hash=code_hash,
                           notes=notes)
    if device == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device is 'cuda' but this machine has no CUDA GPU to name; make the record on the "
                             "machine that trained the run")
        device_name = torch.cuda.get_device_name()
    else:
        device_name = cpu_name()
    record.update(device_name=device_name, cores=os.cpu_count(), torch=torch.__version__,
                  transformer_lib=__version__, date=datetime.date.today().isoformat())
    ordered = {key: record[key] for key in RECORD_KEYS}
    if _check_precision(precision) is not None:
        ordered["precision"] = precision  # only where it says something: records of a device's own precision lack it
    if _check_tutorial_bleu(test_tutorial_bleu) is not None:
        ordered["test_tutorial_bleu"] = test_tutorial_bleu  # only where spaCy could measure it
    return ordered


def check_record(record: Any, what: str = "record") -> dict:
    """A scoreboard record as scoreboard_record makes it; else one line naming what is wrong."""
    if not isinstance(record, dict):
        raise ValueError(f"{what} must be a dict made by scoreboard_record, got {type(record).__name__} "
                         f"{record!r:.60}")
    missing = [key for key in RECORD_KEYS if key not in record]
    unknown = [key for key in record if key not in RECORD_KEYS and key not in OPTIONAL_KEYS]
    if missing or unknown:
        problems = [f"it lacks {', '.join(missing)}"] * bool(missing) + [
            f"{', '.join(map(repr, unknown))} {'are' if len(unknown) > 1 else 'is'} not part of a record"
        ] * bool(unknown)
        raise ValueError(f"{what} is not a scoreboard record: {' and '.join(problems)}; make it with "
                         f"scoreboard_record")
    try:
        _check_fields(**{key: record[key] for key in ("preset", "device", "training_minutes", "steps", "validation",
                                                      "test", "decoding", "weights", "chosen_on",
                                                      "test_lowercase_tokenized_bleu", "code_hash", "notes")})
    except ValueError as error:
        raise ValueError(f"{what}: {error}") from None
    optional = {"precision": _check_precision,  # records of a device's own precision leave it out
                "test_tutorial_bleu": _check_tutorial_bleu}  # a record made without spaCy leaves it out
    for key, check in optional.items():
        if key in record:
            if record[key] is None:
                raise ValueError(f"{what}: {key}, when present, must not be None (leave it out instead)")
            try:
                check(record[key])
            except ValueError as error:
                raise ValueError(f"{what}: {error}") from None
    for key in ("device_name", "torch", "transformer_lib", "date"):
        if not isinstance(record[key], str) or not 0 < len(record[key]) <= 200:
            raise ValueError(f"{what}: {key} must be a non-empty string of at most 200 characters, got "
                             f"{record[key]!r:.80}")
    try:
        datetime.date.fromisoformat(record["date"])
    except ValueError:
        raise ValueError(f"{what}: date must be the ISO date (YYYY-MM-DD) the record was made, got "
                         f"{record['date']!r}") from None
    if record["cores"] is not None and not (is_count(record["cores"]) and record["cores"] <= MAX_CORES):
        raise ValueError(f"{what}: cores must be an integer from 1 to {MAX_CORES} or None, got {record['cores']!r}")
    return record


def scoreboard_path(record: dict, folder: str | Path) -> Path:
    """folder/<preset>-<device>.json, the one file of a preset's full run on a kind of device; with a precision,
    folder/<preset>-<device>-<precision>.json."""
    precision = f"-{record['precision']}" if record.get("precision") else ""
    return Path(folder) / f"{record['preset']}-{record['device']}{precision}.json"


def check_scoreboard_folder(folder: str | Path, what: str = "scoreboard folder") -> Path:
    """folder as a Path, when records may be written there (a folder, or none yet); never a link or a file."""
    folder = Path(folder)
    if folder.is_symlink():
        raise ValueError(f"{what} {str(folder)!r} is a symbolic link (to {os.readlink(folder)!r}); it is never written "
                         f"through: give the path of a real folder")
    if folder.exists() and not folder.is_dir():
        raise NotADirectoryError(f"{what} {str(folder)!r} is a file; give a folder for the records")
    return folder


def run_facts(checkpoint: str | Path, run: dict) -> dict:
    """What a record says of the run in checkpoint (its folder's checkpoint.pt, written by train_translator), besides
    its decoding and scores: device ('cpu' or 'cuda', where its tensors were saved from), precision ('fp16' for a
    GradScaler's run, else None), training_minutes (the checkpoint's last epoch record), steps (the checkpoint's)
    and notes (what sets it apart from the preset's plain run: another corpus, overridden settings, less data).

    run is the checkpoint's run record (runs.read_run_record(...)["run"]). One line for whatever is missing or wrong.
    """
    checkpoint = Path(checkpoint)
    locations = set()  # where the checkpoint's tensors were saved from: 'cpu', and 'cuda:0' for a run on a GPU

    def location(storage, where):
        locations.add(where)
        return storage

    with checkpoint_errors(checkpoint):
        saved = torch.load(checkpoint, map_location=location, weights_only=True, mmap=True)
    state = check_checkpoint(saved, checkpoint, ("config", "model", "state"))["state"]  # its checksum holds
    steps = state.get("step") if isinstance(state, dict) else None
    if not is_count(steps):
        raise ValueError(f"{checkpoint} records no training step (state['step'] is {steps!r}); the scoreboard needs a "
                         f"checkpoint written by train_translator")
    epochs = state.get("epochs")  # the epoch records, covered by the checkpoint's checksum (history.json is a copy)
    minutes = epochs[-1].get("minutes") if isinstance(epochs, list) and epochs and isinstance(epochs[-1], dict) \
        else None
    if not is_minutes(minutes):
        raise ValueError(f"the scoreboard takes the training minutes from the last epoch record of {checkpoint}, "
                         f"which has none (got {minutes!r}); a run records them at the end of each epoch it validates")
    kinds = {place.split(":")[0] for place in locations} - {"cpu"}
    if len(kinds) > 1 or kinds - {"cuda"}:
        raise ValueError(f"{checkpoint} was saved from {', '.join(sorted(locations))}; the scoreboard records runs "
                         f"trained on 'cpu' or 'cuda'")
    device = "cuda" if kinds else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"{checkpoint} was trained on a GPU and this machine has none for the record to name; make "
                         f"the record on the machine that trained it")
    notes = []
    if (run["corpus"], run["src_lang"], run["tgt_lang"]) != ("multi30k", "de", "en"):
        notes.append(f"corpus {run['corpus']} {run['src_lang']}-{run['tgt_lang']}")
    if run["corpus_config"] is not None:
        notes.append(f"corpus config {run['corpus_config']}")
    if run["overrides"]:
        notes.append(f"settings overridden: {json.dumps(run['overrides'], sort_keys=True)}")
    if run["train_limit"] is not None:
        notes.append(f"trained on the first {run['train_limit']} pairs only")
    return {"device": device, "precision": "fp16" if saved.get("scaler") is not None else None,  # a GradScaler: fp16
            "training_minutes": float(minutes), "steps": steps, "notes": "; ".join(notes) or None}


def write_scoreboard(record: dict, folder: str | Path) -> Path:
    """Write record to scoreboard_path(record, folder) (atomic, strict JSON, with the checksum of its content),
    creating folder; returns the path.

    The record replaces that preset's earlier record on that device (in that precision). A folder, or a file in it, that is a symbolic
    link is refused: nothing is written through a link this module did not create.
    """
    check_record(record)
    folder = check_scoreboard_folder(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = scoreboard_path(record, folder)
    write_checked_json(path, record)  # refuses a link or a special file at path
    return path


def replaced_record(record: dict, folder: str | Path) -> str:
    """What writing record to folder replaces, said for the caller to print (", replacing the record of ..."); ""
    where its file does not exist yet."""
    path = scoreboard_path(record, folder)
    if not path.exists():
        return ""
    try:
        old = check_record(read_checked_json(path, "scoreboard file", "write_scoreboard"))
        return (f", replacing the record of {old['date']} (test BLEU {old['test']['bleu']:.2f}, "
                f"{old['training_minutes']:.1f} training minutes)")
    except (ValueError, OSError) as error:
        return f", replacing a file that was not a valid record ({error})"


def read_scoreboard(folder: str | Path) -> list[dict]:
    """Every record in folder (its *.json files), checked, sorted by preset and device; one line for a bad file."""
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"scoreboard folder {str(folder)!r} does not exist or is not a folder; write a record "
                                f"there first with write_scoreboard")
    records = []
    for path in sorted(folder.glob("*.json")):
        if path.is_symlink() or not path.is_file():
            raise ValueError(f"scoreboard file {str(path)!r} is a link or not a regular file; the scoreboard holds "
                             f"only the files write_scoreboard writes")
        record = read_checked_json(path, "scoreboard file", "write_scoreboard")
        check_record(record, f"scoreboard file {str(path)!r}")
        if scoreboard_path(record, folder).name != path.name:
            raise ValueError(f"scoreboard file {str(path)!r} holds the record of {record['preset']} on "
                             f"{record['device']}, which belongs in {scoreboard_path(record, folder).name}; rename it")
        records.append(record)
    return sorted(records, key=lambda r: (r["preset"], r["device"], r.get("precision") or ""))


def _decoding_text(record: dict) -> str:
    """How a record's run decoded: "beam 4, alpha 1.0, the average of epochs 9-12"."""
    decoding = record["decoding"]
    search = "greedy" if decoding["beam_size"] == 1 else f"beam {decoding['beam_size']}, alpha {float(decoding['alpha'])}"
    return f"{search}, {record['weights']}"


def _trained_text(record: dict) -> str:
    """Where and how long a record's run trained: "cpu, AMD EPYC (2 cores): 35.6 min, 3,823 steps"."""
    device = record["device"] + (f" ({record['precision']}, GradScaler)" if record.get("precision") else "")
    cores = f" ({record['cores']} cores)" if record["device"] == "cpu" and record["cores"] else ""
    return (f"{device}, {record['device_name']}{cores}: {record['training_minutes']:.1f} min, "
            f"{record['steps']:,} steps")


def scoreboard_table(records: list[dict], tutorials: tuple[dict, ...] | list[dict] = TUTORIAL_ROWS):
    """A pandas DataFrame of COLUMNS: one row per record (in the given order), then one per tutorial row.

    "trained" says where, how long and how many steps; "test BLEU" and "test chrF" are cased, detokenized sacreBLEU
    (METRICS says what each score column measures); the last column, TUTORIAL_COLUMN, holds a record's
    test_tutorial_bleu and the tutorials' own scores, the one column in which the two may be compared. A missing
    number is NaN. Seven columns, so that the table fits the book's page.
    """
    import pandas as pd

    rows = []
    for number, record in enumerate(records):
        check_record(record, f"records[{number}]")
        test, validation = record["test"], record["validation"]
        rows.append({
            "system": f"transformer_lib {record['preset']}",
            "trained": _trained_text(record),
            "decoding": _decoding_text(record),
            "validation BLEU": math.nan if validation is None else validation["bleu"],
            "test BLEU": test["bleu"],
            "test chrF": test["chrf"],
            TUTORIAL_COLUMN: record.get("test_tutorial_bleu", math.nan),
        })
    for number, row in enumerate(tutorials):
        unknown = [key for key in row if key not in COLUMNS and key != "reference"]
        if unknown or "system" not in row or "reference" not in row:
            raise ValueError(f"tutorials[{number}] must name its system and its reference (a key of "
                             f"book/references.bib) and use only the columns {', '.join(COLUMNS)}; got {sorted(row)}")
        rows.append({column: row.get(column, math.nan) for column in COLUMNS})
    return pd.DataFrame(rows, columns=list(COLUMNS))


def notebook_code_hash(notebook: str | Path) -> str:
    """sha256 of a notebook's code cells, in order: what its stored outputs were computed from.

    The same hash as the one tools/run_heavy_chapters.py records in chapters 8 and 9, so that a scoreboard record
    written by chapter 8 names the code that made it.
    """
    return code_hash(json.loads(read_text(notebook, "notebook")))


INSTALL_CELL_ID = "colab-install"  # the id of the Colab install cell that tools/colab.py writes first in every notebook


def code_hash(notebook: dict) -> str:
    """sha256 of the code cells of a notebook (as JSON or nbformat's node), in order, the Colab install cell left out.

    The install cell does nothing outside Colab and names the commit of the package to install, which changes with
    every change to the package, so it is not part of what the stored outputs were computed from."""
    digest = hashlib.sha256()
    for cell in notebook["cells"]:
        if cell["cell_type"] == "code" and cell.get("id") != INSTALL_CELL_ID:
            source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
            digest.update(source.encode("utf-8") + b"\0")
    return digest.hexdigest()
