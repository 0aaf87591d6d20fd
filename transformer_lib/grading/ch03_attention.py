"""The named check of chapter 3's coding exercise (book/03_attention.ipynb): scaled dot-product attention with a float
position bias (T5- or ALiBi-style) added to the scores, and the boolean mask added as a finite bias, rows with no
allowed key included."""

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from transformer_lib.attention import scaled_dot_product_attention

from .engine import _generator, _name_number, _randint, _run


def _reference(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
               bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """softmax(q k^T / sqrt(d_k) + bias), masked as tl.scaled_dot_product_attention masks; (output, weights)."""
    if bias is None:
        return scaled_dot_product_attention(q, k, v, mask)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)) + bias  # (..., T_q, T_k)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)  # (..., T_q, T_k)
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)  # a row with no allowed key: NaN -> 0
    return weights @ v, weights  # (..., T_q, d_v)


def _attention_variant(divisor: Callable[[int], float] = math.sqrt, dim: int = -1,
                       fill: Callable[[Tensor], Tensor] = lambda mask: ~mask, value: float = float("-inf"),
                       bias_factor: Callable[[int], float] = lambda d_k: 1.0, bias_only_with_mask: bool = False):
    """Attention with one thing changed; the checks use these to recognise common mistakes."""

    def attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                  bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
        scores = q @ k.transpose(-2, -1) / divisor(q.size(-1))  # (..., T_q, T_k)
        if bias is not None and (mask is not None or not bias_only_with_mask):
            scores = scores + bias_factor(q.size(-1)) * bias
        if mask is not None:
            scores = scores.masked_fill(fill(mask), value)
        weights = torch.softmax(scores, dim=dim).nan_to_num(0.0)  # (..., T_q, T_k); a row with no allowed key: 0
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


def _unhandled_empty_rows(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None,
                          bias: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """A finite bias (or -1e9) and nothing else: a row with no allowed key is left with equal scores, uniform weights."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (..., T_q, T_k)
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        scores = scores + torch.zeros(mask.shape).masked_fill(~mask, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=-1)  # (..., T_q, T_k)
    return weights @ v, weights  # (..., T_q, d_v)


def _masked_key_leads(case: Mapping[str, Any], received: Any, expected: Any) -> str | None:
    """Name a softmax taken over every key before the mask (then, as a rule, renormalised over the allowed keys): on
    a row whose masked key outscores every allowed key by more than float32's exp can span, the allowed keys'
    weights underflow to 0 and no renormalising brings them back."""
    mask, weights = case.get("mask"), received[1]
    if mask is None:
        return None
    scores = case["q"].double() @ case["k"].double().transpose(-2, -1) / math.sqrt(case["q"].size(-1))
    if case.get("bias") is not None:
        scores = scores + case["bias"].double()
    shape = torch.broadcast_shapes(scores.shape, mask.shape)  # (..., T_q, T_k)
    scores, allowed = scores.expand(shape), mask.expand(shape)
    lead = scores.masked_fill(allowed, -math.inf).amax(-1) - scores.masked_fill(~allowed, -math.inf).amax(-1)
    far = (lead > 87) & allowed.any(dim=-1)  # (..., T_q): an allowed key, and a masked key beyond exp(-87) ahead
    got = weights.double()
    vanished = torch.isnan(got).any(dim=-1) | (got.abs().amax(dim=-1) < 1e-6)  # (..., T_q): a row of 0 or NaN
    rows = far & vanished  # where the reference's row sums to 1 (it has an allowed key)
    if not rows.any():
        return None
    return (f"Likely cause: the softmax ran over every key before the mask. Here a masked key outscores every allowed "
            f"key by {lead[rows].max().item():.0f}, so the allowed keys' weights, exp(score - the row's maximum), "
            f"underflow to 0 in float32 (which holds nothing below about 1e-45 = exp(-103)), and no renormalising over "
            f"the allowed keys brings them back (0 or NaN where the reference gives them weights that sum to 1). Mask "
            f"the scores before the softmax.")


def _attention_diagnosis(case: Mapping[str, Any], received: Any, expected: Any) -> str | None:
    if not (isinstance(received, tuple) and len(received) == 2 and all(isinstance(r, Tensor) for r in received)):
        return None
    output, weights = received
    if weights.shape != expected[1].shape or not weights.dtype.is_floating_point:
        return None
    leads = _masked_key_leads(case, received, expected)
    if leads is not None:
        return leads
    q, k = case["q"].double(), case["k"].double()
    top = (q @ k.transpose(-2, -1)).max().item() / math.sqrt(q.size(-1))
    if top > 88 and not (torch.isfinite(output).all() and torch.isfinite(weights).all()):
        return (f"Likely cause: the softmax takes exp of the raw scores: in float32 exp overflows to inf above about "
                f"88 (these scores reach {top:.0f}), and inf / inf is NaN. As in this chapter's first exercise, "
                f"subtract each row's maximum before exp (torch.softmax does it for you).")
    mask = case.get("mask")
    if mask is not None:
        empty = ~mask.expand(weights.shape).any(dim=-1)  # (..., T_q): rows with no allowed key
        if empty.any() and (torch.isnan(weights[empty]).any() or torch.isnan(output[empty]).any()):
            return ("Likely cause: a row with no allowed key has every score at -inf, and the softmax of such a row "
                    "is 0/0 = NaN. Add a finite bias (`torch.finfo(scores.dtype).min`) instead of -inf, and set the "
                    "weights of masked keys to 0 after the softmax.")
        if empty.any() and not torch.allclose(weights[empty], torch.zeros_like(weights[empty]), atol=1e-6):
            return ("Likely cause: a row with no allowed key must get weights 0 and output 0, as in "
                    "tl.scaled_dot_product_attention; yours has weights that sum to "
                    f"{weights[empty].sum(-1).max().item():.3g}. Set the weights of masked keys to 0 after the softmax.")
        if empty.any() and not torch.allclose(output[empty], torch.zeros_like(output[empty]), atol=1e-6):
            return ("Likely cause: the weights of a row with no allowed key are 0, but its output is not: compute the "
                    "output from the corrected weights, `weights @ v`.")
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
    bias = case.get("bias")
    if bias is not None:  # a divisor cannot be read off weights that a bias has moved; a transposed bias can be seen
        if bias.size(-1) == bias.size(-2) and not torch.equal(bias, bias.transpose(-2, -1)):
            flipped = _reference(case["q"], case["k"], case["v"], mask, bias.transpose(-2, -1))[1]
            if torch.allclose(weights, flipped, atol=1e-5, rtol=1e-5):
                return ("Likely cause: the bias is transposed: its rows (dim=-2) are the queries and its columns "
                        "(dim=-1) the keys, as in the scores q k^T.")
        return None
    divisor = _estimate_divisor(case["q"], case["k"], weights, mask)
    d_k = case["q"].size(-1)
    if divisor is not None and abs(divisor - math.sqrt(d_k)) > 1e-3 * math.sqrt(d_k):
        label = _name_number(divisor)
        return (f"Likely cause: your weights are softmax(q k^T / {divisor:.4g}){f' (= {label})' if label else ''}, "
                f"but the paper divides the scores by sqrt(d_k) = sqrt({d_k}) = {math.sqrt(d_k):.4g}, where "
                f"d_k = q.size(-1) is the size of one query (in multi-head attention d_model / n_heads, not d_model).")
    return None


def _alibi_bias(n_heads: int, size: int) -> Tensor:
    """ALiBi's bias -m_h (i - j) for query i and key j, slopes m_h = 2^(-8 h / n_heads); (1, n_heads, size, size)."""
    slopes = 2.0 ** (-8.0 * torch.arange(1, n_heads + 1) / n_heads)  # (h,)
    distance = torch.arange(size)[:, None] - torch.arange(size)[None, :]  # (T, T): i - j
    return -(slopes[:, None, None] * distance)[None]  # (1, h, T, T)


def grade_attention(fn: Callable[..., tuple[Tensor, Tensor]], seed: int | None = None) -> None:
    """Check fn(q, k, v, mask=None, bias=None) -> (output, weights): softmax(q k^T / sqrt(d_k) + bias) v, the mask
    as in tl.scaled_dot_product_attention, on fresh inputs."""
    g, seed = _generator(seed)

    def randn(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=g)

    def one_winner(batch: int, t_q: int, t_k: int, d_k: int, spread: float, lead: float = 20.0) -> dict:
        """q, k, v drawn again until each query's best score leads the next by lead: its weight is 1 to within
        exp(-lead), so float32's rounding of scores in the hundreds (3e-5) does not show in the result."""
        for _ in range(100):
            case = {"q": spread * randn(batch, t_q, d_k), "k": spread * randn(batch, t_k, d_k),
                    "v": randn(batch, t_k, d_k)}
            top = (case["q"].double() @ case["k"].double().transpose(-2, -1)).topk(2, dim=-1).values
            if (top[..., 0] - top[..., 1]).min() >= lead * math.sqrt(d_k):
                break
        return case

    def masked_winner(batch: int, heads: int, t_q: int, t_k: int, d_k: int, lead: float = 200.0) -> dict:
        """A padding mask that hides the last key, whose score for query 0 is lead: far more than float32's exp
        spans, so a softmax over every key gives query 0's allowed keys weights of exactly 0 before any mask."""
        q, k = randn(batch, heads, t_q, d_k), randn(batch, heads, t_k, d_k)
        first = q[..., 0, :]  # (B, h, d_k): query 0
        k[..., -1, :] = first * (lead * math.sqrt(d_k) / (first * first).sum(-1, keepdim=True))  # its score: lead
        mask = torch.ones(batch, 1, 1, t_k, dtype=torch.bool)  # (B, 1, 1, T_k)
        mask[..., -1] = False
        return {"q": q, "k": k, "v": randn(batch, heads, t_k, d_k), "mask": mask}

    causal = torch.ones(6, 6, dtype=torch.bool).tril()[None, None]  # (1, 1, 6, 6): key j <= query i
    padding = torch.rand(2, 1, 1, 7, generator=g) > 0.5  # (B, 1, 1, T_k): random padding-like mask
    padding[..., 0] = True  # every query keeps at least one key
    lengths = torch.tensor([5, _randint(1, 5, g)])  # two target sentences, the second padded
    target = (torch.arange(5)[None, :] < lengths[:, None])[:, None, None, :] & torch.ones(5, 5, dtype=torch.bool).tril()
    empty_sentence = torch.tensor([True, True, _randint(0, 1, g) == 1, False])[None, None, None, :].repeat(2, 1, 1, 1)
    empty_sentence[1] = False  # (B, 1, 1, T_k): the second sentence has no real token
    segments = torch.tensor([[1, 1, 2, 2, 2, 0], [1, 2, 2, 0, 0, 0]])  # (B, T): two packed sentences, 0 = padding
    packed = ((segments[:, :, None] == segments[:, None, :]) & (segments != 0)[:, :, None]
              & torch.ones(6, 6, dtype=torch.bool).tril())[:, None]  # (B, 1, T, T): a padded query sees nothing
    cases = [
        ("self-attention", {"q": randn(2, 5, 8), "k": randn(2, 5, 8), "v": randn(2, 5, 8)}),
        ("T_q != T_k and d_v != d_k", {"q": randn(2, 3, 16), "k": randn(2, 7, 16), "v": randn(2, 7, 4)}),
        ("a single key", {"q": randn(1, 4, 8), "k": randn(1, 1, 8), "v": randn(1, 1, 8)}),
        ("a single query", {"q": randn(3, 1, 4), "k": randn(3, 6, 4), "v": randn(3, 6, 4)}),
        ("scores of a few hundred, beyond float32's exp (which overflows above about 88)",
         one_winner(2, 4, 6, 8, spread=15.0)),
        ("a padded key that scores 200, far above every allowed key and beyond float32's exp: mask first",
         masked_winner(2, 2, 4, 5, 8)),
        ("a causal mask over 4 heads",
         {"q": randn(2, 4, 6, 8), "k": randn(2, 4, 6, 8), "v": randn(2, 4, 6, 8), "mask": causal}),
        ("a padding mask, T_q != T_k",
         {"q": randn(2, 4, 3, 8), "k": randn(2, 4, 7, 8), "v": randn(2, 4, 7, 5), "mask": padding}),
        ("a decoder mask: padding and causal (B, 1, T, T)",
         {"q": randn(2, 2, 5, 16), "k": randn(2, 2, 5, 16), "v": randn(2, 2, 5, 16), "mask": target}),
        ("a padding mask whose second sentence is all padding: its queries have no allowed key",
         {"q": randn(2, 2, 3, 8), "k": randn(2, 2, 4, 8), "v": randn(2, 2, 4, 8), "mask": empty_sentence}),
        ("packed sentences whose padded queries see no key (B, 1, T, T)",
         {"q": randn(2, 4, 6, 8), "k": randn(2, 4, 6, 8), "v": randn(2, 4, 6, 3), "mask": packed}),
        ("a bias of shape (T_q, T_k) and no mask",
         {"q": randn(2, 5, 8), "k": randn(2, 5, 8), "v": randn(2, 5, 8), "bias": 2 * randn(5, 5)}),
        ("ALiBi's bias, one slope per head, with a causal mask over 4 heads",
         {"q": randn(2, 4, 6, 8), "k": randn(2, 4, 6, 8), "v": randn(2, 4, 6, 8), "mask": causal,
          "bias": _alibi_bias(4, 6)}),
        ("a learned bias per head (1, h, T_q, T_k) with a padding mask, T_q != T_k",
         {"q": randn(2, 4, 3, 8), "k": randn(2, 4, 7, 8), "v": randn(2, 4, 7, 5), "mask": padding,
          "bias": randn(1, 4, 3, 7)}),
        ("a bias on packed sentences whose padded queries see no key",
         {"q": randn(2, 4, 6, 8), "k": randn(2, 4, 6, 8), "v": randn(2, 4, 6, 3), "mask": packed,
          "bias": 3 * randn(1, 4, 6, 6)}),
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
        "a row with no allowed key is left as it is: a finite bias makes all its scores the same number, and the "
        "softmax of equal scores is uniform, 1/T_k on every key; set the weights of masked keys to 0 after the "
        "softmax": _unhandled_empty_rows,
        "the pair is in the wrong order: return (output, weights), not (weights, output)":
            lambda q, k, v, mask=None, bias=None: _attention_variant()(q, k, v, mask, bias)[::-1],
        "the bias is ignored: add it to the scaled scores, softmax(q k^T / sqrt(d_k) + bias)":
            _attention_variant(bias_factor=lambda d_k: 0.0),
        "the bias is divided by sqrt(d_k) with the scores; add it after the scaling, "
        "softmax(q k^T / sqrt(d_k) + bias)": _attention_variant(bias_factor=lambda d_k: 1 / math.sqrt(d_k)),
        "the bias is subtracted from the scores; add it": _attention_variant(bias_factor=lambda d_k: -1.0),
        "the bias is added only when a mask is given; a bias without a mask counts too":
            _attention_variant(bias_only_with_mask=True),
    }
    _run("grade_attention", fn, _reference, cases, seed, hints=hints, item_names=("output", "weights"),
         diagnose=_attention_diagnosis)
