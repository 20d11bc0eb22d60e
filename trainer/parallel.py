"""Process groups for a 2-D layout of data-parallel x context-parallel ranks.

Ranks are laid out context-parallel-major: rank ``r`` has ``dp_rank = r // cp`` and
``cp_rank = r % cp``, so the ranks of one ring are neighbours (on one node when ``cp`` fits in it).
Every group carries the configured timeout: a dead or stuck rank ends in an error, not a hang.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from longctx.core.errors import ConfigError


@dataclass(frozen=True)
class ParallelState:
    rank: int
    world_size: int
    dp_rank: int
    dp_size: int
    cp_rank: int
    cp_size: int
    device: torch.device
    cp_group: dist.ProcessGroup | None  # None: a single process, no communication
    world_group: dist.ProcessGroup | None

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_parallel(cp: int, timeout_s: int) -> ParallelState:
    """Join the torchrun job (or run as one process) and build the context-parallel groups.

    Uses NCCL when CUDA is available and gloo otherwise. Raises ``ConfigError`` when ``cp`` does not
    divide the world size.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if cp < 1 or world_size % cp:
        raise ConfigError(
            f"train.cp = {cp} must divide the number of processes ({world_size}); "
            f"start {cp} or a multiple of {cp} processes (torchrun --nproc-per-node, or longctx train --nproc)"
        )
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    else:
        device = torch.device("cpu")
    if world_size == 1:
        return ParallelState(0, 1, 0, 1, 0, 1, device, None, None)
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))
    timeout = timedelta(seconds=timeout_s)
    cp_group = None
    for first in range(0, world_size, cp):  # every rank creates every group, in the same order
        group = dist.new_group(list(range(first, first + cp)), timeout=timeout)
        if first <= rank < first + cp:
            cp_group = group
    return ParallelState(
        rank=rank,
        world_size=world_size,
        dp_rank=rank // cp,
        dp_size=world_size // cp,
        cp_rank=rank % cp,
        cp_size=cp,
        device=device,
        cp_group=cp_group if cp > 1 else None,
        world_group=dist.group.WORLD,
    )


def all_reduce_sum(tensor: torch.Tensor, state: ParallelState) -> torch.Tensor:
    """Sum over every rank (data- and context-parallel), in place; a no-op for one process."""
    if state.world_group is not None:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=state.world_group)
    return tensor


def all_reduce_max(tensor: torch.Tensor, state: ParallelState) -> torch.Tensor:
    if state.world_group is not None:
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX, group=state.world_group)
    return tensor


def sync_gradients(parameters: list[torch.nn.Parameter], state: ParallelState) -> None:
    """Sum gradients over all ranks in one flat buffer.

    The model is replicated on every rank and each rank's loss is already divided by the token
    count of the whole data- x context-parallel group, so the sum is the exact gradient.
    """
    if state.world_group is None:
        return
    grads = [p.grad for p in parameters if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=state.world_group)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def shutdown() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
