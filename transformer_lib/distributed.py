"""Hand-written helpers for data-parallel training under torchrun, explained in book/appendix_scaling_out.ipynb.

torchrun starts one process per device and tells each, through environment variables, who it is. These helpers
join those processes into one group, give each its share of every batch and keep the training exact. On a single
process (no torchrun) each of them does nothing: the rank is 0, nothing is split, the loss weight is 1.0.

TorchrunProcess gathers them behind the members of chapter 7's SingleProcess, so that chapter 7's `train` and
chapter 8's `train_translator` run under torchrun when they are given one (`process=TorchrunProcess()`), as the
command line does when torchrun started it, without a line of their own about ranks.
"""

import os
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import Tensor, nn

from transformer_lib.runtime import get_device


class LaunchInfo(NamedTuple):
    """Where torchrun placed this process: its rank among all, their number, and its rank on this machine."""

    rank: int
    world_size: int
    local_rank: int


def launch_info() -> LaunchInfo:
    """Read RANK, WORLD_SIZE and LOCAL_RANK, which torchrun sets for each process; (0, 1, 0) without torchrun."""
    values = []
    for name, default in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
        raw = os.environ.get(name, default)
        try:
            values.append(int(raw))
        except ValueError:
            raise ValueError(f"environment variable {name} must be an integer, got {raw!r}") from None
    rank, world_size, local_rank = values
    if world_size < 1 or not 0 <= rank < world_size or local_rank < 0:
        raise ValueError(
            f"RANK={rank}, WORLD_SIZE={world_size}, LOCAL_RANK={local_rank}: expected 0 <= RANK < WORLD_SIZE "
            f"and LOCAL_RANK >= 0 (torchrun sets them; do not set them by hand)"
        )
    return LaunchInfo(rank, world_size, local_rank)


def is_distributed() -> bool:
    """True when this process belongs to an initialised process group of more than one process."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def world_size() -> int:
    """The number of processes training together: 1 without a process group."""
    return dist.get_world_size() if is_distributed() else 1


def is_main_process() -> bool:
    """True on the process that prints and writes files: rank 0, or the only process."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank() == 0
    return launch_info().rank == 0  # before joining or after leaving the group, torchrun's RANK still tells


def init_distributed() -> bool:
    """Join the group of processes torchrun started (NCCL on GPUs, gloo on CPUs); True when this call joined one.

    Returns False, doing nothing, on a single process (WORLD_SIZE unset or 1) or when a group already exists.
    MASTER_ADDR and MASTER_PORT, also set by torchrun, tell the processes where to meet.
    """
    info = launch_info()
    if info.world_size == 1 or dist.is_initialized():
        return False
    if torch.cuda.is_available():
        if info.local_rank >= torch.cuda.device_count():
            raise RuntimeError(
                f"LOCAL_RANK={info.local_rank} but this machine shows {torch.cuda.device_count()} CUDA device(s); "
                f"expected --nproc_per_node <= {torch.cuda.device_count()} (or CUDA_VISIBLE_DEVICES= to train on CPUs)"
            )
        torch.cuda.set_device(info.local_rank)  # one GPU per process: cuda:LOCAL_RANK
        dist.init_process_group("nccl", rank=info.rank, world_size=info.world_size)
    else:
        dist.init_process_group("gloo", rank=info.rank, world_size=info.world_size)
    return True


def destroy_distributed() -> None:
    """Leave the process group, after a barrier so that no process quits while another still needs it."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def local_device() -> torch.device:
    """This process's device: cuda:LOCAL_RANK in an NCCL group, the CPU in a gloo group, else get_device()."""
    if not is_distributed():
        return get_device()
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def data_parallel(model: nn.Module) -> nn.Module:
    """Wrap the model in DistributedDataParallel inside a process group; return it unchanged on one process."""
    if not is_distributed():
        return model
    device = next(model.parameters()).device
    return nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside a DistributedDataParallel wrapper (whose state_dict keys start with 'module.'), or the model."""
    return model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model


def broadcast_from_main(obj: Any) -> Any:
    """Rank 0's obj on every process (pickled and sent); obj itself on a single process."""
    if not is_distributed():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _trim(ids: Tensor, pad_id: int) -> Tensor:
    """Drop the trailing columns that hold only padding."""
    used = torch.nonzero((ids != pad_id).any(dim=0))  # (n_used, 1) indices of columns with a real token
    return ids[:, : int(used.max()) + 1] if used.numel() else ids


def shard_batch(
    src: Tensor,
    tgt: Tensor,
    pad_id: int,
    rank: int | None = None,
    world_size: int | None = None,
    whole_if_small: bool = False,
) -> tuple[Tensor, Tensor]:
    """This process's share of a batch: a contiguous slice of its sentences, without all-padding columns.

    The slices of ranks 0 .. world_size-1 hold every sentence exactly once, in order (sizes differ by at most one).
    A batch with fewer sentences than processes is refused, or with whole_if_small goes whole to every process:
    token_share then weights each copy by 1/world_size, so the gradient is still exactly that of the batch.
    rank and world_size default to the process group's; with world_size 1 the batch is returned unchanged.
    """
    if rank is None or world_size is None:
        rank = dist.get_rank() if is_distributed() else 0
        world_size = dist.get_world_size() if is_distributed() else 1
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank={rank} and world_size={world_size}: expected 0 <= rank < world_size")
    if src.size(0) != tgt.size(0):
        raise ValueError(f"src has {src.size(0)} sentences but tgt has {tgt.size(0)}; expected the same number")
    if world_size == 1:
        return src, tgt
    if src.size(0) < world_size:
        if whole_if_small:
            return src, tgt
        raise ValueError(
            f"a batch of {src.size(0)} sentences cannot be shared by world_size={world_size} processes; expected "
            f"at least one sentence per process (pass whole_if_small=True to give it whole to every process)"
        )
    rows = torch.tensor_split(torch.arange(src.size(0)), world_size)[rank]  # contiguous, sizes differ by <= 1
    return _trim(src[rows], pad_id), _trim(tgt[rows], pad_id)  # (b, S') and (b, T') with b ~ B / world_size


class TokenShare(NamedTuple):
    """What token_share returns: the weight for this process's loss, and the global batch's mean loss and tokens."""

    weight: Tensor | float
    loss: Tensor
    tokens: Tensor


def token_share(loss: Tensor, tokens: Tensor) -> TokenShare:
    """Weight this process's mean loss so that DDP's gradient average is the gradient of the global token mean.

    Process r holds n_r of the N target tokens and computes the mean loss L_r over them. DDP averages gradients over
    the W processes, so back-propagating L_r * (n_r * W / N) gives (1/W) sum_r (n_r W / N) grad L_r, the gradient of
    sum_r n_r L_r / N: the mean over all N tokens, as one process computes it on the whole batch. One all_reduce
    sums (n_r L_r, n_r) over processes. On a single process the weight is 1.0 and nothing is sent.
    """
    if not is_distributed():
        return TokenShare(1.0, loss.detach(), tokens)
    totals = torch.stack([loss.detach().double() * tokens, tokens.double()])  # (2,): this process's loss sum, tokens
    dist.all_reduce(totals)  # (2,): sums over all processes
    weight = (tokens * world_size() / totals[1]).to(loss.dtype)
    return TokenShare(weight, totals[0] / totals[1], totals[1])


def launched_by_torchrun() -> bool:
    """True when torchrun (or torch.distributed.run) started this process as one of several."""
    return launch_info().world_size > 1


class TorchrunProcess:
    """One of the processes torchrun started, with the members of chapter 7's SingleProcess (training.py).

    Creating it joins the group (init_distributed); close() leaves it. Only the main process (rank 0) shows progress
    and writes files; the tokenizer is trained there and broadcast; each process trains on its shard of every batch,
    with the model in DistributedDataParallel and its loss weighted by token_share.
    """

    def __init__(self) -> None:
        self.joined = init_distributed()  # False when a group already exists, or on a single process

    @property
    def is_main(self) -> bool:
        return is_main_process()

    @property
    def world_size(self) -> int:
        return world_size()

    def device(self) -> torch.device:
        return local_device()

    def broadcast(self, obj: Any) -> Any:
        return broadcast_from_main(obj)

    def shard(self, src: Tensor, tgt: Tensor, pad_id: int) -> tuple[Tensor, Tensor]:
        return shard_batch(src, tgt, pad_id, whole_if_small=True)  # a batch smaller than the group goes to everyone

    def wrap(self, model: nn.Module) -> nn.Module:
        return data_parallel(model)

    def unwrap(self, model: nn.Module) -> nn.Module:
        return unwrap(model)

    def share(self, loss: Tensor, tokens: Tensor) -> TokenShare:
        return token_share(loss, tokens)

    def close(self) -> None:
        """Leave the group if this object joined it."""
        if self.joined:
            destroy_distributed()
            self.joined = False
