"""Hand-written checks for the book's coding exercises: run a learner's function on fresh inputs, compare it
with the reference piece from transformer_lib and say, in plain words, what differs.

    from transformer_lib.checks import check_against
    check_against(my_fn, reference_fn, cases, name="causal_mask")
"""

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import Tensor


class ExerciseCheckError(AssertionError):
    """Raised by a check when the learner's answer differs from the reference."""


def _describe(value: Any) -> str:
    if isinstance(value, Tensor):
        return f"tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
    return f"{type(value).__name__} {value!r}"


def _describe_case(case: Mapping[str, Any]) -> str:
    parts = []
    for key, value in case.items():
        parts.append(f"{key}: shape {tuple(value.shape)}" if isinstance(value, Tensor) else f"{key}={value!r}")
    return ", ".join(parts)


def _compare(received: Any, expected: Any, where: str, atol: float, rtol: float) -> None:
    if isinstance(expected, tuple):
        if not isinstance(received, tuple) or len(received) != len(expected):
            raise ExerciseCheckError(f"{where}: expected a tuple of {len(expected)} values, got {_describe(received)}")
        for index, (got, want) in enumerate(zip(received, expected)):
            _compare(got, want, f"{where}, item {index}", atol, rtol)
        return
    if not isinstance(received, Tensor):
        raise ExerciseCheckError(f"{where}: expected {_describe(expected)}, got {_describe(received)}")
    if received.shape != expected.shape:
        raise ExerciseCheckError(
            f"{where}: expected shape {tuple(expected.shape)}, got {tuple(received.shape)}"
        )
    if received.dtype != expected.dtype:
        raise ExerciseCheckError(f"{where}: expected dtype {expected.dtype}, got {received.dtype}")
    if expected.dtype == torch.bool:
        wrong = (received != expected).nonzero()
        if len(wrong):
            index = tuple(wrong[0].tolist())
            raise ExerciseCheckError(
                f"{where}: {len(wrong)} entries differ; the first is at index {index}: "
                f"expected {bool(expected[index])}, got {bool(received[index])}"
            )
        return
    if torch.isnan(received).any() and not torch.isnan(expected).any():
        raise ExerciseCheckError(f"{where}: your result contains NaN where the reference has none")
    if not torch.allclose(received.float(), expected.float(), atol=atol, rtol=rtol, equal_nan=True):
        diff = (received.float() - expected.float()).abs()
        index = tuple(torch.nonzero(diff == diff.max())[0].tolist())
        raise ExerciseCheckError(
            f"{where}: values differ by up to {diff.max().item():.3g}; at index {index} "
            f"expected {expected[index].item():.5g}, got {received[index].item():.5g}"
        )


def check_against(
    learner: Callable[..., Any],
    reference: Callable[..., Any],
    cases: Iterable[Mapping[str, Any]],
    name: str,
    atol: float = 1e-5,
    rtol: float = 1e-5,
    hints: Mapping[str, Callable[..., Any]] | None = None,
) -> None:
    """Call learner and reference on every case's keyword arguments; raise ExerciseCheckError at the first difference.

    hints maps a short diagnosis ("scores scaled by sqrt(d_model) instead of sqrt(d_k)") to a known wrong
    implementation; when the learner's answer matches one of them, the diagnosis is added to the message.
    """
    cases = list(cases)
    for number, case in enumerate(cases, start=1):
        expected = reference(**case)
        where = f"{name}, case {number} of {len(cases)} ({_describe_case(case)})"
        try:
            received = learner(**case)
        except NotImplementedError:
            raise
        except Exception as error:  # the learner's code crashed: say where, keep the original error
            raise ExerciseCheckError(f"{where}: your function raised {type(error).__name__}: {error}") from error
        try:
            _compare(received, expected, where, atol, rtol)
        except ExerciseCheckError as error:
            for diagnosis, mutant in (hints or {}).items():
                try:
                    _compare(received, mutant(**case), where, atol, rtol)
                except Exception:
                    continue
                raise ExerciseCheckError(f"{error}\nLikely cause: {diagnosis}.") from None
            raise
    print(f"Well done: {name} matches the reference on all {len(cases)} test inputs.")
