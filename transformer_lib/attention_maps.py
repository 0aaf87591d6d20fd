from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import matplotlib.pyplot as plt
import seaborn as sns
import torch
from torch import Tensor

from transformer_lib.model import Transformer
from transformer_lib.multihead import MultiHeadAttention


@contextmanager
def explicit_attention(model: Transformer) -> Iterator[None]:
    """Run every attention module on the explicit path, which returns weights; restore the fused path afterwards."""
    modules = [m for m in model.modules() if isinstance(m, MultiHeadAttention)]
    saved = [m.fused for m in modules]
    for m in modules:
        m.fused = False
    try:
        yield
    finally:
        for m, fused in zip(modules, saved):
            m.fused = fused


@torch.no_grad()
def collect_attention(model: Transformer, src: Tensor, tgt: Tensor) -> dict[str, Tensor]:
    """Every attention module's weights for one teacher-forced pass, keyed like "decoder.2.cross": (B, h, T_q, T_k)."""
    names = {}
    for i, layer in enumerate(model.encoder.layers):
        names[layer.self_attn] = f"encoder.{i}.self"
    for i, layer in enumerate(model.decoder.layers):
        names[layer.self_attn] = f"decoder.{i}.self"
        names[layer.cross_attn] = f"decoder.{i}.cross"
    weights: dict[str, Tensor] = {}
    hooks = [
        module.register_forward_hook(lambda module, args, output: weights.__setitem__(names[module], output[1].cpu()))
        for module in names
    ]
    was_training = model.training
    try:
        model.eval()
        with explicit_attention(model):
            model(src, tgt)
    finally:
        for hook in hooks:
            hook.remove()
        model.train(was_training)
    return weights


def plot_attention(
    weights: Tensor, query_tokens: Sequence[str], key_tokens: Sequence[str], ax=None, title: str = "", cbar: bool = True
):
    """Draw one (T_q, T_k) attention matrix as a heatmap with the tokens on the axes."""
    if weights.shape != (len(query_tokens), len(key_tokens)):
        raise ValueError(
            f"weights has shape {tuple(weights.shape)}, expected ({len(query_tokens)}, {len(key_tokens)}) "
            f"= (len(query_tokens), len(key_tokens))"
        )
    ax = ax or plt.gca()
    sns.heatmap(
        weights.float().numpy(), xticklabels=list(key_tokens), yticklabels=list(query_tokens), vmin=0.0, vmax=1.0,
        cmap="viridis", square=False, cbar=cbar, cbar_kws={"label": "attention weight"} if cbar else None, ax=ax,
    )
    ax.set(title=title, xlabel="attended to (keys)", ylabel="attending (queries)")
    ax.tick_params(axis="x", labelrotation=90)
    ax.tick_params(axis="y", labelrotation=0)
    return ax


def plot_heads(weights: Tensor, query_tokens: Sequence[str], key_tokens: Sequence[str], title: str = ""):
    """A grid of heatmaps, one row per layer and one column per head, for weights of shape (L, h, T_q, T_k)."""
    n_layers, n_heads = weights.shape[:2]
    fig, axes = plt.subplots(
        n_layers, n_heads, figsize=(2.2 * n_heads, 2.2 * n_layers), squeeze=False, sharex=True, sharey=True
    )
    for layer in range(n_layers):
        for head in range(n_heads):
            ax = axes[layer, head]
            sns.heatmap(weights[layer, head].float().numpy(), vmin=0.0, vmax=1.0, cmap="viridis", cbar=False, ax=ax,
                        xticklabels=list(key_tokens) if layer == n_layers - 1 else False,
                        yticklabels=list(query_tokens) if head == 0 else False)
            ax.set_title(f"layer {layer + 1}, head {head + 1}", fontsize=8)
            ax.tick_params(labelsize=6)
    fig.suptitle(title)
    fig.tight_layout()
    return fig
