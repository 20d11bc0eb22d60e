"""Which tokens of a packed row each rank of a context-parallel group holds (``train.cp_layout``).

Two layouts, both equal token counts per rank:

* ``zigzag``: rank ``r`` of a ``P``-rank ring holds chunks ``r`` and ``2P - 1 - r`` of the row
  (``zigzag.py``), which balances causal work for a row that is one document;
* ``balanced``: document-aware (``balance.py``), which balances causal work for rows packed from
  many documents of uneven length and keeps short documents whole on one rank.

With an all-to-all group (``cp_mode`` ulysses or hybrid, degree ``u``) the layout is over the ring's
``cp / u`` groups, whose attention work is what differs; the ``u`` members of a group then hold equal
consecutive slices of the group's tokens (the all-to-all gathers them back). Context-parallel rank
``c`` is member ``c % u`` of group ``c // u`` (``longctx.trainer.parallel.state`` builds the mesh so).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from longctx.trainer.parallel.balance import balanced_indices
from longctx.trainer.parallel.zigzag import ContextParallelShard, segment_ids, zigzag_indices

CP_LAYOUTS = ("balanced", "zigzag")


def group_indices(cu_seqlens: torch.Tensor, length: int, groups: int, layout: str) -> list[torch.Tensor]:
    """The window indices each of ``groups`` ring ranks holds under ``layout``, ascending."""
    if layout == "zigzag":
        return [zigzag_indices(length, groups, g) for g in range(groups)]
    if layout == "balanced":
        return balanced_indices(cu_seqlens.tolist(), groups)
    raise ValueError(f"unknown context-parallel layout {layout!r}; use one of {', '.join(CP_LAYOUTS)}")


def rank_indices(
    cu_seqlens: torch.Tensor, length: int, *, cp: int, cp_rank: int, layout: str, ulysses: int = 1
) -> torch.Tensor:
    """Window indices held by ``cp_rank`` of ``cp`` ranks whose all-to-all groups have ``ulysses`` members."""
    if cp < 1 or ulysses < 1 or cp % ulysses or not 0 <= cp_rank < cp:
        raise ValueError(f"need 0 <= cp_rank < cp with ulysses dividing cp, got {cp_rank}, {cp}, {ulysses}")
    group, member = divmod(cp_rank, ulysses)
    held = group_indices(cu_seqlens, length, cp // ulysses, layout)[group]
    return held.view(ulysses, -1)[member]


def context_split(
    sample: Mapping[str, torch.Tensor], *, cp: int, cp_rank: int, layout: str = "zigzag", ulysses: int = 1
) -> ContextParallelShard:
    """``cp_rank``'s share of ``sample`` (a packed row, or a ``[batch, L]`` batch of them: several
    rows only with the zigzag layout, which takes the same indices of every row), along the last dimension."""
    input_ids = sample["input_ids"]
    length = input_ids.shape[-1]
    if layout != "zigzag" and input_ids.dim() > 1 and input_ids.shape[:-1].numel() != 1:
        raise ValueError(
            f"the {layout} layout splits one row at a time, got a batch of shape {tuple(input_ids.shape)}"
        )
    index = rank_indices(sample["cu_seqlens"], length, cp=cp, cp_rank=cp_rank, layout=layout, ulysses=ulysses)
    segments = segment_ids(sample["cu_seqlens"], input_ids.numel()).reshape(input_ids.shape)
    return ContextParallelShard(
        indices=index,
        input_ids=input_ids[..., index],
        labels=sample["labels"][..., index],
        position_ids=sample["position_ids"][..., index],
        loss_mask=sample["loss_mask"][..., index],
        segment_ids=segments[..., index],
    )
