import math
import random
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import Tensor, nn
from tqdm.auto import tqdm

from transformer_lib.masks import padding_mask
from transformer_lib.model import Transformer, TransformerConfig


def teacher_forcing_pair(tgt: Tensor) -> tuple[Tensor, Tensor]:
    """Split target ids <bos> y1 .. yn <eos> (B, T+1) into decoder input (B, T) and the labels it must predict (B, T)."""
    if tgt.dim() != 2 or tgt.size(1) < 2:
        raise ValueError(f"tgt must be (batch, length) with length >= 2 (<bos> ... <eos>), got shape {tuple(tgt.shape)}")
    return tgt[:, :-1], tgt[:, 1:]  # input: <bos> y1 .. yn ; labels: y1 .. yn <eos>


def translation_loss(logits: Tensor, labels: Tensor, pad_id: int, label_smoothing: float = 0.1) -> Tensor:
    """Mean cross-entropy over the real (non-padding) target tokens, with label smoothing."""
    return nn.functional.cross_entropy(
        logits.flatten(0, 1),  # (B, T, V) -> (B*T, V)
        labels.flatten(),  # (B, T) -> (B*T,)
        ignore_index=pad_id,
        label_smoothing=label_smoothing,
    )


def noam_lr(step: int, d_model: int, warmup: int) -> float:
    """The paper's learning rate (eq. 3): d_model^-0.5 * min(step^-0.5, step * warmup^-1.5), for step >= 1."""
    if step < 1:
        raise ValueError(f"step must be >= 1, got {step}")
    return d_model**-0.5 * min(step**-0.5, step * warmup**-1.5)


def make_optimizer(
    model: nn.Module, d_model: int, warmup: int = 4000, factor: float = 1.0
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """Adam with the paper's betas and epsilon, driven by the warm-up then inverse-square-root schedule."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=(0.9, 0.98), eps=1e-9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: factor * noam_lr(i + 1, d_model, warmup))
    return optimizer, scheduler


def autocast_dtype(device: torch.device) -> torch.dtype | None:
    """The mixed-precision type for a device: bf16 where the GPU has it, fp16 on older GPUs, None (fp32) elsewhere."""
    if device.type != "cuda":
        return None
    return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16


@dataclass
class TrainState:
    """Where training stands: steps taken, position in the data, and the loss history for plotting."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    history: list[tuple[int, float]] = field(default_factory=list)


def _rng_states() -> dict:
    states = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def _set_rng_states(states: dict) -> None:
    torch.set_rng_state(states["torch"])
    random.setstate(states["python"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def save_checkpoint(
    path: str | Path,
    model: Transformer,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler: torch.amp.GradScaler | None,
    state: TrainState,
    extra: dict | None = None,
) -> None:
    """Save everything a resumed run needs to continue the same trajectory: weights, optimizer, RNGs, config, data position."""
    torch.save(
        {
            "config": asdict(model.cfg),
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "scaler": scaler.state_dict() if scaler is not None else None,
            "state": asdict(state),
            "rng": _rng_states(),
            "extra": extra or {},
        },
        path,
    )


def load_checkpoint(path: str | Path, device: torch.device | str = "cpu") -> dict:
    """Read a checkpoint written by save_checkpoint; a clear error when the file is missing."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint {str(path)!r} does not exist; expected a file written by save_checkpoint")
    return torch.load(path, map_location=device, weights_only=False)


def model_from_checkpoint(checkpoint: dict, device: torch.device | str = "cpu") -> Transformer:
    """Rebuild the model of a checkpoint, with its weights, in evaluation mode."""
    model = Transformer(TransformerConfig(**checkpoint["config"])).to(device)
    model.load_state_dict(checkpoint["model"])
    return model.eval()


def resume_training(
    checkpoint: dict,
    model: Transformer,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    scaler: torch.amp.GradScaler | None = None,
) -> TrainState:
    """Load a checkpoint's weights, optimizer, scheduler, scaler and RNG states; return where training stood."""
    model.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    scheduler.load_state_dict(checkpoint["scheduler"])
    if scaler is not None and checkpoint["scaler"] is not None:
        scaler.load_state_dict(checkpoint["scaler"])
    _set_rng_states(checkpoint["rng"])
    state = checkpoint["state"]
    return TrainState(state["step"], state["epoch"], state["batch_in_epoch"], [tuple(h) for h in state["history"]])


def train(
    model: Transformer,
    batches_for_epoch: Callable[[int], Sequence[tuple[Tensor, Tensor]]],
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    max_steps: int,
    state: TrainState | None = None,
    label_smoothing: float = 0.1,
    clip_norm: float | None = 1.0,
    scaler: torch.amp.GradScaler | None = None,
    checkpoint_path: str | Path | None = None,
    checkpoint_every: int | None = None,
    checkpoint_extra: dict | None = None,
    log_every: int = 10,
    progress: bool = True,
) -> TrainState:
    """Train until state.step == max_steps; batches_for_epoch(e) must return the same batches for the same e."""
    device = next(model.parameters()).device
    amp_dtype = autocast_dtype(device)
    if amp_dtype == torch.float16 and scaler is None:
        raise ValueError("fp16 training needs a GradScaler: pass scaler=torch.amp.GradScaler('cuda')")
    state = state or TrainState()
    pad_id = model.cfg.pad_id
    model.train()
    bar = tqdm(total=max_steps, initial=state.step, disable=not progress, desc="training", unit="step")
    running, tokens, started = 0.0, 0, time.perf_counter()
    while state.step < max_steps:
        batches = batches_for_epoch(state.epoch)
        if len(batches) == 0:
            raise ValueError(f"batches_for_epoch({state.epoch}) returned no batches")
        for src, tgt in batches[state.batch_in_epoch :]:
            src, tgt = src.to(device, non_blocking=True), tgt.to(device, non_blocking=True)
            decoder_input, labels = teacher_forcing_pair(tgt)  # (B, T), (B, T)
            with torch.autocast(device.type, dtype=amp_dtype) if amp_dtype else nullcontext():
                logits = model(src, decoder_input)  # (B, T, V)
                loss = translation_loss(logits.float(), labels, pad_id, label_smoothing)
            optimizer.zero_grad(set_to_none=True)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.unscale_(optimizer)
            else:
                loss.backward()
            if clip_norm is not None:
                nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
            if scaler is not None:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            scheduler.step()
            state.step += 1
            state.batch_in_epoch += 1
            running += loss.item()
            tokens += int((labels != pad_id).sum())
            if state.step % log_every == 0 or state.step == max_steps:
                steps_logged = state.step % log_every or log_every
                state.history.append((state.step, running / steps_logged))
                rate = tokens / (time.perf_counter() - started)
                bar.set_postfix(loss=f"{running / steps_logged:.3f}", tok_s=f"{rate:,.0f}")
                running, tokens, started = 0.0, 0, time.perf_counter()
            bar.update(1)
            if checkpoint_path and checkpoint_every and state.step % checkpoint_every == 0:
                save_checkpoint(checkpoint_path, model, optimizer, scheduler, scaler, state, checkpoint_extra)
            if state.step >= max_steps:
                break
        else:
            state.epoch += 1
            state.batch_in_epoch = 0
    bar.close()
    if checkpoint_path:
        save_checkpoint(checkpoint_path, model, optimizer, scheduler, scaler, state, checkpoint_extra)
    return state


@torch.no_grad()
def greedy_decode(
    model: Transformer, src: Tensor, max_len: int, bos_id: int, eos_id: int, use_cache: bool = True
) -> Tensor:
    """Translate a batch by always taking the most likely next token; (B, S) -> (B, <= max_len) ids after <bos>."""
    model.eval()
    src_mask = padding_mask(src, model.cfg.pad_id)  # (B, 1, 1, S)
    memory = model.encode(src, src_mask)  # (B, S, d_model)
    out = torch.full((src.size(0), 1), bos_id, dtype=torch.long, device=src.device)  # (B, 1)
    finished = torch.zeros(src.size(0), dtype=torch.bool, device=src.device)  # (B,)
    cache = model.init_cache() if use_cache else None
    for _ in range(max_len):
        step_input = out[:, -1:] if use_cache else out  # the cache remembers every earlier token
        logits = model.decode(step_input, memory, src_mask, cache=cache)[:, -1]  # (B, t, V) -> (B, V)
        next_id = logits.argmax(-1).masked_fill(finished, model.cfg.pad_id)  # (B,)
        out = torch.cat([out, next_id[:, None]], dim=1)  # (B, t + 1)
        finished |= next_id == eos_id
        if finished.all():
            break
    return out[:, 1:]
