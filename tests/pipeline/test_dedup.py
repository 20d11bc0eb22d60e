"""Duplicate resolution and the long-document MinHash signature."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest
from datatrove.pipeline.dedup.minhash import MinhashConfig, MinhashDedupSignature
from hypothesis import given, settings
from hypothesis import strategies as st

from longctx.pipeline.dedup import (
    LongDocMinhashSignature,
    RegexWordTokenizer,
    exact_hash,
    normalize_for_exact,
    resolve_duplicates,
)


def _index(ids: list[str], hashes: list[str], ranks: list[int] | None = None) -> pa.Table:
    ranks = ranks or [0] * len(ids)
    idx = []
    seen: dict[int, int] = {}
    for r in ranks:
        idx.append(seen.get(r, 0))
        seen[r] = idx[-1] + 1
    return pa.table({"idx": idx, "id": ids, "text_hash": hashes, "rank": ranks})


def test_normalization_ignores_wrapping_and_line_endings() -> None:
    a = "It is a truth universally\r\nacknowledged, that a single man"
    b = "It is a truth\nuniversally acknowledged,   that a single man\n"
    assert normalize_for_exact(a) == normalize_for_exact(b)
    assert exact_hash(a) == exact_hash(b)
    assert exact_hash(a) != exact_hash(a + " extra")


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
@given(st.integers(2, 30), st.lists(st.tuples(st.integers(0, 29), st.integers(0, 29)), max_size=40), st.integers(0, 5))
def test_clusters_match_connected_components(n: int, edges: list[tuple[int, int]], n_hashes: int) -> None:
    """Against an independent reference: connected components by repeated relaxation."""
    rng = random.Random(n * 1000 + len(edges))
    ids = [f"doc{i:02d}" for i in range(n)]
    hashes = [f"h{rng.randint(0, n_hashes)}" for _ in range(n)]
    edges = [(a % n, b % n) for a, b in edges]
    out = {r["id"]: r for r in resolve_duplicates(_index(ids, hashes), [(0, a, 0, b) for a, b in edges], True).to_pylist()}
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


def test_chunked_signature_equals_datatrove_signature(tmp_path) -> None:
    """The bounded-memory signature must equal datatrove's own on the same shingles."""
    config = MinhashConfig()
    ours = LongDocMinhashSignature(tmp_path / "a", config=config)
    ours.chunk_rows = 37  # force many chunks
    theirs = MinhashDedupSignature(str(tmp_path / "b"), config=config, language=RegexWordTokenizer())
    rng = random.Random(0)
    words = [f"w{rng.randint(0, 300)}" for _ in range(2000)]
    text = " ".join(words)
    shingles = theirs.get_shingles(text)
    assert ours.get_signature(shingles) == theirs.get_signature(shingles)
    assert np.unique(shingles).size < shingles.size  # repeated shingles were present


def test_regex_word_tokenizer_is_language_agnostic() -> None:
    tok = RegexWordTokenizer()
    assert tok.word_tokenize("def f(x): return x_1 + 2  # Größe") == ["def", "f", "x", "return", "x_1", "2", "Größe"]
