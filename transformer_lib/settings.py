"""A run's settings checked in one place, and the validators every record shares (hand-written: plumbing the
chapters call in one line each).

- `merge_settings`, `validate_settings`: an unknown key is refused with the closest valid name, a bad value with the
  key, the value and what is allowed (`RULES`, `SIZE_BOUNDS`, `estimate_parameters`).
- `check_decoding`: the decoding settings (beam size, length penalty, weights averaged) by the same rules.
- `is_count`, `is_number`, `is_score`, `is_minutes`, `check_chosen_on`, `check_scores`: the checks that decoding.json,
  the scoreboard's records and the ablations' records share.
"""

from __future__ import annotations

import difflib
import math
import re
from typing import Any


MAX_SEED = 2**32 - 1  # the largest seed that every generator a run seeds (torch, Python's random) takes alike


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
MAX_AVERAGED = 1000  # epochs whose weights a run keeps and averages: the paper averages 5 or 20 checkpoints; a count
# without a bound (a signed decoding.json with average_last 10**18) made load_translator list every epoch: MemoryError

RULES: dict[str, dict[str, tuple]] = {
    # part -> key -> (test, what is allowed)
    "model": {  # the rest of the model's rules are TransformerConfig's own (validate_settings' check_model)
        "max_len": (lambda v: is_count(v) and v >= 3, "an integer >= 3 (a translation needs <bos>, a token, <eos>)"),
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
        "keep_checkpoints": (lambda v: is_count(v) and v <= MAX_AVERAGED,
                             f"an integer from 1 to {MAX_AVERAGED:,} (epochs whose weights are kept for averaging)"),
    },
    "decoding": {  # also what check_decoding applies to decoding.json
        "beam_size": (lambda v: is_count(v) and v <= MAX_BEAM, f"an integer from 1 (greedy) to {MAX_BEAM}"),
        "alpha": (lambda v: is_number(v) and 0 <= v <= 10, "a number from 0 (no length penalty) to 10"),
        "average_last": (lambda v: is_count(v) and v <= MAX_AVERAGED,
                         f"an integer from 1 (the final weights) to {MAX_AVERAGED:,} (epochs averaged)"),
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


def merge_settings(defaults: dict, overrides: Any, source: str = "overrides",
                   keys: dict[str, tuple[str, ...]] | None = None) -> dict:
    """defaults ({"model": {...}, "training": {...}}) with overrides applied; unknown parts and keys are refused.

    A part may set the keys of its defaults, of RULES, and keys[part] (the model's: TransformerConfig's fields)."""
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
        known = sorted(set(settings[part]) | set(RULES.get(part, {})) | set((keys or {}).get(part, ())))
        for key, value in values.items():
            if key not in known:
                raise ValueError(f"{source}: {part}.{key} is not a setting; {_suggest(key, known)}"
                                 f"the {part} settings are {', '.join(known)}")
            settings[part][key] = value
    return settings


def validate_settings(settings: dict, defaults: dict | None = None, *, check_model: Any = None) -> dict:
    """Check every value of settings; the error names the key, the value and what is allowed. Returns settings.

    check_model(settings), when given, applies the model's own rules (the recipe passes TransformerConfig's, which
    own what a model may be) to the model part, which then has no rule here but RULES' and SIZE_BOUNDS'.
    """
    for part, values in settings.items():
        for key, value in values.items():
            test, allowed = RULES.get(part, {}).get(key, (None, None))
            owned = part == "model" and check_model is not None  # its owner checks it, below
            if test is None and not owned and defaults is not None and key in defaults.get(part, {}):
                default = defaults[part][key]  # a setting without a rule: keep the type of its default
                test = lambda v, d=default: type(v) is type(d) or (is_number(v) and is_number(d) and type(d) is float)
                allowed = f"a {type(default).__name__} like its default {default!r}"
            if test is not None and not test(value):
                raise ValueError(f"setting {part}.{key} must be {allowed}, got {value!r}")
    if check_model is not None:
        check_model(settings)  # before the bounds below compare numbers
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
    if "max_tokens" in training and "max_len" in model and training["max_tokens"] < model["max_len"]:
        raise ValueError(f"setting training.max_tokens must be at least model.max_len={model['max_len']} (a batch "
                         f"must hold the longest sentence), got {training['max_tokens']}")
    return settings


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


AVERAGE_NAME = re.compile(r"the average of epochs (\d+)-(\d+)")  # translation.weights_label's names


def check_weights(weights: Any, average_last: int, what: str = "weights") -> str:
    """The weights decoded, named as translation.weights_label names them, and agreeing with average_last: "the
    final weights (step N)" for 1, "the average of epochs a-b" with b - a + 1 = average_last for more."""
    expected = ("'the final weights (step N)'" if average_last == 1 else
                f"'the average of epochs a-b' with {average_last} epochs (decoding's average_last)")
    if not isinstance(weights, str) or len(weights) > 200:
        raise ValueError(f"{what} must name the weights decoded, {expected}, got {weights!r:.80}")
    average = AVERAGE_NAME.fullmatch(weights)
    agrees = (weights.startswith("the final weights") if average_last == 1 else
              average is not None and int(average[2]) - int(average[1]) + 1 == average_last)
    if not agrees:
        raise ValueError(f"{what} must name the weights decoded, {expected}, got {weights!r}")
    return weights


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
