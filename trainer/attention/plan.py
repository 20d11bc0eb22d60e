"""The ring schedule for one packed window: which block pairs to compute and which blocks to send.

Rank ``r`` of a ``P``-rank ring holds, at step ``t``, the key/value block that rank ``s = (r - t) % P``
owns; ``t`` is that block's *position* on its trip ``s -> s+1 -> ... -> s+P-1``. Planning gathers every
rank's token metadata once (two int64 values per token, negligible next to key/value traffic), so all
ranks derive the same decisions without further agreement:

* ``need[r, s]``: does any query of rank ``r`` see any key of rank ``s``? Pairs without same-segment
  causal overlap are never computed.
* ``last[s]``: the last position whose rank needs block ``s``. The block is forwarded only up to there;
  with many short documents most blocks never leave their owner.
* In backward, the dk/dv accumulator of block ``s`` is created at the first position (after the owner)
  that needs it, rides the ring with the block up to ``last[s]`` and is then sent straight back to its
  owner, which adds it to its own contribution.

The plan depends only on indices and segment ids, so one plan serves every layer of a micro-batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
import torch.distributed as dist
from torch import Tensor

from longctx.trainer.attention.comm import RingCommError
from longctx.trainer.attention.masks import BlockMask, block_mask, pair_extents


@dataclass(frozen=True)
class RingStats:
    """What the plan saves over the dense ring, per attention call (forward; backward mirrors it)."""

    world_size: int
    tokens_q: int
    tokens_kv: int
    pairs_computed: int
    scores_computed: int
    kv_sends: int

    @property
    def pairs_total(self) -> int:
        """Block pairs of the dense ring: every rank's queries against every rank's keys."""
        return self.world_size**2

    @property
    def compute_fraction(self) -> float:
        """Fraction of (query rank, key rank) block pairs that are computed."""
        return self.pairs_computed / self.pairs_total

    @property
    def score_fraction(self) -> float:
        """Fraction of the dense ring's query-key scores inside computed rectangles.

        Finer than ``compute_fraction``: it also counts the rows and columns trimmed from a computed
        pair (with zigzag, about half of every off-diagonal pair even for a single document).
        """
        return self.scores_computed / (self.pairs_total * self.tokens_q * self.tokens_kv)

    @property
    def kv_sends_dense(self) -> int:
        """Key/value block transfers of a ring that forwards every block ``P - 1`` times."""
        return self.world_size * (self.world_size - 1)


def _check_metadata(index: Tensor, segment: Tensor, name: str) -> None:
    if index.dim() != 1 or segment.shape != index.shape or index.numel() == 0:
        raise ValueError(f"{name}_index and {name}_segment must be non-empty 1-D tensors of one length")
    if index.dtype.is_floating_point or segment.dtype.is_floating_point:
        raise TypeError(f"{name}_index and {name}_segment must be integer tensors")
    if segment.device != index.device:
        raise ValueError(f"{name}_index and {name}_segment must be on one device")


def _all_gather(tensor: Tensor, group: dist.ProcessGroup, world_size: int, what: str) -> Tensor:
    parts = [torch.empty_like(tensor) for _ in range(world_size)]
    try:
        dist.all_gather(parts, tensor, group=group)
    except RuntimeError as exc:
        raise RingCommError(f"ring attention plan: all_gather of {what} failed: {exc}") from exc
    return torch.stack(parts)


class RingPlan:
    """Schedule and block masks of ring attention for one packed window; build with ``build_ring_plan``.

    ``need[r][s]``: rank ``r``'s queries see some key of rank ``s`` (the same on every rank).
    ``blocks[s]``: what this rank computes against rank ``s``'s keys (None: skipped).
    ``last[s]``: last ring position (steps from ``s``) that needs block ``s``.
    ``first_remote[s]``: first position after the owner that needs it (None: no other rank does).
    ``stats``: the ``RingStats`` of the call.
    """

    def __init__(
        self,
        group: dist.ProcessGroup | None,
        rank: int,
        need: list[list[bool]],
        blocks: list[BlockMask | None],
        n_q: int,
        n_kv: int,
        scores_computed: int,
    ) -> None:
        self.group = group
        self.rank = rank
        self.world_size = len(need)
        self.n_q = n_q
        self.n_kv = n_kv
        self.need = need
        self.blocks = blocks
        world = self.world_size
        self.last = [
            max((p for p in range(world) if need[(s + p) % world][s]), default=0) for s in range(world)
        ]
        self.first_remote = [
            next((p for p in range(1, world) if need[(s + p) % world][s]), None) for s in range(world)
        ]
        self.stats = RingStats(world, n_q, n_kv, sum(map(sum, need)), scores_computed, sum(self.last))
        self.op_key: int | None = None
        """Key of this plan in the ring operator's registry (``ring.plan_key``), once registered."""

    # Ring geometry -------------------------------------------------------------------------------
    def source(self, step: int) -> int:
        """Owner of the key/value block this rank holds at ``step``."""
        return (self.rank - step) % self.world_size

    @cached_property
    def _global_ranks(self) -> list[int]:
        return [dist.get_global_rank(self.group, r) for r in range(self.world_size)]

    def global_rank(self, group_rank: int) -> int:
        """Global rank of a group member, the address P2P operations use."""
        return self._global_ranks[group_rank % self.world_size]

    @property
    def next_rank(self) -> int:
        """Group rank this rank sends to along the ring."""
        return (self.rank + 1) % self.world_size

    @property
    def prev_rank(self) -> int:
        """Group rank this rank receives from along the ring."""
        return (self.rank - 1) % self.world_size

    # Key/value traffic ---------------------------------------------------------------------------
    def kv_forwarded(self, source: int, position: int) -> bool:
        """Whether block ``source`` moves on from ``position`` (some later rank needs it)."""
        return position < self.last[source]

    # dk/dv accumulator traffic (backward) --------------------------------------------------------
    def acc_exists(self, source: int, position: int) -> bool:
        """Whether the travelling dk/dv accumulator of ``source`` is held at ``position``."""
        first = self.first_remote[source]
        return first is not None and first <= position <= self.last[source]

    def acc_arrives(self, source: int, position: int) -> bool:
        """Whether the accumulator of ``source`` is received from the previous rank at ``position``."""
        return position >= 1 and self.acc_exists(source, position - 1) and position - 1 < self.last[source]

    def acc_destination(self, source: int, position: int) -> int:
        """Group rank the accumulator held at ``position`` goes to: the next rank, or home after the last."""
        return self.next_rank if position < self.last[source] else source

    @property
    def acc_return_step(self) -> int | None:
        """Step at which this rank's own accumulator comes home (None if no other rank needs its block)."""
        if self.first_remote[self.rank] is None:
            return None
        return self.last[self.rank] + 1

    @property
    def acc_return_sender(self) -> int:
        """Group rank that sends this rank's accumulator home."""
        return (self.rank + self.last[self.rank]) % self.world_size


def build_ring_plan(
    q_index: Tensor,
    q_segment: Tensor,
    *,
    kv_index: Tensor | None = None,
    kv_segment: Tensor | None = None,
    group: dist.ProcessGroup | None = None,
    skip_empty_blocks: bool = True,
    tile_blocks: bool = True,
) -> RingPlan:
    """Plan ring attention for this rank's tokens of a packed window.

    ``q_index``/``q_segment`` are the global token indices and segment ids of the local query tokens
    (1-D, in the order of the rows of ``q``); ``kv_index``/``kv_segment`` describe the local key/value
    tokens and default to the query ones (self-attention). Every rank must hold the same number of
    tokens (the zigzag layout does). ``group`` is the context-parallel process group; ``None`` or a
    group of size 1 plans a local call. Two independent savings, each can be turned off for baselines
    (benchmarks, debugging): ``skip_empty_blocks=False`` sends and computes every block pair, even one
    where no query sees any key; ``tile_blocks=False`` computes each computed block whole (no trimming
    to the rectangle of allowed entries, no tiles), so dense-mask kernels also compute its masked part.
    Collective: every rank of ``group`` must call it.
    """
    kv_index = q_index if kv_index is None else kv_index
    kv_segment = q_segment if kv_segment is None else kv_segment
    _check_metadata(q_index, q_segment, "q")
    _check_metadata(kv_index, kv_segment, "kv")
    world_size = 1 if group is None else dist.get_world_size(group)
    rank = 0 if group is None else dist.get_rank(group)
    if rank < 0:
        raise ValueError("this process is not a member of the given process group")
    n_q, n_kv = q_index.numel(), kv_index.numel()
    local = torch.cat([q_index, q_segment, kv_index, kv_segment]).to(torch.int64)
    if world_size > 1:
        lengths = _all_gather(
            torch.tensor([n_q, n_kv], device=local.device), group, world_size, "token counts"
        )
        if bool((lengths != lengths[0]).any()):
            raise ValueError(
                f"every rank must hold the same numbers of tokens, got (q, kv) = {lengths.tolist()}"
            )
        gathered = _all_gather(local, group, world_size, "token indices and segment ids")
    else:
        gathered = local[None]
    q_idx, q_seg, kv_idx, kv_seg = gathered.split([n_q, n_q, n_kv, n_kv], dim=1)
    if skip_empty_blocks:
        overlaps, areas = pair_extents(q_idx, q_seg, kv_idx, kv_seg)
        need, scores = overlaps.tolist(), int(areas.sum())
    else:
        need, scores = [[True] * world_size for _ in range(world_size)], world_size**2 * n_q * n_kv
    blocks = [
        block_mask(q_idx[rank], q_seg[rank], kv_idx[s], kv_seg[s], trim=tile_blocks)
        if need[rank][s]
        else None
        for s in range(world_size)
    ]
    return RingPlan(group, rank, need, blocks, n_q, n_kv, scores)
