"""The named check of chapter 8's coding exercise (book/08_translation.ipynb): averaging checkpoints."""

from collections.abc import Callable, Mapping, Sequence

import torch
from torch import Tensor

from transformer_lib.translation import average_checkpoints

from .engine import (ExerciseGradeError, _describe, _difference, _generator, _name_of, _randint, _refuse_calls,
                     not_attempted)


def _average_state_dicts(state_dicts: Sequence[Mapping[str, Tensor]]) -> dict[str, Tensor]:
    """The mean of the floating-point tensors (computed in float64, returned in their dtype); others from the last."""
    return {key: torch.stack([state[key].double() for state in state_dicts]).mean(dim=0).to(last.dtype)
            if last.is_floating_point() else last.clone() for key, last in state_dicts[-1].items()}


def _random_state_dicts(count: int, shapes: Mapping[str, tuple[int, ...]], dtype: torch.dtype,
                        g: torch.Generator) -> list[dict[str, Tensor]]:
    """count state dicts of one model: float tensors of the given shapes and dtype, and an integer step counter."""
    states = []
    for index in range(count):
        state = {key: torch.randn(shape, generator=g, dtype=torch.float64).to(dtype) for key, shape in shapes.items()}
        state["norm.num_batches_tracked"] = torch.tensor(100 * (index + 1) + _randint(0, 9, g))  # int64, ()
        state["pos.index"] = torch.randint(0, 50, (3,), generator=g, dtype=torch.int32)  # an integer buffer
        states.append(state)
    return states


def grade_average_checkpoints(fn: Callable[[list[dict[str, Tensor]]], dict[str, Tensor]],
                              seed: int | None = None) -> None:
    """Check fn(state_dicts) -> the mean of their floating-point tensors (others from the last), on fresh state dicts."""
    g, seed = _generator(seed)
    name = _name_of(fn)
    again = f"\n(To run these same inputs again: grade_average_checkpoints({name}, seed={seed}).)"
    model_shapes = {"embed.weight": (7, 4), "layer.0.linear.weight": (4, 4), "layer.0.linear.bias": (4,),
                    "norm.running_mean": (4,), "temperature": ()}
    cases = [
        ("a single state dict: its average is itself", _random_state_dicts(1, model_shapes, torch.float32, g)),
        ("3 state dicts, float32", _random_state_dicts(3, model_shapes, torch.float32, g)),
        ("2 state dicts, float64", _random_state_dicts(2, {"w": (3, 2, 5), "b": (5,)}, torch.float64, g)),
        ("5 state dicts, bfloat16", _random_state_dicts(5, {"w": (6, 3), "b": (3,)}, torch.bfloat16, g)),
        ("a random number of state dicts", _random_state_dicts(_randint(2, 6, g), {"w": (_randint(1, 5, g), 8)},
                                                               torch.float32, g)),
    ]
    mistakes = {
        "the tensors are summed, not averaged: divide the sum by the number of state dicts":
            lambda states: {k: torch.stack([s[k] for s in states]).sum(dim=0) if v.is_floating_point() else v
                            for k, v in states[-1].items()},
        "only the last state dict is returned; average the tensors of all of them": lambda states: states[-1],
        "only the first state dict is returned; average the tensors of all of them": lambda states: states[0],
        "the first and the last state dicts are averaged, not all of them":
            lambda states: _average_state_dicts([states[0], states[-1]]),
    }
    # The exercise is to write the average: the library's own function (folded in the chapter) would pass every
    # value check below.
    _refuse_calls(fn, [(states,) for _, states in cases], {average_checkpoints: "library"},
                  lambda label, _: "your function called the library's average_checkpoints (tl.average_checkpoints); "
                                   "the exercise is to write the average yourself, with torch.stack and mean.",
                  "grade_average_checkpoints", seed)
    for number, (note, states) in enumerate(cases, start=1):
        where = f"{name}, case {number} of {len(cases)} ({note}; keys {sorted(states[0])})"
        given = [{key: value.clone() for key, value in state.items()} for state in states]
        try:
            received = fn(given)
        except NotImplementedError:  # the untouched stub: one line, no error (engine.not_attempted)
            not_attempted(name, "grade_average_checkpoints")
            return
        except Exception as error:  # the learner's code crashed: say where, keep the original error
            raise ExerciseGradeError(f"{where}: your function raised {type(error).__name__}: {error}{again}") from error
        for index, (copy, state) in enumerate(zip(given, states)):
            changed = [key for key in state if key not in copy or not torch.equal(copy[key], state[key])]
            if changed or set(copy) != set(state):
                raise ExerciseGradeError(
                    f"{where}: your function modified its input: state dict {index}'s entry "
                    f"{(changed or sorted(set(copy) ^ set(state)))[0]!r} changed in place. The caller's checkpoints "
                    f"must stay as they are: build new tensors (torch.stack(...).mean(dim=0)) in a new dict, rather "
                    f"than adding into the first state dict with += or assigning into it.{again}")
        if not isinstance(received, Mapping):
            raise ExerciseGradeError(f"{where}: expected a dict from names to tensors, got {_describe(received)}{again}")
        expected = _average_state_dicts(states)
        missing, extra = sorted(set(expected) - set(received)), sorted(set(received) - set(expected))
        if missing or extra:
            raise ExerciseGradeError(
                f"{where}: the keys differ from the state dicts' keys: "
                + (f"keys missing: {missing}" if missing else "") + ("; " if missing and extra else "")
                + (f"unexpected keys: {extra}" if extra else "")
                + f". Return every key, the integer buffers too (taken from the last state dict).{again}")
        for key, want in expected.items():
            eps = torch.finfo(want.dtype).eps if want.is_floating_point() else 0.0
            tol = 4 * len(states) * eps  # the mean of n values rounded in the tensor's own dtype: ~n roundings
            found = _difference(received[key], want, tol, tol, False)
            if found is None:
                continue
            lines = [f"{where}: entry {key!r}: {found[0]}"]
            if not want.is_floating_point():
                lines.append(f"Likely cause: {key!r} is an integer buffer (dtype {want.dtype}), a count or an index "
                             f"rather than a weight: it cannot be averaged, so take it from the last state dict.")
            else:
                for diagnosis, mistake in mistakes.items():
                    wrong = mistake(states)
                    if all(_difference(received.get(k), w, tol, tol, False) is None for k, w in wrong.items()
                           if k in received and w.is_floating_point()):
                        lines.append(f"Likely cause: {diagnosis}.")
                        break
                else:
                    lines += found[1]
            raise ExerciseGradeError("\n".join(lines) + again)
    print(f"Well done: {name} matches the reference on all {len(cases)} test inputs.")
