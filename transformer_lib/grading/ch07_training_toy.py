"""The named check of chapter 7's coding exercise (book/07_training_toy.ipynb): the label-smoothed loss."""

from collections.abc import Callable

import torch
from torch import Tensor, nn

from transformer_lib.training import translation_loss

from .engine import _generator, _randint, _refuse_calls, _run

# The ways to reach PyTorch's cross-entropy, which the exercise forbids; the check names the first one reached.
_CROSS_ENTROPY = {
    translation_loss: "tl.translation_loss, which calls torch.nn.functional.cross_entropy",
    nn.CrossEntropyLoss.forward: "nn.CrossEntropyLoss, which calls torch.nn.functional.cross_entropy",
    nn.functional.cross_entropy: "torch.nn.functional.cross_entropy (F.cross_entropy)",
    torch._C._nn.cross_entropy_loss: "torch._C._nn.cross_entropy_loss, the kernel of F.cross_entropy",
}


def _smoothed_per_token(logits: Tensor, labels: Tensor, on_label: float, on_others: float, dim: int = -1) -> Tensor:
    """-sum_k q_k log p_k at every position, for q = on_label at the label and on_others elsewhere; (B, T)."""
    log_p = torch.log_softmax(logits, dim=dim)  # (B, T, V), normalised over the classes unless dim says otherwise
    q = torch.full_like(log_p, on_others).scatter_(-1, labels.unsqueeze(-1), on_label)  # (B, T, V)
    return -(q * log_p).sum(dim=-1)  # (B, T)


def _label_smoothed_loss(logits: Tensor, labels: Tensor, pad_id: int, eps: float) -> Tensor:
    """The exercise's answer, without cross_entropy: the mean over the real (non-padding) tokens of -sum_k q_k log p_k,
    q = (1 - eps) one-hot + eps / V, what translation_loss computes with F.cross_entropy (0 if there are none)."""
    vocab = logits.size(-1)
    real = labels != pad_id  # (B, T)
    per_token = _smoothed_per_token(logits, labels, 1 - eps + eps / vocab, eps / vocab)  # (B, T)
    return (per_token * real).sum() / real.sum().clamp(min=1)


def grade_label_smoothed_loss(fn: Callable[..., Tensor], seed: int | None = None) -> None:
    """Check fn(logits, labels, pad_id, eps) -> mean label-smoothed loss over real tokens (translation_loss)."""
    g, seed = _generator(seed)

    def batch(size: tuple[int, int, int], eps: float, pad_id: int = 0, empty_row: int | None = None) -> dict:
        b, t, vocab = size
        labels = torch.randint(0, vocab, (b, t), generator=g)  # (B, T)
        labels[labels == pad_id] = (pad_id + 1) % vocab
        labels[torch.rand(b, t, generator=g) < 0.3] = pad_id  # random padding
        labels[0, 0] = (pad_id + 1) % vocab  # at least one real token
        if empty_row is not None:
            labels[empty_row] = pad_id  # a sentence made only of padding
        return {"logits": 3 * torch.randn(b, t, vocab, generator=g), "labels": labels, "pad_id": pad_id, "eps": eps}

    lonely = {"logits": 3 * torch.randn(3, 4, 8, generator=g), "labels": torch.zeros(3, 4, dtype=torch.long),
              "pad_id": 0, "eps": 0.1}
    lonely["labels"][1, 2] = 5  # all padding but one token
    cases = [
        ("", batch((2, 5, 7), 0.1)),
        ("no smoothing (eps = 0)", batch((3, 6, 11), 0.0)),
        ("a single position", batch((1, 1, 4), 0.3)),
        ("a sentence made only of padding", batch((4, 9, 30), 0.1, empty_row=2)),
        ("every position but one is padding", lonely),
        ("padding id 2; label 0 is a real class here", batch((2, 6, 9), 0.2, pad_id=2)),
        ("a random size", batch((_randint(1, 4, g), _randint(1, 8, g), _randint(2, 40, g)),
                                round(0.3 * torch.rand((), generator=g).item(), 3))),
    ]

    def padded_too(logits: Tensor, labels: Tensor, pad_id: int, eps: float) -> Tensor:
        vocab = logits.size(-1)
        return _smoothed_per_token(logits, labels, 1 - eps + eps / vocab, eps / vocab).mean()

    def per_token(logits: Tensor, labels: Tensor, eps: float, dim: int = -1) -> Tensor:
        vocab = logits.size(-1)
        return _smoothed_per_token(logits, labels, 1 - eps + eps / vocab, eps / vocab, dim)  # (B, T)

    def sentence_means(logits: Tensor, labels: Tensor, pad_id: int, eps: float) -> Tensor:
        real = (labels != pad_id).float()  # (B, T)
        keep = real.sum(dim=1) > 0  # sentences with at least one real token
        means = (per_token(logits, labels, eps) * real).sum(dim=1)[keep] / real.sum(dim=1)[keep]  # (B',)
        return means.mean()

    hints = {
        "the mean includes the padded positions; average over the positions where labels != pad_id only": padded_too,
        "eps is spread over the V - 1 wrong classes (fairseq's convention), but PyTorch spreads it over all V "
        "classes, so that the label gets 1 - eps + eps / V":
            lambda logits, labels, pad_id, eps: _smoothed_per_token(
                logits, labels, 1 - eps, eps / (logits.size(-1) - 1))[labels != pad_id].mean(),
        "the loss has no label smoothing; mix the one-hot target with eps / V":
            lambda logits, labels, pad_id, eps: _label_smoothed_loss(logits, labels, pad_id, 0.0),
        "eps is added to every class without dividing by V: q = (1 - eps) one-hot + eps / V sums to 1":
            lambda logits, labels, pad_id, eps: _smoothed_per_token(
                logits, labels, 1 - eps + eps, eps)[labels != pad_id].mean(),
        "the losses of the real positions are summed; take their mean":
            lambda logits, labels, pad_id, eps: per_token(logits, labels, eps)[labels != pad_id].sum(),
        "the log-softmax runs over the positions (dim=1); the probabilities must sum to 1 over the classes (dim=-1)":
            lambda logits, labels, pad_id, eps: per_token(logits, labels, eps, dim=1)[labels != pad_id].mean(),
        "each sentence is averaged first, then the sentences; average over all real tokens at once, so that every "
        "token counts the same": sentence_means,
    }
    _refuse_calls(fn, [case for _, case in cases], _CROSS_ENTROPY,
                  lambda label, _: f"your function called {label}; the exercise is to write the smoothed loss "
                                   f"without calling cross_entropy, from log_softmax and the smoothed target q.",
                  "grade_label_smoothed_loss", seed)
    _run("grade_label_smoothed_loss", fn,
         lambda logits, labels, pad_id, eps: translation_loss(logits, labels, pad_id, eps), cases, seed, hints=hints)
