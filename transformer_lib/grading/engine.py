"""The engine of the exercise graders, and what every named check shares: the error they raise, the comparison of
a learner's function with a reference, the messages that describe the first difference in plain words, the private
random generator (fresh unless a seed is given) and the way a named check runs the engine.

The engine grade_against also works on its own, for an exercise of your own:

    grade_against(my_fn, reference_fn, cases, name="my_fn")
"""

import math
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import CodeType, FrameType
from typing import Any

import torch
from torch import Tensor, nn

Diagnosis = Callable[[Mapping[str, Any], Any, Any], "str | None"]


class ExerciseGradeError(AssertionError):
    """Raised by a check when the learner's answer differs from the reference."""


def not_attempted(name: str, check: str | None = None) -> None:
    """Say in one line that the exercise's stub is still untouched (its function raised NotImplementedError).

    An unsolved exercise is not an error: *Run all* goes on past it
    (CONTRIBUTING.md, 'Exercises and the student edition'). Every other failure of the learner's function still raises ExerciseGradeError. Where an unanswered
    exercise must count as failed (an autograder such as nbgrader), set the environment variable
    TRANSFORMER_LIB_STRICT_GRADING=1: the same words are then raised as an ExerciseGradeError.
    """
    by = f" ({check} checks it)" if check else ""
    message = f"Exercise not attempted yet: write {name} above, then run this cell again{by}."
    if os.environ.get("TRANSFORMER_LIB_STRICT_GRADING", "").strip().lower() in {"1", "true", "yes"}:
        raise ExerciseGradeError(message)
    print(message)


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
    if isinstance(expected, list):  # e.g. a list of tokens: compared item by item, exactly
        if received == expected and isinstance(received, list):
            return None
        if not isinstance(received, list):
            return f"expected list {expected!r}, got {_describe(received)}", _type_notes(received, expected)
        first = next((i for i, (a, b) in enumerate(zip(received, expected)) if a != b), min(len(received), len(expected)))
        return f"expected {expected!r}, got {received!r} (they first differ at item {first})", []
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


def grade_against(
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
    explain_crash: Callable[[Mapping[str, Any], Exception], str | None] | None = None,
    check: str | None = None,
) -> None:
    """Call learner and reference on every case's keyword arguments; raise ExerciseGradeError at the first difference.

    hints maps a short diagnosis ("scores scaled by sqrt(d_model) instead of sqrt(d_k)") to a known wrong
    implementation; when the learner's answer matches one of them, the diagnosis is added to the message.
    notes gives a few words per case ("a single key"); masks=True describes wrong boolean entries as which query
    position may or may not see which key position (the last two axes); item_names names the items of a tuple
    result; diagnose(case, received, expected) may return a sentence on the likely cause when no hint matches, and
    explain_crash(case, error) one for an error the learner's function raised.
    The learner gets copies of the tensors, so changing one in place is caught. A learner that raises
    NotImplementedError is the exercise's untouched stub: one line says so (naming check, the grader, when given)
    and the call returns without raising, so that a notebook's *Run all* goes on; any other error still raises.
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
        except NotImplementedError:  # the stub as the book gives it: not a wrong answer, not yet an answer
            not_attempted(name, check)
            return
        except Exception as error:  # the learner's code crashed: say where, keep the original error
            advice = ""
            if isinstance(error, TypeError) and "argument" in str(error):
                advice = (f"\nThe check passes the arguments by name ({', '.join(case)}): keep the parameter names "
                          f"of the exercise's signature.")
            elif explain_crash is not None:
                try:
                    cause = explain_crash(case, error)
                except Exception:  # a diagnosis is a bonus: never let it hide the error itself
                    cause = None
                advice = f"\nLikely cause: {cause}" if cause else ""
            raise ExerciseGradeError(
                f"{where}: your function raised {type(error).__name__}: {error}{advice}") from error
        changed = [key for key, value in case.items() if isinstance(value, Tensor)
                   and not (given[key].shape == value.shape and torch.equal(given[key], value))]
        if changed:
            raise ExerciseGradeError(
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
        raise ExerciseGradeError("\n".join(lines)) from None
    print(f"Well done: {name} matches the reference on all {len(cases)} test inputs.")


# ----------------------------------------------------------------------------------------------------------------
# Helpers of the graders.
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
    """Run grade_against on (note, case) pairs; a failure says how to repeat the same inputs."""
    name = _name_of(fn)
    try:
        grade_against(fn, reference, [case for _, case in cases], name, notes=[note for note, _ in cases],
                      check=check, **options)
    except ExerciseGradeError as error:
        raise ExerciseGradeError(
            f"{error}\n(To run these same inputs again: {check}({name}, seed={seed}).)"
        ) from error.__cause__


class _Calls:
    """Record, while active, which of the watched functions run. A Python function is recognised by its code (its
    name, names and constants, not where it was compiled: _fingerprint), so that every way of reaching it counts: an
    attribute such as tl.average_checkpoints, a name imported earlier, a method or a library function that calls
    it, a subclass's super().__init__, and the same function defined again by a chapter's `#| export` cell in the
    notebook. A builtin (a function written in C) is recognised by identity. Each record is (the watched function's
    label, the class of its `self` argument, or None)."""

    def __init__(self, watched: Mapping[Any, str]) -> None:
        self._codes = {_fingerprint(f.__code__): label for f, label in watched.items() if hasattr(f, "__code__")}
        self._names = {f.__code__.co_name for f in watched if hasattr(f, "__code__")}
        self._builtins = [(f, label) for f, label in watched.items() if not hasattr(f, "__code__")]
        self.seen: list[tuple[str, type | None]] = []
        self._previous: Any = None

    def _profile(self, frame: FrameType, event: str, arg: Any) -> None:
        if event == "call" and frame.f_code.co_name in self._names:  # the name first: most calls stop here
            label = self._codes.get(_fingerprint(frame.f_code))
            if label is not None:
                owner = frame.f_locals.get("self")
                self.seen.append((label, None if owner is None else type(owner)))
        elif event == "c_call":
            self.seen.extend((label, None) for f, label in self._builtins if arg is f)

    def __enter__(self) -> "_Calls":
        self._previous = sys.getprofile()  # put back on exit (a profiler of the notebook's own, if any)
        sys.setprofile(self._profile)
        return self

    def __exit__(self, *exc: object) -> None:
        sys.setprofile(self._previous)


def _fingerprint(code: CodeType) -> tuple:
    """What a function's code is, wherever it was compiled: its name, its parameters and local names, the names it
    uses and its constants (its docstring and messages among them). Not its bytecode, which changes with the code
    around it (Python 3.11 compiles torch.stack(...) in a module that imports torch otherwise than in a notebook
    cell that does not), nor nested code such as a comprehension's, which carries its line numbers."""
    constants = tuple(c for c in code.co_consts if not isinstance(c, CodeType))
    return code.co_name, code.co_argcount, code.co_varnames, code.co_names, constants


def _refuse_calls(fn: Callable[..., Any], cases: Sequence[Mapping[str, Any] | tuple], watched: Mapping[Any, str],
                  refusal: Callable[[str, type | None], str], check: str, seed: int) -> None:
    """Run fn on the arguments of every case (copies; a dict passes them by name, a tuple by position, as the value
    checks do) while watching for calls of the functions that the exercise's own rule forbids (watched: function ->
    label); raise ExerciseGradeError with refusal(label, class of its self), one line that names what is wrong, for
    the first one that ran. A crash or the untouched stub is left to the value checks that follow; the notebook's
    random numbers are left alone."""
    calls = _Calls(watched)
    with torch.random.fork_rng(devices=[]), calls:
        for case in cases:
            args, kwargs = (case, {}) if isinstance(case, tuple) else ((), case)
            try:
                fn(*_copied(args), **_copied(kwargs))
            except Exception:  # NotImplementedError (the stub) or a crash: the value checks say so, with the input
                break
    if calls.seen:
        name = _name_of(fn)
        raise ExerciseGradeError(f"{name}, the rule check: {refusal(*calls.seen[0])}\n"
                                 f"(To run these same inputs again: {check}({name}, seed={seed}).)")


def _copied(value: Any) -> Any:
    """A copy of a case's argument that the learner may change without touching the case: tensors cloned, inside
    dicts, lists and tuples too."""
    if isinstance(value, Tensor):
        return value.clone()
    if isinstance(value, Mapping):
        return {key: _copied(item) for key, item in value.items()}
    if type(value) in (list, tuple):
        return type(value)(_copied(item) for item in value)
    return value
