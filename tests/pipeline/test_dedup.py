"""Duplicate resolution (the signatures themselves: test_signatures.py)."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longctx.pipeline.dedup import resolve_duplicates


def _index(ids: list[str], hashes: list[str], ranks: list[int] | None = None) -> pa.Table:
    ranks = ranks or [0] * len(ids)
    idx = []
    seen: dict[int, int] = {}
    for r in ranks:
        idx.append(seen.get(r, 0))
        seen[r] = idx[-1] + 1
    return pa.table({"idx": idx, "id": ids, "text_hash": hashes, "rank": ranks})


def test_exact_and_near_pairs_cluster_to_smallest_id() -> None:
    index = _index(["c", "a", "b", "d", "e"], ["h1", "h1", "h2", "h3", "h4"], ranks=[0, 0, 1, 1, 1])
    # near pair between b (rank 1, idx 0) and c (rank 0, idx 0); d stands alone; e pairs with d
    pairs = [(1, 0, 0, 0), (1, 1, 1, 2)]
    out = resolve_duplicates(index, pairs, use_exact=True).to_pylist()
    assert out == [
        {"id": "b", "duplicate_of": "a", "kind": "near_duplicate"},
        {"id": "c", "duplicate_of": "a", "kind": "exact_duplicate"},
        {"id": "e", "duplicate_of": "d", "kind": "near_duplicate"},
    ]


def test_exact_off_keeps_identical_texts() -> None:
    index = _index(["a", "b"], ["h", "h"])
    assert resolve_duplicates(index, [], use_exact=False).num_rows == 0


def test_pair_naming_unknown_document_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="missing from the dedup index"):
        resolve_duplicates(_index(["a"], ["h"]), [(0, 0, 3, 9)], use_exact=True)


@settings(max_examples=60, deadline=None)
@given(
    st.integers(2, 30),
    st.lists(st.tuples(st.integers(0, 29), st.integers(0, 29)), max_size=40),
    st.integers(0, 5),
)
def test_clusters_match_connected_components(n: int, edges: list[tuple[int, int]], n_hashes: int) -> None:
    """Against an independent reference: connected components by repeated relaxation."""
    rng = random.Random(n * 1000 + len(edges))
    ids = [f"doc{i:02d}" for i in range(n)]
    hashes = [f"h{rng.randint(0, n_hashes)}" for _ in range(n)]
    edges = [(a % n, b % n) for a, b in edges]
    out = {
        r["id"]: r
        for r in resolve_duplicates(_index(ids, hashes), [(0, a, 0, b) for a, b in edges], True).to_pylist()
    }
    label = list(range(n))
    links = edges + [(i, j) for i in range(n) for j in range(n) if hashes[i] == hashes[j]]
    changed = True
    while changed:
        changed = False
        for a, b in links:
            low = min(label[a], label[b])
            if label[a] != low or label[b] != low:
                label[a] = label[b] = low
                changed = True
    for i in range(n):
        root = min(j for j in range(n) if label[j] == label[i])
        if root == i:
            assert ids[i] not in out
        else:
            assert out[ids[i]]["duplicate_of"] == ids[root]
            expected_kind = "exact_duplicate" if hashes[i] == hashes[root] else "near_duplicate"
            assert out[ids[i]]["kind"] == expected_kind
