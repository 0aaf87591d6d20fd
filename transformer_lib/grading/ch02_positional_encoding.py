"""The named check of chapter 2's coding exercise (book/02_positional_encoding.ipynb): the sinusoidal table."""

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from .engine import _generator, _randint, _run


def grade_sinusoidal_encoding(fn: Callable[[int, int], Tensor], seed: int | None = None) -> None:
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

    _run("grade_sinusoidal_encoding", fn, paper, cases, seed, atol=1e-4, rtol=1e-4, hints=hints, diagnose=diagnose)
