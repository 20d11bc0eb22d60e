"""Document-masked causal attention masks, derived from global token indices and segment ids.

The rule: query ``i`` may attend to key ``j`` iff ``segment[j] == segment[i]`` and
``index[j] <= index[i]``. Indices are positions in the packed window (not in a rank's local slice),
so the rule is the same whichever ranks hold the two tokens, and packing needs no padding or
divisibility of documents.

This module answers three questions for a pair of token blocks (a rank's queries, some rank's keys):

* does the pair have any allowed (query, key) at all, and how much of it must be computed?
  (``pair_extents``, for all rank pairs at once);
* which rectangle of the pair holds every allowed entry, and what is the mask inside it?
  (``block_mask`` -> ``BlockMask``);
* can that mask be handed to a variable-length kernel as ``cu_seqlens`` instead of a dense mask?
  (``BlockMask.varlen`` -> ``VarlenLayout``).

Dense masks are only built on demand, per block or tile (``BlockMask.allowed``): planning a ring costs
``O(P^2 * tokens per rank)`` memory, never ``rows x cols``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property

import torch
from torch import Tensor

_INT64_MAX = torch.iinfo(torch.int64).max
_INT64_MIN = torch.iinfo(torch.int64).min


def allowed_mask(q_index: Tensor, q_segment: Tensor, kv_index: Tensor, kv_segment: Tensor) -> Tensor:
    """Dense boolean mask ``[n_q, n_kv]``: True where the query may attend to the key."""
    same_segment = q_segment[:, None] == kv_segment[None, :]
    return same_segment & (kv_index[None, :] <= q_index[:, None])


def _compact_segments(q_segment: Tensor, kv_segment: Tensor) -> tuple[Tensor, Tensor, int]:
    """Relabel the segment ids of both token sets onto ``0..n-1`` so they can index a table."""
    ids, inverse = torch.unique(torch.cat([q_segment.flatten(), kv_segment.flatten()]), return_inverse=True)
    n_q = q_segment.numel()
    return inverse[:n_q].view(q_segment.shape), inverse[n_q:].view(kv_segment.shape), ids.numel()


def rows_with_keys(q_index: Tensor, q_segment: Tensor, kv_index: Tensor, kv_segment: Tensor) -> Tensor:
    """Bool ``[n_q]``: which queries see at least one key of the block (in O(n) memory).

    A query sees a key iff the earliest key of its segment is not later than the query.
    """
    q_seg, kv_seg, n = _compact_segments(q_segment, kv_segment)
    first_key = torch.full((n,), _INT64_MAX, dtype=torch.int64, device=kv_index.device)
    first_key.scatter_reduce_(0, kv_seg, kv_index.to(torch.int64), reduce="amin")
    return first_key[q_seg] <= q_index


def cols_with_queries(q_index: Tensor, q_segment: Tensor, kv_index: Tensor, kv_segment: Tensor) -> Tensor:
    """Bool ``[n_kv]``: which keys are seen by at least one query of the block."""
    q_seg, kv_seg, n = _compact_segments(q_segment, kv_segment)
    last_query = torch.full((n,), _INT64_MIN, dtype=torch.int64, device=q_index.device)
    last_query.scatter_reduce_(0, q_seg, q_index.to(torch.int64), reduce="amax")
    return last_query[kv_seg] >= kv_index


def _span_lengths(flags: Tensor) -> Tensor:
    """Along the last dim: distance from the first to the last True, inclusive (0 when none is True)."""
    n = flags.shape[-1]
    position = torch.arange(n, device=flags.device)
    first = torch.where(flags, position, n).amin(dim=-1)
    last = torch.where(flags, position, -1).amax(dim=-1)
    return (last - first + 1).clamp_min(0)


def pair_extents(
    q_index: Tensor, q_segment: Tensor, kv_index: Tensor, kv_segment: Tensor
) -> tuple[Tensor, Tensor]:
    """For every (query rank ``r``, key rank ``s``): does the pair overlap, and how many scores to compute.

    Inputs are the gathered metadata of all ranks, ``[P, n_q]`` and ``[P, n_kv]``. Returns a bool
    ``[P, P]`` (some query of ``r`` sees some key of ``s``: a query sees a key iff the first key of its
    segment is not later than itself) and an int64 ``[P, P]`` with the area of the rectangle that
    ``block_mask`` would compute (0 for pairs without overlap). Memory is ``O(P^2 * n)``.
    """
    world = q_index.shape[0]
    q_index, kv_index = q_index.to(torch.int64), kv_index.to(torch.int64)
    q_seg, kv_seg, n = _compact_segments(q_segment, kv_segment)
    first_key = torch.full((world, n), _INT64_MAX, dtype=torch.int64, device=kv_index.device)
    first_key.scatter_reduce_(1, kv_seg, kv_index, reduce="amin")
    last_query = torch.full((world, n), _INT64_MIN, dtype=torch.int64, device=q_index.device)
    last_query.scatter_reduce_(1, q_seg, q_index, reduce="amax")
    row_sees = first_key[:, q_seg] <= q_index[None]  # [P_kv, P_q, n_q]
    col_seen = last_query[:, kv_seg] >= kv_index[None]  # [P_q, P_kv, n_kv]
    rows = _span_lengths(row_sees).transpose(0, 1)
    return rows > 0, rows * _span_lengths(col_seen)


@dataclass(frozen=True)
class VarlenLayout:
    """A block mask expressed as independent sequences, the input of FlashAttention's varlen kernels.

    Sequence ``b`` pairs queries ``cu_seqlens_q[b]:cu_seqlens_q[b+1]`` with keys
    ``cu_seqlens_k[b]:cu_seqlens_k[b+1]`` (either range may be empty); ``causal`` applies to every
    sequence (then query and key ranges are the same tokens).
    """

    cu_seqlens_q: Tensor
    cu_seqlens_k: Tensor
    max_seqlen_q: int
    max_seqlen_k: int
    causal: bool


def _runs(segment: Tensor) -> tuple[list[int], list[int]] | None:
    """Segment id and length of each run of equal ids; None when a segment is split into several runs."""
    ids, lengths = torch.unique_consecutive(segment, return_counts=True)
    id_list = ids.tolist()
    if len(set(id_list)) != len(id_list):
        return None
    return id_list, lengths.tolist()


def _cumulative(lengths: list[int], device: torch.device) -> tuple[Tensor, int]:
    cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(lengths, dtype=torch.int32).cumsum(0)
    return cu.to(device), max(lengths, default=0)


def _varlen_layout(
    q_index: Tensor, q_segment: Tensor, kv_index: Tensor, kv_segment: Tensor
) -> VarlenLayout | None:
    """Express the block as varlen sequences, or None when the mask has no such form.

    Two forms exist. Causal: queries and keys are the same tokens, and every segment forms one run
    (the diagonal block of a rank). Full: every segment forms one run in both sets, the shared segments
    come in the same order, and all keys of a shared segment precede all its queries (an off-diagonal
    block of a zigzag ring). Anything else (interleaved documents, partial causal overlap between two
    different token sets) is left to dense-mask kernels.
    """
    for index in (q_index, kv_index):
        if index.numel() > 1 and not bool((index[1:] > index[:-1]).all()):
            return None
    q_runs, kv_runs = _runs(q_segment), _runs(kv_segment)
    if q_runs is None or kv_runs is None:
        return None
    device = q_index.device
    if torch.equal(q_index, kv_index):
        if not torch.equal(q_segment, kv_segment):
            return None
        cu, longest = _cumulative(q_runs[1], device)
        return VarlenLayout(cu, cu, longest, longest, causal=True)

    q_ids, q_lengths = q_runs
    kv_ids, kv_lengths = kv_runs
    q_first = q_index[torch.tensor([0, *q_lengths[:-1]]).cumsum(0).to(device)].tolist()
    kv_last = kv_index[(torch.tensor(kv_lengths).cumsum(0) - 1).to(device)].tolist()
    shared = set(q_ids) & set(kv_ids)
    seq_q: list[int] = []
    seq_k: list[int] = []
    qi = ki = 0
    while qi < len(q_ids) or ki < len(kv_ids):
        if qi < len(q_ids) and q_ids[qi] not in shared:
            seq_q.append(q_lengths[qi])
            seq_k.append(0)
            qi += 1
        elif ki < len(kv_ids) and kv_ids[ki] not in shared:
            seq_q.append(0)
            seq_k.append(kv_lengths[ki])
            ki += 1
        elif q_ids[qi] == kv_ids[ki] and kv_last[ki] <= q_first[qi]:
            seq_q.append(q_lengths[qi])
            seq_k.append(kv_lengths[ki])
            qi += 1
            ki += 1
        else:
            return None
    cu_q, max_q = _cumulative(seq_q, device)
    cu_k, max_k = _cumulative(seq_k, device)
    return VarlenLayout(cu_q, cu_k, max_q, max_k, causal=False)


@dataclass(frozen=True, eq=False)
class BlockMask:
    """The part of one (queries, keys) block pair that attention must compute.

    ``rows`` and ``cols`` cut the rectangle that contains every allowed entry out of the local query
    block and the (possibly remote) key block; the metadata fields are restricted to that rectangle.
    ``row_has_key`` marks rectangle rows that see at least one key: the others must merge as "nothing
    seen" whatever the kernel returns for them. ``is_full`` means every entry of the rectangle is
    allowed, so kernels need no mask at all. ``trimmed=False`` marks the no-skipping baseline, which
    kernels compute whole.
    """

    rows: slice
    cols: slice
    q_index: Tensor
    q_segment: Tensor
    kv_index: Tensor
    kv_segment: Tensor
    row_has_key: Tensor
    is_full: bool
    trimmed: bool = True
    _tiles: dict[int, list[BlockMask]] = field(default_factory=dict, repr=False)

    @property
    def shape(self) -> tuple[int, int]:
        """``(n_rows, n_cols)`` of the rectangle."""
        return self.q_index.numel(), self.kv_index.numel()

    def allowed(self) -> Tensor:
        """Dense bool mask of the rectangle, ``[n_rows, n_cols]``."""
        return allowed_mask(self.q_index, self.q_segment, self.kv_index, self.kv_segment)

    def additive(self, dtype: torch.dtype) -> Tensor | None:
        """Additive float mask (0 allowed, -inf masked) of the rectangle; None when ``is_full``."""
        if self.is_full:
            return None
        mask = torch.zeros(self.shape, dtype=dtype, device=self.q_index.device)
        return mask.masked_fill_(~self.allowed(), float("-inf"))

    def tiles(self, size: int) -> list[BlockMask]:
        """The rectangle cut into ``size x size`` tiles, each trimmed like a block (empty ones dropped).

        Dense-mask kernels compute every entry of what they are given, so tiling lets them skip the
        masked-out parts of a block (the upper triangle of a causal block, the gaps between documents)
        and bounds the size of the mask they build. Tile slices index the same local tensors as the
        block's. Cached per size.
        """
        if size not in self._tiles:
            n_rows, n_cols = self.shape
            found = (
                self._tile(slice(r0, r0 + size), slice(c0, c0 + size))
                for r0 in range(0, n_rows, size)
                for c0 in range(0, n_cols, size)
            )
            self._tiles[size] = [tile for tile in found if tile is not None]
        return self._tiles[size]

    def _tile(self, rows: slice, cols: slice) -> BlockMask | None:
        """The trimmed block of ``rows x cols`` of this rectangle, with slices into the local tensors."""
        tile = block_mask(
            self.q_index[rows], self.q_segment[rows], self.kv_index[cols], self.kv_segment[cols]
        )
        if tile is None:
            return None
        row_offset, col_offset = self.rows.start + rows.start, self.cols.start + cols.start
        return replace(
            tile,
            rows=slice(tile.rows.start + row_offset, tile.rows.stop + row_offset),
            cols=slice(tile.cols.start + col_offset, tile.cols.stop + col_offset),
        )

    @cached_property
    def varlen(self) -> VarlenLayout | None:
        """The rectangle as varlen sequences (see ``VarlenLayout``), or None if it has no such form."""
        return _varlen_layout(self.q_index, self.q_segment, self.kv_index, self.kv_segment)


def _span(flags: Tensor) -> slice:
    hits = flags.nonzero().flatten()
    return slice(int(hits[0]), int(hits[-1]) + 1)


def block_mask(
    q_index: Tensor, q_segment: Tensor, kv_index: Tensor, kv_segment: Tensor, *, trim: bool = True
) -> BlockMask | None:
    """Plan one block pair: None if no query sees any key, else the ``BlockMask`` to compute.

    With ``trim=False`` the whole block is kept even when empty (the no-skipping baseline).
    """
    row_has_key = rows_with_keys(q_index, q_segment, kv_index, kv_segment)
    if trim:
        if not bool(row_has_key.any()):
            return None
        rows = _span(row_has_key)
        cols = _span(cols_with_queries(q_index, q_segment, kv_index, kv_segment))
    else:
        rows, cols = slice(0, q_index.numel()), slice(0, kv_index.numel())
    q_idx, q_seg = q_index[rows], q_segment[rows]
    kv_idx, kv_seg = kv_index[cols], kv_segment[cols]
    is_full = (
        bool(row_has_key[rows].all())
        and bool((q_seg == q_seg[0]).all())
        and bool((kv_seg == q_seg[0]).all())
        and int(kv_idx.max()) <= int(q_idx.min())
    )
    return BlockMask(rows, cols, q_idx, q_seg, kv_idx, kv_seg, row_has_key[rows], is_full, trimmed=trim)
