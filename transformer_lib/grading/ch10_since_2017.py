"""The named check of chapter 10's coding exercise (book/10_since_2017.ipynb): RMSNorm as a function, safe in
float16."""

from collections.abc import Callable

import torch
from torch import Tensor

from .engine import _generator, _randint, _run

# Two rounding steps of the coarsest type among the cases, bfloat16 (7 bits after the point), relative: a correct
# answer computed in another order may land one step away in the cast, and the gain's product may add one more.
# Every usual mistake is off by far more (the hints' cases differ by tens of per cent at least).
ROUNDING_RTOL = 2 * torch.finfo(torch.bfloat16).eps


def _rms_norm(x: Tensor, weight: Tensor, eps: float, dims: int = 1, centre: bool = False, eps_outside: bool = False,
              in_dtype: bool = False) -> Tensor:
    """weight * x / RMS(x) over the last `dims` dimensions, with optional mistakes to recognise them."""
    x_ = x if in_dtype else x.float()
    axes = tuple(range(-dims, 0))
    if centre:
        x_ = x_ - x_.mean(axes, keepdim=True)
    mean_square = x_.pow(2).mean(axes, keepdim=True)
    rms = mean_square.sqrt() + eps if eps_outside else (mean_square + eps).sqrt()
    return (x_ / rms).to(x.dtype) * weight


def grade_rms_norm(fn: Callable[..., Tensor], seed: int | None = None) -> None:
    """Check fn(x, weight, eps) -> weight * x / sqrt(mean(x^2 over the last dimension) + eps), in x's dtype."""
    g, seed = _generator(seed)

    def case(shape: tuple[int, ...], scale: float = 1.0, eps: float = 1e-6, dtype: torch.dtype = torch.float32) -> dict:
        x = (scale * torch.randn(shape, generator=g)).to(dtype)
        weight = (0.5 + torch.rand(shape[-1], generator=g)).to(dtype)
        return {"x": x, "weight": weight, "eps": eps}

    zero = case((2, 3, 6))
    zero["x"][1, 2] = 0.0  # one position whose features are all zero: eps keeps it finite
    cases = [
        ("", case((2, 5, 8))),
        ("one vector", case((_randint(2, 12, g),))),
        ("small values, where eps matters: the mean of the squares is about eps", case((3, 4, 16), scale=1e-3)),
        ("a larger eps", case((2, 7, 10), eps=0.1)),
        ("a vector of zeros among the positions", zero),
        ("float16 values in the hundreds: their squares pass float16's largest number, 65504",
         case((2, 3, 32), scale=300.0, dtype=torch.float16)),
        ("bfloat16", case((2, 4, 24), dtype=torch.bfloat16)),
        ("a random size", case((_randint(1, 3, g), _randint(1, 9, g), _randint(2, 40, g)))),
    ]
    hints = {
        "the features were centred first: that is LayerNorm; RMSNorm divides x itself by its root mean square":
            lambda x, weight, eps: _rms_norm(x, weight, eps, centre=True),
        "eps is added to the root mean square; it belongs under the square root, with the mean of the squares":
            lambda x, weight, eps: _rms_norm(x, weight, eps, eps_outside=True),
        "the mean of the squares was computed in x's own type: in float16 the squares of values above 256 pass "
        "65504 and become inf; compute it in float32 (x.float()) and cast the result back":
            lambda x, weight, eps: _rms_norm(x, weight, eps, in_dtype=True),
        "the mean runs over the last two dimensions; RMSNorm normalises each position's features, the last "
        "dimension only": lambda x, weight, eps: _rms_norm(x, weight, eps, dims=min(2, x.dim())),
        "the gain is missing: multiply by weight": lambda x, weight, eps: _rms_norm(x, torch.ones_like(weight), eps),
    }
    _run("grade_rms_norm", fn, lambda x, weight, eps: _rms_norm(x, weight, eps), cases, seed,
         atol=1e-6, rtol=ROUNDING_RTOL, hints=hints)
