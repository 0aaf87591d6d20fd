"""The exercise graders of transformer_lib.grading: each passes correct answers (on many seeds), rejects the
usual wrong answers with a message that names the cause, says in one line that an untouched stub (one that raises
NotImplementedError) is not attempted yet, without raising, and explains a crash. The wrong answers (mutants) are written here, independently of the hints inside transformer_lib/grading/."""

import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import transformer_lib as tl
from transformer_lib import grading
from transformer_lib.grading import EXERCISE_GRADERS, ExerciseGradeError

ROOT = Path(__file__).resolve().parent.parent
BOOK = ROOT / "book"
SEEDS = range(20)  # a correct answer must pass on every one of them
MUTANT_SEEDS = range(4)  # a wrong answer must fail on every one of them, with the same diagnosis


# ---------------------------------------------------------------------------------------------------------------
# Correct answers, written the way a learner would (not by calling the library function).
# ---------------------------------------------------------------------------------------------------------------


def bpe_segment(word, merges):  # apply each merge, in the order learned, wherever it fits
    symbols = list(word) + ["</w>"]
    for left, right in merges:
        i = 0
        while i < len(symbols) - 1:
            if symbols[i] == left and symbols[i + 1] == right:
                symbols[i : i + 2] = [left + right]
            i += 1
    return symbols


def bpe_segment_by_rank(word, merges):  # repeatedly merge the present pair with the best (lowest) rank
    rank = {pair: r for r, pair in enumerate(merges)}
    symbols = [*word, "</w>"]
    while True:
        present = [(rank[p], i) for i, p in enumerate(zip(symbols, symbols[1:])) if p in rank]
        if not present:
            return symbols
        best = min(present)[0]
        pair, out, i = merges[best], [], 0
        while i < len(symbols):
            if tuple(symbols[i : i + 2]) == pair:
                out.append(symbols[i] + symbols[i + 1])
                i += 2
            else:
                out.append(symbols[i])
                i += 1
        symbols = out


def ids_from_embeddings(vectors, weight):  # undo the scale, then the nearest row by Euclidean distance
    rows = (vectors / math.sqrt(weight.size(1))).reshape(-1, weight.size(1))  # (N, d_model)
    return torch.cdist(rows, weight).argmin(dim=-1).view(vectors.shape[:-1])


def ids_from_embeddings_by_expansion(vectors, weight):  # |x - w|^2 = |x|^2 - 2 x.w + |w|^2, |x|^2 the same for all w
    scores = vectors @ weight.T / math.sqrt(weight.size(1)) - 0.5 * (weight * weight).sum(dim=-1)
    return scores.argmax(dim=-1)


def shift_encoding(pe, k):  # each pair (s, c) -> (s cos + c sin, c cos - s sin), in float64
    d_model = pe.size(-1)
    angle = k * 10000.0 ** (-torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)  # (d_model/2,)
    s, c = pe[..., 0::2].double(), pe[..., 1::2].double()
    out = torch.empty(pe.shape, dtype=torch.float64)
    out[..., 0::2] = s * angle.cos() + c * angle.sin()
    out[..., 1::2] = c * angle.cos() - s * angle.sin()
    return out.to(pe.dtype)


def shift_encoding_as_complex(pe, k):  # a pair as cos + i sin, times e^(i k omega): float32 all the way
    d_model = pe.size(-1)
    omega = torch.exp(-torch.arange(0, d_model, 2).float() / d_model * math.log(10000.0))  # (d_model/2,)
    z = torch.complex(pe[..., 1::2], pe[..., 0::2]) * torch.polar(torch.ones_like(omega), k * omega)
    return torch.stack([z.imag, z.real], dim=-1).flatten(-2)


def attention(q, k, v, mask=None, bias=None, divisor=None, dim=-1, fill=float("-inf"), invert=False):
    scores = q @ k.transpose(-2, -1) / (math.sqrt(q.size(-1)) if divisor is None else divisor(q.size(-1)))
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        scores = scores.masked_fill(mask if invert else ~mask, fill)
    weights = torch.softmax(scores, dim=dim).nan_to_num(0.0)  # a row with no allowed key: 0/0 -> 0
    return weights @ v, weights


def attention_additive_bias(q, k, v, mask=None, bias=None):  # one finite float term, masked weights set to 0 after
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        mask_term = torch.where(mask, 0.0, torch.finfo(scores.dtype).min)
        bias = mask_term if bias is None else bias + mask_term
    if bias is not None:
        scores = scores + bias
    weights = torch.softmax(scores, dim=-1)
    if mask is not None:
        weights = weights * mask
    return weights @ v, weights


def attention_masked_after_softmax(q, k, v, mask=None, bias=None):  # softmax over all keys, masked, renormalised: wrong
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    weights = torch.softmax(scores if bias is None else scores + bias, dim=-1)
    if mask is not None:
        weights = weights * mask
        weights = (weights / weights.sum(-1, keepdim=True)).nan_to_num(0.0)  # a row with no allowed key: 0/0 -> 0
    return weights @ v, weights


def attention_bias_as_factor(q, k, v, mask=None, bias=None):  # softmax(s) times e^b, masked, renormalised: wrong too
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)), dim=-1)
    if bias is not None:
        weights = weights * (bias - bias.amax(dim=-1, keepdim=True)).exp()  # e^(b - max b) <= 1: no overflow
    if mask is not None:
        weights = weights * mask
    weights = (weights / weights.sum(-1, keepdim=True)).nan_to_num(0.0)
    return weights @ v, weights


def attention_bias_not_zeroed(q, k, v, mask=None, bias=None):  # -1e9 added, nothing else: empty rows come out uniform
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        scores = scores + (~mask).float() * -1e9
    weights = torch.softmax(scores, dim=-1)
    return weights @ v, weights


def attention_output_not_zeroed(q, k, v, mask=None, bias=None):  # weights zeroed, output computed before that
    output, weights = attention_bias_not_zeroed(q, k, v, mask, bias)
    return output, weights if mask is None else weights * mask


def _added_mask(q, k, v, mask):  # the boolean mask added as 0/1 instead of turned into a bias
    weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.size(-1)) + mask.float(), dim=-1)
    return weights @ v, weights


def attention_exp_without_max(q, k, v, mask=None, bias=None):  # exp(s) / sum exp(s): overflows for scores above 88
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        scores = scores + torch.where(mask, 0.0, torch.finfo(scores.dtype).min)
    e = torch.exp(scores)
    weights = e / e.sum(dim=-1, keepdim=True)
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)  # a row with no allowed key: 0/0 -> 0
    return weights @ v, weights


def attention_nan_rows(q, k, v, mask=None, bias=None):  # -inf and no repair: 0/0 on a row with no allowed key
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if bias is not None:
        scores = scores + bias
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = scores.softmax(dim=-1)
    return weights @ v, weights


def attention_bias_before_scaling(q, k, v, mask=None, bias=None):  # (q k^T + bias) / sqrt(d_k)
    scores = q @ k.transpose(-2, -1)
    if bias is not None:
        scores = scores + bias
    return attention_from_scores(scores / math.sqrt(q.size(-1)), v, mask)


def attention_bias_with_mask_only(q, k, v, mask=None, bias=None):  # the bias folded into the mask's branch
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if mask is not None:
        scores = scores + (0.0 if bias is None else bias)
    return attention_from_scores(scores, v, mask)


def attention_bias_into_mask_in_place(q, k, v, mask=None, bias=None):  # writes the mask into the caller's bias
    if bias is not None and mask is not None:
        bias.masked_fill_(~mask, torch.finfo(bias.dtype).min)  # broadcasts over the bias when the shapes allow
    return attention(q, k, v, mask, bias)


def attention_bias_on_weights(q, k, v, mask=None, bias=None):  # the bias added after the softmax, renormalised
    weights = attention(q, k, v, mask)[1]
    if bias is not None:
        weights = (weights + bias.softmax(dim=-1)) / 2
        if mask is not None:
            weights = weights * mask
    return weights @ v, weights


def attention_from_scores(scores, v, mask):  # the chapter's masking on given scores
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)
    return weights @ v, weights


def packed_mask(segments):
    size = segments.size(1)
    same = segments.unsqueeze(2) == segments.unsqueeze(1)  # (B, T, T)
    allowed = same & (segments != 0).unsqueeze(1) & torch.ones(size, size, dtype=torch.bool).tril()
    return allowed.unsqueeze(1)


def packed_mask_by_comparison(segments):  # positions compared instead of tril; a padded query sees nothing
    i = torch.arange(segments.size(1))
    real = segments != 0
    allowed = (segments[:, :, None] == segments[:, None, :]) & (i[None, :] <= i[:, None]) & real[:, :, None]
    return allowed[:, None]


def attention_heads(attention, x, split="transpose"):  # each head's attention output, (B, h, T, d_k)
    batch, length, d_model = x.shape
    h = attention.n_heads
    if split == "view":  # the classic bug
        q, k, v = (layer(x).reshape(batch, h, length, -1) for layer in (attention.w_q, attention.w_k, attention.w_v))
    else:
        projections = (attention.w_q, attention.w_k, attention.w_v)
        q, k, v = (torch.stack(layer(x).chunk(h, dim=-1), dim=1) for layer in projections)
    return F.scaled_dot_product_attention(q, k, v)


def head_outputs(attention, x, block="columns", bias=False, split="transpose"):
    heads = attention_heads(attention, x, split)
    d_k, weight = attention.d_k, attention.w_o.weight
    shares = []
    for i in range(attention.n_heads):
        cut = slice(i * d_k, (i + 1) * d_k)
        shares.append(heads[:, i] @ (weight[:, cut].T if block == "columns" else weight[cut]))
    out = torch.stack(shares, dim=1)
    return out + attention.w_o.bias if bias else out


def head_outputs_by_zeroing_heads(attention, x):  # run W^O on one head at a time, the others set to 0
    heads = attention_heads(attention, x)
    shares = []
    for i in range(attention.n_heads):
        alone = torch.zeros_like(heads)
        alone[:, i] = heads[:, i]
        shares.append(attention.w_o(attention.merge_heads(alone)) - attention.w_o.bias)
    return torch.stack(shares, dim=1)


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


def blockwise_two_passes(q, k, v, block_size):  # a first pass finds each row's maximum, a second sums with it
    starts = range(0, k.size(-2), block_size)
    scale = q.size(-1) ** -0.5
    m = torch.stack([(q @ k[..., s : s + block_size, :].mT * scale).amax(-1) for s in starts]).amax(0)[..., None]
    total, out = 0.0, 0.0
    for s in starts:
        p = torch.exp(q @ k[..., s : s + block_size, :].mT * scale - m)
        total, out = total + p.sum(-1, keepdim=True), out + p @ v[..., s : s + block_size, :]
    return out / total


def blockwise_log_sum_exp(q, k, v, block_size):  # a softmax per block, the blocks combined by their log-sum-exp
    lse, out = torch.full((*q.shape[:-1], 1), float("-inf")), torch.zeros(*q.shape[:-1], v.size(-1))
    for s in range(0, k.size(-2), block_size):
        scores = q @ k[..., s : s + block_size, :].transpose(-2, -1) / math.sqrt(q.size(-1))
        block_lse = torch.logsumexp(scores, dim=-1, keepdim=True)
        new = torch.logaddexp(lse, block_lse)
        out = out * torch.exp(lse - new) + torch.softmax(scores, -1) @ v[..., s : s + block_size, :] * torch.exp(
            block_lse - new)
        lse = new
    return out


def blockwise_in_place_without_grad(q, k, v, block_size):  # under torch.no_grad(), m, l and o updated in place
    with torch.no_grad():
        m = torch.full((*q.shape[:-1], 1), -math.inf)
        total, out = torch.zeros_like(m), torch.zeros(*q.shape[:-1], v.size(-1))
        for k_block, v_block in zip(k.split(block_size, dim=-2), v.split(block_size, dim=-2)):
            scores = torch.einsum("bhqd,bhkd->bhqk", q, k_block) / math.sqrt(q.size(-1))
            m_new = torch.maximum(m, scores.max(dim=-1, keepdim=True).values)
            p, factor = (scores - m_new).exp(), (m - m_new).exp()
            total.mul_(factor).add_(p.sum(dim=-1, keepdim=True))
            out.mul_(factor).add_(p @ v_block)
            m = m_new
        return out / total


def bpe_without_end_marker(word, merges):  # starts from the letters alone
    symbols = list(word)
    for left, right in merges:
        i = 0
        while i < len(symbols) - 1:
            if symbols[i] == left and symbols[i + 1] == right:
                symbols[i : i + 2] = [left + right]
            i += 1
    return symbols


def _bpe_first_only(word, merges):
    symbols = [*word, "</w>"]
    for left, right in merges:
        for i in range(len(symbols) - 1):
            if symbols[i] == left and symbols[i + 1] == right:
                symbols[i : i + 2] = [left + right]
                break
    return symbols


def blockwise_without_running_max(q, k, v, block_size):  # plain exp and sums: overflows for large scores
    total, out = q.new_zeros((*q.shape[:-1], 1)), q.new_zeros((*q.shape[:-1], v.size(-1)))
    for start in range(0, k.size(-2), block_size):
        p = torch.exp(q @ k[..., start : start + block_size, :].transpose(-2, -1) / math.sqrt(q.size(-1)))
        total = total + p.sum(-1, keepdim=True)
        out = out + p @ v[..., start : start + block_size, :]
    return out / total


def blockwise_then_full_softmax(q, k, v, block_size):  # scores block by block, but gathered into one matrix
    scores = torch.cat([q @ k[..., s : s + block_size, :].transpose(-2, -1) for s in range(0, k.size(-2), block_size)],
                       dim=-1) / math.sqrt(q.size(-1))
    return torch.softmax(scores, dim=-1) @ v


def blockwise_float64_without_running_max(q, k, v, block_size):  # raw exp in float64: overflows above about 709
    q, k, v = q.double(), k.double(), v.double()
    total, out = 0.0, 0.0
    for start in range(0, k.size(-2), block_size):
        p = (q @ k[..., start : start + block_size, :].transpose(-2, -1) / math.sqrt(q.size(-1))).exp()
        total, out = total + p.sum(-1, keepdim=True), out + p @ v[..., start : start + block_size, :]
    return (out / total).float()


def attention_keys_first(q, k, v, block_size):  # all the scores at once, laid out (B, h, T_k, T_q)
    weights = torch.softmax(torch.einsum("bhkd,bhqd->bhkq", k, q) / math.sqrt(q.size(-1)), dim=-2)
    return torch.einsum("bhkq,bhkd->bhqd", weights, v)


def attention_query_by_query(q, k, v, block_size, queries=1):  # blocks of queries, each against all the keys
    rows = []
    for i in range(0, q.size(-2), queries):
        scores = q[..., i : i + queries, :] @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, h, queries, T_k)
        rows.append(torch.softmax(scores, dim=-1) @ v)
    return torch.cat(rows, dim=-2)


def attention_in_numpy(q, k, v, block_size, how="detach"):  # full attention in NumPy, out of PyTorch's sight
    if how == "flat lists":  # a list of numbers per tensor, rebuilt in NumPy
        q, k, v = (np.array(t.detach().flatten().tolist()).reshape(tuple(t.shape)) for t in (q, k, v))
    else:
        q, k, v = (np.asarray(t.detach() if how == "detach" else t, dtype=np.float64) for t in (q, k, v))
    scores = q @ k.swapaxes(-2, -1) / np.sqrt(q.shape[-1])
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    return torch.from_numpy(weights / weights.sum(-1, keepdims=True) @ v).float()


def parameter_count(cfg, final_norms=True, tie=True, share=True, tables=2, attention_bias=True, ln=2):
    d, n = cfg.d_model, cfg.n_layers
    attention = 4 * d * d + (4 * d if attention_bias else 0)
    ffn = d * cfg.d_ff + cfg.d_ff + cfg.d_ff * d + d
    count = n * (attention + ffn + 2 * ln * d) + n * (2 * attention + ffn + 3 * ln * d)
    if cfg.norm_first and final_norms:
        count += 2 * ln * d
    count += cfg.src_vocab_size * d
    if not (cfg.share_embeddings and share):
        count += cfg.tgt_vocab_size * d
    if not (cfg.tie_embeddings and tie):
        count += cfg.tgt_vocab_size * d
    if cfg.positional == "learned":
        count += tables * cfg.max_len * d
    return count


def parameter_count_by_parts(cfg):  # layer by layer, the way the chapter's table adds them up
    d = cfg.d_model
    layer_norm, attention, ffn = 2 * d, 4 * (d * d + d), 2 * d * cfg.d_ff + cfg.d_ff + d
    encoder = cfg.n_layers * (attention + ffn + 2 * layer_norm) + (layer_norm if cfg.norm_first else 0)
    decoder = cfg.n_layers * (2 * attention + ffn + 3 * layer_norm) + (layer_norm if cfg.norm_first else 0)
    embeddings = cfg.src_vocab_size * d  # the source embedding ...
    embeddings += 0 if cfg.share_embeddings else cfg.tgt_vocab_size * d  # ... the target's, unless shared ...
    embeddings += 0 if cfg.tie_embeddings else cfg.tgt_vocab_size * d  # ... and the generator's, unless tied
    positions = 2 * cfg.max_len * d if cfg.positional == "learned" else 0
    return encoder + decoder + embeddings + positions


def smoothed_loss(logits, labels, pad_id, eps):
    log_p = torch.log_softmax(logits, dim=-1)
    nll = -log_p.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    per_token = (1 - eps) * nll + eps * -log_p.mean(dim=-1)
    return per_token[labels != pad_id].mean()


def smoothed_loss_with_nll_loss(logits, labels, pad_id, eps):  # F.nll_loss for the label's term: no cross_entropy
    log_p = F.log_softmax(logits, dim=-1).flatten(0, 1)  # (B*T, V)
    real = (labels != pad_id).flatten()
    nll = F.nll_loss(log_p[real], labels.flatten()[real], reduction="none")
    return ((1 - eps) * nll - eps * log_p[real].mean(dim=-1)).mean()


def smoothed_loss_with_targets(logits, labels, pad_id, eps, spread=None, dim=-1, positions="real", reduce="mean"):
    vocab = logits.size(-1)
    log_p = torch.log_softmax(logits, dim=dim)
    on_label, on_others = (1 - eps + eps / vocab, eps / vocab) if spread is None else spread(eps, vocab)
    q = torch.full_like(log_p, on_others).scatter(-1, labels.unsqueeze(-1), on_label)
    per_token = -(q * log_p).sum(dim=-1)  # (B, T)
    kept = per_token if positions == "all" else per_token[labels != pad_id]
    return kept.sum() if reduce == "sum" else kept.mean()


def average_checkpoints(state_dicts):
    return {key: torch.stack([state[key] for state in state_dicts]).mean(dim=0) if last.is_floating_point()
            else last.clone() for key, last in state_dicts[-1].items()}


def average_checkpoints_by_sum(state_dicts):  # a running sum in float64, divided at the end
    average = {}
    for key, last in state_dicts[-1].items():
        if not last.is_floating_point():
            average[key] = last
            continue
        total = torch.zeros(last.shape, dtype=torch.float64)
        for state in state_dicts:
            total = total + state[key]
        average[key] = (total / len(state_dicts)).to(last.dtype)
    return average


def attention_rollout(weights):
    identity = torch.eye(weights.size(-1), dtype=weights.dtype)
    rollout = identity
    for attention in weights:
        mixed = 0.5 * attention + 0.5 * identity
        rollout = (mixed / mixed.sum(-1, keepdim=True)) @ rollout
    return rollout


def attention_rollout_from_the_last_layer(weights):  # the layers multiplied from the last one down
    identity = torch.eye(weights.size(-1), dtype=weights.dtype)
    mixed = 0.5 * weights + 0.5 * identity  # (L, S, S)
    mixed = mixed / mixed.sum(-1, keepdim=True)
    rollout = mixed[-1]
    for layer in reversed(range(weights.size(0) - 1)):
        rollout = rollout @ mixed[layer]
    return rollout


def _in_place_average(state_dicts):  # adds into the first state dict: the caller's checkpoint is overwritten
    first = state_dicts[0]
    for key, value in first.items():
        if value.is_floating_point():
            for state in state_dicts[1:]:
                value += state[key]
            value /= len(state_dicts)
    return first


def _rollout_variant(weights, share=0.5, renormalise=True, reverse=False):
    identity = torch.eye(weights.size(-1), dtype=weights.dtype)
    rollout = identity
    for attention in weights:
        mixed = (1 - share) * attention + share * identity
        mixed = mixed / mixed.sum(-1, keepdim=True) if renormalise else mixed
        rollout = rollout @ mixed if reverse else mixed @ rollout
    return rollout


def rms_norm(x, weight, eps):  # in float32 whatever x's type, then back
    x32 = x.float()
    return (x32 / torch.sqrt((x32 * x32).mean(dim=-1, keepdim=True) + eps)).to(x.dtype) * weight


def rms_norm_by_norm(x, weight, eps):  # the root mean square is the 2-norm over sqrt(d), scaled first to stay in range
    x64 = x.double()
    rms = torch.sqrt(torch.linalg.vector_norm(x64, dim=-1, keepdim=True) ** 2 / x.size(-1) + eps)
    return (weight.double() * x64 / rms).to(x.dtype)


def rms_norm_variant(x, weight, eps, how=""):
    x_ = x if how == "own dtype" else x.float()
    if how == "centred":
        x_ = x_ - x_.mean(-1, keepdim=True)
    mean_square = x_.pow(2).mean(dim=(-2, -1) if how == "two dims" and x.dim() > 1 else -1, keepdim=True)
    rms = mean_square.sqrt() + eps if how == "eps outside" else (mean_square + eps).sqrt()
    return (x_ / rms).to(x.dtype) * (1 if how == "no gain" else weight)


CORRECT = {
    "grade_bpe_segment": [bpe_segment, bpe_segment_by_rank],
    "grade_embedding_inverse": [ids_from_embeddings, ids_from_embeddings_by_expansion],
    "grade_shift_encoding": [shift_encoding, shift_encoding_as_complex],
    "grade_attention": [attention, attention_additive_bias],
    "grade_packed_mask": [packed_mask, packed_mask_by_comparison],
    "grade_head_outputs": [head_outputs, head_outputs_by_zeroing_heads],
    "grade_blockwise_attention": [blockwise, blockwise_two_passes, blockwise_log_sum_exp,
                                  blockwise_in_place_without_grad],
    "grade_parameter_count": [parameter_count, parameter_count_by_parts],
    "grade_label_smoothed_loss": [smoothed_loss, smoothed_loss_with_targets, smoothed_loss_with_nll_loss],
    "grade_average_checkpoints": [average_checkpoints, average_checkpoints_by_sum],
    "grade_attention_rollout": [attention_rollout, attention_rollout_from_the_last_layer],
    "grade_rms_norm": [rms_norm, rms_norm_by_norm],
}


# ---------------------------------------------------------------------------------------------------------------
# Wrong answers: (what the learner got wrong, the function, a phrase the message must contain).
# Phrases after "Likely cause" come from the check's hints; the others from the engine's own description.
# ---------------------------------------------------------------------------------------------------------------


def square(size, dtype=torch.bool):
    return torch.ones(size, size, dtype=dtype)


def attention_scaling_q_in_place(q, k, v, mask=None, bias=None):
    q /= math.sqrt(q.size(-1))  # changes the caller's tensor
    return attention(q, k, v, mask, bias, divisor=lambda d_k: 1.0)


def _frequencies(d_model, exponent=2.0, sign=-1.0):  # 10000^(sign * exponent * i / d_model), i counting pairs
    return 10000.0 ** (sign * exponent * torch.arange(d_model // 2).float() / d_model)


def shift_textbook_rotation(pe, k):  # [[cos, -sin], [sin, cos]] applied to the pair as if it were (x, y)
    angle = k * _frequencies(pe.size(-1))
    x, y = pe[..., 0::2], pe[..., 1::2]
    return torch.stack([x * angle.cos() - y * angle.sin(), x * angle.sin() + y * angle.cos()], dim=-1).flatten(-2)


def shift_rotate_half(pe, k):  # dimension j paired with j + d_model/2, the layout of some RoPE code
    half = pe.size(-1) // 2
    angle = k * _frequencies(pe.size(-1))
    s, c = pe[..., :half], pe[..., half:]
    return torch.cat([s * angle.cos() + c * angle.sin(), c * angle.cos() - s * angle.sin()], dim=-1)


def shift_with_frequencies(pe, k, **frequency):  # the right rotation with other frequencies
    angle = k * _frequencies(pe.size(-1), **frequency)
    s, c = pe[..., 0::2], pe[..., 1::2]
    return torch.stack([s * angle.cos() + c * angle.sin(), c * angle.cos() - s * angle.sin()], dim=-1).flatten(-2)


def shift_by_reencoding(pe, k):  # finds each row in the table and looks up the row k further on
    table = tl.sinusoidal_encoding(400, pe.size(-1))
    p = torch.cdist(pe.reshape(-1, pe.size(-1)), table[:300]).argmin(dim=-1)
    return table[p + k].view(pe.shape)


def shift_angle_only(pe, k):  # the angle of each pair moved on, its length forgotten
    theta = torch.atan2(pe[..., 0::2], pe[..., 1::2]) + k * _frequencies(pe.size(-1))
    return torch.stack([theta.sin(), theta.cos()], dim=-1).flatten(-2)


def shift_by_matrix(pe, k):  # the chapter's block-diagonal M_k
    blocks = [torch.tensor([[math.cos(a), math.sin(a)], [-math.sin(a), math.cos(a)]])
              for a in (k * _frequencies(pe.size(-1))).tolist()]
    return pe @ torch.block_diag(*blocks).T


def shift_by_flat_matrix(pe, k):  # M_k as d_model^2 numbers in a row; each vector repeated d_model times against it
    d = pe.size(-1)
    angle, i = k * _frequencies(d), torch.arange(d // 2)
    flat = torch.zeros(d * d)  # row r of M_k at r * d ... r * d + d - 1
    flat[2 * i * d + 2 * i], flat[2 * i * d + 2 * i + 1] = angle.cos(), angle.sin()
    flat[(2 * i + 1) * d + 2 * i], flat[(2 * i + 1) * d + 2 * i + 1] = -angle.sin(), angle.cos()
    products = pe.repeat(*[1] * (pe.dim() - 1), d) * flat  # (..., d * d)
    return products.unflatten(-1, (d, d)).sum(-1)


def attention_without_normalising(q, k, v, mask=None, bias=None):
    weights = (q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))).exp()  # forgot to divide by the row sums
    return weights @ v, weights


def bpe_leftmost_first(word, merges):  # merges the leftmost known pair, whatever its rank
    symbols = [*word, "</w>"]
    while True:
        i = next((i for i, p in enumerate(zip(symbols, symbols[1:])) if p in merges), None)
        if i is None:
            return symbols
        symbols[i : i + 2] = [symbols[i] + symbols[i + 1]]


MUTANTS = {
    "grade_bpe_segment": [
        ("leftmost pair first", bpe_leftmost_first, r"Likely cause: the merges are applied to the leftmost known pair"),
        ("no end-of-word marker", bpe_without_end_marker,
         r"Likely cause: the end-of-word marker '</w>' is missing"),
        ("only the first occurrence", lambda word, merges: _bpe_first_only(word, merges),
         r"Likely cause: each merge is applied only where its pair first occurs"),
        ("a tuple", lambda word, merges: tuple(bpe_segment(word, merges)),
         r"expected list \[.*\], got tuple"),
        ("characters only", lambda word, merges: [*word, "</w>"],
         r"case 1 of 8 \(a word of the corpus; .*\): expected \['newest</w>'\], got \['n', 'e', 'w'"),
    ],
    "grade_embedding_inverse": [
        ("largest dot product", lambda vectors, weight: torch.argmax(vectors @ weight.T, dim=-1),
         r"Likely cause: you picked the row with the largest dot product"),
        ("scale not undone",
         lambda vectors, weight: torch.cdist(vectors.reshape(-1, weight.size(1)), weight).argmin(-1).view(
             vectors.shape[:-1]),
         r"Likely cause: .*without undoing the sqrt\(d_model\) scale"),
        ("cosine similarity",
         lambda vectors, weight: F.normalize(vectors, dim=-1).matmul(F.normalize(weight, dim=-1).T).argmax(-1),
         r"Likely cause: .*A comparison by direction, such as cosine similarity"),
        ("float ids", lambda vectors, weight: ids_from_embeddings(vectors, weight).float(),
         r"expected dtype torch\.int64, got torch\.float32\nIndices are torch\.long"),
        ("one id per sentence", lambda vectors, weight: ids_from_embeddings(vectors, weight)[..., 0],
         r"case 1 of 7 .*expected shape \(2, 7\), got \(2,\)"),
    ],
    "grade_shift_encoding": [
        ("the textbook rotation matrix", shift_textbook_rotation, r"Likely cause: every pair is turned the wrong way"),
        ("pairs of halves", shift_rotate_half,
         r"Likely cause: dimension j is paired with dimension j \+ d_model/2"),
        ("exponent i/d_model", lambda pe, k: shift_with_frequencies(pe, k, exponent=1.0),
         r"Likely cause: the exponent is i/d_model instead of 2i/d_model"),
        ("exponent without its minus sign", lambda pe, k: shift_with_frequencies(pe, k, sign=1.0),
         r"Likely cause: the exponent lost its minus sign"),
        ("position found and encoded again", shift_by_reencoding,
         r"case 6 of 6 \(vectors that are not the encoding of any position.*\nLikely cause: your answer relies on "
         r"the vectors being encodings of positions"),
        ("angle moved, length forgotten", shift_angle_only,
         r"Likely cause: .*every \(sin, cos\) pair of your result has length 1"),
        ("the d_model x d_model matrix", shift_by_matrix,
         r"the cost check \(pe: shape \(3, 5, 128\), k=7\): your function made a tensor of shape \(128, 128\)"),
        ("M_k flattened, its products with every vector", shift_by_flat_matrix,
         r"the cost check \(pe: shape \(3, 5, 128\), k=7\): your function made a tensor of shape \(3, 5, 16384\), "
         r"245760 values, d_model = 128 products for each of the 1920 numbers of pe"),
        ("k ignored", lambda pe, k: pe.clone(),
         r"case 1 of 6 \(the rows of positions 0 to 9, one step on; pe: shape \(10, 8\), k=1\): \d+ of 80 values "
         r"differ"),
        ("float64", lambda pe, k: shift_encoding(pe, k).double(), r"expected dtype torch\.float32, got torch\.float64"),
    ],
    "grade_attention": [
        ("divided by d_k", lambda q, k, v, mask=None, bias=None: attention(q, k, v, mask, bias, divisor=lambda d_k: d_k),
         r"Likely cause: the scores are divided by d_k; the paper divides them by sqrt\(d_k\)"),
        ("not scaled", lambda q, k, v, mask=None, bias=None: attention(q, k, v, mask, bias, divisor=lambda d_k: 1.0),
         r"Likely cause: the scores are not scaled"),
        ("scaled by sqrt(d_model) with d_model = 512",
         lambda q, k, v, mask=None, bias=None: attention(q, k, v, mask, bias, divisor=lambda d_k: math.sqrt(512)),
         r"Likely cause: your weights are softmax\(q k\^T / 22\.63\) \(= sqrt\(512\)\), but the paper divides the "
         r"scores by sqrt\(d_k\) = sqrt\(8\)"),
        ("softmax over the queries", lambda q, k, v, mask=None, bias=None: attention(q, k, v, mask, bias, dim=-2),
         r"Likely cause: the softmax runs over the queries \(dim=-2\)"),
        ("mask inverted", lambda q, k, v, mask=None, bias=None: attention(q, k, v, mask, bias, invert=True),
         r"Likely cause: masked_fill put -inf where the mask is True"),
        ("masked scores set to 0", lambda q, k, v, mask=None, bias=None: attention(q, k, v, mask, bias, fill=0.0),
         r"Likely cause: the masked scores are set to 0"),
        ("masked scores set to -5", lambda q, k, v, mask=None, bias=None: attention(q, k, v, mask, bias, fill=-5.0),
         r"a padded key that scores 200.*\nLikely cause: query position \d+ gives weight [\d.e-]+ to key "
         r"position \d+, which the mask forbids"),
        ("returns (weights, output)", lambda q, k, v, mask=None, bias=None: attention(q, k, v, mask, bias)[::-1],
         r"Likely cause: the pair is in the wrong order"),
        ("returns the output only", lambda q, k, v, mask=None, bias=None: attention(q, k, v, mask, bias)[0],
         r"expected a tuple of 2 values, got tensor of shape \(2, 5, 8\).*\nReturn a tuple of 2 tensors"),
        ("weights not normalised", attention_without_normalising,
         r"item 0 \(output\).*\nIn item 1 \(weights\): each row of the reference sums to 1 over the last dimension "
         r"\(dim=-1\); your rows sum to values between"),
        ("output off by a small constant", lambda q, k, v, mask=None, bias=None: (
            attention(q, k, v, mask, bias)[0] + 1e-3, attention(q, k, v, mask, bias)[1]),
         r"item 0 \(output\): 80 of 80 values differ.*\nEvery value you return is the expected one plus 0\.001"),
        ("changes q in place", attention_scaling_q_in_place, r"changed its argument 'q' in place"),
        ("a finite bias, rows with no allowed key left uniform", attention_bias_not_zeroed,
         r"all padding.*\nLikely cause: a row with no allowed key is left as it is"),
        ("-inf, rows with no allowed key left NaN", attention_nan_rows,
         r"your result contains NaN.*\nLikely cause: a row with no allowed key has every score at -inf"),
        ("weights zeroed after the output was computed", attention_output_not_zeroed,
         r"item 0 \(output\).*\nLikely cause: the weights of a row with no allowed key are 0, but its output is not"),
        ("a 0/1 mask added to the scores", lambda q, k, v, mask=None, bias=None: attention(q, k, v, bias=bias)
         if mask is None else _added_mask(q, k, v, mask),
         r"Likely cause: query position \d+ gives weight [\d.e-]+ to key position \d+, which the mask forbids"),
        ("a softmax over every key, then masked and renormalised", attention_masked_after_softmax,
         r"case 6 of 15 \(a padded key that scores 200.*\): item 0 \(output\)(?:.*\n)+Likely cause: the softmax ran "
         r"over every key before the mask"),
        ("the bias as a factor e^b after a softmax over every key", attention_bias_as_factor,
         r"Likely cause: the softmax ran over every key before the mask"),
        ("a softmax without its maximum subtracted", attention_exp_without_max,
         r"scores of a few hundred.*\): item 0 \(output\): your result contains NaN.*\nLikely cause: the softmax "
         r"takes exp of the raw scores.*subtract each row's maximum before exp"),
    
        ("the chapter's function, which has no bias", lambda q, k, v, mask=None, bias=None:
         tl.scaled_dot_product_attention(q, k, v, mask),
         r"a bias of shape \(T_q, T_k\) and no mask.*\nLikely cause: the bias is ignored"),
        ("the bias divided by sqrt(d_k) with the scores", attention_bias_before_scaling,
         r"Likely cause: the bias is divided by sqrt\(d_k\) with the scores"),
        ("the bias subtracted", lambda q, k, v, mask=None, bias=None: attention(
            q, k, v, mask, None if bias is None else -bias), r"Likely cause: the bias is subtracted"),
        ("the bias only inside the mask's branch", attention_bias_with_mask_only,
         r"a bias of shape \(T_q, T_k\) and no mask.*\nLikely cause: the bias is added only when a mask is given"),
        ("the bias transposed", lambda q, k, v, mask=None, bias=None: attention(
            q, k, v, mask, None if bias is None else bias.transpose(-2, -1)),
         r"a bias of shape \(T_q, T_k\) and no mask.*\nLikely cause: the bias is transposed"),
        ("the mask written into the bias in place", attention_bias_into_mask_in_place,
         r"ALiBi.*changed its argument 'bias' in place"),
        ("the bias mixed into the weights after the softmax", attention_bias_on_weights,
         r"a bias of shape \(T_q, T_k\) and no mask.*: item 0 \(output\)"),
    ],
    "grade_packed_mask": [
        ("sentences ignored", lambda segments: ((segments != 0)[:, None, :] & square(segments.size(1)).tril())[:, None],
         r"Likely cause: the sentences are ignored"),
        ("no causal part", lambda segments: packed_mask(segments) | packed_mask(segments).transpose(-2, -1),
         r"Likely cause: the causal part is missing"),
        ("padded keys allowed", lambda segments: ((segments[:, :, None] == segments[:, None, :])
                                                  & square(segments.size(1)).tril())[:, None],
         r"Likely cause: padded keys are allowed"),
        ("upper triangle", lambda segments: packed_mask(segments).transpose(-2, -1),
         r"Likely cause: the future is allowed and the past hidden"),
        ("diagonal excluded", lambda segments: packed_mask(segments) & ~torch.eye(segments.size(1), dtype=torch.bool),
         r"your mask stops position 0 from seeing position 0 \(itself\).*\nLikely cause: the diagonal is excluded"),
        ("inverted", lambda segments: ~packed_mask(segments), r"Likely cause: the mask is inverted"),
        ("no head dimension", lambda segments: packed_mask(segments)[:, 0],
         r"Likely cause: the singleton head dimension is missing"),
        ("int64 mask", lambda segments: packed_mask(segments).long(), r"expected dtype torch\.bool, got torch\.int64"),
        ("one sentence seen from the next", lambda segments: packed_mask(segments)
         | ((segments[:, :, None] - segments[:, None, :] > 0) & (segments != 0)[:, None, :])[:, None],
         r"case 1 of 7 \(two sentences in one row; segments: shape \(1, 7\)\): 12 entries differ; the first is at index "
         r"\(0, 0, 3, 0\): expected False, got True\nIn words: your mask lets position 3 see position 0 \(an earlier "
         r"position\)"),
    ],
    "grade_head_outputs": [
        ("rows of w_o.weight", lambda attention, x: head_outputs(attention, x, block="rows"),
         r"Likely cause: head i's block of W\^O was taken from rows"),
        ("bias in every share", lambda attention, x: head_outputs(attention, x, bias=True),
         r"Likely cause: every head's share includes the output bias"),
        ("view without transpose", lambda attention, x: head_outputs(attention, x, split="view"),
         r"Likely cause: x\.view\(B, n_heads, T, d_k\) cuts the heads across positions"),
        ("the output shared out equally", lambda attention, x: ((attention(x, x, x)[0] - attention.w_o.bias)
                                                               / attention.n_heads).unsqueeze(1).expand(
            -1, attention.n_heads, -1, -1), r"Your shares do add up to the layer's output, but"),
        ("(B, T, h, d_model)", lambda attention, x: head_outputs(attention, x).transpose(1, 2),
         r"expected shape \(2, 4, 5, 16\), got \(2, 5, 4, 16\)\nYou have the right sizes in a different order"),
    ],
    "grade_blockwise_attention": [
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
         r"case 1 of 9 \(the last block is shorter .*\): \d+ of 320 values differ"),
        ("no running maximum", blockwise_without_running_max,
         r"case 7 of 9 \(scores of several hundred.*\): your result contains NaN.*\n"
         r"Likely cause: the exponentials are taken of the raw scores, without subtracting the running maximum"),
        ("full attention from the library", lambda q, k, v, block_size: tl.scaled_dot_product_attention(q, k, v)[0],
         r"the blocks check .*: your function made a tensor of shape \(1, 2, 5, 12\), scores or weights of all 12 "
         r"keys"),
        ("PyTorch's fused attention", lambda q, k, v, block_size: F.scaled_dot_product_attention(q, k, v),
         r"the blocks check .*: your function called torch\.nn\.functional\.scaled_dot_product_attention on all "
         r"12 keys at once"),
        ("blocks, then all the scores again", blockwise_then_full_softmax,
         r"the blocks check .*: your function made a tensor of shape \(1, 2, 5, 12\)"),
        ("no running maximum, in float64", blockwise_float64_without_running_max,
         r"case 8 of 9 \(scores of a few thousand.*\): your result contains NaN.*\n"
         r"Likely cause: the exponentials are taken of the raw scores, without subtracting the running maximum"),
        ("all the scores at once, keys first", attention_keys_first,
         r"the blocks check .*: your function made a tensor of shape \(1, 2, 12, 5\), scores or weights of all 12 "
         r"keys"),
        ("one query at a time against all the keys", attention_query_by_query,
         r"the blocks check .*: your function made a tensor of shape \(1, 2, 1, 12\), scores or weights of all 12 "
         r"keys"),
        ("blocks of queries against all the keys",
         lambda q, k, v, block_size: attention_query_by_query(q, k, v, block_size, queries=block_size),
         r"the blocks check .*: your function made a tensor of shape \(1, 2, 4, 12\), scores or weights of all 12 "
         r"keys"),
        ("full attention in NumPy", attention_in_numpy,
         r"the blocks check .*: your function left PyTorch"),
        ("full attention in NumPy, without detach", lambda q, k, v, block_size: attention_in_numpy(
            q, k, v, block_size, how="no detach"), r"the blocks check .*: your function left PyTorch \(it turned a "
         r"tensor of shape \(1, 2, 5, 8\) into a NumPy array"),
        ("full attention in NumPy, through flat lists", lambda q, k, v, block_size: attention_in_numpy(
            q, k, v, block_size, how="flat lists"), r"the blocks check .*: your function left PyTorch \(its output "
         r"does not come from q, k and v through torch operations\)"),
        ("off by a small constant", lambda q, k, v, block_size: blockwise(q, k, v, block_size, add=1e-3),
         r"Every value you return is the expected one plus 0\.001"),
    ],
    "grade_parameter_count": [
        ("no final norms", lambda cfg: parameter_count(cfg, final_norms=False),
         r"Likely cause: the final LayerNorm of each pre-norm stack is missing"),
        ("generator counted", lambda cfg: parameter_count(cfg, tie=False),
         r"Likely cause: the tied generator is counted as a matrix of its own"),
        ("shared embedding twice", lambda cfg: parameter_count(cfg, share=False),
         r"Likely cause: the shared embedding is counted twice"),
        ("no learned positions", lambda cfg: parameter_count(cfg, tables=0),
         r"Likely cause: the learned positional tables are missing"),
        ("one learned table", lambda cfg: parameter_count(cfg, tables=1),
         r"Likely cause: only one learned positional table is counted"),
        ("no attention biases", lambda cfg: parameter_count(cfg, attention_bias=False),
         r"Likely cause: the biases of the attention projections are missing"),
        ("LayerNorm without its bias", lambda cfg: parameter_count(cfg, ln=1),
         r"Likely cause: each LayerNorm is counted with d_model numbers"),
        ("a float", lambda cfg: float(parameter_count(cfg)),
         r"your function raised ExerciseGradeError: return the count as an int, got the float \d+\.0"),
        ("one too many", lambda cfg: parameter_count(cfg) + 1,
         r"case 1 of 7 \(the paper's choices.*\): the value differs, by up to 1; at index \(\) expected (\d+), "
         r"got \d+"),
    ],
    "grade_label_smoothed_loss": [
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
    "grade_average_checkpoints": [
        ("summed", lambda state_dicts: {k: torch.stack([s[k] for s in state_dicts]).sum(0) if v.is_floating_point()
                                        else v for k, v in state_dicts[-1].items()},
         r"Likely cause: the tensors are summed, not averaged"),
        ("only the last", lambda state_dicts: dict(state_dicts[-1]),
         r"Likely cause: only the last state dict is returned"),
        ("in place", _in_place_average, r"your function modified its input: state dict 0's entry"),
        ("integer buffers averaged", lambda state_dicts: {
            k: torch.stack([s[k] for s in state_dicts]).double().mean(0).to(v.dtype) for k, v in state_dicts[-1].items()},
         r"is an integer buffer .*take it from the last state dict"),
        ("integer buffers left out", lambda state_dicts: {
            k: torch.stack([s[k] for s in state_dicts]).mean(0) for k, v in state_dicts[-1].items()
            if v.is_floating_point()},
         r"keys missing: \['norm\.num_batches_tracked', 'pos\.index'\]"),
        ("first and last only", lambda state_dicts: average_checkpoints([state_dicts[0], state_dicts[-1]]),
         r"Likely cause: the first and the last state dicts are averaged"),
        ("a list", lambda state_dicts: list(average_checkpoints(state_dicts).values()),
         r"expected a dict from names to tensors, got list"),
    ],
    "grade_attention_rollout": [
        ("wrong order", lambda weights: _rollout_variant(weights, reverse=True),
         r"Likely cause: the matrices are multiplied in the wrong order"),
        ("no identity", lambda weights: _rollout_variant(weights, share=0.0),
         r"Likely cause: the identity term \(the residual connection\) is left out"),
        ("no renormalisation", lambda weights: _rollout_variant(weights, renormalise=False),
         r"Likely cause: the rows of 0\.5 A \+ 0\.5 I are not renormalised"),
        ("first layer skipped", lambda weights: _rollout_variant(weights[1:]), r"Likely cause: the first layer is skipped"),
        ("last layer only", lambda weights: _rollout_variant(weights[-1:]),
         r"Likely cause: only the last layer is used"),
        ("one row per layer", lambda weights: weights.mean(0), r"values differ"),
    ],
    "grade_rms_norm": [
        ("LayerNorm", lambda x, weight, eps: rms_norm_variant(x, weight, eps, "centred"),
         r"Likely cause: the features were centred first"),
        ("eps outside the root", lambda x, weight, eps: rms_norm_variant(x, weight, eps, "eps outside"),
         r"Likely cause: eps is added to the root mean square"),
        ("squares in float16", lambda x, weight, eps: rms_norm_variant(x, weight, eps, "own dtype"),
         r"Likely cause: the mean of the squares was computed in x's own type"),
        ("mean over two dimensions", lambda x, weight, eps: rms_norm_variant(x, weight, eps, "two dims"),
         r"Likely cause: the mean runs over the last two dimensions"),
        ("no gain", lambda x, weight, eps: rms_norm_variant(x, weight, eps, "no gain"),
         r"Likely cause: the gain is missing"),
        ("float32 out", lambda x, weight, eps: rms_norm(x, weight, eps).float(), r"expected dtype torch\.float16"),
    ],
}


# ---------------------------------------------------------------------------------------------------------------
# The answers that the round-5 reviews showed accepted (shared/reviews/round5: pedagogy_1_5.md L1-L4 and
# pedagogy_6_9.md section 4), written as the reviews wrote them: two wrong in value, five that break the exercise's
# own rule. Each must now be refused with one line that names what is wrong.
# ---------------------------------------------------------------------------------------------------------------


def loophole_bpe_right_to_left(word, merges):  # L1: each merge applied scanning from the right end
    symbols = list(word) + ["</w>"]
    for left, right in merges:
        i = len(symbols) - 2
        while i >= 0:
            if symbols[i] == left and symbols[i + 1] == right:
                symbols[i : i + 2] = [left + right]
            i -= 1
    return symbols


def loophole_softmax_then_renormalise(q, k, v, mask=None, bias=None):  # L2: no mask term, so no -inf anywhere
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))
    if bias is not None:
        scores = scores + bias
    weights = torch.softmax(scores, dim=-1)
    if mask is not None:
        weights = weights * mask  # masked keys -> 0
        total = weights.sum(-1, keepdim=True)
        weights = torch.where(total > 0, weights / total.clamp_min(1e-30), torch.zeros_like(weights))
    return weights @ v, weights


def loophole_every_block_at_once(q, k, v, block_size):  # L3: no loop, no running m, l, o; all blocks' scores
    t_k = k.size(-2)
    pad = (-t_k) % block_size
    n = (t_k + pad) // block_size
    k_blocks = F.pad(k, (0, 0, 0, pad)).unflatten(-2, (n, block_size))  # (B, h, n, blk, d_k)
    v_blocks = F.pad(v, (0, 0, 0, pad)).unflatten(-2, (n, block_size))
    real = (torch.arange(n * block_size) < t_k).view(n, 1, block_size)
    s = torch.einsum("bhqd,bhnkd->bhnqk", q, k_blocks) / math.sqrt(q.size(-1))  # (B, h, n, T_q, blk): every score
    s = s.masked_fill(~real, float("-inf"))
    m = s.amax(dim=(2, 4), keepdim=True)
    p = torch.exp(s - m)
    total = p.sum(dim=(2, 4))[..., None]
    return torch.einsum("bhnqk,bhnkd->bhqd", p, v_blocks) / total


def loophole_dense_shift_matrix(pe, k):  # L4: M_k stored as (d, 1, d), d^2 products per vector
    d = pe.size(-1)
    omega = torch.pow(10000.0, -torch.arange(0, d, 2, dtype=torch.float64) / d)
    c, s = torch.cos(k * omega), torch.sin(k * omega)
    matrix = torch.zeros(d, 1, d, dtype=torch.float64)
    i = torch.arange(d // 2)
    matrix[2 * i, 0, 2 * i], matrix[2 * i, 0, 2 * i + 1] = c, s
    matrix[2 * i + 1, 0, 2 * i], matrix[2 * i + 1, 0, 2 * i + 1] = -s, c
    return (pe.double()[..., None, None, :] * matrix).sum(-1).squeeze(-1).to(pe.dtype)


def loophole_count_the_built_model(cfg):  # L5: "without building the model"
    return tl.count_parameters(tl.Transformer(cfg))


def loophole_pytorch_cross_entropy(logits, labels, pad_id, eps):  # L6: "without calling cross_entropy"
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=pad_id, label_smoothing=eps)


def loophole_library_average(state_dicts):  # L7: the chapter folds the library's own function
    return tl.average_checkpoints(state_dicts)


LOOPHOLES = [  # (check, the answer, what the one line that refuses it must say)
    ("grade_bpe_segment", loophole_bpe_right_to_left,
     r"Likely cause: each merge is applied from the right end of the word; apply it from left to right"),
    ("grade_attention", loophole_softmax_then_renormalise,
     r"Likely cause: the softmax ran over every key before the mask\. Here a masked key outscores every allowed key "
     r"by \d+, so the allowed keys' weights, exp\(score - the row's maximum\), underflow to 0 in float32"),
    ("grade_blockwise_attention", loophole_every_block_at_once,
     r"the blocks check .*: your function made a tensor of shape \(1, 2, 3, 5, 4\), 120 scores or weights, more "
     r"than one block of them holds, B \* h \* T_q \* block_size = 40: the scores of every block at once"),
    ("grade_shift_encoding", loophole_dense_shift_matrix,
     r"the cost check \(pe: shape \(3, 5, 128\), k=7\): your function made a tensor of shape \(128, 1, 128\), a "
     r"d_model x d_model matrix such as M_k \(in whatever layout\)"),
    ("grade_parameter_count", loophole_count_the_built_model,
     r"the rule check: your function built the model, Transformer\(cfg\), to count parameters; the exercise is to "
     r"compute the count from cfg alone, without building the model"),
    ("grade_label_smoothed_loss", loophole_pytorch_cross_entropy,
     r"the rule check: your function called torch\.nn\.functional\.cross_entropy \(F\.cross_entropy\); the exercise "
     r"is to write the smoothed loss without calling cross_entropy"),
    ("grade_average_checkpoints", loophole_library_average,
     r"the rule check: your function called the library's average_checkpoints \(tl\.average_checkpoints\); the "
     r"exercise is to write the average yourself"),
]


# ---------------------------------------------------------------------------------------------------------------
# The tests.
# ---------------------------------------------------------------------------------------------------------------


def named_graders() -> list[str]:
    return sorted(name for name in dir(grading) if name.startswith("grade_") and name != "grade_against")


def test_every_named_check_is_tested_and_belongs_to_an_exercise():
    assert sorted(CORRECT) == sorted(MUTANTS) == named_graders()
    assert named_graders() == sorted(f.__name__ for f in EXERCISE_GRADERS.values())
    for name in named_graders():
        assert len(MUTANTS[name]) >= 3, f"{name} needs at least three wrong answers"


@pytest.mark.parametrize("check_name", sorted(CORRECT))
def test_correct_answers_pass_on_every_seed(check_name, capsys):
    check = getattr(grading, check_name)
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
    check = getattr(grading, check_name)
    for seed in MUTANT_SEEDS:
        with pytest.raises(ExerciseGradeError) as error:
            check(mutant, seed=seed)
        message = str(error.value)
        assert re.search(phrase, message), f"seed {seed}: {what!r} gave\n{message}\nwithout {phrase!r}"
        assert f"{check_name}({mutant.__name__}, seed={seed})" in message  # how to repeat the same inputs


@pytest.mark.parametrize("check_name", named_graders())
def test_an_untouched_stub_prints_one_line_and_does_not_raise(check_name, capsys):
    def my_answer(*args, **kwargs):
        raise NotImplementedError("Exercise: write it")

    getattr(grading, check_name)(my_answer)  # Run all goes on past an unsolved exercise
    assert capsys.readouterr().out == (f"Exercise not attempted yet: write my_answer above, then run this cell "
                                       f"again ({check_name} checks it).\n")


@pytest.mark.parametrize("check_name", named_graders())
def test_a_wrong_answer_still_raises(check_name):
    wrong = MUTANTS[check_name][0][1]  # the stub prints; an answer that runs and is wrong still fails
    with pytest.raises(ExerciseGradeError):
        getattr(grading, check_name)(wrong)


@pytest.mark.parametrize("check_name", named_graders())
def test_a_crash_is_reported_with_the_error_and_the_input(check_name):
    def crashes(*args, **kwargs):
        return 1 / 0

    with pytest.raises(ExerciseGradeError, match=r"crashes, case 1 of \d+ \(.*\): your function raised "
                                                 r"ZeroDivisionError: division by zero") as error:
        getattr(grading, check_name)(crashes)
    assert isinstance(error.value.__cause__, ZeroDivisionError)  # the learner's traceback is kept


def test_wrong_parameter_names_are_explained():
    def my_head_outputs(layer, x):
        return head_outputs(layer, x)

    with pytest.raises(ExerciseGradeError, match=r"unexpected keyword argument 'attention'\nThe check passes the "
                                                 r"arguments by name \(attention, x\)"):
        grading.grade_head_outputs(my_head_outputs)


def test_something_that_is_not_a_function_is_refused():
    with pytest.raises(TypeError, match="fn must be the function you wrote"):
        grading.grade_packed_mask(torch.ones(3))


def test_inputs_are_fresh_on_every_call_and_repeatable_with_a_seed():
    seen = []

    def spy(q, k, v, mask=None, bias=None):
        seen.append(q)
        return attention(q, k, v, mask, bias)

    for seed in (None, None, 7, 7):
        grading.grade_attention(spy, seed=seed)
    cases = len(seen) // 4
    first = [seen[call * cases] for call in range(4)]  # the q of the first case of each call
    assert not torch.equal(first[0], first[1]), "two calls without a seed drew the same inputs"
    assert torch.equal(first[2], first[3]), "the same seed must give the same inputs"


def test_the_global_random_state_is_left_alone():
    torch.manual_seed(0)
    before = torch.rand(3)
    torch.manual_seed(0)
    for check_name, answers in CORRECT.items():
        getattr(grading, check_name)(answers[0])
    assert torch.equal(torch.rand(3), before), "a check changed the notebook's random numbers"


@pytest.mark.parametrize("label", sorted(EXERCISE_GRADERS))
def test_each_exercise_calls_its_named_check_in_stub_and_solution(label):
    check_name = EXERCISE_GRADERS[label].__name__
    for path in sorted(BOOK.glob("[0-9][0-9]_*.ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        starts = [i for i, c in enumerate(cells) if c["cell_type"] == "markdown"
                  and re.search(rf"^:label: {re.escape(label)}$", "".join(c["source"]), re.M)]
        if starts:
            break
    else:
        pytest.fail(f"no notebook has the exercise {label}")
    after = cells[starts[0] + 1 :]
    stub = next(c for c in after if "exercise-stub" in c.get("metadata", {}).get("tags", []))
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
    graders_named = set(re.findall(r"\b(grade_\w+)\b", text)) - {"grade_against"}
    assert graders_named and graders_named <= set(named_graders()), graders_named - set(named_graders())


def test_blockwise_attention_accepts_a_correct_answer_on_many_seeds(capsys):
    """The notebooks draw a fresh seed each run: a correct answer must pass on any of them, not on most. Before the
    case of scores of several hundred drew one clear winner per query, float32's rounding of such scores failed a
    correct answer on about 3 seeds in 2,000 (1515966914 among them, in a build of chapter 5)."""
    for seed in [1515966914, *range(400)]:
        grading.grade_blockwise_attention(blockwise, seed=seed)
        assert capsys.readouterr().out.startswith("Well done")


@pytest.mark.parametrize("check_name, answer, phrase", LOOPHOLES, ids=[a.__name__ for _, a, _ in LOOPHOLES])
def test_the_answers_the_reviews_showed_accepted_are_refused_in_one_line(check_name, answer, phrase):
    profiler = sys.getprofile()
    for seed in range(10):
        with pytest.raises(ExerciseGradeError) as error:
            getattr(grading, check_name)(answer, seed=seed)
        message = str(error.value)
        assert any(re.search(phrase, line) for line in message.splitlines()), f"seed {seed}:\n{message}"
        assert f"{check_name}({answer.__name__}, seed={seed})" in message
    assert sys.getprofile() is profiler, "a rule check left its call watcher behind"


def test_the_bpe_case_of_a_run_tells_the_two_directions_apart():
    """The fixed case of L1, by hand: "aaab" with (a, a) then (aa, b)."""
    merges = [("a", "a"), ("aa", "b")]
    assert bpe_segment("aaab", merges) == ["aa", "a", "b", "</w>"]
    assert loophole_bpe_right_to_left("aaab", merges) == ["a", "aab", "</w>"]


def test_the_case_of_a_padded_winner_gives_the_allowed_key_its_weight():
    """The fixed case of L2, by hand: one query that may see key 0 only, while the masked key 1 scores 127 higher.
    The reference gives key 0 weight 1; the softmax taken before the mask gives it exp(-127), 0 in float32."""
    q, v = torch.tensor([[[1.0, 0.0]]]), torch.eye(2)[None]  # (1, 1, 2), (1, 2, 2)
    k = torch.tensor([[[0.0, 0.0], [127.0 * math.sqrt(2), 0.0]]])  # scores 0 and 127 once divided by sqrt(d_k)
    mask = torch.tensor([[[True, False]]])  # (1, 1, T_k): one dimension per score dimension
    assert tl.scaled_dot_product_attention(q, k, v, mask)[1].tolist() == [[[1.0, 0.0]]]
    assert loophole_softmax_then_renormalise(q, k, v, mask)[1].tolist() == [[[0.0, 0.0]]]


def test_a_rule_check_sees_a_forbidden_function_however_it_is_reached():
    """The rule checks watch the function's code, not a name: an alias imported before, the same function defined
    again (as chapter 8's `#| export` cell defines it in the notebook), a subclass, a module of the library that
    calls it, a piece of the model."""
    import inspect

    from transformer_lib import translation
    from transformer_lib.translation import average_checkpoints as library_average

    notebook = dict(vars(translation))  # the chapter's cell run again, in a namespace of its own
    exec(compile(inspect.getsource(translation.average_checkpoints), "<chapter 8, cell>", "exec"), notebook)
    assert notebook["average_checkpoints"].__code__ is not translation.average_checkpoints.__code__

    class MyTransformer(tl.Transformer):
        pass

    def my_average(state_dicts):
        return library_average(state_dicts)

    def my_average_from_the_notebook(state_dicts):
        return notebook["average_checkpoints"](state_dicts)

    def my_count(cfg):
        return tl.count_parameters(MyTransformer(cfg))

    def my_count_by_layers(cfg):
        tl.count_parameters(tl.MultiHeadAttention(cfg.d_model, cfg.n_heads))
        return parameter_count(cfg)

    def my_loss_module(logits, labels, pad_id, eps):
        loss = torch.nn.CrossEntropyLoss(ignore_index=pad_id, label_smoothing=eps)
        return loss(logits.flatten(0, 1), labels.flatten())

    def my_loss_from_the_library(logits, labels, pad_id, eps):
        return tl.translation_loss(logits, labels, pad_id, eps)

    for check, answer, phrase in [
        (grading.grade_average_checkpoints, my_average, r"called the library's average_checkpoints"),
        (grading.grade_average_checkpoints, my_average_from_the_notebook, r"called the library's average_checkpoints"),
        (grading.grade_parameter_count, my_count, r"built the model, Transformer\(cfg\),"),
        (grading.grade_parameter_count, my_count_by_layers, r"built a module, MultiHeadAttention,"),
        (grading.grade_label_smoothed_loss, my_loss_module, r"called nn\.CrossEntropyLoss, which calls"),
        (grading.grade_label_smoothed_loss, my_loss_from_the_library, r"called tl\.translation_loss, which calls"),
    ]:
        with pytest.raises(ExerciseGradeError, match=rf"{answer.__name__}, the rule check: your function {phrase}"):
            check(answer, seed=0)
