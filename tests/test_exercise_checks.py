"""The named exercise checks of transformer_lib.checks: each passes correct answers (on many seeds), rejects the
usual wrong answers with a message that names the cause, lets a stub's NotImplementedError through and explains
a crash. The wrong answers (mutants) are written here, independently of the hints inside checks.py."""

import json
import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from transformer_lib import checks
from transformer_lib.checks import EXERCISE_CHECKS, ExerciseCheckError

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "book"
SEEDS = range(20)  # a correct answer must pass on every one of them
MUTANT_SEEDS = range(4)  # a wrong answer must fail on every one of them, with the same diagnosis


# ---------------------------------------------------------------------------------------------------------------
# Correct answers, written the way a learner would (not by calling the library function).
# ---------------------------------------------------------------------------------------------------------------


def token_embedding(ids, weight):
    vocab_size, d_model = weight.shape
    return F.one_hot(ids, num_classes=vocab_size).to(weight.dtype) @ weight * math.sqrt(d_model)


def token_embedding_by_indexing(ids, weight):
    return weight[ids] * weight.size(1) ** 0.5


def sinusoidal_float64(max_len, d_model):
    pos = torch.arange(max_len, dtype=torch.float64)
    omega = 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    angle = torch.outer(pos, omega)
    return torch.stack([angle.sin(), angle.cos()], dim=-1).reshape(max_len, d_model).float()


def sinusoidal_float32(max_len, d_model):  # the exp/log form, float32 all the way
    pos = torch.arange(max_len, dtype=torch.float32)[:, None]
    div = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
    pe = torch.zeros(max_len, d_model)
    pe[:, 0::2] = torch.sin(pos * div)
    pe[:, 1::2] = torch.cos(pos * div)
    return pe


def attention(q, k, v, mask=None, divisor=None, dim=-1, fill=float("-inf"), invert=False):
    scores = q @ k.transpose(-2, -1) / (math.sqrt(q.size(-1)) if divisor is None else divisor(q.size(-1)))
    if mask is not None:
        scores = scores.masked_fill(mask if invert else ~mask, fill)
    weights = torch.softmax(scores, dim=dim)
    return weights @ v, weights


def attention_large_negative(q, k, v, mask=None):  # -1e9 instead of -inf: the same weights in float32
    return attention(q, k, v, mask, fill=-1e9)


def causal_mask(size):
    return torch.ones(size, size, dtype=torch.bool).tril()[None, None]


def causal_mask_by_comparison(size):
    i = torch.arange(size)
    return (i[None, :] <= i[:, None]).view(1, 1, size, size)


def padding_mask(ids, pad_id):
    return (ids != pad_id)[:, None, None, :]


def split_heads(x, n_heads):
    batch, length, d_model = x.shape
    return x.view(batch, length, n_heads, d_model // n_heads).transpose(1, 2)


def split_heads_by_chunks(x, n_heads):
    return torch.stack(x.chunk(n_heads, dim=-1), dim=1)


def blockwise(q, k, v, block_size, rescale=True, divide=True, scale=True, skip_last=False, add=0.0):
    m = q.new_full((*q.shape[:-1], 1), float("-inf"))
    total, out = q.new_zeros((*q.shape[:-1], 1)), q.new_zeros((*q.shape[:-1], v.size(-1)))
    stop = k.size(-2) - block_size + 1 if skip_last else k.size(-2)
    for start in range(0, stop, block_size):
        s = q @ k[..., start : start + block_size, :].transpose(-2, -1) / (math.sqrt(q.size(-1)) if scale else 1.0)
        m_new = torch.maximum(m, s.amax(-1, keepdim=True))
        factor = torch.exp(m - m_new) if rescale else 1.0
        p = torch.exp(s - m_new)
        total = total * factor + p.sum(-1, keepdim=True)
        out = out * factor + p @ v[..., start : start + block_size, :]
        m = m_new
    return (out / total if divide else out) + add


def sublayer_connection(x, sublayer, norm, dropout, norm_first):
    if norm_first:
        return x + dropout(sublayer(norm(x)))
    return norm(x + dropout(sublayer(x)))


def smoothed_loss(logits, labels, pad_id, eps):
    log_p = torch.log_softmax(logits, dim=-1)
    nll = -log_p.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    per_token = (1 - eps) * nll + eps * -log_p.mean(dim=-1)
    return per_token[labels != pad_id].mean()


def smoothed_loss_with_targets(logits, labels, pad_id, eps, spread=None, dim=-1, positions="real", reduce="mean"):
    vocab = logits.size(-1)
    log_p = torch.log_softmax(logits, dim=dim)
    on_label, on_others = (1 - eps + eps / vocab, eps / vocab) if spread is None else spread(eps, vocab)
    q = torch.full_like(log_p, on_others).scatter(-1, labels.unsqueeze(-1), on_label)
    per_token = -(q * log_p).sum(dim=-1)  # (B, T)
    kept = per_token if positions == "all" else per_token[labels != pad_id]
    return kept.sum() if reduce == "sum" else kept.mean()


def best_beam(scores, lengths, alpha):
    return (scores / ((5.0 + lengths.float()) / 6.0) ** alpha).argmax(dim=1)


def head_entropy(weights):
    return -torch.special.xlogy(weights, weights).sum(dim=-1).mean(dim=(0, 2))


def head_entropy_masked_log(weights):  # log only where the weight is positive
    logs = torch.where(weights > 0, weights.log(), torch.zeros_like(weights))
    return -(weights * logs).sum(dim=-1).mean(dim=(0, 2))


CORRECT = {
    "check_token_embedding": [token_embedding, token_embedding_by_indexing],
    "check_sinusoidal_encoding": [sinusoidal_float64, sinusoidal_float32],
    "check_attention": [attention, attention_large_negative],
    "check_causal_mask": [causal_mask, causal_mask_by_comparison],
    "check_padding_mask": [padding_mask],
    "check_split_heads": [split_heads, split_heads_by_chunks],
    "check_blockwise_attention": [blockwise],
    "check_sublayer_connection": [sublayer_connection],
    "check_label_smoothed_loss": [smoothed_loss, smoothed_loss_with_targets],
    "check_best_beam": [best_beam],
    "check_attention_entropy": [head_entropy, head_entropy_masked_log],
}


# ---------------------------------------------------------------------------------------------------------------
# Wrong answers: (what the learner got wrong, the function, a phrase the message must contain).
# Phrases after "Likely cause" come from the check's hints; the others from the engine's own description.
# ---------------------------------------------------------------------------------------------------------------


def square(size, dtype=torch.bool):
    return torch.ones(size, size, dtype=dtype)


def attention_scaling_q_in_place(q, k, v, mask=None):
    q /= math.sqrt(q.size(-1))  # changes the caller's tensor
    return attention(q, k, v, mask, divisor=lambda d_k: 1.0)


def sinusoidal_exp_form_without_minus(max_len, d_model):
    div = torch.exp(torch.arange(0, d_model, 2).float() * (math.log(10000.0) / d_model))  # should be -log(10000)
    angle = torch.outer(torch.arange(max_len).float(), div)  # (max_len, d_model/2)
    return torch.stack([angle.sin(), angle.cos()], dim=-1).reshape(max_len, d_model)


def sinusoidal_base_1000(max_len, d_model):
    angle = torch.outer(torch.arange(max_len).double(), 1000.0 ** (-torch.arange(0, d_model, 2).double() / d_model))
    return torch.stack([angle.sin(), angle.cos()], dim=-1).reshape(max_len, d_model).float()


def attention_without_normalising(q, k, v, mask=None):
    weights = (q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))).exp()  # forgot to divide by the row sums
    return weights @ v, weights


MUTANTS = {
    "check_token_embedding": [
        ("not scaled", lambda ids, weight: weight[ids], r"Likely cause: the embeddings are not scaled"),
        ("times d_model", lambda ids, weight: weight[ids] * weight.size(1), r"Likely cause: .*multiplied by d_model"),
        ("divided by sqrt", lambda ids, weight: weight[ids] / math.sqrt(weight.size(1)),
         r"Likely cause: .*divided by sqrt\(d_model\) instead of multiplied"),
        ("one_hot without num_classes",
         lambda ids, weight: F.one_hot(ids).float() @ weight * math.sqrt(weight.size(1)),
         r"ids that use only the first 10 of the table's 40 rows.*your function raised RuntimeError"),
        ("off by a small constant", lambda ids, weight: token_embedding(ids, weight) + 1e-3,
         r"values differ.*\nEvery value you return is the expected one plus 0\.001"),
        ("float64", lambda ids, weight: token_embedding(ids, weight).double(),
         r"expected dtype torch\.float32, got torch\.float64"),
        ("one-hot vectors only", lambda ids, weight: F.one_hot(ids, weight.size(0)).float(),
         r"expected shape .*\nLikely cause: the result still has one entry per word of the vocabulary"),
    ],
    "check_sinusoidal_encoding": [
        ("exponent i/d_model", lambda max_len, d_model: sinusoidal_float64(max_len, 2 * d_model)[:, :d_model],
         r"Likely cause: the exponent is i/d_model instead of 2i/d_model"),
        ("sine and cosine swapped",
         lambda max_len, d_model: sinusoidal_float64(max_len, d_model)[:, torch.arange(d_model) ^ 1],
         r"Likely cause: sine and cosine are swapped"),
        ("sines then cosines",
         lambda max_len, d_model: torch.cat([sinusoidal_float64(max_len, d_model)[:, 0::2],
                                             sinusoidal_float64(max_len, d_model)[:, 1::2]], dim=1),
         r"Likely cause: all sines come first"),
        ("positions from 1", lambda max_len, d_model: sinusoidal_float64(max_len + 1, d_model)[1:],
         r"Likely cause: the positions start at 1"),
        ("exp form without its minus sign", sinusoidal_exp_form_without_minus, r"Likely cause: .*lost its minus sign"),
        ("base 1000 instead of 10000", sinusoidal_base_1000,
         r"values differ.*\nDimensions 0 and 1 \(i = 0, frequency 1\) are right, but dimension \d+ \(i = \d+\) is not"),
        ("float64", lambda max_len, d_model: sinusoidal_float64(max_len, d_model).double(),
         r"expected dtype torch\.float32, got torch\.float64"),
        ("transposed", lambda max_len, d_model: sinusoidal_float64(max_len, d_model).T,
         r"expected shape \(1, 2\), got \(2, 1\)\nYou have the right sizes in a different order"),
    ],
    "check_attention": [
        ("divided by d_k", lambda q, k, v, mask=None: attention(q, k, v, mask, divisor=lambda d_k: d_k),
         r"Likely cause: the scores are divided by d_k; the paper divides them by sqrt\(d_k\)"),
        ("not scaled", lambda q, k, v, mask=None: attention(q, k, v, mask, divisor=lambda d_k: 1.0),
         r"Likely cause: the scores are not scaled"),
        ("scaled by sqrt(d_model) with d_model = 512",
         lambda q, k, v, mask=None: attention(q, k, v, mask, divisor=lambda d_k: math.sqrt(512)),
         r"Likely cause: your weights are softmax\(q k\^T / 22\.63\) \(= sqrt\(512\)\), but the paper divides the "
         r"scores by sqrt\(d_k\) = sqrt\(8\)"),
        ("softmax over the queries", lambda q, k, v, mask=None: attention(q, k, v, mask, dim=-2),
         r"Likely cause: the softmax runs over the queries \(dim=-2\)"),
        ("mask inverted", lambda q, k, v, mask=None: attention(q, k, v, mask, invert=True),
         r"Likely cause: masked_fill put -inf where the mask is True"),
        ("masked scores set to 0", lambda q, k, v, mask=None: attention(q, k, v, mask, fill=0.0),
         r"Likely cause: the masked scores are set to 0"),
        ("masked scores set to -5", lambda q, k, v, mask=None: attention(q, k, v, mask, fill=-5.0),
         r"a causal mask over 4 heads.*\nLikely cause: query position \d+ gives weight [\d.e-]+ to key position \d+, "
         r"which the mask forbids"),
        ("returns (weights, output)", lambda q, k, v, mask=None: attention(q, k, v, mask)[::-1],
         r"Likely cause: the pair is in the wrong order"),
        ("returns the output only", lambda q, k, v, mask=None: attention(q, k, v, mask)[0],
         r"expected a tuple of 2 values, got tensor of shape \(2, 5, 8\).*\nReturn a tuple of 2 tensors"),
        ("weights not normalised", attention_without_normalising,
         r"item 0 \(output\).*\nIn item 1 \(weights\): each row of the reference sums to 1 over the last dimension "
         r"\(dim=-1\); your rows sum to values between"),
        ("output off by a small constant", lambda q, k, v, mask=None: (attention(q, k, v, mask)[0] + 1e-3,
                                                                       attention(q, k, v, mask)[1]),
         r"item 0 \(output\): 80 of 80 values differ.*\nEvery value you return is the expected one plus 0\.001"),
        ("changes q in place", attention_scaling_q_in_place, r"changed its argument 'q' in place"),
    ],
    "check_causal_mask": [
        ("upper triangle", lambda size: square(size).triu()[None, None], r"Likely cause: you kept the upper triangle"),
        ("inverted", lambda size: ~square(size).tril()[None, None], r"Likely cause: the mask is inverted"),
        ("diagonal excluded", lambda size: square(size).tril(-1)[None, None],
         r"your mask stops position 0 from seeing position 0 \(itself\).*\nLikely cause: the diagonal is excluded"),
        ("no singleton dimensions", lambda size: square(size).tril(), r"Likely cause: the singleton batch and head"),
        ("float mask", lambda size: square(size, torch.float32).tril()[None, None],
         r"Likely cause: the mask is not boolean"),
        ("off by one diagonal", lambda size: square(size).tril(1)[None, None],
         r"case 2 of 7 \(size=2\): 1 entry differs; the first is at index \(0, 0, 0, 1\): expected False, got True\n"
         r"In words: your mask lets position 0 see position 1 \(a later position\)\."),
        ("everything allowed", lambda size: square(size)[None, None],
         r"In words: your mask lets position 0 see position 1 \(a later position\)"),
        ("one singleton dimension", lambda size: square(size).tril()[None],
         r"expected shape \(1, 1, 1, 1\), got \(1, 1, 1\)\nThe sizes other than 1 are right, but 1 dimension of "
         r"size 1 is missing"),
        ("int64 mask", lambda size: square(size, torch.long).tril()[None, None],
         r"expected dtype torch\.bool, got torch\.int64\nA mask holds True and False"),
    ],
    "check_padding_mask": [
        ("inverted", lambda ids, pad_id: (ids == pad_id)[:, None, None, :], r"Likely cause: the mask is inverted"),
        ("no singleton dimensions", lambda ids, pad_id: ids != pad_id, r"Likely cause: the singleton head and query"),
        ("keys on the wrong axis", lambda ids, pad_id: (ids != pad_id)[:, None, :, None],
         r"Likely cause: the singleton dimensions are in the wrong place"),
        ("one singleton dimension", lambda ids, pad_id: (ids != pad_id).unsqueeze(1),
         r"Likely cause: only one singleton dimension was added"),
        ("pad id hard-coded", lambda ids, pad_id: (ids != 0)[:, None, None, :],
         r"Likely cause: the padding id is hard-coded as 0"),
        ("ids > pad_id", lambda ids, pad_id: (ids > pad_id)[:, None, None, :],
         r"padding id 1; token id 0 is a word here.*\nIn words: in batch row \d+: your mask stops every query from "
         r"seeing key position \d+.*\nids\[\d+, \d+\] = 0 is a real token \(the padding id is 1\)"),
        ("int64 mask", lambda ids, pad_id: (ids != pad_id).long()[:, None, None, :],
         r"expected dtype torch\.bool, got torch\.int64"),
        ("last real token masked", lambda ids, pad_id: (torch.arange(ids.size(1)) < (ids != pad_id).sum(1, keepdim=True)
                                                      - 1)[:, None, None, :],
         r"your mask stops every query from seeing key position \d+"),
    ],
    "check_split_heads": [
        ("view without transpose", lambda x, n_heads: x.reshape(x.size(0), n_heads, x.size(1), -1),
         r"Likely cause: x\.view\(B, n_heads, T, d_k\) cuts the heads across positions"),
        ("strided features", lambda x, n_heads: x.view(*x.shape[:2], -1, n_heads).permute(0, 3, 1, 2),
         r"Likely cause: head i got every n_heads-th feature"),
        ("heads not moved", lambda x, n_heads: x.view(*x.shape[:2], n_heads, -1),
         r"Likely cause: the heads are not moved in front of the positions"),
        ("(B, h, d_k, T)", lambda x, n_heads: x.view(*x.shape[:2], n_heads, -1).permute(0, 2, 3, 1),
         r"expected shape \(2, 4, 5, 4\), got \(2, 4, 4, 5\)\nYou have the right sizes in a different order"),
        ("off by a small constant", lambda x, n_heads: split_heads(x, n_heads) + 1e-3,
         r"Every value you return is the expected one plus 0\.001"),
    ],
    "check_blockwise_attention": [
        ("no rescaling", lambda q, k, v, block_size: blockwise(q, k, v, block_size, rescale=False),
         r"Likely cause: the running sum and output are not rescaled"),
        ("no final division", lambda q, k, v, block_size: blockwise(q, k, v, block_size, divide=False),
         r"Likely cause: the output is not divided by the running sum"),
        ("not scaled", lambda q, k, v, block_size: blockwise(q, k, v, block_size, scale=False),
         r"Likely cause: the scores are not scaled"),
        ("last block left out", lambda q, k, v, block_size: blockwise(q, k, v, block_size, skip_last=True),
         r"Likely cause: the last, shorter block is left out"),
        ("a softmax per block, summed", lambda q, k, v, block_size: sum(
            torch.softmax(q @ k[..., s : s + block_size, :].transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1)
            @ v[..., s : s + block_size, :] for s in range(0, k.size(-2), block_size)),
         r"case 1 of 7 \(the last block is shorter .*\): \d+ of 320 values differ"),
        ("off by a small constant", lambda q, k, v, block_size: blockwise(q, k, v, block_size, add=1e-3),
         r"Every value you return is the expected one plus 0\.001"),
    ],
    "check_sublayer_connection": [
        ("norms swapped", lambda x, sublayer, norm, dropout, norm_first: sublayer_connection(
            x, sublayer, norm, dropout, not norm_first), r"Likely cause: post-norm and pre-norm are swapped"),
        ("no residual", lambda x, sublayer, norm, dropout, norm_first: (
            dropout(sublayer(norm(x))) if norm_first else norm(dropout(sublayer(x)))),
         r"Likely cause: the residual connection is missing"),
        ("pre-norm adds LayerNorm(x)", lambda x, sublayer, norm, dropout, norm_first: (
            norm(x) + dropout(sublayer(norm(x))) if norm_first else norm(x + dropout(sublayer(x)))),
         r"Likely cause: the pre-norm residual adds LayerNorm\(x\) instead of x"),
        ("pre-norm normalises the sum too", lambda x, sublayer, norm, dropout, norm_first: (
            norm(x + dropout(sublayer(norm(x)))) if norm_first else norm(x + dropout(sublayer(x)))),
         r"Likely cause: pre-norm also normalises the sum"),
        ("dropout after the addition", lambda x, sublayer, norm, dropout, norm_first: (
            dropout(x + sublayer(norm(x))) if norm_first else norm(dropout(x + sublayer(x)))),
         r"dropout 0\.5 in training mode.*\nLikely cause: dropout is applied after the residual addition"),
        ("no dropout", lambda x, sublayer, norm, dropout, norm_first: (
            x + sublayer(norm(x)) if norm_first else norm(x + sublayer(x))),
         r"Likely cause: dropout is left out"),
        ("a new LayerNorm instead of norm", lambda x, sublayer, norm, dropout, norm_first: sublayer_connection(
            x, sublayer, torch.nn.LayerNorm(x.size(-1)), dropout, norm_first),
         r"case 1 of 8 \(x: shape \(2, 5, 16\), sublayer: Linear, norm: LayerNorm, dropout: Dropout\(p=0\.0\), "
         r"norm_first=False\): 160 of 160 values differ"),
        ("float64", lambda x, sublayer, norm, dropout, norm_first: sublayer_connection(
            x, sublayer, norm, dropout, norm_first).double(), r"expected dtype torch\.float32, got torch\.float64"),
    ],
    "check_label_smoothed_loss": [
        ("mean over padding too", lambda logits, labels, pad_id, eps: smoothed_loss_with_targets(
            logits, labels, pad_id, eps, positions="all"), r"Likely cause: the mean includes the padded positions"),
        ("eps over V - 1 classes", lambda logits, labels, pad_id, eps: smoothed_loss_with_targets(
            logits, labels, pad_id, eps, spread=lambda eps, vocab: (1 - eps, eps / (vocab - 1))),
         r"Likely cause: eps is spread over the V - 1 wrong classes"),
        ("no smoothing", lambda logits, labels, pad_id, eps: smoothed_loss(logits, labels, pad_id, 0.0),
         r"Likely cause: the loss has no label smoothing"),
        ("eps not divided by V", lambda logits, labels, pad_id, eps: smoothed_loss_with_targets(
            logits, labels, pad_id, eps, spread=lambda eps, vocab: (1.0, eps)),
         r"Likely cause: eps is added to every class without dividing by V"),
        ("summed", lambda logits, labels, pad_id, eps: smoothed_loss_with_targets(
            logits, labels, pad_id, eps, reduce="sum"), r"Likely cause: the losses of the real positions are summed"),
        ("log-softmax over the positions", lambda logits, labels, pad_id, eps: smoothed_loss_with_targets(
            logits, labels, pad_id, eps, dim=1), r"Likely cause: the log-softmax runs over the positions \(dim=1\)"),
        ("a mean of sentence means", lambda logits, labels, pad_id, eps: torch.stack([
            smoothed_loss(logits[b : b + 1], labels[b : b + 1], pad_id, eps) for b in range(labels.size(0))
            if (labels[b] != pad_id).any()]).mean(), r"Likely cause: each sentence is averaged first"),
        (".item()", lambda logits, labels, pad_id, eps: smoothed_loss(logits, labels, pad_id, eps).item(),
         r"expected tensor of shape \(\) and dtype torch\.float32, got float .*\nReturn a tensor, not a Python number"),
        ("shape (1,)", lambda logits, labels, pad_id, eps: smoothed_loss(logits, labels, pad_id, eps).reshape(1),
         r"expected shape \(\), got \(1,\)\nThe reference returns a single number as a tensor of shape \(\)"),
        ("probabilities instead of log-probabilities", lambda logits, labels, pad_id, eps: smoothed_loss(
            logits.softmax(-1).log().exp(), labels, pad_id, eps),
         r"case 1 of 7 \(logits: shape \(2, 5, 7\), labels: shape \(2, 5\), pad_id=0, eps=0\.1\): the value differs, "
         r"by up to [\d.]+; at index \(\) expected [\d.]+, got [\d.]+"),
    ],
    "check_best_beam": [
        ("divided by the length", lambda scores, lengths, alpha: (scores / lengths).argmax(dim=1),
         r"Likely cause: the scores are divided by the length itself"),
        ("multiplied by the penalty", lambda scores, lengths, alpha: (
            scores * ((5.0 + lengths) / 6.0) ** alpha).argmax(dim=1),
         r"Likely cause: the scores are multiplied by the penalty"),
        ("argmin", lambda scores, lengths, alpha: (scores / ((5.0 + lengths) / 6.0) ** alpha).argmin(dim=1),
         r"Likely cause: argmin instead of argmax"),
        ("no penalty", lambda scores, lengths, alpha: scores.argmax(dim=1),
         r"Likely cause: the length penalty is left out"),
        ("no exponent", lambda scores, lengths, alpha: (scores / ((5.0 + lengths) / 6.0)).argmax(dim=1),
         r"Likely cause: the exponent alpha is missing"),
        ("argmax over the sentences", lambda scores, lengths, alpha: (
            scores / ((5.0 + lengths) / 6.0) ** alpha).argmax(dim=0),
         r"Likely cause: the argmax runs over the sentences"),
        ("length ** alpha", lambda scores, lengths, alpha: (scores / lengths.float() ** alpha).argmax(dim=1),
         r"values differ.*\nFor sentence \d+ you picked hypothesis \d+ \(log-probability [-\d.]+, length \d+, "
         r"penalised score [-\d.e]+\); the best is hypothesis \d+"),
        ("int32", lambda scores, lengths, alpha: best_beam(scores, lengths, alpha).int(),
         r"expected dtype torch\.int64, got torch\.int32\nIndices are torch\.long"),
        ("keepdim", lambda scores, lengths, alpha: (scores / ((5.0 + lengths) / 6.0) ** alpha).argmax(1, keepdim=True),
         r"expected shape \(1,\), got \(1, 1\)\nThe sizes other than 1 are right, but you have 1 extra dimension"),
        ("the penalised scores instead of the index", lambda scores, lengths, alpha: (
            scores / ((5.0 + lengths) / 6.0) ** alpha).amax(dim=1), r"expected dtype torch\.int64, got torch\.float32"),
    ],
    "check_attention_entropy": [
        ("0 log 0 = NaN", lambda weights: -(weights * weights.log()).sum(-1).mean(dim=(0, 2)),
         r"your result contains NaN.*\nLikely cause: log\(0\) = -inf"),
        ("bits", lambda weights: -(torch.special.xlogy(weights, weights) / math.log(2)).sum(-1).mean(dim=(0, 2)),
         r"Likely cause: the entropy is in bits"),
        ("queries summed", lambda weights: -torch.special.xlogy(weights, weights).sum(-1).sum(2).mean(0),
         r"Likely cause: the entropies of the queries are summed"),
        ("mean over the keys", lambda weights: -torch.special.xlogy(weights, weights).mean(-1).mean(dim=(0, 2)),
         r"Likely cause: the terms a log a are averaged over the keys"),
        ("no minus sign", lambda weights: torch.special.xlogy(weights, weights).sum(-1).mean(dim=(0, 2)),
         r"Likely cause: the minus sign is missing"),
        ("averaged over the heads too", lambda weights: head_entropy(weights).mean(),
         r"expected shape \(\d+,\), got \(\)\nLikely cause: the entropies are averaged over the heads too"),
        ("log(w + 1e-3)", lambda weights: -(weights * (weights + 1e-3).log()).sum(-1).mean(dim=(0, 2)),
         r"case 1 of 7 \(weights: shape \(2, 4, 5, 5\)\): \d of 4 values differ"),
        ("one value per sentence and head", lambda weights: -torch.special.xlogy(weights, weights).sum(-1).mean(2),
         r"expected shape \(4,\), got \(2, 4\)"),
    ],
}


# ---------------------------------------------------------------------------------------------------------------
# The tests.
# ---------------------------------------------------------------------------------------------------------------


def named_checks() -> list[str]:
    return sorted(name for name in dir(checks) if name.startswith("check_") and name != "check_against")


def test_every_named_check_is_tested_and_belongs_to_an_exercise():
    assert sorted(CORRECT) == sorted(MUTANTS) == named_checks() == sorted(f.__name__ for f in EXERCISE_CHECKS.values())
    for name in named_checks():
        assert len(MUTANTS[name]) >= 3, f"{name} needs at least three wrong answers"


@pytest.mark.parametrize("check_name", sorted(CORRECT))
def test_correct_answers_pass_on_every_seed(check_name, capsys):
    check = getattr(checks, check_name)
    for answer in CORRECT[check_name]:
        for seed in SEEDS:
            check(answer, seed=seed)
            out = capsys.readouterr().out
            assert out.startswith(f"Well done: {answer.__name__} matches the reference on all "), (answer, seed, out)
    check(CORRECT[check_name][0])  # and with fresh inputs, as in the notebooks
    assert "Well done" in capsys.readouterr().out


@pytest.mark.parametrize(
    "check_name, what, mutant, phrase",
    [(name, what, mutant, phrase) for name, rows in MUTANTS.items() for what, mutant, phrase in rows],
    ids=[f"{name.removeprefix('check_')}-{what}" for name, rows in MUTANTS.items() for what, _, _ in rows],
)
def test_wrong_answers_are_rejected_with_the_likely_cause(check_name, what, mutant, phrase):
    check = getattr(checks, check_name)
    for seed in MUTANT_SEEDS:
        with pytest.raises(ExerciseCheckError) as error:
            check(mutant, seed=seed)
        message = str(error.value)
        assert re.search(phrase, message), f"seed {seed}: {what!r} gave\n{message}\nwithout {phrase!r}"
        assert f"{check_name}({mutant.__name__}, seed={seed})" in message  # how to repeat the same inputs


@pytest.mark.parametrize("check_name", named_checks())
def test_a_stub_propagates_not_implemented_error(check_name):
    def stub(*args, **kwargs):
        raise NotImplementedError("Exercise: write it")

    with pytest.raises(NotImplementedError, match="Exercise: write it"):
        getattr(checks, check_name)(stub)


@pytest.mark.parametrize("check_name", named_checks())
def test_a_crash_is_reported_with_the_error_and_the_input(check_name):
    def crashes(*args, **kwargs):
        return 1 / 0

    with pytest.raises(ExerciseCheckError, match=r"crashes, case 1 of \d+ \(.*\): your function raised "
                                                 r"ZeroDivisionError: division by zero") as error:
        getattr(checks, check_name)(crashes)
    assert isinstance(error.value.__cause__, ZeroDivisionError)  # the learner's traceback is kept


def test_wrong_parameter_names_are_explained():
    def my_split_heads(x, heads):
        return split_heads(x, heads)

    with pytest.raises(ExerciseCheckError, match=r"unexpected keyword argument 'n_heads'\nThe check passes the "
                                                 r"arguments by name \(x, n_heads\)"):
        checks.check_split_heads(my_split_heads)


def test_something_that_is_not_a_function_is_refused():
    with pytest.raises(TypeError, match="fn must be the function you wrote"):
        checks.check_causal_mask(torch.ones(3))


def test_inputs_are_fresh_on_every_call_and_repeatable_with_a_seed():
    seen = []

    def spy(q, k, v, mask=None):
        seen.append(q)
        return attention(q, k, v, mask)

    for seed in (None, None, 7, 7):
        checks.check_attention(spy, seed=seed)
    cases = len(seen) // 4
    first = [seen[call * cases] for call in range(4)]  # the q of the first case of each call
    assert not torch.equal(first[0], first[1]), "two calls without a seed drew the same inputs"
    assert torch.equal(first[2], first[3]), "the same seed must give the same inputs"


def test_the_global_random_state_is_left_alone():
    torch.manual_seed(0)
    before = torch.rand(3)
    torch.manual_seed(0)
    for check_name, answers in CORRECT.items():
        getattr(checks, check_name)(answers[0])
    assert torch.equal(torch.rand(3), before), "a check changed the notebook's random numbers"


@pytest.mark.parametrize("label", sorted(EXERCISE_CHECKS))
def test_each_exercise_calls_its_named_check_in_stub_and_solution(label):
    check_name = EXERCISE_CHECKS[label].__name__
    for path in sorted(BOOK.glob("[0-9][0-9]_*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        starts = [i for i, c in enumerate(cells) if c["cell_type"] == "markdown"
                  and re.search(rf"^:label: {re.escape(label)}$", "".join(c["source"]), re.M)]
        if starts:
            break
    else:
        pytest.fail(f"no notebook has the exercise {label}")
    after = cells[starts[0] + 1 :]
    stub = next(c for c in after if "raises-exception" in c.get("metadata", {}).get("tags", []))
    solution = next(c for c in after if c["cell_type"] == "code" and "solution" in c["metadata"].get("tags", []))
    for cell in (stub, solution):
        assert re.search(rf"\b{check_name}\(my_\w+\)", "".join(cell["source"])), (path.name, label, cell["id"])


def test_every_test_named_in_the_common_bugs_appendix_exists():
    text = (BOOK / "appendix_common_bugs.md").read_text(encoding="utf-8")
    named = set(re.findall(r"(tests/test_\w+\.py)::(\w+)", text))
    assert len(named) >= 10, "the appendix should name the tests that catch each bug"
    for path, test in sorted(named):
        source = (ROOT / path).read_text(encoding="utf-8")
        assert re.search(rf"^(?:async )?def {test}\(", source, re.M), f"{path}::{test} does not exist"
    checks_named = set(re.findall(r"\b(check_\w+)\b", text)) - {"check_against", "check_mask"}
    assert checks_named and checks_named <= set(named_checks()), checks_named - set(named_checks())
