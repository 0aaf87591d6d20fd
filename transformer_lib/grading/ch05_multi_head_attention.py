"""The graders of chapter 5's two coding exercises (book/05_multi_head_attention.ipynb): each head's share of
the output, and attention computed block by block."""

import math
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from transformer_lib.attention import scaled_dot_product_attention
from transformer_lib.multihead import MultiHeadAttention

from .engine import ExerciseGradeError, _generator, _name_of, _randint, _run


def _head_outputs(attention: nn.Module, x: Tensor, split: str = "transpose", w_o_block: str = "columns",
                  bias: bool = False) -> Tensor:
    """Each head's share of attention(x, x, x)[0] (B, h, T, d_model), with optional mistakes to recognise them."""
    batch, length, d_model = x.shape
    h, d_k = attention.n_heads, attention.d_k

    def heads_of(t: Tensor) -> Tensor:  # (B, T, d_model) -> (B, h, T, d_k)
        if split == "view":
            return t.reshape(batch, h, length, d_k)
        return t.view(batch, length, h, d_k).transpose(1, 2)

    q, k, v = (heads_of(layer(x)) for layer in (attention.w_q, attention.w_k, attention.w_v))
    heads, _ = scaled_dot_product_attention(q, k, v)  # (B, h, T, d_k)
    if w_o_block == "columns":  # head i meets columns i*d_k .. (i+1)*d_k - 1 of w_o.weight (d_model, d_model)
        w_o = attention.w_o.weight.view(d_model, h, d_k).permute(1, 2, 0)  # (h, d_k, d_model)
    else:
        w_o = attention.w_o.weight.view(h, d_k, d_model)  # (h, d_k, d_model): rows, the wrong block
    out = heads @ w_o.unsqueeze(0)  # (B, h, T, d_k) @ (1, h, d_k, d_model) -> (B, h, T, d_model)
    return out + attention.w_o.bias if bias else out


def grade_head_outputs(fn: Callable[..., Tensor], seed: int | None = None) -> None:
    """Check fn(attention, x) -> each head's share (B, h, T, d_model) of attention(x, x, x)[0], bias left out."""
    g, seed = _generator(seed)

    def layer(d_model: int, n_heads: int) -> MultiHeadAttention:
        with torch.random.fork_rng(devices=[]):  # the default initialisation is overwritten below
            attention = MultiHeadAttention(d_model, n_heads).eval()
        with torch.no_grad():
            for linear in (attention.w_q, attention.w_k, attention.w_v, attention.w_o):
                linear.weight.copy_(torch.randn(d_model, d_model, generator=g) / math.sqrt(d_model))
                linear.bias.copy_(torch.randn(d_model, generator=g))  # a bias that shows if it is counted h times
        return attention

    sizes = [("", 2, 5, 16, 4), ("a single position", 3, 1, 8, 2), ("a single head", 2, 6, 12, 1),
             ("", 1, 7, 24, 3), ("eight heads of d_k = 4", 2, 9, 32, 8), ("as many positions as heads", 2, 4, 16, 4)]
    heads = _randint(1, 4, g)
    sizes.append(("a random size", _randint(1, 3, g), _randint(1, 9, g), heads * _randint(1, 6, g), heads))
    cases = [(note, {"attention": layer(d_model, h), "x": torch.randn(batch, length, d_model, generator=g)})
             for note, batch, length, d_model, h in sizes]
    hints = {
        "head i's block of W^O was taken from rows i*d_k .. (i+1)*d_k - 1 of w_o.weight; nn.Linear stores W^O "
        "transposed, as (out_features, in_features), so head i's outputs meet the columns i*d_k .. (i+1)*d_k - 1":
            lambda attention, x: _head_outputs(attention, x, w_o_block="rows"),
        "every head's share includes the output bias w_o.bias; the layer adds it once, after the sum over the heads, "
        "so leave it out": lambda attention, x: _head_outputs(attention, x, bias=True),
        "x.view(B, n_heads, T, d_k) cuts the heads across positions; view as (B, T, n_heads, d_k), then "
        "transpose(1, 2)": lambda attention, x: _head_outputs(attention, x, split="view"),
    }

    def diagnose(case: Mapping[str, Any], received: Any, expected: Any) -> str | None:
        if not (isinstance(received, Tensor) and received.shape == expected.shape):
            return None
        attention, x = case["attention"], case["x"]
        total = received.sum(dim=1) + attention.w_o.bias  # (B, T, d_model)
        if torch.allclose(total, attention(x, x, x)[0], atol=1e-4, rtol=1e-4):
            return ("Your shares do add up to the layer's output, but they are divided among the heads differently: "
                    "head i's share must come from head i's attention output alone.")
        return "Your shares plus w_o.bias do not add up to attention(x, x, x)[0]; that is a first thing to test."

    _run("grade_head_outputs", fn, _head_outputs, cases, seed, hints=hints, diagnose=diagnose)


def _online_attention(q: Tensor, k: Tensor, v: Tensor, block_size: int, rescale: bool = True, divide: bool = True,
                      accumulate: bool = True, scale: bool = True, last_block: bool = True,
                      running_max: bool = True) -> Tensor:
    """Block-by-block attention with optional mistakes, to recognise them in a learner's answer."""
    m = q.new_full((*q.shape[:-1], 1), float("-inf") if running_max else 0.0)  # (B, h, T_q, 1)
    total, out = q.new_zeros((*q.shape[:-1], 1)), q.new_zeros((*q.shape[:-1], v.size(-1)))
    stop = k.size(-2) if last_block else k.size(-2) - block_size + 1
    for start in range(0, stop, block_size):
        s = q @ k[..., start : start + block_size, :].transpose(-2, -1)  # (B, h, T_q, blk)
        s = s / math.sqrt(q.size(-1)) if scale else s
        m_new = torch.maximum(m, s.amax(-1, keepdim=True)) if running_max else m  # without: exp of the raw scores
        p = torch.exp(s - m_new)  # (B, h, T_q, blk)
        factor = torch.exp(m - m_new) if rescale else torch.ones_like(m)
        keep = 1.0 if accumulate else 0.0
        total = keep * total * factor + p.sum(-1, keepdim=True)
        out = keep * out * factor + p @ v[..., start : start + block_size, :]  # (B, h, T_q, d_v)
        m = m_new
    return out / total if divide else out


class _Watch(TorchFunctionMode):
    """Record, during a call, the shapes of the floating-point tensors made, the keys handed to a fused attention
    kernel, the tensors of two or more dimensions turned into NumPy arrays or lists, and whether autograd was off."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []
        self.fused_keys: list[int] = []
        self.exported: list[tuple[int, ...]] = []
        self.grad_off = False

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        self.grad_off = self.grad_off or not torch.is_grad_enabled()
        if func is torch.nn.functional.scaled_dot_product_attention:
            key = kwargs.get("key", args[1] if len(args) > 1 else None)
            if isinstance(key, Tensor):
                self.fused_keys.append(key.size(-2))
        if func in (Tensor.numpy, Tensor.__array__, Tensor.tolist) and args and isinstance(args[0], Tensor):
            if args[0].dim() >= 2:  # e.g. q.numpy(); a list of block starts, arange(...).tolist(), is fine
                self.exported.append(tuple(args[0].shape))
        result = func(*args, **kwargs)
        for item in result if isinstance(result, (tuple, list)) else (result,):
            if isinstance(item, Tensor) and item.dtype.is_floating_point:
                self.shapes.append(tuple(item.shape))
        return result


def _leaves(output: Tensor) -> list[Tensor]:
    """The tensors that output's autograd history starts from (without running backward)."""
    found, seen, stack = [], set(), [output.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if hasattr(node, "variable"):  # an AccumulateGrad node: a leaf that requires grad
            found.append(node.variable)
        stack.extend(child for child, _ in node.next_functions)
    return found


def _refuse_full_scores(fn: Callable[..., Tensor], seed: int) -> None:
    """Refuse an answer that holds the scores of all keys at once (e.g. one that calls full attention, loops over
    the queries instead of the keys, or computes every block's scores in one tensor) or computes outside PyTorch
    (e.g. in NumPy)."""
    batch, heads, t_q, t_k, d_k, block_size = 1, 2, 5, 12, 8, 4  # T_k = 12 is none of the other sizes
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(batch, heads, t, d_k, generator=g).requires_grad_() for t in (t_q, t_k, t_k))
    watch = _Watch()
    output = None
    try:
        with watch, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. .item() of a tensor that requires grad: fine here
            output = fn(q=q, k=k, v=v, block_size=block_size)
    except NotImplementedError:  # the untouched stub: the value checks that follow say so in one line
        return
    except Exception:  # a crash is reported, with its input, by the value checks that follow (unless it left torch)
        pass
    again = f"\n(To run these same inputs again: grade_blockwise_attention({_name_of(fn)}, seed={seed}).)"
    where = (f"{_name_of(fn)}, the blocks check (q: shape {tuple(q.shape)}, k and v: shape {tuple(k.shape)}, "
             f"block_size={block_size})")
    loop = ("the point of the exercise is never to hold more than one block of scores, (..., T_q, block_size): "
            "loop over k[..., start:start + block_size, :] and fold each block into the running m, l and o.")
    if any(size > block_size for size in watch.fused_keys):
        raise ExerciseGradeError(
            f"{where}: your function called torch.nn.functional.scaled_dot_product_attention on all {t_k} keys at "
            f"once. Its output may be right, but the exercise is to compute attention yourself, one block of "
            f"{block_size} keys at a time: loop over k[..., start:start + block_size, :] and fold each block into "
            f"the running m, l and o.{again}")
    full = [shape for shape in watch.shapes if t_k in shape and t_q in shape]
    if full:  # (..., T_q, T_k) or (..., T_k, T_q): all the scores, in any layout
        raise ExerciseGradeError(
            f"{where}: your function made a tensor of shape {full[0]}, scores or weights of all {t_k} keys for "
            f"each of the {t_q} queries at once, with blocks of {block_size} keys. Its output may be right, but "
            f"{loop}{again}")
    rows = [shape for shape in watch.shapes if t_k in shape and d_k not in shape]  # keys and values keep d_k
    if rows:
        raise ExerciseGradeError(
            f"{where}: your function made a tensor of shape {rows[0]}, scores or weights of all {t_k} keys at once "
            f"for some of the queries, with blocks of {block_size} keys: a loop over the queries does not help, "
            f"the loop must run over the keys. Its output may be right, but {loop}{again}")
    block = batch * heads * t_q * block_size  # the most values one block of scores holds: 40 here
    blocks = [shape for shape in watch.shapes if t_q in shape and d_k not in shape and math.prod(shape) > block]
    if blocks:  # e.g. (B, h, n_blocks, T_q, block_size): every block's scores at once, in a layout without T_k
        raise ExerciseGradeError(
            f"{where}: your function made a tensor of shape {blocks[0]}, {math.prod(blocks[0])} scores or weights, "
            f"more than one block of them holds, B * h * T_q * block_size = {block}: the scores of every block at "
            f"once. Its output may be right, but {loop}{again}")
    history = isinstance(output, Tensor) and not watch.grad_off  # under torch.no_grad() there is none to follow
    if watch.exported or (history and not all(any(leaf is x for leaf in _leaves(output)) for x in (q, k, v))):
        how = (f"it turned a tensor of shape {watch.exported[0]} into a NumPy array or a list" if watch.exported
               else "its output does not come from q, k and v through torch operations")
        raise ExerciseGradeError(
            f"{where}: your function left PyTorch ({how}), e.g. through NumPy, where the check cannot see the "
            f"tensors it makes: write it with torch operations.{again}")


def _blockwise_diagnosis(case: Mapping[str, Any], received: Any, expected: Any) -> str | None:
    """Name an overflow of exp: an answer that is not finite where the reference is, on scores beyond exp's range."""
    if not (isinstance(received, Tensor) and received.shape == expected.shape) or torch.isfinite(received).all():
        return None
    q, k = case["q"].double(), case["k"].double()
    top = (q @ k.transpose(-2, -1)).max().item() / math.sqrt(q.size(-1))
    if not torch.isfinite(expected).all() or top < 88:
        return None
    return (f"Likely cause: the exponentials are taken of the raw scores, without subtracting the running maximum m: "
            f"exp overflows to inf above about 88 in float32 and about 709 in float64 (these scores reach {top:.0f}), "
            f"and inf / inf is NaN. Keep the largest score seen so far and use exp(s - m_new), rescaling l and o by "
            f"exp(m - m_new) when it grows.")


def grade_blockwise_attention(fn: Callable[..., Tensor], seed: int | None = None) -> None:
    """Check fn(q, k, v, block_size) -> softmax(q k^T / sqrt(d_k)) v against tl.scaled_dot_product_attention."""
    g, seed = _generator(seed)

    def qkv(batch: int, heads: int, t_q: int, t_k: int, d_k: int, spread: float = 1.0) -> dict:
        return {"q": spread * torch.randn(batch, heads, t_q, d_k, generator=g),
                "k": spread * torch.randn(batch, heads, t_k, d_k, generator=g),
                "v": torch.randn(batch, heads, t_k, d_k, generator=g)}

    def one_winner(*sizes: int, spread: float, lead: float = 20.0) -> dict:
        """qkv(*sizes, spread) drawn again until each query's best score leads the next by lead: its weight is 1 to
        within exp(-lead), so float32's rounding of large scores does not show in the output. (A score of s carries
        an error of about d_k * 6e-8 * s, 3e-4 at several hundred, 2e-3 at a few thousand; with weights that are not
        near 0 or 1 it would move the output by as much, beyond any tolerance that still tells a bug apart.)"""
        for _ in range(100):
            case = qkv(*sizes, spread)
            top = (case["q"].double() @ case["k"].double().transpose(-2, -1)).topk(2, dim=-1).values
            if (top[..., 0] - top[..., 1]).min() >= lead * math.sqrt(sizes[-1]):
                break
        return case

    t_k = _randint(1, 20, g)
    cases = [
        ("the last block is shorter (7 keys, blocks of 3)", {**qkv(2, 4, 5, 7, 8), "block_size": 3}),
        ("blocks of one key", {**qkv(1, 2, 6, 6, 4), "block_size": 1}),
        ("one block larger than all the keys", {**qkv(3, 1, 4, 5, 16), "block_size": 8}),
        ("a single query", {**qkv(2, 8, 1, 9, 8), "block_size": 4}),
        ("a single key", {**qkv(2, 2, 3, 1, 8), "block_size": 2}),
        ("large scores: the running maximum changes from block to block",
         {**qkv(1, 4, 10, 12, 8, 4.0), "block_size": 5}),
        ("scores of several hundred, beyond float32's exp (which overflows above about 88)",
         {**one_winner(1, 2, 6, 9, 8, spread=12.0), "block_size": 3}),
        ("scores of a few thousand, beyond even float64's exp (which overflows above about 709)",
         {**one_winner(1, 2, 5, 10, 8, spread=40.0), "block_size": 4}),
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
        "the exponentials are taken of the raw scores, without subtracting the running maximum m: in float32 exp "
        "overflows to inf above about 88, and inf / inf is NaN. Keep the largest score seen so far and use "
        "exp(s - m_new), rescaling l and o by exp(m - m_new) when it grows":
            lambda q, k, v, block_size: _online_attention(q, k, v, block_size, running_max=False),
    }
    _refuse_full_scores(fn, seed)
    _run("grade_blockwise_attention", fn,
         lambda q, k, v, block_size: scaled_dot_product_attention(q, k, v)[0], cases, seed, atol=2e-5, rtol=1e-4,
         hints=hints, diagnose=_blockwise_diagnosis)
