"""Context-parallel splitting of a packed window in the zigzag layout used by ring attention.

A window of ``L`` tokens is cut into ``2P`` equal chunks for ``P`` context-parallel ranks; rank
``r`` holds chunks ``r`` and ``2P - 1 - r``, which balances causal-attention work across ranks.
Documents are not aligned to chunks: only ``L`` must be divisible by ``2P`` (the mesh's rule,
``longctx.trainer.parallel.mesh``). Each rank gets its tokens with their global indices, position ids,
labels, loss mask and segment ids, from which ring attention builds its masks (a query attends to a
key iff they share a segment id and the key's global index is not larger).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from longctx.trainer.parallel.mesh import MeshShape


@dataclass(frozen=True)
class ContextParallelShard:
    """One rank's share of a window (or of a ``[batch, L]`` batch, along the last dimension)."""

    indices: torch.Tensor
    input_ids: torch.Tensor
    labels: torch.Tensor
    position_ids: torch.Tensor
    loss_mask: torch.Tensor
    segment_ids: torch.Tensor


def zigzag_indices(length: int, cp_size: int, cp_rank: int) -> torch.Tensor:
    """Global token indices held by ``cp_rank``: chunks ``cp_rank`` and ``2 x cp_size - 1 - cp_rank``
    (``length`` must split into those chunks:
    :meth:`~longctx.trainer.parallel.mesh.MeshShape.check_window`)."""
    if cp_size < 1 or not 0 <= cp_rank < cp_size:
        raise ValueError(f"need 0 <= cp_rank < cp_size, got cp_rank={cp_rank}, cp_size={cp_size}")
    MeshShape.check_window(length, cp_size, length_key="sequence length", cp_key="cp_size")
    chunks = MeshShape.chunks_per_window(cp_size)
    chunk = length // chunks
    first = torch.arange(cp_rank * chunk, (cp_rank + 1) * chunk)
    second = torch.arange((chunks - 1 - cp_rank) * chunk, (chunks - cp_rank) * chunk)
    return torch.cat([first, second])


def segment_ids(cu_seqlens: torch.Tensor, total: int) -> torch.Tensor:
    """Segment index of each of ``total`` tokens, from boundaries ``cu_seqlens`` (0 ... total)."""
    return torch.searchsorted(cu_seqlens[1:].to(torch.int64), torch.arange(total), right=True)
