"""The records of benchmarks/ablations.py: the variants, where a run's record and log go, what a record holds (its
schema, checked field by field), and how records are read and matched to a sweep.

benchmarks/ablation_tables.py says what the records show; benchmarks/ablations_page.py writes the appendix from both.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

from transformer_lib.files import read_checked_json
from transformer_lib.settings import CHOSEN_ON, RULES, is_count, is_minutes, is_number, is_score

# name -> (what it changes, settings overrides). The baseline is the preset as chapter 8 trains it: post-norm with
# warm-up, label smoothing 0.1, dropout 0.1, sinusoidal positions, one embedding matrix shared by source and target,
# scaled by sqrt(d_model) and reused by the output projection.
VARIANTS: dict[str, tuple[str, dict]] = {
    "baseline": ("the preset as chapter 8 trains it", {}),
    "pre-norm": ("LayerNorm before each sublayer instead of after the residual sum (chapter 6)",
                 {"model": {"norm_first": True}}),
    "no-warmup": ("post-norm without warm-up: warmup=1, the schedule's inverse square-root decay from the first step",
                  {"training": {"warmup": 1}}),
    "pre-norm-no-warmup": ("pre-norm without warm-up (warmup=1)",
                           {"model": {"norm_first": True}, "training": {"warmup": 1}}),
    "no-embedding-scale": ("embeddings not multiplied by sqrt(d_model) (chapter 1)",
                           {"model": {"scale_embeddings": False}}),
    "untied-output": ("an output projection of its own instead of the embedding matrix (chapter 6)",
                      {"model": {"tie_embeddings": False}}),
    "separate-embeddings": ("one embedding for the source and another for the target (each still of the joint "
                            "vocabulary; the target's reused by the output projection)",
                            {"model": {"share_embeddings": False}}),
    "no-label-smoothing": ("label smoothing 0 instead of 0.1 (chapter 7)", {"training": {"label_smoothing": 0.0}}),
    "dropout-0.3": ("dropout 0.3 instead of 0.1", {"model": {"dropout": 0.3}}),
    "learned-positions": ("learned positional embeddings instead of sinusoids (chapter 2)",
                          {"model": {"positional": "learned"}}),
    # Part III (chapter 10): what came after 2017, seeds 0 and 1 declared before any ran
    "rms-norm": ("pre-norm with RMSNorm instead of LayerNorm (chapter 10); compared with pre-norm too",
                 {"model": {"norm_first": True, "norm": "rms"}}),
    "swiglu": ("a SwiGLU feed-forward network, 2/3 of d_ff wide, instead of the ReLU one (chapter 10)",
               {"model": {"ffn": "swiglu"}}),
    "rotary": ("rotary positions in every self-attention instead of added sinusoids (chapter 10)",
               {"model": {"positional": "rotary"}}),
    "grouped-query": ("2 key/value heads for the 8 query heads of the decoder's attentions (chapter 10)",
                      {"model": {"n_kv_heads": 2}}),
    "block-2026": ("all of them with pre-norm: RMSNorm, SwiGLU, rotary positions, 2 key/value heads (chapter 10)",
                   {"model": {"norm_first": True, "norm": "rms", "ffn": "swiglu", "positional": "rotary",
                              "n_kv_heads": 2}}),
}


def merge(overrides: dict, extra: dict) -> dict:
    """overrides with extra's parts laid over them, key by key."""
    for part, values in {**overrides, **extra}.items():
        if not isinstance(values, dict):
            raise ValueError(f'--overrides: {part!r} must be an object of settings like {{"epochs": 2}}, got '
                             f"{json.dumps(values)[:60]}")
    merged = {part: dict(values) for part, values in overrides.items()}
    for part, values in extra.items():
        merged.setdefault(part, {}).update(values)
    return merged


def record_path(out: Path, variant: str, seed: int) -> Path:
    return out / f"{variant}-seed{seed}.json"


def log_path(out: Path, variant: str, seed: int) -> Path:
    return out / "logs" / f"{variant}-seed{seed}.log"


def test2016_references() -> list[str]:
    """test2016's English references, as the runs decoded it."""
    from transformer_lib.data import load_pairs

    return [en for _, en in load_pairs("multi30k", "test", "de", "en")]


RECORD_KEYS = ("what", "variant", "description", "changes", "seed", "preset", "overrides", "settings", "train_limit",
               "epochs_asked", "jobs", "device", "device_name", "torch", "cores", "torch_threads", "python", "date",
               "diverged", "curve", "steps", "minutes", "wall_minutes")
TRAINED_KEYS = ("epochs", "final_valid_loss", "valid_bleu_greedy", "chosen", "test", "test_greedy_final",
                "test_beam_final", "decodes", "test_hypotheses")


class RecordError(ValueError):
    """A record file that is not a complete record of benchmarks/ablations.py, or not of this sweep."""


def _text(value) -> bool:
    return isinstance(value, str) and value != ""


def _date(value) -> bool:
    try:
        datetime.date.fromisoformat(value)
    except (TypeError, ValueError):
        return False
    return True


def _optional(test):
    return lambda value: value is None or test(value)


def _at_least_0(value) -> bool:
    return is_number(value) and value >= 0


def _point(point) -> bool:  # one epoch of the curve, as validation.validation_hook records it
    return (isinstance(point, dict) and is_count(point.get("epoch")) and is_count(point.get("step"), 0)
            and _at_least_0(point.get("minutes")) and all(_optional(is_number)(point.get(key))
                                                          for key in ("train_loss", "valid_loss"))
            and _optional(is_score)(point.get("valid_bleu")))


def _scores(row) -> bool:  # corpus_scores' numbers, as the records keep them
    return (isinstance(row, dict) and is_score(row.get("bleu")) and is_score(row.get("chrf"))
            and _at_least_0(row.get("bp")) and _at_least_0(row.get("ratio")) and _text(row.get("bleu_signature")))


def _decoding(row) -> bool:  # beam_size, alpha and average_last, by the rules of decoding.json
    return isinstance(row, dict) and all(test(row.get(key)) for key, (test, _) in RULES["decoding"].items())


def _hypotheses(kept) -> bool:
    return (isinstance(kept, dict) and sorted(kept) == ["beam_final", "chosen", "greedy_final"]
            and all(isinstance(h, list) and all(isinstance(t, str) for t in h) for h in kept.values())
            and len({len(h) for h in kept.values()}) == 1)


# key -> (test, what is expected): every field that the sweep, the tables and the appendix read, of every record ...
FIELDS = {
    "what": (_text, "a sentence"), "description": (_text, "a sentence"), "preset": (_text, "a preset's name"),
    "overrides": (lambda v: isinstance(v, dict) and all(isinstance(part, dict) for part in v.values()),
                  "an object of settings parts"),
    "settings": (lambda v: isinstance(v, dict) and all(isinstance(v.get(part), dict) for part in ("model", "training"))
                 and is_count(v["training"].get("epochs")), "the run's settings, model and training with its epochs"),
    "train_limit": (_optional(is_count), "null or a positive count"),
    "epochs_asked": (_optional(is_count), "null or a positive count"), "jobs": (is_count, "a positive count"),
    "device": (_text, "a device's name"), "device_name": (_text, "a device's name"), "torch": (_text, "a version"),
    "python": (_text, "a version"), "cores": (_optional(is_count), "null or a positive count"),
    "torch_threads": (is_count, "a positive count"), "date": (_date, "a date, YYYY-MM-DD"),
    "curve": (lambda v: isinstance(v, list) and all(_point(p) for p in v),
              "a list of epoch records (epoch, step, minutes, losses, validation BLEU)"),
    "wall_minutes": (is_minutes, "a number of minutes up to a year"),
}
# ... and of a run that trained to its end
TRAINED_FIELDS = {
    "steps": (is_count, "a positive count"), "epochs": (is_count, "a positive count"),
    "minutes": (is_minutes, "a number of minutes up to a year"), "final_valid_loss": (_at_least_0, "a number >= 0"),
    "load_average": (_optional(lambda v: isinstance(v, list) and all(_at_least_0(x) for x in v)),
                     "a list of load averages, numbers >= 0"),  # missing in the first records
    **{key: (is_score, "a number from 0 to 100")
       for key in ("valid_bleu_greedy", "test_greedy_final", "test_beam_final")},
    "test": (_scores, "the scores bleu and chrf (numbers from 0 to 100), bp and ratio (numbers >= 0), bleu_signature"),
    "chosen": (lambda v: _decoding(v) and is_score(v.get("valid_bleu")) and v.get("chosen_on") == CHOSEN_ON,
               f"a decoding chosen on the validation split: beam_size, alpha, average_last, valid_bleu, chosen_on "
               f"{CHOSEN_ON!r}"),
    "decodes": (lambda v: isinstance(v, list) and v != [] and all(
        _decoding(row) and _scores(row) and row.get("split") in ("validation", "test") for row in v),
        "a list of decodings: split, beam_size, alpha, average_last and their scores"),
    "test_hypotheses": (_hypotheses, "the test hypotheses of its three decodings, chosen, greedy_final and beam_final "
                                     "(lists of sentences, of one length)"),
}


def check_record(record, path: Path) -> dict:
    """record as run_one writes it: complete, every field of the right type and range, its file named after it, its
    variant's changes those of VARIANTS; else a RecordError naming the file and what is wrong."""
    def wrong(problem: str) -> RecordError:
        return RecordError(f"ablation record {str(path)!r} {problem}; remove it (or run with --overwrite) to run it "
                           f"again")

    if not isinstance(record, dict):
        raise wrong(f"holds a JSON {type(record).__name__}, not a record")
    missing = [key for key in RECORD_KEYS + (() if record.get("diverged") else TRAINED_KEYS) if key not in record]
    if missing:
        raise wrong(f"lacks {', '.join(missing)}: it is not a complete record")
    if not isinstance(record["variant"], str) or record["variant"] not in VARIANTS or not is_count(record["seed"], 0):
        raise wrong(f"names variant {record['variant']!r} and seed {record['seed']!r}; expected one of VARIANTS and "
                    f"a seed >= 0")
    if path.name != record_path(path.parent, record["variant"], record["seed"]).name:
        raise wrong(f"holds the record of {record['variant']} seed {record['seed']}, which belongs in "
                    f"{record_path(path.parent, record['variant'], record['seed']).name}")
    if record["changes"] != VARIANTS[record["variant"]][1]:
        raise wrong(f"changes {record['changes']} where {record['variant']} now changes "
                    f"{VARIANTS[record['variant']][1]}")
    if not isinstance(record["diverged"], bool):
        raise wrong(f"has diverged {json.dumps(record['diverged'])[:60]}, not true or false")
    for key, (test, expected) in {**FIELDS, **({} if record["diverged"] else TRAINED_FIELDS)}.items():
        if not test(record.get(key)):
            raise wrong(f"has {key} {json.dumps(record.get(key))[:60]}, not {expected}")
    if record["diverged"]:
        if not _text(record.get("error")):
            raise wrong("records a diverged run without its error")
        return record
    epochs = record["settings"]["training"]["epochs"] if record["epochs_asked"] is None else record["epochs_asked"]
    if record["epochs"] != epochs or len(record["curve"]) != epochs:
        raise wrong(f"records {record['epochs']} epochs and {len(record['curve'])} epoch records where its run asked "
                    f"for {epochs}: a run cut short")
    if record["chosen"]["average_last"] > epochs:
        raise wrong(f"chose the average of the last {record['chosen']['average_last']} epochs of a run of {epochs}")
    return record


def read_record(path: Path) -> dict:
    """The checked record in path; a RecordError naming the file when it is not valid JSON or not a record."""
    if path.is_symlink() or not path.is_file():
        raise RecordError(f"ablation record {str(path)!r} is a link or not a regular file; the records are the files "
                          f"run_one writes")
    try:
        record = read_checked_json(path, "ablation record", "run_one (run it again with --overwrite)")
    except ValueError as error:  # not UTF-8, not JSON, or failing its checksum: named, with where
        raise RecordError(str(error)) from None
    return check_record(record, path)


def read_records(folder: Path) -> list[dict]:
    """Every record in folder, checked (read_record), and all of one sweep (differs_from_sweep)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise RecordError(f"--summary {str(folder)!r} is not a folder of ablation records")
    records = [read_record(path) for path in sorted(folder.glob("*-seed*.json"))]
    if records:  # compared with a trained baseline where there is one: its overrides are the sweep's own
        first = min(records, key=lambda r: (r["diverged"], r["variant"] != "baseline"))
        name, sweep = record_path(folder, first["variant"], first["seed"]), sweep_of(first)
        for record in records:
            other = differs_from_sweep(record, sweep, name.name)
            if other is not None:
                raise RecordError(f"ablation records {str(name)!r} and "
                                  f"{str(record_path(folder, record['variant'], record['seed']))!r} are of two "
                                  f"sweeps: the second has {other}; keep each sweep's records in a folder of its own")
    return records


def check_hypotheses(records: list[dict], references: list[str], folder: Path) -> None:
    """Refuse, naming its file, a trained record whose test hypotheses are not one per sentence of references."""
    for record in (r for r in records if not r["diverged"]):
        count = len(record["test_hypotheses"]["chosen"])
        if count != len(references):
            raise RecordError(f"ablation record {str(record_path(Path(folder), record['variant'], record['seed']))!r} "
                              f"holds {count} test hypotheses per decoding where test2016 has {len(references)} "
                              f"sentences: it was decoded from another test set; remove it (or run with --overwrite) "
                              f"to run it again")


def sweep_of(record: dict) -> dict:
    """What the sweep of a record asked for: preset, the overrides under every variant (the record's own without
    its variant's changes), data, length and, for a trained run, the decoding sweep (beam and alphas)."""
    changes = VARIANTS[record["variant"]][1]
    overrides = {part: {key: value for key, value in values.items() if key not in changes.get(part, {})}
                 for part, values in record["overrides"].items()}
    trained = not record["diverged"]
    return {"preset": record["preset"], "train_limit": record["train_limit"], "epochs_asked": record["epochs_asked"],
            "overrides": {part: values for part, values in overrides.items() if values or part not in changes},
            "beam": record["chosen"]["beam_size"] if trained else None, "alpha": alphas_of(record) if trained else None}


def alphas_of(record: dict) -> list[float]:
    """The alphas of a trained record's beam search on the validation split."""
    return sorted({row["alpha"] for row in record["decodes"] if row["split"] == "validation" and row["beam_size"] > 1})


def differs_from_sweep(record: dict, sweep: dict, whose: str = "this sweep") -> str | None:
    """What makes a record another sweep's (its preset, settings, data, length or decoding sweep), or None."""
    asked = {"preset": sweep["preset"], "overrides": merge(sweep["overrides"], VARIANTS[record["variant"]][1]),
             "train_limit": sweep["train_limit"], "epochs_asked": sweep["epochs_asked"]}
    for key, value in asked.items():
        if record[key] != value:
            return f"{key} {record[key]!r} where {whose} has {value!r}"
    if not record["diverged"] and sweep["beam"] is not None:
        if alphas_of(record) != sweep["alpha"] or record["chosen"]["beam_size"] != sweep["beam"]:
            return (f"a decoding sweep of beam {record['chosen']['beam_size']} and alpha {alphas_of(record)} where "
                    f"{whose} has beam {sweep['beam']} and alpha {sweep['alpha']}")
    return None
