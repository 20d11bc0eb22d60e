"""The one power-of-two bucket convention, checked against direct definitions."""

from __future__ import annotations

import numpy as np
import pytest

from longctx.core.buckets import (
    bucket_bounds,
    bucket_edges,
    bucket_floor,
    bucket_of,
    num_buckets,
    value_histogram,
)


@pytest.mark.parametrize("value", [0, 1, 2, 3, 4, 7, 8, 1000, 1023, 1024, 65535, 65536])
def test_bucket_holds_its_value(value: int) -> None:
    k = bucket_of(value)
    lo, hi = bucket_bounds(k)
    assert lo <= value < hi
    assert bucket_floor(value) == lo
    # the lower edge is the largest power of two not above the value (0 for 0)
    assert lo == (0 if value == 0 else max(2**j for j in range(40) if 2**j <= value))


def test_histogram_counts_like_a_loop() -> None:
    values = np.random.default_rng(0).integers(0, 5000, size=2000)
    buckets = num_buckets(4999)
    expected = np.zeros(buckets, dtype=np.int64)
    for v in values:
        expected[int(v).bit_length()] += 1
    assert value_histogram(values, buckets).tolist() == expected.tolist()


@pytest.mark.parametrize(
    ("limit", "extra"), [(1, ()), (2, ()), (5, ()), (4, ()), (2048, (512,)), (2048, (600,)), (96, (64,))]
)
def test_edges_are_the_lower_edges_below_the_limit(limit: int, extra: tuple[int, ...]) -> None:
    edges, edge = [0], 1  # the definition: 0, then powers of two below the limit, plus the extra splits
    while edge < limit:
        edges.append(edge)
        edge *= 2
    assert bucket_edges(limit, extra) == sorted(set(edges) | set(extra))
