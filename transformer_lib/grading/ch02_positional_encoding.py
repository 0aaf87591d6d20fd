"""The named check of chapter 2's coding exercise (book/02_positional_encoding.ipynb): the sinusoidal encoding of
given positions, with the frequencies computed in log space."""

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from transformer_lib.positional import sinusoidal_encoding as paper

from .engine import _generator, _randint, _run


def _encode(positions: Tensor, d_model: int, base: float = 10000.0, log: Callable[[float], float] = math.log,
            sign: float = -1.0, exponent: float = 2.0, shift: int = 0, swap: bool = False) -> Tensor:
    """sin/cos of positions * exp(sign * (exponent * i / d_model) * log(base)), in float64, as float32; the options
    reproduce known mistakes."""
    i = torch.arange(d_model // 2, dtype=torch.float64)  # (d_model/2,)
    omega = torch.exp(sign * (exponent * i / d_model) * log(base))  # (d_model/2,)
    angle = (positions.double() + shift).unsqueeze(-1) * omega  # (...) -> (..., d_model/2)
    pair = (angle.cos(), angle.sin()) if swap else (angle.sin(), angle.cos())
    return torch.stack(pair, dim=-1).flatten(-2).float()  # (..., d_model/2, 2) -> (..., d_model): sin, cos, ...


def grade_sinusoidal_encoding(fn: Callable[[Tensor, int], Tensor], seed: int | None = None) -> None:
    """Check fn(positions, d_model) -> the paper's encodings (..., d_model) of integer positions (...) against the
    rows of tl.sinusoidal_encoding."""
    g, seed = _generator(seed)

    def reference(positions: Tensor, d_model: int) -> Tensor:
        return paper(int(positions.max()) + 1, d_model)[positions]  # (...) -> (..., d_model)

    start = _randint(5, 100, g)
    lengths = [_randint(1, 5, g) for _ in range(3)]
    packed = torch.cat([torch.arange(n) for n in lengths])  # three sentences packed in one row, each from 0
    cases = [
        ("positions 0 to 9", {"positions": torch.arange(10), "d_model": 8}),
        ("position 0 alone, d_model = 2", {"positions": torch.tensor([0]), "d_model": 2}),
        (f"the next 4 positions of a decoder that has already written {start} tokens",
         {"positions": torch.arange(start, start + 4), "d_model": 16}),
        ("a batch (2, 6) of positions, the second row in reverse order",
         {"positions": torch.stack([torch.arange(6), torch.arange(5, -1, -1)]), "d_model": 32}),
        (f"three sentences of lengths {lengths} packed in one row, each counted from 0",
         {"positions": packed[None], "d_model": 64}),
        ("random positions below 150", {"positions": torch.randint(0, 150, (_randint(1, 3, g), _randint(1, 9, g)),
                                                                   generator=g), "d_model": 2 * _randint(1, 64, g)}),
    ]

    hints = {
        "the rows are those of positions 0, 1, 2, ... whatever the positions asked for: encode the values of "
        "`positions`, not their indices":
            lambda positions, d_model: paper(positions.numel(), d_model).view(*positions.shape, d_model),
        "the logarithm is in base 10 (math.log10); 10000^x = exp(x * ln 10000) needs the natural logarithm "
        "(math.log)": lambda positions, d_model: _encode(positions, d_model, log=math.log10),
        "the exponent is i/d_model instead of 2i/d_model (i counts pairs of dimensions)":
            lambda positions, d_model: _encode(positions, d_model, exponent=1.0),
        "sine and cosine are swapped: dimension 2i holds the sine, dimension 2i+1 the cosine":
            lambda positions, d_model: _encode(positions, d_model, swap=True),
        "every position is one too far: the first token of a sentence is position 0":
            lambda positions, d_model: _encode(positions, d_model, shift=1),
    }

    def lost_minus_sign(positions: Tensor, received: Tensor) -> bool:
        # exp(+2i/d_model * ln 10000) makes angles so large (up to 150 * 10000) that float32 rounds them by more than
        # 1e-4; each learner's order of operations rounds differently, so allow what float32 can do to such an angle.
        d_model = received.size(-1)
        omega = torch.exp((2 * torch.arange(d_model // 2, dtype=torch.float64) / d_model) * math.log(10000.0))
        angle = positions.double().unsqueeze(-1) * omega  # (..., d_model/2)
        wrong = torch.stack([angle.sin(), angle.cos()], dim=-1).flatten(-2)  # (..., d_model)
        allowed = 1e-4 + 1e-5 * angle.repeat_interleave(2, dim=-1)  # a few float32 roundings of the angle
        return bool(((received.double() - wrong).abs() <= allowed).all())

    def diagnose(case: Mapping[str, Any], received: Any, expected: Any) -> str | None:
        if not (isinstance(received, Tensor) and received.shape == expected.shape and received.dtype.is_floating_point):
            return None
        if lost_minus_sign(case["positions"], received):
            return ("Likely cause: the exponent lost its minus sign: exp(+(2i/d_model) * ln 10000) makes the "
                    "frequencies grow with i instead of shrinking.")
        wrong = ~torch.isclose(received.double(), expected.double(), atol=1e-4, rtol=1e-4)  # (..., d_model)
        column = int(wrong.flatten(0, -2).any(dim=0).nonzero()[0])
        if column >= 2:
            return (f"Dimensions 0 and 1 (i = 0, frequency 1) are right, but dimension {column} (i = {column // 2}) "
                    f"is not: check the frequency exp(-(2i / d_model) * ln 10000) of pair i.")
        return None

    _run("grade_sinusoidal_encoding", fn, reference, cases, seed, atol=1e-4, rtol=1e-4, hints=hints, diagnose=diagnose)
