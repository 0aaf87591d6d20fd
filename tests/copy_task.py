"""The copy task that the training tests share (a helper, not a test): a small model, its optimizer and its batches."""

import torch

import transformer_lib as tl
from transformer_lib.training import make_optimizer

CFG = dict(src_vocab_size=20, tgt_vocab_size=20, d_model=32, n_heads=4, n_layers=2, d_ff=64, max_len=32)


def copy_batches(epoch: int):
    """Four batches of a copy task on the host, the same for the same epoch (train copies them to the device)."""
    generator = torch.Generator().manual_seed(1000 + epoch)
    batches = []
    for _ in range(4):
        body = torch.randint(4, 20, (16, 6), generator=generator)
        tgt = torch.cat([torch.full((16, 1), tl.BOS_ID), body, torch.full((16, 1), tl.EOS_ID)], dim=1)
        batches.append((body, tgt))
    return batches


def fresh(seed: int = 0, dropout: float = 0.1, device: str = "cpu"):
    """A seeded model built on device (model.to("meta") would untie the tied embeddings), its Adam and schedule."""
    torch.manual_seed(seed)
    with torch.device(device):
        model = tl.Transformer(tl.TransformerConfig(**CFG, dropout=dropout))
    return (model, *make_optimizer(model, 32, warmup=50, factor=0.25))
