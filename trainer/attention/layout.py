"""Zigzag split of a packed window across the ranks of a context-parallel group.

With causal attention the cost of a query grows with its position, so giving rank ``r`` one contiguous
slice would leave the last rank with most of the work. The zigzag layout cuts the window into ``2P``
equal chunks and gives rank ``r`` chunks ``r`` and ``2P - 1 - r``: every rank then holds one early and
one late chunk and does the same amount of causal work.

The production splitter lives in ``packer/``; this helper defines the layout the ring schedule is
balanced for and is used by tests and benchmarks.
"""

from __future__ import annotations

import torch
from torch import Tensor


def zigzag_indices(
    seq_len: int, world_size: int, rank: int, *, device: torch.device | str | None = None
) -> Tensor:
    """Global token indices (int64, increasing) that ``rank`` holds in the zigzag layout.

    Raises ``ValueError`` unless ``seq_len`` is a positive multiple of ``2 * world_size`` and
    ``0 <= rank < world_size``.
    """
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside a group of size {world_size}")
    n_chunks = 2 * world_size
    if seq_len <= 0 or seq_len % n_chunks:
        raise ValueError(f"seq_len {seq_len} must be a positive multiple of 2 * world_size = {n_chunks}")
    chunk = seq_len // n_chunks
    late = n_chunks - 1 - rank
    return torch.cat(
        [
            torch.arange(rank * chunk, (rank + 1) * chunk, device=device),
            torch.arange(late * chunk, (late + 1) * chunk, device=device),
        ]
    )
