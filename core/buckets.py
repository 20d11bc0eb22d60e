"""The one power-of-two histogram convention of longctx.

Bucket ``k`` holds the non-negative integers ``v`` with ``v.bit_length() == k``: bucket 0 holds 0,
bucket ``k >= 1`` holds ``[2**(k-1), 2**k)``. Curation's document lengths (keyed by a bucket's lower
edge), the packer's position and segment-length histograms (indexed by ``k``) and the trainer's loss
and coverage by position (lower edges, with one more edge at the original context) all use it.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

HISTOGRAM_BUCKETS = (
    "bucket k counts values v with v.bit_length() == k: k=0 holds 0, k>=1 holds [2**(k-1), 2**k)"
)


def bucket_of(value: int) -> int:
    """Index ``k`` of the bucket holding ``value`` (0 for 0 and below)."""
    return max(0, int(value)).bit_length()


def bucket_bounds(k: int) -> tuple[int, int]:
    """Half-open value range ``[lo, hi)`` of bucket ``k``."""
    return (0, 1) if k == 0 else (1 << (k - 1), 1 << k)


def bucket_floor(value: int) -> int:
    """Lower edge of the bucket holding ``value`` (0 for 0)."""
    return bucket_bounds(bucket_of(value))[0]


def num_buckets(largest: int) -> int:
    """Buckets needed for values ``0..largest``."""
    return int(largest).bit_length() + 1


def value_histogram(values: np.ndarray, buckets: int) -> np.ndarray:
    """Counts of non-negative integer ``values`` per bucket (values beyond the last bucket dropped)."""
    values = np.asarray(values, dtype=np.int64)
    return np.bincount(np.frexp(values)[1], minlength=buckets)[:buckets].astype(np.int64)


def bucket_edges(limit: int, extra: Iterable[int] = ()) -> list[int]:
    """Lower edges of the buckets that hold values below ``limit``, plus ``extra`` edges that split
    a bucket (e.g. at the original context, so that "at or beyond it" is a set of whole buckets).
    Bucket ``b`` then holds ``[edges[b], edges[b + 1])``."""
    edges = [bucket_bounds(k)[0] for k in range(num_buckets(max(0, limit - 1)))]
    return sorted(set(edges) | set(extra))
