"""Tokenized documents that one task holds in memory and packs together."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DocumentPool:
    """Documents as one flat token buffer: document ``d`` is ``tokens[start[d]:start[d] + length[d]]``,
    with id ``ids[d]``, source ``sources[d]``, used ``copies[d]`` times."""

    tokens: np.ndarray
    start: np.ndarray
    length: np.ndarray
    copies: np.ndarray
    ids: list[str]
    sources: list[str]

    def __len__(self) -> int:
        return len(self.ids)


class PoolBuilder:
    """Collects tokenized documents until the pool is large enough to pack."""

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._tokens: list[np.ndarray] = []
        self._copies: list[int] = []
        self._ids: list[str] = []
        self._sources: list[str] = []
        self.num_tokens = 0

    def __len__(self) -> int:
        return len(self._ids)

    def add(self, doc_id: str, source: str, tokens: np.ndarray, copies: int) -> None:
        self._tokens.append(tokens)
        self._copies.append(copies)
        self._ids.append(doc_id)
        self._sources.append(source)
        self.num_tokens += len(tokens)

    def build(self) -> DocumentPool:
        """The collected documents as a :class:`DocumentPool`; the builder starts over empty."""
        length = np.array([len(t) for t in self._tokens], dtype=np.int64)
        start = np.zeros(len(length), dtype=np.int64)
        np.cumsum(length[:-1], out=start[1:])
        tokens = np.concatenate(self._tokens) if self._tokens else np.zeros(0, dtype=np.int32)
        pool = DocumentPool(
            tokens, start, length, np.array(self._copies, dtype=np.int64), self._ids, self._sources
        )
        self._reset()
        return pool
