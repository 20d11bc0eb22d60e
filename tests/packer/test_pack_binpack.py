"""Packing strategies against brute-force references and their invariants on random inputs."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from longctx.packer.binpack import GapIndex, Packing, best_fit_decreasing, concat_chunk, pack


def windows_of(packing: Packing) -> list[list[tuple[int, int, int]]]:
    ptr = packing.window_ptr
    return [
        [
            (int(packing.doc[i]), int(packing.offset[i]), int(packing.length[i]))
            for i in range(ptr[w], ptr[w + 1])
        ]
        for w in range(packing.num_windows)
    ]


def coverage(packing: Packing, num_docs: int) -> list[Counter]:
    """For each document, how many times each of its token offsets is placed."""
    covered = [Counter() for _ in range(num_docs)]
    for doc, offset, length in zip(packing.doc.tolist(), packing.offset.tolist(), packing.length.tolist()):
        covered[doc].update(range(offset, offset + length))
    return covered


def reference_bfd(lengths: list[int], seq_len: int) -> list[list[tuple[int, int, int]]]:
    """Best-fit decreasing by linear scan (documents no longer than seq_len): longest document
    first, into the window with the smallest sufficient gap; among equal gaps, the window that has
    had its gap longest."""
    order = sorted(range(len(lengths)), key=lambda d: (-lengths[d], d))
    windows: list[list[tuple[int, int, int]]] = []
    gaps: list[int] = []
    since: list[int] = []
    for step, doc in enumerate(order):
        fits = [w for w in range(len(windows)) if gaps[w] >= lengths[doc]]
        if fits:
            w = min(fits, key=lambda w: (gaps[w], since[w]))
        else:
            w = len(windows)
            windows.append([])
            gaps.append(seq_len)
            since.append(step)
        windows[w].append((doc, 0, lengths[doc]))
        gaps[w] -= lengths[doc]
        since[w] = step
    return windows


@given(st.data(), st.integers(2, 40))
@settings(max_examples=200, deadline=None)
def test_gap_index_matches_a_linear_scan(data: st.DataObject, seq_len: int) -> None:
    index, open_gaps = GapIndex(seq_len), {}
    for step in range(data.draw(st.integers(1, 60))):
        if open_gaps and data.draw(st.booleans()):
            window = data.draw(st.sampled_from(sorted(open_gaps)))
            index.remove(window, open_gaps.pop(window))
        else:
            gap = data.draw(st.integers(0, seq_len))
            index.add(step, gap)
            open_gaps[step] = gap
        need = data.draw(st.integers(0, seq_len + 1))
        fits = [(g, w) for w, g in open_gaps.items() if g >= need]  # windows are added in increasing id order
        assert index.best_fit(need) == (min(fits)[1] if fits else None)
        assert index.largest() == (min(open_gaps, key=lambda w: (-open_gaps[w], w)) if open_gaps else None)
        assert len(index) == len(open_gaps)


@given(st.lists(st.integers(1, 32), min_size=1, max_size=60), st.integers(32, 48))
@settings(max_examples=200, deadline=None)
def test_bfd_of_short_documents_matches_a_linear_scan(lengths: list[int], seq_len: int) -> None:
    assert windows_of(best_fit_decreasing(np.array(lengths), seq_len)) == reference_bfd(lengths, seq_len)


@given(st.lists(st.integers(1, 200), min_size=1, max_size=50), st.integers(2, 64))
@settings(max_examples=300, deadline=None)
def test_bfd_invariants(lengths: list[int], seq_len: int) -> None:
    packing = best_fit_decreasing(np.array(lengths), seq_len)
    windows = windows_of(packing)
    # every token of every document placed exactly once, and no window overflows
    assert all(
        set(c) == set(range(n)) and set(c.values()) == {1}
        for c, n in zip(coverage(packing, len(lengths)), lengths)
    )
    assert all(sum(s[2] for s in w) <= seq_len for w in windows)
    # short documents are never split; long ones give full windows of their own
    for doc, n in enumerate(lengths):
        segments = [s for w in windows for s in w if s[0] == doc]
        if n <= seq_len:
            assert segments == [(doc, 0, n)]
        else:
            assert [w for w in windows if w[0][0] == doc and w[0][2] == seq_len and len(w) == 1]
    # padding: below a whole window once only remainders of long documents could fill it
    padding = len(windows) * seq_len - sum(lengths)
    if all(n > seq_len for n in lengths):
        assert padding < seq_len
    assert len(windows) >= -(-sum(lengths) // seq_len)


@given(st.lists(st.integers(1, 100), min_size=1, max_size=50), st.integers(2, 64))
@settings(max_examples=200, deadline=None)
def test_concat_chunk_cuts_the_stream_every_seq_len(lengths: list[int], seq_len: int) -> None:
    packing = concat_chunk(np.array(lengths), seq_len)
    windows = windows_of(packing)
    total = sum(lengths)
    assert len(windows) == -(-total // seq_len)
    assert [sum(s[2] for s in w) for w in windows[:-1]] == [seq_len] * (len(windows) - 1)
    stream = [(d, o + i) for w in windows for d, o, n in w for i in range(n)]
    assert stream == [(d, i) for d, n in enumerate(lengths) for i in range(n)]


@given(
    st.lists(st.integers(1, 90), min_size=1, max_size=30),
    st.lists(st.integers(0, 3), min_size=30, max_size=30),
)
@settings(max_examples=150, deadline=None)
def test_every_copy_is_placed_exactly(lengths: list[int], copies: list[int]) -> None:
    copies = copies[: len(lengths)]
    for strategy in ("bfd", "concat"):
        packing = pack(np.array(lengths), np.array(copies), 32, strategy)
        for c, n, k in zip(coverage(packing, len(lengths)), lengths, copies):
            assert c == Counter(dict.fromkeys(range(n), k) if k else {})
        if strategy == "bfd":  # a copy of a short document is as unsplittable as the document
            segments = Counter((d, o, n) for w in windows_of(packing) for d, o, n in w if lengths[d] <= 32)
            assert segments == Counter(
                {(d, 0, n): k for d, (n, k) in enumerate(zip(lengths, copies)) if k and n <= 32}
            )


def test_bfd_reaches_the_lower_bound_on_long_documents() -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(10_000, 200_000, size=40)
    for seq_len in (4096, 16384, 65536):
        packing = best_fit_decreasing(lengths, seq_len)
        assert packing.num_windows == -(-int(lengths.sum()) // seq_len)


@pytest.mark.parametrize("strategy", ["bfd", "concat"])
def test_empty_input_gives_no_windows(strategy: str) -> None:
    packing = pack(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64), 8, strategy)
    assert packing.num_windows == 0 and packing.tokens() == 0
