"""Hand-written checks for the book's coding exercises: run a learner's function on fresh inputs, compare it
with the reference piece from transformer_lib and say, in plain words, what differs.

    from transformer_lib.checks import check_attention
    check_attention(my_attention)  # prints "Well done: ..." or raises ExerciseCheckError with the likely cause

There is one named check per coding exercise (see EXERCISE_CHECKS). Each draws new random inputs on every call
(pass seed=... to repeat a run), of several shapes and with the exercise's edge cases, and knows the usual wrong
answers of its exercise. All of them run on the generic engine check_against, which also works on its own:

    check_against(my_fn, reference_fn, cases, name="my_fn")
"""

import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

Diagnosis = Callable[[Mapping[str, Any], Any, Any], "str | None"]


class ExerciseCheckError(AssertionError):
    """Raised by a check when the learner's answer differs from the reference."""


# ----------------------------------------------------------------------------------------------------------------
# The engine: compare a learner's function with a reference on given inputs and describe the first difference.
# ----------------------------------------------------------------------------------------------------------------


def _describe(value: Any) -> str:
    if isinstance(value, Tensor):
        return f"tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
    if isinstance(value, tuple):
        return f"tuple of {len(value)} values"
    return f"{type(value).__name__} {value!r}"


def _describe_argument(key: str, value: Any) -> str:
    if isinstance(value, Tensor):
        return f"{key}: shape {tuple(value.shape)}"
    if isinstance(value, nn.Module):  # e.g. "dropout: Dropout(p=0.5)", without the long repr of its options
        rate = getattr(value, "p", None)
        return f"{key}: {type(value).__name__}" + (f"(p={rate})" if isinstance(rate, float) else "")
    return f"{key}={value!r}"


def _describe_case(case: Mapping[str, Any], note: str = "") -> str:
    arguments = ", ".join(_describe_argument(key, value) for key, value in case.items())
    return f"{note}; {arguments}" if note and arguments else note or arguments


def _plural(count: int, word: str, plural: str | None = None) -> str:
    return f"{count} {word if count == 1 else plural or word + 's'}"


def _name_number(x: float) -> str:
    """A readable name for a factor such as 4 (= 4), 2.828 (= sqrt(8)), 0.25 (= 1/4) or 1.443 (= 1/ln 2); '' if none."""

    def close(a: float, b: float) -> bool:
        return abs(a - b) <= 1e-3 * abs(b)

    for label, value in (("-1", -1.0), ("ln 2", math.log(2)), ("1/ln 2", 1 / math.log(2))):
        if close(x, value):
            return label
    if not math.isfinite(x) or x <= 0:
        return ""
    for prefix, y in (("", x), ("1/", 1 / x)):
        if y > 1.001 and close(y, round(y)) and round(y) <= 100_000:
            return f"{prefix}{round(y)}"
        if y > 1.001 and close(y * y, round(y * y)) and round(y * y) <= 100_000:
            return f"{prefix}sqrt({round(y * y)})"
    return ""


def _mask_words(index: tuple[int, ...], allowed: bool, shape: tuple[int, ...]) -> str:
    """Say in words what a wrong mask entry does; the last two axes are (query, key) positions."""
    *lead, i, j = index
    where = ""
    if len(lead) >= 1 and shape[0] > 1:
        where += f"batch row {lead[0]}, "
    if len(lead) >= 2 and shape[1] > 1:
        where += f"head {lead[1]}, "
    where = f"in {where[:-2]}: " if where else ""
    if shape[-2] == 1 and shape[-1] > 1:  # one row for every query, as in a padding mask
        seen = f"key position {j}"
        return f"{where}your mask lets every query see {seen}" if allowed else (
            f"{where}your mask stops every query from seeing {seen}")
    relation = "a later position" if j > i else "an earlier position" if j < i else "itself"
    if allowed:
        return f"{where}your mask lets position {i} see position {j} ({relation})"
    return f"{where}your mask stops position {i} from seeing position {j} ({relation})"


def _type_notes(received: Any, expected: Any) -> list[str]:
    if received is None:
        return ["Your function returned None: is the `return` statement missing?"]
    if isinstance(received, bool | int | float):
        return ["Return a tensor, not a Python number (`.item()` turns a one-element tensor into a number)."]
    if isinstance(received, tuple) and isinstance(expected, Tensor):
        return [f"Your function returned a tuple of {len(received)} values; return the one tensor alone."]
    if isinstance(received, Tensor) and isinstance(expected, tuple):
        return [f"Return a tuple of {len(expected)} tensors, e.g. `return output, weights`."]
    return []


def _shape_notes(received: Tensor, expected: Tensor) -> list[str]:
    got, want = tuple(received.shape), tuple(expected.shape)
    if expected.dim() == 0 and received.numel() == 1:
        return ["The reference returns a single number as a tensor of shape (), e.g. from `.mean()` over all "
                "the values; remove the extra dimensions of size 1 (`.squeeze()`, or no `keepdim=True`)."]
    if received.dim() == 0:
        return [f"You return a single number, but the reference returns a tensor of shape {want}: a sum or mean "
                f"ran over too many dimensions."]
    if received.numel() != expected.numel():
        return []
    if received.dim() == expected.dim() and sorted(got) == sorted(want):
        return ["You have the right sizes in a different order: two axes are swapped (check the order of your "
                "`view`, `transpose` or `permute`)."]
    if [n for n in got if n != 1] == [n for n in want if n != 1]:
        if received.dim() < expected.dim():
            return [f"The sizes other than 1 are right, but {_plural(expected.dim() - received.dim(), 'dimension')} "
                    f"of size 1 {'is' if expected.dim() - received.dim() == 1 else 'are'} missing: add them with "
                    f"`None` indexing (e.g. `mask[None, None]`) or `unsqueeze`."]
        if received.dim() > expected.dim():
            return [f"The sizes other than 1 are right, but you have "
                    f"{_plural(received.dim() - expected.dim(), 'extra dimension')} of size 1."]
    return ["You have the right number of values, arranged in a different shape (check your `view` or `reshape`)."]


def _dtype_notes(received: Tensor, expected: Tensor) -> list[str]:
    if expected.dtype == torch.bool:
        return ["A mask holds True and False: build it from a comparison (e.g. `ids != pad_id`) or with "
                "`dtype=torch.bool`."]
    if expected.dtype.is_floating_point and received.dtype.is_floating_point:
        return [f"Convert your result with `.to({expected.dtype})`; PyTorch's default is float32."]
    if expected.dtype == torch.long:
        return ["Indices are torch.long (int64), which `argmax` returns; convert with `.long()`."]
    return []


def _value_notes(received: Tensor, expected: Tensor, atol: float) -> list[str]:
    """Facts about how received differs from expected that point at a cause: a constant factor or shift, rows that
    sum to 1 over the wrong axis, a transpose."""
    notes: list[str] = []
    got, want = received.double(), expected.double()
    if not (torch.isfinite(got).all() and torch.isfinite(want).all()) or want.numel() == 0:
        return notes
    if want.dim() >= 2 and (want >= 0).all():
        row_sums = want.sum(dim=-1)
        one_or_empty = ((row_sums - 1).abs() < 1e-3) | (row_sums.abs() < 1e-6)  # fully masked rows sum to 0
        if one_or_empty.all() and ((row_sums - 1).abs() < 1e-3).any() and not (
            (got.sum(dim=-1) - row_sums).abs() < 1e-3
        ).all():
            for dim in range(-2, -want.dim() - 1, -1):
                if ((got.sum(dim=dim) - 1).abs() < 1e-3).all():
                    notes.append(f"Each row of the reference sums to 1 over the last dimension (dim=-1); yours sum "
                                 f"to 1 over dim={dim} instead: take the softmax over dim=-1.")
                    break
            else:
                sums = got.sum(dim=-1)
                notes.append(f"Each row of the reference sums to 1 over the last dimension (dim=-1); your rows sum "
                             f"to values between {sums.min().item():.3g} and {sums.max().item():.3g}.")
    if want.numel() < 2:  # one number is always "a constant times" or "a constant plus" another
        return notes
    big = want.abs() > 1e-3 * want.abs().max()
    if big.any() and (got[~big].abs() <= 1e-3 * want.abs().max() + atol).all():
        ratios = got[big] / want[big]
        ratio = ratios.median().item()
        if abs(ratio - 1) > 1e-3 and (ratios - ratio).abs().max().item() <= 1e-4 * abs(ratio) + 1e-6:
            label = _name_number(ratio)
            notes.append(f"Every value you return is the expected one times {ratio:.4g}"
                         f"{f' (= {label})' if label else ''}.")
    shift = (got - want).median().item()
    if abs(shift) > atol and ((got - want) - shift).abs().max().item() <= 1e-4 * (1 + abs(shift)):
        notes.append(f"Every value you return is the expected one plus {shift:.3g}.")
    if (want.dim() >= 2 and want.size(-1) == want.size(-2) > 1 and not torch.allclose(want, want.mT)
            and torch.allclose(got, want.mT, atol=max(atol, 1e-6), rtol=1e-5)):
        notes.append("Your result is the reference with its last two dimensions swapped (transposed).")
    return notes


def _difference(received: Any, expected: Any, atol: float, rtol: float, masks: bool,
                item_names: Sequence[str] | None = None) -> tuple[str, list[str]] | None:
    """None if received matches expected; else (what differs, notes that point at a cause)."""
    if isinstance(expected, tuple):
        if not isinstance(received, tuple) or len(received) != len(expected):
            return f"expected a tuple of {len(expected)} values, got {_describe(received)}", _type_notes(
                received, expected)
        first: tuple[str, list[str]] | None = None
        for index, (got, want) in enumerate(zip(received, expected)):
            found = _difference(got, want, atol, rtol, masks)
            if found is None:
                continue
            label = f"item {index}" + (f" ({item_names[index]})" if item_names and index < len(item_names) else "")
            if first is None:
                first = (f"{label}: {found[0]}", list(found[1]))
            else:  # what is noticed about a later item (e.g. the weights) may explain the first (the output)
                first[1].extend(f"In {label}: {note[0].lower()}{note[1:]}" for note in found[1])
        return first
    if not isinstance(received, Tensor):
        return f"expected {_describe(expected)}, got {_describe(received)}", _type_notes(received, expected)
    if received.shape != expected.shape:
        return (f"expected shape {tuple(expected.shape)}, got {tuple(received.shape)}",
                _shape_notes(received, expected))
    if received.dtype != expected.dtype:
        return f"expected dtype {expected.dtype}, got {received.dtype}", _dtype_notes(received, expected)
    if expected.dtype == torch.bool:
        wrong = (received != expected).nonzero()
        if not len(wrong):
            return None
        index = tuple(wrong[0].tolist())
        detail = (f"{_plural(len(wrong), 'entry differs', 'entries differ')}; the first is at index {index}: "
                  f"expected {bool(expected[index])}, got {bool(received[index])}")
        notes = []
        if masks and expected.dim() >= 2:
            words = [_mask_words(tuple(w.tolist()), bool(received[tuple(w.tolist())]), tuple(expected.shape))
                     for w in wrong[:3]]
            more = f"; and {len(wrong) - 3} more" if len(wrong) > 3 else ""
            detail += "\nIn words: " + "; ".join(words) + more + "."
            if (received == ~expected).all():
                notes.append("Your mask is the exact opposite of the reference: here True means 'may attend' (the "
                             "convention of torch.nn.functional.scaled_dot_product_attention), not 'hidden' (the "
                             "convention of nn.Transformer's masks).")
            elif expected.dim() >= 2 and expected.size(-1) == expected.size(-2) and (received == expected.mT).all():
                notes.append("Your mask is the reference transposed: rows (dim=-2) are queries, columns (dim=-1) "
                             "are keys.")
        elif (received == ~expected).all():
            notes.append("Every entry is the opposite of the reference.")
        return detail, notes
    got, want = received.detach().double(), expected.detach().double()
    got_nan, want_nan = torch.isnan(got), torch.isnan(want)
    if (got_nan & ~want_nan).any():
        first = tuple(torch.nonzero(got_nan & ~want_nan)[0].tolist())
        return (f"your result contains NaN at {int((got_nan & ~want_nan).sum())} places where the reference has "
                f"none (the first at index {first})", [])
    close = torch.isclose(got, want, atol=atol, rtol=rtol, equal_nan=True)
    if close.all():
        return None
    diff = (got - want).abs().masked_fill(got_nan & want_nan, 0.0).nan_to_num(nan=math.inf)
    index = tuple(int(i) for i in torch.unravel_index(diff.flatten().argmax(), diff.shape))
    wrong = int((~close).sum())
    if close.numel() == 1:
        count = "the value differs"
    else:
        count = f"{wrong} of {close.numel()} {'values differs' if wrong == 1 else 'values differ'}"
    detail = (f"{count}, by up to {diff.max().item():.3g}; at index {index} expected "
              f"{expected[index].item():.5g}, got {received[index].item():.5g}")
    return detail, _value_notes(received, expected, atol)


def _matching_hint(learner: Callable[..., Any], received: Any, case: Mapping[str, Any],
                   cases: Sequence[Mapping[str, Any]], hints: Mapping[str, Callable[..., Any]], atol: float,
                   rtol: float, masks: bool) -> str | None:
    """The diagnosis of the first known mistake that reproduces the learner's answers, on this case and on all the
    others (a mistake that only coincides with the answer here is not the cause)."""

    def agrees(mutant: Callable[..., Any], got: Any, inputs: Mapping[str, Any]) -> bool:
        try:
            return _difference(got, mutant(**inputs), atol, rtol, masks) is None
        except Exception:  # the wrong implementation does not apply to these inputs
            return False

    matching = [diagnosis for diagnosis, mutant in hints.items() if agrees(mutant, received, case)]
    if not matching:
        return None
    answers = []
    for other in cases:
        try:
            answers.append(learner(**{key: v.clone() if isinstance(v, Tensor) else v for key, v in other.items()}))
        except Exception:
            answers.append(None)
    for diagnosis in matching:
        if all(agrees(hints[diagnosis], got, other) for got, other in zip(answers, cases)):
            return diagnosis
    return None


def check_against(
    learner: Callable[..., Any],
    reference: Callable[..., Any],
    cases: Iterable[Mapping[str, Any]],
    name: str,
    atol: float = 1e-5,
    rtol: float = 1e-5,
    hints: Mapping[str, Callable[..., Any]] | None = None,
    *,
    notes: Sequence[str] | None = None,
    masks: bool = False,
    item_names: Sequence[str] | None = None,
    diagnose: Diagnosis | None = None,
) -> None:
    """Call learner and reference on every case's keyword arguments; raise ExerciseCheckError at the first difference.

    hints maps a short diagnosis ("scores scaled by sqrt(d_model) instead of sqrt(d_k)") to a known wrong
    implementation; when the learner's answer matches one of them, the diagnosis is added to the message.
    notes gives a few words per case ("a single key"); masks=True describes wrong boolean entries as which query
    position may or may not see which key position (the last two axes); item_names names the items of a tuple
    result; diagnose(case, received, expected) may return a sentence on the likely cause when no hint matches.
    The learner gets copies of the tensors, so changing one in place is caught; NotImplementedError passes through.
    """
    cases = list(cases)
    notes = list(notes) if notes is not None else [""] * len(cases)
    if len(notes) != len(cases):
        raise ValueError(f"notes must hold one entry per case: got {len(notes)} notes for {len(cases)} cases")
    for number, (case, note) in enumerate(zip(cases, notes), start=1):
        expected = reference(**case)
        where = f"{name}, case {number} of {len(cases)} ({_describe_case(case, note)})"
        given = {key: value.clone() if isinstance(value, Tensor) else value for key, value in case.items()}
        try:
            received = learner(**given)
        except NotImplementedError:
            raise
        except Exception as error:  # the learner's code crashed: say where, keep the original error
            advice = ""
            if isinstance(error, TypeError) and "argument" in str(error):
                advice = (f"\nThe check passes the arguments by name ({', '.join(case)}): keep the parameter names "
                          f"of the exercise's signature.")
            raise ExerciseCheckError(
                f"{where}: your function raised {type(error).__name__}: {error}{advice}") from error
        changed = [key for key, value in case.items() if isinstance(value, Tensor)
                   and not (given[key].shape == value.shape and torch.equal(given[key], value))]
        if changed:
            raise ExerciseCheckError(
                f"{where}: your function changed its argument {changed[0]!r} in place; the caller still needs it. "
                f"Work on a new tensor instead (e.g. `x = x.masked_fill(...)` rather than `x.masked_fill_(...)` "
                f"or `x += ...`)."
            )
        found = _difference(received, expected, atol, rtol, masks, item_names)
        if found is None:
            continue
        detail, facts = found
        lines = [f"{where}: {detail}"]
        diagnosis = _matching_hint(learner, received, case, cases, hints or {}, atol, rtol, masks)
        if diagnosis is not None:
            lines.append(f"Likely cause: {diagnosis}.")
        else:
            cause = None
            if diagnose is not None:
                try:
                    cause = diagnose(case, received, expected)
                except Exception:  # a diagnosis is a bonus: never let it hide the difference itself
                    cause = None
            lines += facts + ([cause] if cause else [])
        raise ExerciseCheckError("\n".join(lines)) from None
    print(f"Well done: {name} matches the reference on all {len(cases)} test inputs.")


# ----------------------------------------------------------------------------------------------------------------
# Helpers of the named checks.
# ----------------------------------------------------------------------------------------------------------------


def _name_of(fn: Callable[..., Any]) -> str:
    if not callable(fn):
        raise TypeError(f"fn must be the function you wrote (e.g. my_attention), got {type(fn).__name__}")
    return getattr(fn, "__name__", type(fn).__name__)


def _generator(seed: int | None) -> tuple[torch.Generator, int]:
    """A private random generator (the notebook's global one is left alone) and its seed, fresh unless given."""
    if seed is None:
        seed = int.from_bytes(os.urandom(4), "little") % 2**31
    return torch.Generator().manual_seed(seed), seed


def _randint(low: int, high: int, g: torch.Generator) -> int:
    """A random integer in [low, high]."""
    return int(torch.randint(low, high + 1, (), generator=g))


def _run(check: str, fn: Callable[..., Any], reference: Callable[..., Any], cases: list[tuple[str, dict]],
         seed: int, **options: Any) -> None:
    """Run check_against on (note, case) pairs; a failure says how to repeat the same inputs."""
    name = _name_of(fn)
    try:
        check_against(fn, reference, [case for _, case in cases], name, notes=[note for note, _ in cases], **options)
    except ExerciseCheckError as error:
        raise ExerciseCheckError(
            f"{error}\n(To run these same inputs again: {check}({name}, seed={seed}).)"
        ) from error.__cause__


def _softmax_rows(scores: Tensor, allowed: Tensor | None = None) -> Tensor:
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, dim=-1)


# ----------------------------------------------------------------------------------------------------------------
# Chapter 1: the scaled token embedding.
# ----------------------------------------------------------------------------------------------------------------


def check_token_embedding(fn: Callable[..., Tensor], seed: int | None = None) -> None:
    """Check fn(ids, weight) -> scaled embeddings (..., d_model) against TokenEmbedding on fresh random ids."""
    from transformer_lib.embedding import TokenEmbedding

    g, seed = _generator(seed)

    def reference(ids: Tensor, weight: Tensor) -> Tensor:
        vocab_size, d_model = weight.shape
        with torch.random.fork_rng(devices=[]):  # the layer's random initialisation is overwritten below
            layer = TokenEmbedding(vocab_size, d_model)
        with torch.no_grad():
            layer.lookup.weight.copy_(weight)
            return layer(ids)  # (...) -> (..., d_model)

    cases = []
    sizes = [("a single token", (1,), 5, 4), ("a batch of 2 sentences", (2, 7), 50, 16),
             ("sentences of one token", (3, 1), 11, 8), ("ids with three dimensions", (2, 3, 4), 30, 32),
             ("a random size", (_randint(1, 4, g), _randint(1, 12, g)), _randint(2, 100, g), _randint(1, 64, g))]
    for note, shape, vocab_size, d_model in sizes:
        ids = torch.randint(0, vocab_size, shape, generator=g)
        ids.view(-1)[0] = vocab_size - 1  # the last row of the table is used
        cases.append((note, {"ids": ids, "weight": torch.randn(vocab_size, d_model, generator=g)}))
    cases.append(("ids that use only the first 10 of the table's 40 rows",
                  {"ids": torch.randint(0, 10, (2, 6), generator=g), "weight": torch.randn(40, 9, generator=g)}))

    def lookup(ids: Tensor, weight: Tensor) -> Tensor:
        return weight[ids]  # (...) -> (..., d_model)

    hints = {
        "the embeddings are not scaled: multiply them by sqrt(d_model)": lookup,
        "the embeddings are multiplied by d_model; the paper multiplies them by sqrt(d_model)":
            lambda ids, weight: lookup(ids, weight) * weight.size(1),
        "the embeddings are divided by sqrt(d_model) instead of multiplied by it":
            lambda ids, weight: lookup(ids, weight) / math.sqrt(weight.size(1)),
    }

    def diagnose(case: Mapping[str, Any], received: Any, expected: Any) -> str | None:
        if isinstance(received, Tensor) and received.shape[:-1] == case["ids"].shape and (
            received.size(-1) == case["weight"].size(0) != case["weight"].size(1)
        ):
            return ("Likely cause: the result still has one entry per word of the vocabulary (V); multiply the "
                    "one-hot vectors (..., V) by the table (V, d_model) to get (..., d_model).")
        return None

    _run("check_token_embedding", fn, reference, cases, seed, hints=hints, diagnose=diagnose)


# ----------------------------------------------------------------------------------------------------------------
# Chapter 2: the sinusoidal table.
# ----------------------------------------------------------------------------------------------------------------


def check_sinusoidal_encoding(fn: Callable[[int, int], Tensor], seed: int | None = None) -> None:
    """Check fn(max_len, d_model) -> the paper's (max_len, d_model) table against tl.sinusoidal_encoding."""
    from transformer_lib.positional import sinusoidal_encoding as paper

    g, seed = _generator(seed)
    sizes = [("a single position, d_model = 2", 1, 2), ("a single position", 1, 16), ("d_model = 2", 6, 2),
             ("", 20, 8), ("", 50, 64), ("", 100, 128), ("a random size", _randint(2, 100, g), 2 * _randint(1, 64, g))]
    cases = [(note, {"max_len": n, "d_model": d}) for note, n, d in sizes]

    def no_minus_sign(max_len: int, d_model: int) -> Tensor:
        # The exp form exp(2i * -ln(10000) / d_model), in float32 as learners write it, without its minus sign: the
        # angles grow so large that only the same float32 arithmetic reproduces them.
        div = torch.exp(torch.arange(0, d_model, 2).float() * (math.log(10000.0) / d_model))  # (d_model/2,)
        angle = torch.arange(max_len).float()[:, None] * div  # (max_len, d_model/2)
        return torch.stack([angle.sin(), angle.cos()], dim=-1).reshape(max_len, d_model)

    hints = {
        "the exponent is i/d_model instead of 2i/d_model (i counts pairs of dimensions)":
            lambda max_len, d_model: paper(max_len, 2 * d_model)[:, :d_model],
        "sine and cosine are swapped: dimension 2i holds the sine, dimension 2i+1 the cosine":
            lambda max_len, d_model: paper(max_len, d_model).view(max_len, -1, 2).flip(-1).reshape(max_len, d_model),
        "the cosine uses its own exponent (2i+1)/d_model; both dimensions of pair i share the frequency of 2i":
            lambda max_len, d_model: paper(max_len, 2 * d_model)[:, 2 * torch.arange(d_model)
                                                                 + torch.arange(d_model) % 2],
        "all sines come first and all cosines after them; the paper interleaves them (sin, cos, sin, cos, ...)":
            lambda max_len, d_model: paper(max_len, d_model)[:, torch.arange(d_model).view(-1, 2).T.flatten()],
        "the positions start at 1; the first row is position 0, where every sine is 0 and every cosine 1":
            lambda max_len, d_model: paper(max_len + 1, d_model)[1:],
        "the angle is pos * 10000^(2i/d_model): the exponent lost its minus sign, so the frequencies grow with i "
        "instead of shrinking": no_minus_sign,
    }

    def diagnose(case: Mapping[str, Any], received: Any, expected: Any) -> str | None:
        if not (isinstance(received, Tensor) and received.shape == expected.shape and received.dtype.is_floating_point):
            return None
        wrong = ~torch.isclose(received.double(), expected.double(), atol=1e-4, rtol=1e-4)  # (max_len, d_model)
        if wrong[0].any():
            return ("Row 0 (position 0) must hold sin(0) = 0 in every even dimension and cos(0) = 1 in every odd "
                    "one: does your position count start at 0?")
        column = int(wrong.any(dim=0).nonzero()[0])
        if column >= 2:
            return (f"Dimensions 0 and 1 (i = 0, frequency 1) are right, but dimension {column} (i = {column // 2}) "
                    f"is not: check the frequency 1 / 10000^(2i / d_model) of pair i.")
        return None

    _run("check_sinusoidal_encoding", fn, paper, cases, seed, atol=1e-4, rtol=1e-4, hints=hints, diagnose=diagnose)


# ----------------------------------------------------------------------------------------------------------------
# Chapter 3: scaled dot-product attention.
# ----------------------------------------------------------------------------------------------------------------


def _attention_variant(divisor: Callable[[int], float] = math.sqrt, dim: int = -1,
                       fill: Callable[[Tensor], Tensor] = lambda mask: ~mask, value: float = float("-inf")):
    """Attention with one thing changed; the checks use these to recognise common mistakes."""

    def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
        scores = q @ k.transpose(-2, -1) / divisor(q.size(-1))  # (..., T_q, T_k)
        if mask is not None:
            scores = scores.masked_fill(fill(mask), value)
        weights = torch.softmax(scores, dim=dim)  # (..., T_q, T_k)
        return weights @ v, weights  # (..., T_q, d_v)

    return attention


def _estimate_divisor(q: Tensor, k: Tensor, weights: Tensor, mask: Tensor | None) -> float | None:
    """The c for which weights = softmax(q k^T / c) row by row, or None if no single c explains them."""
    scores = (q.double() @ k.double().transpose(-2, -1)).expand(weights.shape)  # (..., T_q, T_k)
    allowed = torch.ones_like(weights, dtype=torch.bool) if mask is None else mask.expand(weights.shape)
    allowed = allowed & (weights > 1e-12)
    log_w = weights.double().clamp_min(1e-300).log()
    count = allowed.sum(dim=-1, keepdim=True).clamp_min(1)
    s = torch.where(allowed, scores - (scores * allowed).sum(-1, keepdim=True) / count, 0.0)  # centred per row
    w = torch.where(allowed, log_w - (log_w * allowed).sum(-1, keepdim=True) / count, 0.0)
    slope = (s * w).sum() / (s * s).sum()  # least squares: w = s * slope
    if not torch.isfinite(slope) or slope <= 0 or (w - s * slope).abs().max() > 1e-3 * (1 + w.abs().max()):
        return None
    return 1.0 / slope.item()


def _attention_diagnosis(case: Mapping[str, Any], received: Any, expected: Any) -> str | None:
    if not (isinstance(received, tuple) and len(received) == 2 and all(isinstance(r, Tensor) for r in received)):
        return None
    output, weights = received
    if weights.shape != expected[1].shape or not weights.dtype.is_floating_point:
        return None
    mask = case.get("mask")
    if mask is not None:
        leak = (weights.abs() > 1e-6) & ~mask.expand(weights.shape)
        if leak.any():
            index = tuple(leak.nonzero()[0].tolist())
            *_, i, j = index
            return (f"Likely cause: query position {i} gives weight {weights[index].item():.3g} to key position {j}, "
                    f"which the mask forbids (False there). A masked key must get weight exactly 0: fill its score "
                    f"with -inf, `scores.masked_fill(~mask, float('-inf'))`, before the softmax.")
    if torch.allclose(weights, expected[1], atol=1e-5, rtol=1e-5):
        return "Likely cause: your weights are right but the output is not; the output is `weights @ v`."
    divisor = _estimate_divisor(case["q"], case["k"], weights, mask)
    d_k = case["q"].size(-1)
    if divisor is not None and abs(divisor - math.sqrt(d_k)) > 1e-3 * math.sqrt(d_k):
        label = _name_number(divisor)
        return (f"Likely cause: your weights are softmax(q k^T / {divisor:.4g}){f' (= {label})' if label else ''}, "
                f"but the paper divides the scores by sqrt(d_k) = sqrt({d_k}) = {math.sqrt(d_k):.4g}, where "
                f"d_k = q.size(-1) is the size of one query (in multi-head attention d_model / n_heads, not d_model).")
    return None


def check_attention(fn: Callable[..., tuple[Tensor, Tensor]], seed: int | None = None) -> None:
    """Check fn(q, k, v, mask=None) -> (output, weights) against tl.scaled_dot_product_attention on fresh inputs."""
    from transformer_lib.attention import scaled_dot_product_attention

    g, seed = _generator(seed)

    def randn(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=g)

    causal = torch.ones(6, 6, dtype=torch.bool).tril()[None, None]  # (1, 1, 6, 6): key j <= query i
    padding = torch.rand(2, 1, 1, 7, generator=g) > 0.5  # (B, 1, 1, T_k): random padding-like mask
    padding[..., 0] = True  # every query keeps at least one key
    lengths = torch.tensor([5, _randint(1, 5, g)])  # two target sentences, the second padded
    target = (torch.arange(5)[None, :] < lengths[:, None])[:, None, None, :] & torch.ones(5, 5, dtype=torch.bool).tril()
    cases = [
        ("self-attention", {"q": randn(2, 5, 8), "k": randn(2, 5, 8), "v": randn(2, 5, 8)}),
        ("T_q != T_k and d_v != d_k", {"q": randn(2, 3, 16), "k": randn(2, 7, 16), "v": randn(2, 7, 4)}),
        ("a single key", {"q": randn(1, 4, 8), "k": randn(1, 1, 8), "v": randn(1, 1, 8)}),
        ("a single query", {"q": randn(3, 1, 4), "k": randn(3, 6, 4), "v": randn(3, 6, 4)}),
        ("a causal mask over 4 heads",
         {"q": randn(2, 4, 6, 8), "k": randn(2, 4, 6, 8), "v": randn(2, 4, 6, 8), "mask": causal}),
        ("a padding mask, T_q != T_k",
         {"q": randn(2, 4, 3, 8), "k": randn(2, 4, 7, 8), "v": randn(2, 4, 7, 5), "mask": padding}),
        ("a decoder mask: padding and causal (B, 1, T, T)",
         {"q": randn(2, 2, 5, 16), "k": randn(2, 2, 5, 16), "v": randn(2, 2, 5, 16), "mask": target}),
    ]
    hints = {
        "the scores are divided by d_k; the paper divides them by sqrt(d_k)": _attention_variant(lambda d_k: d_k),
        "the scores are not scaled; divide them by sqrt(d_k)": _attention_variant(lambda d_k: 1.0),
        "the scores are multiplied by sqrt(d_k) instead of divided by it":
            _attention_variant(lambda d_k: 1 / math.sqrt(d_k)),
        "the softmax runs over the queries (dim=-2); each query's weights must sum to 1 over the keys (dim=-1)":
            _attention_variant(dim=-2),
        "masked_fill put -inf where the mask is True, but True means 'may take part': fill where ~mask":
            _attention_variant(fill=lambda mask: mask),
        "the masked scores are set to 0, which still gives them weight after the softmax: set them to -inf":
            _attention_variant(value=0.0),
        "the pair is in the wrong order: return (output, weights), not (weights, output)":
            lambda q, k, v, mask=None: _attention_variant()(q, k, v, mask)[::-1],
    }
    _run("check_attention", fn, lambda q, k, v, mask=None: scaled_dot_product_attention(q, k, v, mask), cases, seed,
         hints=hints, item_names=("output", "weights"), diagnose=_attention_diagnosis)


# ----------------------------------------------------------------------------------------------------------------
# Chapter 4: the causal mask and the padding mask.
# ----------------------------------------------------------------------------------------------------------------


def check_causal_mask(fn: Callable[[int], Tensor], seed: int | None = None) -> None:
    """Check fn(size) -> the (1, 1, size, size) bool mask, True where query i may see key j <= i (tl.causal_mask)."""
    from transformer_lib.masks import causal_mask

    g, seed = _generator(seed)
    sizes = [("a single position", 1), ("", 2), ("", 3), ("", 5), ("", 9), ("", 16),
             ("a random size", _randint(4, 32, g))]
    cases = [(note, {"size": n}) for note, n in sizes]

    def square(size: int) -> Tensor:
        return torch.ones(size, size, dtype=torch.bool)

    hints = {
        "you kept the upper triangle (triu): every query sees the future and not the past":
            lambda size: square(size).triu()[None, None],
        "the mask is inverted (True above the diagonal): here True must mean 'may attend', the convention of "
        "torch.nn.functional.scaled_dot_product_attention, not 'hidden' as in nn.Transformer's masks":
            lambda size: square(size).triu(1)[None, None],
        "the diagonal is excluded (tril with diagonal=-1): a position must be allowed to attend to itself":
            lambda size: square(size).tril(-1)[None, None],
        "the singleton batch and head dimensions are missing: return shape (1, 1, size, size), e.g. mask[None, None]":
            lambda size: square(size).tril(),
        "the mask is not boolean: build it with dtype=torch.bool":
            lambda size: torch.ones(size, size).tril()[None, None],
    }
    _run("check_causal_mask", fn, causal_mask, cases, seed, hints=hints, masks=True)


def _padded_ids(lengths: Sequence[int], pad_id: int, g: torch.Generator, zero_is_a_word: bool = False) -> Tensor:
    """Random token ids (never pad_id) for sentences of the given lengths, padded into (B, max(lengths))."""
    ids = torch.full((len(lengths), max(max(lengths), 1)), pad_id)  # (B, S)
    for row, length in enumerate(lengths):
        words = torch.randint(0, 50, (length,), generator=g)
        words[words == pad_id] = pad_id + 5  # a real word is never the padding id
        ids[row, :length] = words
    if zero_is_a_word and pad_id != 0:
        row = next(row for row, length in enumerate(lengths) if length > 0)
        ids[row, 0] = 0  # token id 0 is an ordinary word here
    return ids


def check_padding_mask(fn: Callable[[Tensor, int], Tensor], seed: int | None = None) -> None:
    """Check fn(ids, pad_id) -> the (B, 1, 1, S) bool mask, True at real tokens, against tl.padding_mask."""
    from transformer_lib.masks import padding_mask

    g, seed = _generator(seed)
    random_pad = _randint(0, 3, g)
    batches = [
        ("sentences of different lengths", [5, 3, 1], 0),
        ("a single sentence of one token", [1], 0),
        ("no padding at all", [4, 4], 0),
        ("padding id 1; token id 0 is a word here", [7, 2, 6, 1], 1),
        ("a sentence made only of padding", [3, 0, 5], 0),
        (f"a random batch, padding id {random_pad}",
         [_randint(1, 10, g)] + [_randint(0, 10, g) for _ in range(_randint(0, 4, g))], random_pad),
    ]
    cases = [(note, {"ids": _padded_ids(lengths, pad, g, zero_is_a_word=True), "pad_id": pad})
             for note, lengths, pad in batches]
    hints = {
        "the mask is inverted: True must mark the real tokens (ids != pad_id), not the padding":
            lambda ids, pad_id: (ids == pad_id)[:, None, None, :],
        "the singleton head and query dimensions are missing: (B, S) must become (B, 1, 1, S)":
            lambda ids, pad_id: ids != pad_id,
        "the singleton dimensions are in the wrong place: the keys must be the last axis, (B, 1, 1, S)":
            lambda ids, pad_id: (ids != pad_id)[:, None, :, None],
        "only one singleton dimension was added: (B, S) must become (B, 1, 1, S), one for the heads and one for "
        "the queries": lambda ids, pad_id: (ids != pad_id)[:, None, :],
        "the padding id is hard-coded as 0: compare with the pad_id argument":
            lambda ids, pad_id: (ids != 0)[:, None, None, :],
    }

    def diagnose(case: Mapping[str, Any], received: Any, expected: Any) -> str | None:
        if not (isinstance(received, Tensor) and received.shape == expected.shape and received.dtype == torch.bool):
            return None
        b, _, _, j = (received != expected).nonzero()[0].tolist()
        token, pad_id = int(case["ids"][b, j]), case["pad_id"]
        if token == pad_id:
            return (f"ids[{b}, {j}] is the padding id {pad_id}: no query may attend to it, so the mask must be False "
                    f"there.")
        return f"ids[{b}, {j}] = {token} is a real token (the padding id is {pad_id}), so the mask must be True there."

    _run("check_padding_mask", fn, padding_mask, cases, seed, hints=hints, masks=True, diagnose=diagnose)


# ----------------------------------------------------------------------------------------------------------------
# Chapter 5: splitting the heads, and attention computed block by block.
# ----------------------------------------------------------------------------------------------------------------


def check_split_heads(fn: Callable[[Tensor, int], Tensor], seed: int | None = None) -> None:
    """Check fn(x, n_heads): (B, T, d_model) -> (B, n_heads, T, d_k) against MultiHeadAttention.split_heads."""
    from transformer_lib.multihead import MultiHeadAttention

    g, seed = _generator(seed)

    def reference(x: Tensor, n_heads: int) -> Tensor:
        with torch.random.fork_rng(devices=[]):  # the layer's weights are not used
            layer = MultiHeadAttention(x.size(-1), n_heads)
        return layer.split_heads(x)  # (B, T, d_model) -> (B, h, T, d_k)

    heads = _randint(1, 4, g)
    sizes = [("", (2, 5, 16), 4), ("a single position", (3, 1, 8), 2), ("a single head", (2, 7, 12), 1),
             ("", (4, 6, 24), 3), ("", (1, 9, 32), 8), ("as many positions as heads", (2, 4, 16), 4),
             ("d_k = 1", (2, 3, 4), 4),
             ("a random size", (_randint(1, 4, g), _randint(1, 9, g), heads * _randint(1, 8, g)), heads)]
    cases = [(note, {"x": torch.randn(*shape, generator=g), "n_heads": h}) for note, shape, h in sizes]
    hints = {
        "x.view(B, n_heads, T, d_k) cuts the heads across positions; view as (B, T, n_heads, d_k), then "
        "transpose(1, 2)": lambda x, n_heads: x.reshape(x.size(0), n_heads, x.size(1), x.size(2) // n_heads),
        "head i got every n_heads-th feature; it should get the d_k consecutive features i*d_k .. (i+1)*d_k - 1":
            lambda x, n_heads: x.view(*x.shape[:2], x.size(2) // n_heads, n_heads).permute(0, 3, 1, 2),
        "the heads are not moved in front of the positions: you return (B, T, n_heads, d_k); add .transpose(1, 2)":
            lambda x, n_heads: x.view(*x.shape[:2], n_heads, x.size(2) // n_heads),
    }
    _run("check_split_heads", fn, reference, cases, seed, hints=hints)


def _online_attention(q: Tensor, k: Tensor, v: Tensor, block_size: int, rescale: bool = True, divide: bool = True,
                      accumulate: bool = True, scale: bool = True, last_block: bool = True) -> Tensor:
    """Block-by-block attention with optional mistakes, to recognise them in a learner's answer."""
    m = q.new_full((*q.shape[:-1], 1), float("-inf"))  # (B, h, T_q, 1)
    total, out = q.new_zeros((*q.shape[:-1], 1)), q.new_zeros((*q.shape[:-1], v.size(-1)))
    stop = k.size(-2) if last_block else k.size(-2) - block_size + 1
    for start in range(0, stop, block_size):
        s = q @ k[..., start : start + block_size, :].transpose(-2, -1)  # (B, h, T_q, blk)
        s = s / math.sqrt(q.size(-1)) if scale else s
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        p = torch.exp(s - m_new)  # (B, h, T_q, blk)
        factor = torch.exp(m - m_new) if rescale else torch.ones_like(m)
        keep = 1.0 if accumulate else 0.0
        total = keep * total * factor + p.sum(-1, keepdim=True)
        out = keep * out * factor + p @ v[..., start : start + block_size, :]  # (B, h, T_q, d_v)
        m = m_new
    return out / total if divide else out


def check_blockwise_attention(fn: Callable[..., Tensor], seed: int | None = None) -> None:
    """Check fn(q, k, v, block_size) -> softmax(q k^T / sqrt(d_k)) v against tl.scaled_dot_product_attention."""
    from transformer_lib.attention import scaled_dot_product_attention

    g, seed = _generator(seed)

    def qkv(batch: int, heads: int, t_q: int, t_k: int, d_k: int, spread: float = 1.0) -> dict:
        return {"q": spread * torch.randn(batch, heads, t_q, d_k, generator=g),
                "k": spread * torch.randn(batch, heads, t_k, d_k, generator=g),
                "v": torch.randn(batch, heads, t_k, d_k, generator=g)}

    t_k = _randint(1, 20, g)
    cases = [
        ("the last block is shorter (7 keys, blocks of 3)", {**qkv(2, 4, 5, 7, 8), "block_size": 3}),
        ("blocks of one key", {**qkv(1, 2, 6, 6, 4), "block_size": 1}),
        ("one block larger than all the keys", {**qkv(3, 1, 4, 5, 16), "block_size": 8}),
        ("a single query", {**qkv(2, 8, 1, 9, 8), "block_size": 4}),
        ("a single key", {**qkv(2, 2, 3, 1, 8), "block_size": 2}),
        ("large scores: the running maximum changes from block to block",
         {**qkv(1, 4, 10, 12, 8, 4.0), "block_size": 5}),
        ("a random size", {**qkv(_randint(1, 3, g), _randint(1, 4, g), _randint(1, 8, g), t_k, 8),
                           "block_size": _randint(1, t_k, g)}),
    ]
    hints = {
        "the running sum and output are not rescaled by exp(m - m_new) when the maximum grows":
            lambda q, k, v, block_size: _online_attention(q, k, v, block_size, rescale=False),
        "the output is not divided by the running sum at the end: return o / l":
            lambda q, k, v, block_size: _online_attention(q, k, v, block_size, divide=False),
        "the running sum and output are overwritten by each block instead of added up":
            lambda q, k, v, block_size: _online_attention(q, k, v, block_size, accumulate=False),
        "the scores are not scaled; divide them by sqrt(d_k)":
            lambda q, k, v, block_size: _online_attention(q, k, v, block_size, scale=False),
        "the last, shorter block is left out: loop `for start in range(0, T_k, block_size)` and slice "
        "k[..., start:start + block_size, :]":
            lambda q, k, v, block_size: _online_attention(q, k, v, block_size, last_block=False),
    }
    _run("check_blockwise_attention", fn,
         lambda q, k, v, block_size: scaled_dot_product_attention(q, k, v)[0], cases, seed, atol=2e-5, rtol=1e-4,
         hints=hints)


# ----------------------------------------------------------------------------------------------------------------
# Chapter 6: the sublayer connection.
# ----------------------------------------------------------------------------------------------------------------


def _same_dropout(fn: Callable[..., Any]) -> Callable[..., Any]:
    """fn with the random generator reset before the call, so that every function draws the same dropout mask."""

    def seeded(**case: Any) -> Any:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(1234)
            return fn(**case)

    seeded.__name__ = _name_of(fn)
    return seeded


def check_sublayer_connection(fn: Callable[..., Tensor], seed: int | None = None) -> None:
    """Check fn(x, sublayer, norm, dropout, norm_first) against SublayerConnection, post-norm and pre-norm."""
    from transformer_lib.model import SublayerConnection

    g, seed = _generator(seed)

    def reference(x: Tensor, sublayer: Callable[[Tensor], Tensor], norm: nn.LayerNorm, dropout: nn.Dropout,
                  norm_first: bool) -> Tensor:
        block = SublayerConnection(x.size(-1), norm_first=norm_first)
        block.norm, block.dropout = norm, dropout
        return block(x, sublayer)

    def pieces(width: int, p: float) -> dict:
        with torch.random.fork_rng(devices=[]):  # the default initialisation is overwritten below
            sublayer, norm = nn.Linear(width, width), nn.LayerNorm(width)
        with torch.no_grad():  # random gain and bias, so that a misplaced LayerNorm shows
            sublayer.weight.copy_(torch.randn(width, width, generator=g) / math.sqrt(width))
            sublayer.bias.copy_(torch.randn(width, generator=g))
            norm.weight.copy_(1.0 + 0.5 * torch.randn(width, generator=g))
            norm.bias.copy_(0.5 * torch.randn(width, generator=g))
        return {"sublayer": sublayer, "norm": norm, "dropout": nn.Dropout(p)}

    cases = []
    for note, (batch, length, width), p in [("", (2, 5, 16), 0.0), ("a single position", (1, 1, 8), 0.0),
                                            ("", (3, 7, 32), 0.0),
                                            ("dropout 0.5 in training mode, the same dropout mask for you and "
                                             "the reference", (2, 6, 16), 0.5)]:
        for norm_first in (False, True):
            x = 2 * torch.randn(batch, length, width, generator=g) + 1  # (B, T, d_model), far from normalised
            cases.append((note, {"x": x, **pieces(width, p), "norm_first": norm_first}))

    def swapped(norm_first: bool, **rest: Any) -> Tensor:
        return reference(norm_first=not norm_first, **rest)

    hints = {
        "post-norm and pre-norm are swapped (norm_first=True normalises the sublayer's input, not the sum)": swapped,
        "the residual connection is missing (add x to the sublayer's output)":
            lambda x, sublayer, norm, dropout, norm_first: (
                dropout(sublayer(norm(x))) if norm_first else norm(dropout(sublayer(x)))),
        "the pre-norm residual adds LayerNorm(x) instead of x":
            lambda x, sublayer, norm, dropout, norm_first: (
                norm(x) + dropout(sublayer(norm(x))) if norm_first else norm(x + dropout(sublayer(x)))),
        "pre-norm also normalises the sum; with norm_first=True return x + Dropout(Sublayer(LayerNorm(x))) as it is":
            lambda x, sublayer, norm, dropout, norm_first: (
                norm(x + dropout(sublayer(norm(x)))) if norm_first else norm(x + dropout(sublayer(x)))),
        "dropout is applied after the residual addition; apply it to the sublayer's output, before adding x":
            lambda x, sublayer, norm, dropout, norm_first: (
                dropout(x + sublayer(norm(x))) if norm_first else norm(dropout(x + sublayer(x)))),
        "dropout is left out: apply it to the sublayer's output":
            lambda x, sublayer, norm, dropout, norm_first: (
                x + sublayer(norm(x)) if norm_first else norm(x + sublayer(x))),
    }
    _run("check_sublayer_connection", _same_dropout(fn), _same_dropout(reference), cases, seed,
         hints={diagnosis: _same_dropout(mutant) for diagnosis, mutant in hints.items()})


# ----------------------------------------------------------------------------------------------------------------
# Chapter 7: the label-smoothed loss.
# ----------------------------------------------------------------------------------------------------------------


def _smoothed_per_token(logits: Tensor, labels: Tensor, on_label: float, on_others: float, dim: int = -1) -> Tensor:
    """-sum_k q_k log p_k at every position, for q = on_label at the label and on_others elsewhere; (B, T)."""
    log_p = torch.log_softmax(logits, dim=dim)  # (B, T, V), normalised over the classes unless dim says otherwise
    q = torch.full_like(log_p, on_others).scatter_(-1, labels.unsqueeze(-1), on_label)  # (B, T, V)
    return -(q * log_p).sum(dim=-1)  # (B, T)


def check_label_smoothed_loss(fn: Callable[..., Tensor], seed: int | None = None) -> None:
    """Check fn(logits, labels, pad_id, eps) -> mean label-smoothed loss over real tokens (translation_loss)."""
    from transformer_lib.training import translation_loss

    g, seed = _generator(seed)

    def batch(size: tuple[int, int, int], eps: float, pad_id: int = 0, empty_row: int | None = None) -> dict:
        b, t, vocab = size
        labels = torch.randint(0, vocab, (b, t), generator=g)  # (B, T)
        labels[labels == pad_id] = (pad_id + 1) % vocab
        labels[torch.rand(b, t, generator=g) < 0.3] = pad_id  # random padding
        labels[0, 0] = (pad_id + 1) % vocab  # at least one real token
        if empty_row is not None:
            labels[empty_row] = pad_id  # a sentence made only of padding
        return {"logits": 3 * torch.randn(b, t, vocab, generator=g), "labels": labels, "pad_id": pad_id, "eps": eps}

    lonely = {"logits": 3 * torch.randn(3, 4, 8, generator=g), "labels": torch.zeros(3, 4, dtype=torch.long),
              "pad_id": 0, "eps": 0.1}
    lonely["labels"][1, 2] = 5  # all padding but one token
    cases = [
        ("", batch((2, 5, 7), 0.1)),
        ("no smoothing (eps = 0)", batch((3, 6, 11), 0.0)),
        ("a single position", batch((1, 1, 4), 0.3)),
        ("a sentence made only of padding", batch((4, 9, 30), 0.1, empty_row=2)),
        ("every position but one is padding", lonely),
        ("padding id 2; label 0 is a real class here", batch((2, 6, 9), 0.2, pad_id=2)),
        ("a random size", batch((_randint(1, 4, g), _randint(1, 8, g), _randint(2, 40, g)),
                                round(0.3 * torch.rand((), generator=g).item(), 3))),
    ]

    def padded_too(logits: Tensor, labels: Tensor, pad_id: int, eps: float) -> Tensor:
        vocab = logits.size(-1)
        return _smoothed_per_token(logits, labels, 1 - eps + eps / vocab, eps / vocab).mean()

    def per_token(logits: Tensor, labels: Tensor, eps: float, dim: int = -1) -> Tensor:
        vocab = logits.size(-1)
        return _smoothed_per_token(logits, labels, 1 - eps + eps / vocab, eps / vocab, dim)  # (B, T)

    def sentence_means(logits: Tensor, labels: Tensor, pad_id: int, eps: float) -> Tensor:
        real = (labels != pad_id).float()  # (B, T)
        keep = real.sum(dim=1) > 0  # sentences with at least one real token
        means = (per_token(logits, labels, eps) * real).sum(dim=1)[keep] / real.sum(dim=1)[keep]  # (B',)
        return means.mean()

    hints = {
        "the mean includes the padded positions; average over the positions where labels != pad_id only": padded_too,
        "eps is spread over the V - 1 wrong classes (fairseq's convention), but PyTorch spreads it over all V "
        "classes, so that the label gets 1 - eps + eps / V":
            lambda logits, labels, pad_id, eps: _smoothed_per_token(
                logits, labels, 1 - eps, eps / (logits.size(-1) - 1))[labels != pad_id].mean(),
        "the loss has no label smoothing; mix the one-hot target with eps / V":
            lambda logits, labels, pad_id, eps: translation_loss(logits, labels, pad_id, 0.0),
        "eps is added to every class without dividing by V: q = (1 - eps) one-hot + eps / V sums to 1":
            lambda logits, labels, pad_id, eps: _smoothed_per_token(
                logits, labels, 1 - eps + eps, eps)[labels != pad_id].mean(),
        "the losses of the real positions are summed; take their mean":
            lambda logits, labels, pad_id, eps: per_token(logits, labels, eps)[labels != pad_id].sum(),
        "the log-softmax runs over the positions (dim=1); the probabilities must sum to 1 over the classes (dim=-1)":
            lambda logits, labels, pad_id, eps: per_token(logits, labels, eps, dim=1)[labels != pad_id].mean(),
        "each sentence is averaged first, then the sentences; average over all real tokens at once, so that every "
        "token counts the same": sentence_means,
    }
    _run("check_label_smoothed_loss", fn,
         lambda logits, labels, pad_id, eps: translation_loss(logits, labels, pad_id, eps), cases, seed, hints=hints)


# ----------------------------------------------------------------------------------------------------------------
# Chapter 8: the best beam under the GNMT length penalty.
# ----------------------------------------------------------------------------------------------------------------


def check_best_beam(fn: Callable[[Tensor, Tensor, float], Tensor], seed: int | None = None) -> None:
    """Check fn(scores, lengths, alpha) -> (B,) index of the best hypothesis against beam_search's final choice."""
    from transformer_lib.translation import length_penalty

    g, seed = _generator(seed)

    def reference(scores: Tensor, lengths: Tensor, alpha: float) -> Tensor:
        return (scores / length_penalty(lengths, alpha)).argmax(dim=1)  # (B, k) -> (B,)

    def hypotheses(batch: int, k: int, alpha: float) -> dict:
        # Redraw until the best penalised score of every sentence is clearly ahead, so that rounding cannot matter.
        while True:
            scores, lengths = -30 * torch.rand(batch, k, generator=g), torch.randint(1, 41, (batch, k), generator=g)
            best = (scores / length_penalty(lengths, alpha)).topk(min(k, 2), dim=1).values  # (B, 2)
            if k == 1 or (best[:, 0] - best[:, 1]).min() > 1e-3:
                return {"scores": scores, "lengths": lengths, "alpha": alpha}

    cases = []
    for batch, k in [(1, 1), (3, 4), (8, 5), (4, 4)]:
        for alpha in (0.0, 0.6, 1.0):
            note = "a single hypothesis" if k == 1 else "as many sentences as hypotheses" if batch == k else ""
            cases.append((note, hypotheses(batch, k, alpha)))
    hints = {
        "the scores are divided by the length itself, not by the penalty ((5 + length) / 6) ** alpha":
            lambda scores, lengths, alpha: (scores / lengths.float()).argmax(dim=1),
        "the scores are multiplied by the penalty instead of divided by it":
            lambda scores, lengths, alpha: (scores * length_penalty(lengths, alpha)).argmax(dim=1),
        "argmin instead of argmax (log-probabilities are negative: the best score is the largest)":
            lambda scores, lengths, alpha: (scores / length_penalty(lengths, alpha)).argmin(dim=1),
        "the length penalty is left out": lambda scores, lengths, alpha: scores.argmax(dim=1),
        "the exponent alpha is missing: the penalty is ((5 + length) / 6) ** alpha":
            lambda scores, lengths, alpha: (scores / ((5.0 + lengths.float()) / 6.0)).argmax(dim=1),
        "the argmax runs over the sentences (dim=0); take it over each sentence's hypotheses (dim=1)":
            lambda scores, lengths, alpha: (scores / length_penalty(lengths, alpha)).argmax(dim=0),
    }

    def diagnose(case: Mapping[str, Any], received: Any, expected: Any) -> str | None:
        if not (isinstance(received, Tensor) and received.shape == expected.shape):
            return None
        row = int((received != expected).nonzero()[0, 0])
        penalised = case["scores"][row] / length_penalty(case["lengths"][row], case["alpha"])  # (k,)
        want, got = int(expected[row]), int(received[row])
        if not 0 <= got < penalised.numel():
            return (f"For sentence {row} you returned {got}, which is not a hypothesis index "
                    f"(0 to {penalised.numel() - 1}).")

        def describe(i: int) -> str:
            return (f"hypothesis {i} (log-probability {case['scores'][row, i].item():.3g}, length "
                    f"{int(case['lengths'][row, i])}, penalised score {penalised[i].item():.4g})")

        return f"For sentence {row} you picked {describe(got)}; the best is {describe(want)}."

    _run("check_best_beam", fn, reference, cases, seed, hints=hints, diagnose=diagnose)


# ----------------------------------------------------------------------------------------------------------------
# Chapter 9: the entropy of attention heads.
# ----------------------------------------------------------------------------------------------------------------


def _head_entropy(weights: Tensor) -> Tensor:
    """The mean entropy in nats of the rows of each head, with 0 log 0 = 0; (B, h, T_q, T_k) -> (h,)."""
    row_entropy = -torch.special.xlogy(weights, weights).sum(dim=-1)  # (B, h, T_q)
    return row_entropy.mean(dim=(0, 2))  # (h,)


def check_attention_entropy(fn: Callable[[Tensor], Tensor], seed: int | None = None) -> None:
    """Check fn(weights) -> (h,) mean row entropy in nats of each head, on fresh random attention weights."""
    g, seed = _generator(seed)

    def randn(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=g)

    random_mask = torch.rand(2, 4, 6, 6, generator=g) < 0.5  # (B, h, T_q, T_k)
    random_mask[..., 0] = True  # every row keeps at least one key
    causal = torch.ones(7, 7, dtype=torch.bool).tril()  # (T, T)
    one_hot = nn.functional.one_hot(torch.randint(0, 5, (2, 2, 3), generator=g), 5).float()  # (B, h, T_q, T_k)
    cases = [
        ("", {"weights": torch.softmax(randn(2, 4, 5, 5), dim=-1)}),
        ("T_q != T_k, sharper rows", {"weights": torch.softmax(3 * randn(3, 8, 4, 9), dim=-1)}),
        ("random masks: weights of exactly 0", {"weights": _softmax_rows(randn(2, 4, 6, 6), random_mask)}),
        ("a causal map: the first row is one-hot", {"weights": _softmax_rows(randn(1, 2, 7, 7), causal)}),
        ("a single key: entropy 0", {"weights": torch.ones(2, 3, 4, 1)}),
        ("one-hot rows: entropy 0", {"weights": one_hot}),
        ("a single head and a single query", {"weights": torch.softmax(randn(1, 1, 1, 6), dim=-1)}),
    ]
    hints = {
        "log(0) = -inf, and 0 * log(0) gives NaN where a weight is exactly 0; use torch.special.xlogy(a, a) for "
        "a log a": lambda weights: -(weights * weights.log()).sum(dim=-1).mean(dim=(0, 2)),
        "the entropy is in bits (log base 2); use the natural logarithm, for nats":
            lambda weights: _head_entropy(weights) / math.log(2),
        "the entropies of the queries are summed; average them over the queries (and the batch)":
            lambda weights: (-torch.special.xlogy(weights, weights).sum(dim=-1)).sum(dim=2).mean(dim=0),
        "the terms a log a are averaged over the keys; sum them over the keys, then average over the queries":
            lambda weights: -torch.special.xlogy(weights, weights).mean(dim=-1).mean(dim=(0, 2)),
        "the minus sign is missing: a log a is never positive, so the entropy -sum a log a is never negative":
            lambda weights: -_head_entropy(weights),
        "the entropies are averaged over the heads too; return one value per head, shape (h,)":
            lambda weights: _head_entropy(weights).mean(),
        "the sum runs over the queries (dim=-2) instead of the keys (dim=-1)":
            lambda weights: -torch.special.xlogy(weights, weights).sum(dim=-2).mean(dim=(0, 2)),
    }
    _run("check_attention_entropy", fn, _head_entropy, cases, seed, hints=hints)


# The named check of every coding exercise of the book, by the exercise's label.
EXERCISE_CHECKS: dict[str, Callable[..., None]] = {
    "ex-text-one-hot": check_token_embedding,
    "ex-positional-table": check_sinusoidal_encoding,
    "ex-attention-write": check_attention,
    "ex-masking-causal": check_causal_mask,
    "ex-masking-padding": check_padding_mask,
    "ex-multihead-split": check_split_heads,
    "ex-multihead-online-softmax": check_blockwise_attention,
    "ex-encoder-decoder-sublayer": check_sublayer_connection,
    "ex-training-toy-smoothing": check_label_smoothed_loss,
    "ex-translation-best-beam": check_best_beam,
    "ex-heatmaps-entropy": check_attention_entropy,
}
