"""Document-aware load balancing: which tokens of a packed row each context-parallel rank holds.

Under causal, document-masked attention a token at offset ``t`` in its document attends to ``t + 1``
keys, so its attention work is ``t + 1`` wherever it sits. The zigzag layout (``zigzag.py``) gives
each rank chunks ``r`` and ``2P - 1 - r`` of the row, which balances that work for a row that is one
document; a row packed from many documents of uneven length can put most of the work on one rank.
:func:`balanced_ranges` gives every rank the same number of tokens *and* nearly the same work:

* a document longer than a threshold is cut into ``2P`` chunks and zigzagged on its own (rank ``r``
  gets its chunks ``r`` and ``2P - 1 - r``), which balances that document's work exactly;
* shorter documents go whole, most expensive first, to the rank with the least work that has room
  (longest-processing-time first); a document that fits no rank's remaining room is split to fill it;
* the threshold starts at one rank's share of the row, so documents that fit a share stay whole (a row
  whose documents all land whole needs no attention communication: no rank needs another's keys), and
  is halved until the work of the busiest rank is within :data:`TOLERANCE` of the mean.

Each rank's tokens are returned in window order, so each document's tokens on a rank are contiguous and
causal among themselves, as kernels expect. Everything here is a pure function of ``cu_seqlens``: the
ranks of a group, which read the same rows, compute the same layout without communicating.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch

TOLERANCE = 0.01
"""Accepted excess of the busiest rank's work over the mean, in token costs (``t + 1`` per token)."""

MIN_THRESHOLD = 64
"""Documents shorter than this are never zigzagged on their own (pieces of a few tokens gain nothing)."""

Range = tuple[int, int, int]
"""``(start, end, offset)``: window indices ``[start, end)`` of one document, whose first token is at
``offset`` in that document."""


def range_cost(offset: int, count: int) -> int:
    """Attention work of ``count`` consecutive tokens of one document starting at ``offset``:
    ``sum(t + 1 for t in range(offset, offset + count))``."""
    return count * (2 * offset + count + 1) // 2


class _Ranks:
    """The ranges, token counts and work of each rank while a layout is being built."""

    def __init__(self, parts: int, capacity: int) -> None:
        self.capacity = capacity
        self.ranges: list[list[Range]] = [[] for _ in range(parts)]
        self.tokens = [0] * parts
        self.work = [0] * parts

    def add(self, rank: int, start: int, end: int, offset: int) -> None:
        if end > start:
            self.ranges[rank].append((start, end, offset))
            self.tokens[rank] += end - start
            self.work[rank] += range_cost(offset, end - start)

    def room(self, rank: int) -> int:
        return self.capacity - self.tokens[rank]


def _zigzag_document(ranks: _Ranks, start: int, end: int) -> None:
    """Cut one document into ``2P`` chunks; rank ``r`` takes chunks ``r`` and ``2P - 1 - r``."""
    parts = len(ranks.tokens)
    n = end - start
    bounds = [round(i * n / (2 * parts)) for i in range(2 * parts + 1)]
    for rank in range(parts):
        for chunk in (rank, 2 * parts - 1 - rank):
            ranks.add(rank, start + bounds[chunk], start + bounds[chunk + 1], bounds[chunk])


def _place_whole(ranks: _Ranks, start: int, end: int) -> None:
    """Give a document to the least busy rank with room for all of it; without one, fill the rank with
    the most room with its head and place the rest the same way."""
    offset = 0
    while start < end:
        n = end - start
        fitting = [r for r in range(len(ranks.tokens)) if ranks.room(r) >= n]
        if fitting:
            rank = min(fitting, key=lambda r: (ranks.work[r], r))
            ranks.add(rank, start, end, offset)
            return
        rank = max(range(len(ranks.tokens)), key=lambda r: (ranks.room(r), -r))
        take = ranks.room(rank)
        if take <= 0:  # cannot happen while the row's tokens equal the ranks' capacity
            raise AssertionError("no rank has room left for the row's tokens")
        ranks.add(rank, start, start + take, offset)
        start, offset = start + take, offset + take


def _even_counts(ranks: _Ranks) -> None:
    """Move the few tokens that rounding the zigzag chunks put over a rank's share to ranks under it
    (taken from the end of the over-full rank's last range)."""
    parts = len(ranks.tokens)
    for over in range(parts):
        while ranks.tokens[over] > ranks.capacity:
            under = next(r for r in range(parts) if ranks.tokens[r] < ranks.capacity)
            start, end, offset = ranks.ranges[over].pop()
            count = end - start
            ranks.tokens[over] -= count
            ranks.work[over] -= range_cost(offset, count)
            move = min(ranks.tokens[over] + count - ranks.capacity, ranks.room(under), count)
            ranks.add(over, start, end - move, offset)
            ranks.add(under, end - move, end, offset + count - move)


def _layout(documents: Sequence[tuple[int, int]], parts: int, capacity: int, threshold: int) -> _Ranks:
    ranks = _Ranks(parts, capacity)
    whole = []
    for start, end in documents:
        if end - start > threshold:
            _zigzag_document(ranks, start, end)
        else:
            whole.append((start, end))
    _even_counts(ranks)
    for start, end in sorted(whole, key=lambda d: (-(d[1] - d[0]), d[0])):
        _place_whole(ranks, start, end)
    return ranks


def imbalance(work: Sequence[int]) -> float:
    """Busiest rank's work over the mean (1.0: perfectly even; 1.0 for no work at all)."""
    total = sum(work)
    return max(work) * len(work) / total if total else 1.0


def balanced_ranges(cu_seqlens: Sequence[int], parts: int) -> list[list[Range]]:
    """Each of ``parts`` ranks' token ranges of the row with document boundaries ``cu_seqlens``
    (``0 ... length``, ``length`` a multiple of ``parts``), in window order: equal token counts and
    work within :data:`TOLERANCE` of even where the documents allow (see the module docstring)."""
    bounds = [int(b) for b in cu_seqlens]
    length = bounds[-1]
    if parts < 1 or length <= 0 or length % parts:
        raise ValueError(f"a row of {length} tokens does not split evenly over {parts} ranks")
    documents = [(s, e) for s, e in itertools.pairwise(bounds) if e > s]
    capacity = length // parts
    best: _Ranks | None = None
    threshold = capacity
    while True:
        ranks = _layout(documents, parts, capacity, threshold)
        if best is None or imbalance(ranks.work) < imbalance(best.work):
            best = ranks
        if imbalance(best.work) <= 1 + TOLERANCE or threshold < MIN_THRESHOLD:
            break
        threshold //= 2
    return [sorted(r) for r in best.ranges]


def balanced_indices(cu_seqlens: Sequence[int], parts: int) -> list[torch.Tensor]:
    """Each rank's window indices (int64, ascending) under :func:`balanced_ranges`."""
    return [
        torch.cat([torch.arange(s, e) for s, e, _ in ranges]) if ranges else torch.zeros(0, dtype=torch.int64)
        for ranges in balanced_ranges(cu_seqlens, parts)
    ]
