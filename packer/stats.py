"""What a packed output holds: tokens, padding and position coverage per source.

Positions restart at 0 in every segment, so a segment of length ``L`` holds positions ``0..L-1``:
every statistic here follows from segment lengths alone, without touching tokens.

Histograms use longctx's power-of-two buckets (``longctx.core.buckets``): bucket ``k`` counts
values ``v`` with ``v.bit_length() == k``, i.e. bucket 0 holds 0 and bucket ``k >= 1`` holds
``[2**(k-1), 2**k)``. An output of ``seq_len``-token windows has ``num_buckets(seq_len)`` of them, for
positions ``< seq_len`` and segment lengths ``<= seq_len``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from longctx.core.buckets import bucket_bounds, num_buckets, value_histogram


def position_histogram(lengths: np.ndarray, buckets: int) -> np.ndarray:
    """Counts of positions per bucket over segments of the given lengths."""
    lengths = np.asarray(lengths, dtype=np.int64)
    out = np.zeros(buckets, dtype=np.int64)
    for k in range(buckets):
        lo, hi = bucket_bounds(k)
        out[k] = np.clip(lengths - lo, 0, hi - lo).sum()
    return out


@dataclass
class SourceStats:
    """Totals of one source in one output."""

    buckets: int
    tokens: int = 0
    segments: int = 0
    documents: int = 0
    long_tokens: int = 0
    max_position: int = -1
    position_histogram: np.ndarray = field(init=False)
    segment_length_histogram: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.position_histogram = np.zeros(self.buckets, dtype=np.int64)
        self.segment_length_histogram = np.zeros(self.buckets, dtype=np.int64)

    def add_segments(self, lengths: np.ndarray, original_context: int) -> None:
        if not len(lengths):
            return
        self.tokens += int(lengths.sum())
        self.segments += len(lengths)
        self.long_tokens += int(np.clip(lengths - original_context, 0, None).sum())
        self.max_position = max(self.max_position, int(lengths.max()) - 1)
        self.position_histogram += position_histogram(lengths, self.buckets)
        self.segment_length_histogram += value_histogram(lengths, self.buckets)

    def merge(self, other: SourceStats) -> None:
        self.tokens += other.tokens
        self.segments += other.segments
        self.documents += other.documents
        self.long_tokens += other.long_tokens
        self.max_position = max(self.max_position, other.max_position)
        self.position_histogram += other.position_histogram
        self.segment_length_histogram += other.segment_length_histogram

    def to_json(self) -> dict[str, Any]:
        return {
            "tokens": self.tokens,
            "segments": self.segments,
            "documents": self.documents,
            "long_tokens": self.long_tokens,
            "max_position": self.max_position,
            "position_histogram": self.position_histogram.tolist(),
            "segment_length_histogram": self.segment_length_histogram.tolist(),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SourceStats:
        stats = cls(len(data["position_histogram"]))
        for key in ("tokens", "segments", "documents", "long_tokens", "max_position"):
            setattr(stats, key, int(data[key]))
        stats.position_histogram = np.array(data["position_histogram"], dtype=np.int64)
        stats.segment_length_histogram = np.array(data["segment_length_histogram"], dtype=np.int64)
        return stats


@dataclass
class OutputStats:
    """Totals of one output (one ``seq_len``): rows, padding, per-source :class:`SourceStats`, and
    how many segments hold only part of a document that would have fit in one window."""

    seq_len: int
    original_context: int
    rows: int = 0
    padding: int = 0
    short_document_pieces: int = 0
    sources: dict[str, SourceStats] = field(default_factory=dict)

    def source(self, name: str) -> SourceStats:
        if name not in self.sources:
            self.sources[name] = SourceStats(num_buckets(self.seq_len))
        return self.sources[name]

    def add_windows(
        self, rows: int, seg_sources: Sequence[str], seg_lengths: np.ndarray, seg_doc_lengths: np.ndarray
    ) -> None:
        """Account for ``rows`` windows whose document segments have the given sources and lengths."""
        self.rows += rows
        self.padding += rows * self.seq_len - int(seg_lengths.sum())
        self.short_document_pieces += int(
            ((seg_doc_lengths <= self.seq_len) & (seg_lengths < seg_doc_lengths)).sum()
        )
        names = np.asarray(seg_sources, dtype=object)
        for name in sorted(set(seg_sources)):
            self.source(name).add_segments(seg_lengths[names == name], self.original_context)

    def add_documents(self, sources: Iterable[str]) -> None:
        """Count distinct documents (each counted once however often it is repeated)."""
        for name in sources:
            self.source(name).documents += 1

    def merge(self, other: OutputStats) -> None:
        self.rows += other.rows
        self.padding += other.padding
        self.short_document_pieces += other.short_document_pieces
        for name, stats in other.sources.items():
            self.source(name).merge(stats)

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.sources.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "seq_len": self.seq_len,
            "original_context": self.original_context,
            "rows": self.rows,
            "padding": self.padding,
            "short_document_pieces": self.short_document_pieces,
            "sources": {name: self.sources[name].to_json() for name in sorted(self.sources)},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> OutputStats:
        stats = cls(
            data["seq_len"],
            data["original_context"],
            data["rows"],
            data["padding"],
            data["short_document_pieces"],
        )
        stats.sources = {name: SourceStats.from_json(s) for name, s in data["sources"].items()}
        return stats
