"""Context-parallel attention modes (``train.cp_mode``), each exact, each bound once per packed row.

All modes compute the same thing: every rank's queries attend, causally and within their document,
over the whole window, whose tokens are spread over the ranks of the context-parallel group. They
differ in what travels (``docs/training.md`` says when to use which; ``longctx plan`` prices them):

* :class:`RingAttention` (``ring``): key/value blocks pass around the ranks, overlapped with compute,
  and only as far as some rank needs them (``plan.py``).
* :class:`AllGatherAttention` (``allgather``, Llama 3's choice for GQA models with document masks):
  every rank gathers all keys and values, attends locally, and the key/value gradients are
  reduce-scattered back. It holds the whole window's keys and values, and skips the gather for a row
  in which no rank needs another's keys.
* :class:`UlyssesAttention` (``ulysses``, DeepSpeed-Ulysses; ``hybrid``, USP): all-to-alls trade
  tokens for heads, so each rank of an all-to-all group attends over the group's tokens for a share of
  the heads; a ring across the groups (``hybrid``) covers the rest of the window. Key/value heads
  fewer than the group are copied so that each rank gets one (as USP does).

Every mode takes the tokens' global window indices and document ids, so masks never depend on which
rank holds a token (``masks.py``): any layout of the row over ranks (``longctx.trainer.parallel.layout``)
gives exact results. ``last_stats`` keeps the row's :class:`RingStats` for the trainer's metrics.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch import Tensor

from longctx.trainer.attention.masks import pair_extents
from longctx.trainer.attention.plan import RingStats, build_ring_plan
from longctx.trainer.attention.ring import ring_attention

RowAttention = Callable[..., Tensor]
"""What ``bind`` returns: attention ``(q, k, v, softmax_scale=None) -> out`` over one row's tokens."""


def _size(group: dist.ProcessGroup | None) -> int:
    return 1 if group is None else dist.get_world_size(group)


def _gather_metadata(
    index: Tensor, segment: Tensor, group: dist.ProcessGroup | None
) -> tuple[Tensor, Tensor]:
    """Every member's indices and segment ids, stacked ``[members, tokens]`` in group-rank order."""
    local = torch.stack([index.to(torch.int64), segment.to(torch.int64)])
    if _size(group) == 1:
        return local[0][None], local[1][None]
    parts = [torch.empty_like(local) for _ in range(_size(group))]
    dist.all_gather(parts, local, group=group)
    stacked = torch.stack(parts)
    return stacked[:, 0], stacked[:, 1]


class RingAttention:
    """``ring``: ``longctx.trainer.attention.ring_attention`` over a context-parallel process group.

    ``group=None`` is a plain local call (this process holds the whole window). :meth:`bind` builds
    the ring plan (a collective over ``group``) once per row; every layer then reuses it.
    """

    def __init__(self, group: dist.ProcessGroup | None = None, *, backend: str = "auto") -> None:
        self.group = group
        self.backend = backend
        self.last_stats: RingStats | None = None

    def bind(self, q_index: Tensor, q_segment: Tensor) -> RowAttention:
        """Plan ring attention for one row; the returned callable attends ``(q, k, v)``."""
        plan = build_ring_plan(q_index, q_segment, group=self.group)
        self.last_stats = plan.stats
        return partial(ring_attention, plan=plan, backend=self.backend)

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, *, q_index: Tensor, q_segment: Tensor) -> Tensor:
        """Plan and attend in one call (prefer :meth:`bind` when several layers share a row)."""
        return self.bind(q_index, q_segment)(q, k, v)


def _allgather_call(
    q: Tensor, k: Tensor, v: Tensor, *, plan, group, backend: str, softmax_scale: float | None = None
) -> Tensor:
    """Gather keys and values in one collective (two would reach the backward's reduce-scatters in an
    order autograd may choose differently on each rank), attend locally."""
    gather = getattr(funcol, "all_gather_single_autograd", None) or funcol.all_gather_tensor_autograd  # 2.13
    kv = gather(torch.stack([k, v], dim=1), 0, group)  # [every member's tokens, 2, kv heads, d]
    return ring_attention(q, kv[:, 0], kv[:, 1], plan, backend=backend, softmax_scale=softmax_scale)


class AllGatherAttention:
    """``allgather``: gather the window's keys and values on every rank, attend to them locally."""

    def __init__(self, group: dist.ProcessGroup | None, *, backend: str = "auto") -> None:
        self.group = group
        self.backend = backend
        self.last_stats: RingStats | None = None

    def bind(self, q_index: Tensor, q_segment: Tensor) -> RowAttention:
        """Gather the row's metadata; plan local attention over every key this rank's queries see."""
        index, segment = _gather_metadata(q_index, q_segment, self.group)
        overlaps, _ = pair_extents(index, segment, index, segment)
        remote = bool((overlaps & ~torch.eye(len(overlaps), dtype=torch.bool, device=overlaps.device)).any())
        if not remote:  # every rank's queries see only its own keys: no gather
            plan = build_ring_plan(q_index, q_segment)
            self.last_stats = plan.stats
            return partial(ring_attention, plan=plan, backend=self.backend)
        plan = build_ring_plan(q_index, q_segment, kv_index=index.flatten(), kv_segment=segment.flatten())
        self.last_stats = plan.stats
        return partial(_allgather_call, plan=plan, group=self.group, backend=self.backend)

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, *, q_index: Tensor, q_segment: Tensor) -> Tensor:
        return self.bind(q_index, q_segment)(q, k, v)


def _heads_to_tokens(parts: list[Tensor], group: dist.ProcessGroup) -> list[Tensor]:
    """Each ``[tokens, heads, d]`` tensor on each of ``u`` members -> ``[u * tokens, heads / u, d]``:
    every member's tokens (in group-rank order) for this member's share of the heads. One all-to-all
    moves them all, so that the backward runs one collective per layer in one order on every rank."""
    u = _size(group)
    n, d = parts[0].shape[0], parts[0].shape[2]
    shares = [x.shape[1] // u for x in parts]
    send = torch.cat([x.reshape(n, u, share, d) for x, share in zip(parts, shares, strict=True)], dim=2)
    send = send.transpose(0, 1).contiguous()
    out = funcol.all_to_all_single_autograd(send, None, None, group)
    return [x.reshape(u * n, share, d) for x, share in zip(out.split(shares, dim=2), shares, strict=True)]


def _tokens_to_heads(x: Tensor, group: dist.ProcessGroup) -> Tensor:
    """Inverse of :func:`_heads_to_tokens` for one tensor."""
    u = _size(group)
    total, share, d = x.shape
    send = x.reshape(u, total // u, share, d).contiguous()
    out = funcol.all_to_all_single_autograd(send, None, None, group)
    return out.transpose(0, 1).reshape(total // u, u * share, d)


def _ulysses_call(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    *,
    plan,
    group,
    kv_copies: int,
    backend: str,
    softmax_scale: float | None = None,
) -> Tensor:
    u = _size(group)
    if q.shape[1] % u or (k.shape[1] * kv_copies) % u:
        raise ValueError(
            f"ulysses attention over {u} ranks: {q.shape[1]} query heads and {k.shape[1]} key/value heads "
            f"(copied {kv_copies} times) do not split over them"
        )
    if kv_copies > 1:
        k, v = k.repeat_interleave(kv_copies, dim=1), v.repeat_interleave(kv_copies, dim=1)
    q, k, v = _heads_to_tokens([q, k, v], group)
    out = ring_attention(q, k, v, plan, backend=backend, softmax_scale=softmax_scale)
    return _tokens_to_heads(out, group)


class UlyssesAttention:
    """``ulysses`` (``ring_group=None``) and ``hybrid``: all-to-alls over ``ulysses_group`` give each
    rank its group's tokens for a share of the heads; a ring over ``ring_group`` covers the groups.
    ``kv_copies``: how many times each key/value head is copied first, so that the group's ranks get
    whole heads when the model has fewer key/value heads than ranks
    (``longctx.trainer.parallel.mesh.MeshShape.kv_head_copies``, whose rules the run checked)."""

    def __init__(
        self,
        ulysses_group: dist.ProcessGroup,
        ring_group: dist.ProcessGroup | None = None,
        *,
        kv_copies: int = 1,
        backend: str = "auto",
    ) -> None:
        self.ulysses_group = ulysses_group
        self.ring_group = ring_group
        self.kv_copies = kv_copies
        self.backend = backend
        self.last_stats: RingStats | None = None

    def bind(self, q_index: Tensor, q_segment: Tensor) -> RowAttention:
        """Gather the group's metadata and plan the ring (a local call without a ring group) over it."""
        index, segment = _gather_metadata(q_index, q_segment, self.ulysses_group)
        plan = build_ring_plan(index.flatten(), segment.flatten(), group=self.ring_group)
        self.last_stats = plan.stats
        return partial(
            _ulysses_call, plan=plan, group=self.ulysses_group, kv_copies=self.kv_copies, backend=self.backend
        )

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, *, q_index: Tensor, q_segment: Tensor) -> Tensor:
        return self.bind(q_index, q_segment)(q, k, v)


def cp_attention(
    mode: str,
    *,
    cp_group: dist.ProcessGroup | None,
    ring_group: dist.ProcessGroup | None = None,
    ulysses_group: dist.ProcessGroup | None = None,
    kv_copies: int = 1,
    backend: str = "auto",
) -> RingAttention | AllGatherAttention | UlyssesAttention:
    """The attention of ``mode`` (:data:`~longctx.trainer.parallel.mesh.CP_MODES`) over the given
    groups: ``cp_group`` for ring and allgather, ``ulysses_group`` (and ``ring_group`` for the hybrid)
    for the others, with ``kv_copies`` for :class:`UlyssesAttention`. Without a context-parallel
    group (one rank holds the window) every mode is the
    ring's local call."""
    if cp_group is None or mode == "ring":
        return RingAttention(cp_group, backend=backend)
    if mode == "allgather":
        return AllGatherAttention(cp_group, backend=backend)
    if mode in ("ulysses", "hybrid") and ulysses_group is not None:
        ring = ring_group if mode == "hybrid" else None
        return UlyssesAttention(ulysses_group, ring, kv_copies=kv_copies, backend=backend)
    raise ValueError(f"cp_mode {mode!r} needs its process groups (ulysses_group for ulysses and hybrid)")
