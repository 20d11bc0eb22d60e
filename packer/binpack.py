"""Which piece of which document goes into which window: packing as pure functions of lengths.

Two strategies share one result type, :class:`Packing`:

* :func:`best_fit_decreasing` keeps every document of at most ``seq_len`` tokens whole. A longer
  document becomes full windows of its own plus one remainder, and the remainders and short
  documents are placed by best-fit decreasing. Windows left with room are then reclaimed: while the
  padding adds up to a whole window, the least-filled window holding only remainders of long
  documents is emptied into the other windows' gaps, splitting those remainders (long documents are
  split anyway; short ones never are). Padding is therefore below one window per call whenever
  remainders can fill the gaps, and nowhere where something still fits.
* :func:`concat_chunk` concatenates documents and cuts every ``seq_len`` tokens: the usual baseline,
  which splits documents at arbitrary points.

:func:`pack` applies a strategy to documents that are used any number of times.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

Strategy = Literal["bfd", "concat"]


@dataclass(frozen=True)
class Packing:
    """Segments of documents grouped into windows.

    Segment ``i`` is tokens ``[offset[i], offset[i] + length[i])`` of document ``doc[i]``; window
    ``w`` holds segments ``window_ptr[w]:window_ptr[w + 1]`` in that order, followed by padding up
    to ``seq_len``.
    """

    doc: np.ndarray
    offset: np.ndarray
    length: np.ndarray
    window_ptr: np.ndarray

    @property
    def num_windows(self) -> int:
        return len(self.window_ptr) - 1

    def tokens(self) -> int:
        """Document tokens placed (padding excluded)."""
        return int(self.length.sum())

    def window_slice(self, start: int, stop: int) -> Packing:
        """Windows ``start:stop`` as a packing of their own."""
        lo, hi = int(self.window_ptr[start]), int(self.window_ptr[stop])
        return Packing(
            self.doc[lo:hi], self.offset[lo:hi], self.length[lo:hi], self.window_ptr[start : stop + 1] - lo
        )

    @staticmethod
    def from_windows(windows: Sequence[Sequence[tuple[int, int, int]]]) -> Packing:
        """Build from windows given as lists of ``(doc, offset, length)``."""
        flat = [segment for window in windows for segment in window]
        arr = np.array(flat, dtype=np.int64).reshape(-1, 3)
        ptr = np.zeros(len(windows) + 1, dtype=np.int64)
        np.cumsum([len(window) for window in windows], out=ptr[1:])
        return Packing(arr[:, 0].copy(), arr[:, 1].copy(), arr[:, 2].copy(), ptr)


class GapIndex:
    """Open windows keyed by their free space, with best-fit and largest-gap queries in O(log seq_len).

    A segment tree counts the windows at each gap size ``0..seq_len``; windows of equal gap are kept
    in insertion order, so the one that has had that gap longest is chosen and results are
    deterministic.
    """

    def __init__(self, seq_len: int) -> None:
        self._seq_len = seq_len
        self._size = 1 << seq_len.bit_length()  # leaves 0..size-1 cover every gap 0..seq_len
        self._count = [0] * (2 * self._size)
        self._windows: dict[int, dict[int, None]] = {}

    def __len__(self) -> int:
        return self._count[1]

    def add(self, window: int, gap: int) -> None:
        self._windows.setdefault(gap, {})[window] = None
        self._update(gap, 1)

    def remove(self, window: int, gap: int) -> None:
        del self._windows[gap][window]
        self._update(gap, -1)

    def best_fit(self, need: int) -> int | None:
        """The window with the smallest gap of at least ``need`` tokens, or None."""
        if need > self._seq_len:
            return None
        count, i = self._count, need + self._size
        if not count[i]:
            # climb until a right sibling holds a window, then take its leftmost leaf
            while True:
                if not i & 1 and count[i + 1]:
                    i += 1
                    break
                i >>= 1
                if i <= 1:
                    return None
            while i < self._size:
                i = 2 * i if count[2 * i] else 2 * i + 1
        return next(iter(self._windows[i - self._size]))

    def largest(self) -> int | None:
        """The window with the largest gap, or None when no window is open."""
        count = self._count
        if not count[1]:
            return None
        i = 1
        while i < self._size:
            i = 2 * i + 1 if count[2 * i + 1] else 2 * i
        return next(iter(self._windows[i - self._size]))

    def _update(self, gap: int, delta: int) -> None:
        i = gap + self._size
        while i:
            self._count[i] += delta
            i >>= 1


class _Bins:
    """Partly filled windows under construction (the state of best-fit decreasing)."""

    def __init__(self, seq_len: int) -> None:
        self.seq_len = seq_len
        self.segments: list[list[tuple[int, int, int]]] = []
        self.gap: list[int] = []
        self.only_remainders: list[bool] = []
        self.alive: list[bool] = []
        self.index = GapIndex(seq_len)
        self.reclaimable: list[tuple[int, int]] = []  # heap of (content, window); stale entries skipped

    def place(self, window: int | None, segment: tuple[int, int, int], splittable: bool) -> None:
        """Put ``segment`` into ``window`` (a new window when None); it must fit."""
        if window is None:
            window = len(self.segments)
            self.segments.append([])
            self.gap.append(self.seq_len)
            self.only_remainders.append(True)
            self.alive.append(True)
        else:
            self.index.remove(window, self.gap[window])
        self.segments[window].append(segment)
        self.gap[window] -= segment[2]
        self.only_remainders[window] &= splittable
        if self.gap[window]:
            self.index.add(window, self.gap[window])
            if self.only_remainders[window]:
                heapq.heappush(self.reclaimable, (self.seq_len - self.gap[window], window))

    def pour(self, segment: tuple[int, int, int]) -> None:
        """Place a splittable segment into open windows: whole by best fit when some gap holds it,
        otherwise its head fills the largest gap and the rest continues."""
        doc, offset, length = segment
        while length:
            window = self.index.best_fit(length)
            if window is not None:
                self.place(window, (doc, offset, length), splittable=True)
                return
            window = self.index.largest()
            assert window is not None, "pour() needs at least `length` tokens of open gaps"
            head = self.gap[window]
            self.place(window, (doc, offset, head), splittable=True)
            offset, length = offset + head, length - head

    def reclaim(self) -> None:
        """While the gaps add up to a whole window, empty the least-filled window that holds only
        remainders of long documents into the other windows' gaps. Each step removes one window's
        worth of padding: the dissolved window's gap disappears and its content fills others."""
        padding = sum(gap for gap, alive in zip(self.gap, self.alive, strict=True) if alive)
        while padding >= self.seq_len and self.reclaimable:
            content, window = heapq.heappop(self.reclaimable)
            if not self.alive[window] or self.seq_len - self.gap[window] != content:
                continue  # stale entry: the window was dissolved or has grown since
            self.index.remove(window, self.gap[window])
            self.alive[window] = False
            for segment in sorted(self.segments[window], key=lambda s: (-s[2], s[0], s[1])):
                self.pour(segment)
            padding -= self.seq_len

    def windows(self) -> list[list[tuple[int, int, int]]]:
        return [segments for segments, alive in zip(self.segments, self.alive, strict=True) if alive]


def best_fit_decreasing(lengths: np.ndarray, seq_len: int) -> Packing:
    """Pack documents of the given token lengths into windows of ``seq_len`` tokens.

    Documents longer than ``seq_len`` yield full windows (first) and a remainder; remainders and
    short documents are placed longest first into the window with the least room that still holds
    them (among equal gaps, the one that has had its gap longest), then :meth:`_Bins.reclaim`
    removes whole windows of padding. Sorting and every placement are O(log), so the whole is
    O(n log n).
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    full_counts = lengths // seq_len
    windows: list[list[tuple[int, int, int]]] = [
        [(int(doc), k * seq_len, seq_len)]
        for doc in np.flatnonzero(full_counts)
        for k in range(int(full_counts[doc]))
    ]
    remainders = lengths - full_counts * seq_len
    docs = np.flatnonzero(remainders)
    order = docs[np.lexsort((docs, -remainders[docs]))]  # longest first, ties by document order
    bins = _Bins(seq_len)
    for doc in order.tolist():
        length = int(remainders[doc])
        splittable = bool(full_counts[doc])
        bins.place(bins.index.best_fit(length), (doc, int(full_counts[doc]) * seq_len, length), splittable)
    bins.reclaim()
    return Packing.from_windows(windows + bins.windows())


def concat_chunk(lengths: np.ndarray, seq_len: int) -> Packing:
    """Concatenate the documents in order and cut the stream every ``seq_len`` tokens."""
    lengths = np.asarray(lengths, dtype=np.int64)
    ends = np.cumsum(lengths)
    total = int(ends[-1]) if len(ends) else 0
    starts = ends - lengths
    cuts = np.union1d(starts, np.arange(0, total, seq_len))
    seg_len = np.diff(np.append(cuts, total))
    doc = np.searchsorted(ends, cuts, side="right")
    per_window = np.bincount(cuts // seq_len, minlength=-(-total // seq_len))
    ptr = np.zeros(len(per_window) + 1, dtype=np.int64)
    np.cumsum(per_window, out=ptr[1:])
    return Packing(doc.astype(np.int64), cuts - starts[doc], seg_len, ptr)


STRATEGIES: dict[str, Callable[[np.ndarray, int], Packing]] = {
    "bfd": best_fit_decreasing,
    "concat": concat_chunk,
}


def pack(lengths: np.ndarray, copies: np.ndarray, seq_len: int, strategy: Strategy) -> Packing:
    """Pack ``copies[d]`` copies of every document ``d`` (0 leaves it out) in one go.

    Copies are ordered copy-major (every document's first copy, then every second copy, ...), which
    decides ties in best-fit decreasing and the stream order of concatenate-and-chunk. Copies may
    share a window: attention never crosses a segment boundary, so a copy cannot see another, and
    packing them together costs less padding than packing each round of copies separately.
    """
    lengths = np.asarray(lengths, dtype=np.int64)
    copies = np.asarray(copies, dtype=np.int64)
    items = np.concatenate([np.flatnonzero(copies > j) for j in range(int(copies.max(initial=0)))] or [[]])
    items = items.astype(np.int64)
    packing = STRATEGIES[strategy](lengths[items], seq_len)
    return Packing(items[packing.doc], packing.offset, packing.length, packing.window_ptr)
