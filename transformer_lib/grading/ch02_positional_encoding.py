"""The named check of chapter 2's coding exercise (book/02_positional_encoding.ipynb): move sinusoidal encodings k
positions along with the rotation of every (sin, cos) pair, without knowing the positions and without building the
d_model x d_model matrix M_k."""

import math
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor
from torch.overrides import TorchFunctionMode

from transformer_lib.positional import sinusoidal_encoding as paper

from .engine import ExerciseGradeError, _generator, _name_of, _randint, _run


def _rotate(pe: Tensor, k: int, exponent: float = 2.0, sign: float = -1.0, direction: float = 1.0,
            halves: bool = False) -> Tensor:
    """Turn pair i of every vector of pe (..., d_model) by k * omega_i, omega_i = 10000^(sign * exponent * i /
    d_model), in float64, returned in pe's dtype; the options reproduce known mistakes."""
    d_model = pe.size(-1)
    omega = 10000.0 ** (sign * exponent * torch.arange(d_model // 2, dtype=torch.float64) / d_model)  # (d_model/2,)
    cos, sin = torch.cos(k * omega), direction * torch.sin(k * omega)  # (d_model/2,): R(k omega) of each pair
    x = pe.double()
    s, c = (x[..., : d_model // 2], x[..., d_model // 2 :]) if halves else (x[..., 0::2], x[..., 1::2])
    s_new, c_new = s * cos + c * sin, c * cos - s * sin  # (..., d_model/2) each
    out = torch.cat([s_new, c_new], dim=-1) if halves else torch.stack([s_new, c_new], dim=-1).flatten(-2)
    return out.to(pe.dtype)  # (..., d_model)


class _Shapes(TorchFunctionMode):
    """Record the shapes of the floating-point and complex tensors made during a call."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        result = func(*args, **(kwargs or {}))
        for item in result if isinstance(result, (tuple, list)) else (result,):
            if isinstance(item, Tensor) and (item.dtype.is_floating_point or item.dtype.is_complex):
                self.shapes.append(tuple(item.shape))
        return result


def _refuse_full_matrix(fn: Callable[[Tensor, int], Tensor], seed: int) -> None:
    """Refuse an answer that builds a d_model x d_model matrix, such as the block-diagonal M_k of the chapter, in any
    layout that keeps its two axes ((d_model, d_model), (d_model, 1, d_model), ...), or that makes the d_model^2
    products of one with every vector, in any layout (a tensor of numel(pe) * d_model values or more). A table of
    encodings, (positions, d_model), is neither: an answer that reads the positions is left to the value checks."""
    d_model, k = 128, 7
    pe = paper(20, d_model)[torch.arange(15).view(3, 5)]  # (3, 5, 128): no size but the last is 128
    watch = _Shapes()
    try:
        with watch, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fn(pe=pe, k=k)
    except NotImplementedError:  # the untouched stub: the value checks that follow say so in one line
        return
    except Exception:  # a crash is reported, with its input, by the value checks that follow
        return
    for shape in watch.shapes:
        if shape.count(d_model) >= 2:
            what = "a d_model x d_model matrix such as M_k (in whatever layout)"
        elif math.prod(shape) >= pe.numel() * d_model:
            what = (f"{math.prod(shape)} values, d_model = {d_model} products for each of the {pe.numel()} numbers "
                    f"of pe: a d_model x d_model matrix such as M_k times every vector")
        else:
            continue
        name = _name_of(fn)
        raise ExerciseGradeError(
            f"{name}, the cost check (pe: shape {tuple(pe.shape)}, k={k}): your function made a tensor of shape "
            f"{shape}, {what}. Its output may be right, but it costs d_model^2 multiplications per vector; the "
            f"exercise is to turn each (sin, cos) pair with elementwise products, cos(k omega_i) and sin(k omega_i) "
            f"times the sines and cosines, at a cost proportional to d_model.\n(To run these same inputs again: "
            f"grade_shift_encoding({name}, seed={seed}).)")


def grade_shift_encoding(fn: Callable[[Tensor, int], Tensor], seed: int | None = None) -> None:
    """Check fn(pe, k) -> every (sin, cos) pair of pe (..., d_model) turned by k * omega_i: PE[p + k] for the rows
    PE[p] of tl.sinusoidal_encoding, and the same rotation for any other vector."""
    g, seed = _generator(seed)
    _refuse_full_matrix(fn, seed)

    start, k_far = _randint(5, 60, g), _randint(20, 60, g)
    positions = torch.randint(0, 90, (2, 6), generator=g)  # (2, 6)
    k_random = _randint(1, 40, g) * (1 if _randint(0, 1, g) else -1)  # never 0: every vector must move
    not_encodings = torch.randn(2, 4, 64, generator=g)  # (2, 4, 64): no position has these vectors
    cases = [
        ("the rows of positions 0 to 9, one step on", {"pe": paper(10, 8), "k": 1}),
        ("no shift at all", {"pe": paper(6, 16)[2:], "k": 0}),
        ("three positions back", {"pe": paper(12, 16)[5:], "k": -3}),
        (f"position {start} alone, d_model = 2", {"pe": paper(start + 1, 2)[start:], "k": _randint(1, 50, g)}),
        ("a batch (2, 6) of encodings of random positions", {"pe": paper(90, 32)[positions], "k": k_far}),
        ("vectors that are not the encoding of any position, as the queries and keys that RoPE turns",
         {"pe": not_encodings, "k": k_random}),
    ]

    def reference(pe: Tensor, k: int) -> Tensor:
        return _rotate(pe, k)  # (..., d_model)

    hints = {
        "every pair is turned the wrong way, by -k omega_i: the result is PE[p - k]. The textbook matrix "
        "[[cos, -sin], [sin, cos]] turns (x, y) = (cos, sin); the pairs of the table are (sin, cos), in that order, "
        "so R(k omega) = [[cos, sin], [-sin, cos]] acts on them (a sine and a cosine swapped)":
            lambda pe, k: _rotate(pe, k, direction=-1.0),
        "dimension j is paired with dimension j + d_model/2, the 'rotate_half' layout of some RoPE code; the "
        "pairs of the paper's table are neighbours, (2i, 2i+1)": lambda pe, k: _rotate(pe, k, halves=True),
        "the exponent is i/d_model instead of 2i/d_model (i counts pairs of dimensions)":
            lambda pe, k: _rotate(pe, k, exponent=1.0),
    }

    def lost_minus_sign(pe: Tensor, k: int, received: Tensor) -> bool:
        # 10000^(+2i/d_model) makes the angles k * omega_i so large (up to 60 * 10000) that float32 rounds them by
        # more than 1e-4; each learner's order of operations rounds differently, so allow what float32 can do.
        d_model = pe.size(-1)
        angle = abs(k) * 10000.0 ** (2 * torch.arange(d_model // 2, dtype=torch.float64) / d_model)  # (d_model/2,)
        wrong = _rotate(pe, k, sign=1.0).double()  # (..., d_model)
        pair = pe.double().abs().unflatten(-1, (d_model // 2, 2)).sum(-1)  # (..., d_model/2): |sin| + |cos|
        allowed = 1e-4 + 1e-6 * (angle * pair).repeat_interleave(2, dim=-1)  # a few float32 roundings of the angle
        return bool(((received.double() - wrong).abs() <= allowed).all())

    def diagnose(case: Mapping[str, Any], received: Any, expected: Any) -> str | None:
        if not (isinstance(received, Tensor) and received.shape == expected.shape and received.dtype.is_floating_point):
            return None
        if case["pe"] is not_encodings:  # the earlier cases passed: the answer works for encodings only
            lengths = received.double().unflatten(-1, (-1, 2)).norm(dim=-1)  # (..., d_model/2): each pair's length
            unit = ("every (sin, cos) pair of your result has length 1, but the pairs of these vectors do not, and a "
                    "rotation keeps each pair's length. " if torch.allclose(lengths, torch.ones_like(lengths),
                                                                               atol=1e-3) else "")
            return (f"Likely cause: your answer relies on the vectors being encodings of positions (it reads off a "
                    f"position p and evaluates sin and cos at p + k, or it takes the angle of each pair without its "
                    f"length): {unit}These vectors are not the encoding of any position, and yet M_k, being "
                    f"linear, turns pair i of any vector by k omega_i. Use only k and the frequencies.")
        if case["k"] != 0 and lost_minus_sign(case["pe"], case["k"], received):
            return ("Likely cause: the exponent lost its minus sign: 10000^(+2i/d_model) makes the frequencies grow "
                    "with i instead of shrinking.")
        wrong = ~torch.isclose(received.double(), expected.double(), atol=1e-4, rtol=1e-4)  # (..., d_model)
        column = int(wrong.flatten(0, -2).any(dim=0).nonzero()[0])
        if column >= 2:
            return (f"Dimensions 0 and 1 (i = 0, frequency 1) are right, but dimension {column} (i = {column // 2}) "
                    f"is not: check the frequency 10000^(-2i / d_model) of pair i.")
        return None

    # k * omega_i stays below 60 radians: float32 rounds such an angle by about 4e-6, and a float32 answer (e.g. in
    # complex numbers) differed from the float64 reference by at most 1.2e-5 on vectors twice as large as these,
    # a tenth of the tolerance.
    _run("grade_shift_encoding", fn, reference, cases, seed, atol=1e-4, rtol=1e-4, hints=hints, diagnose=diagnose)
