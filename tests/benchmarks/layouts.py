"""Packed-window layouts shared by the benchmarks (imported by the scripts beside it)."""

from __future__ import annotations

import torch


def document_lengths(seq_len: int, mean_length: int, seed: int = 0) -> list[int]:
    """Lengths of documents drawn uniformly from ``1..2 mean_length - 1`` until they fill ``seq_len`` tokens
    (the last one cut): the suite's many-document layout."""
    generator = torch.Generator().manual_seed(seed)
    lengths: list[int] = []
    while sum(lengths) < seq_len:
        lengths.append(int(torch.randint(1, max(2, 2 * mean_length), (1,), generator=generator)))
    lengths[-1] -= sum(lengths) - seq_len
    return lengths


def document_segments(seq_len: int, mean_length: int | None, seed: int = 0) -> torch.Tensor:
    """Segment ids of a window of documents with random lengths (one document if ``mean_length`` is None)."""
    if mean_length is None:
        return torch.zeros(seq_len, dtype=torch.int64)
    lengths = document_lengths(seq_len, mean_length, seed)
    return torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
