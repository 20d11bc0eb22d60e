"""Masks, block planning and varlen layouts of ring attention, against masks built here from lengths."""

from __future__ import annotations

from itertools import pairwise

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from longctx.trainer.attention.masks import (
    VarlenLayout,
    block_mask,
    cols_with_queries,
    pair_extents,
    rows_with_keys,
)
from longctx.trainer.parallel.zigzag import zigzag_indices


def document_mask(lengths: list[int]) -> torch.Tensor:
    """Block-diagonal causal mask of a packed window, straight from the document lengths."""
    total = sum(lengths)
    mask = torch.zeros(total, total, dtype=torch.bool)
    start = 0
    for length in lengths:
        mask[start : start + length, start : start + length] = torch.ones(length, length).tril().bool()
        start += length
    return mask


def segments_of(lengths: list[int]) -> torch.Tensor:
    return torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))


def chunks_of(seq_len: int, world: int, rank: int) -> torch.Tensor:
    chunks = torch.arange(seq_len).chunk(2 * world)
    return torch.cat([chunks[rank], chunks[2 * world - 1 - rank]])


def varlen_to_dense(layout: VarlenLayout, rows: int, cols: int) -> torch.Tensor:
    mask = torch.zeros(rows, cols, dtype=torch.bool)
    cu_q, cu_k = layout.cu_seqlens_q.tolist(), layout.cu_seqlens_k.tolist()
    for (q0, q1), (k0, k1) in zip(pairwise(cu_q), pairwise(cu_k), strict=True):
        block = torch.ones(q1 - q0, k1 - k0, dtype=torch.bool)
        mask[q0:q1, k0:k1] = block.tril() if layout.causal else block
    return mask


@st.composite
def packed_windows(draw: st.DrawFn) -> tuple[list[int], int]:
    """A window of 24..96 tokens cut into random documents, and a ring size dividing it."""
    world = draw(st.integers(1, 4))
    seq_len = 2 * world * draw(st.integers(3, 12))
    cuts = sorted(draw(st.sets(st.integers(1, seq_len - 1), max_size=12)))
    bounds = [0, *cuts, seq_len]
    return [b - a for a, b in pairwise(bounds)], world


def test_packer_zigzag_indices_match_the_chunk_pairs_the_ring_is_balanced_for() -> None:
    for world in (1, 2, 3, 4):
        held = [zigzag_indices(48, world, rank) for rank in range(world)]
        for rank, indices in enumerate(held):
            assert torch.equal(indices, chunks_of(48, world, rank))
        assert torch.equal(torch.cat(held).sort().values, torch.arange(48))
    with pytest.raises(ValueError):
        zigzag_indices(50, 4, 0)
    with pytest.raises(ValueError):
        zigzag_indices(48, 4, 4)


@settings(max_examples=60, deadline=None)
@given(packed_windows())
def test_block_masks_match_document_mask(window: tuple[list[int], int]) -> None:
    lengths, world = window
    seq_len, segment, full = sum(lengths), segments_of(lengths), document_mask(lengths)
    held = [chunks_of(seq_len, world, rank) for rank in range(world)]
    q_idx = torch.stack(held)
    overlaps, areas = pair_extents(q_idx, segment[q_idx], q_idx, segment[q_idx])
    for r, rows_idx in enumerate(held):
        for s, cols_idx in enumerate(held):
            expected = full[rows_idx][:, cols_idx]
            args = (rows_idx, segment[rows_idx], cols_idx, segment[cols_idx])
            assert torch.equal(rows_with_keys(*args), expected.any(1))
            assert torch.equal(cols_with_queries(*args), expected.any(0))
            block = block_mask(*args)
            assert bool(overlaps[r, s]) == bool(expected.any()) == (block is not None)
            if block is None:
                assert int(areas[r, s]) == 0
                continue
            # Every allowed entry lies inside the rectangle, and the rectangle's mask is exact.
            assert int(expected.sum()) == int(expected[block.rows, block.cols].sum())
            inside = expected[block.rows, block.cols]
            assert torch.equal(block.allowed(), inside)
            assert int(areas[r, s]) == inside.numel()
            assert torch.equal(block.row_has_key, inside.any(1))
            assert block.is_full == bool(inside.all())
            additive = block.additive(torch.float32)
            assert (additive is None) == block.is_full
            if additive is not None:
                assert torch.equal(additive == 0, inside)
            # Zigzag blocks over contiguous documents always have a varlen form, and it is exact.
            layout = block.varlen
            assert layout is not None
            assert torch.equal(varlen_to_dense(layout, *inside.shape), inside)


@settings(max_examples=30, deadline=None)
@given(packed_windows(), st.integers(1, 20))
def test_tiles_partition_the_allowed_entries(window: tuple[list[int], int], size: int) -> None:
    lengths, world = window
    segment, full = segments_of(lengths), document_mask(lengths)
    rows_idx, cols_idx = chunks_of(sum(lengths), world, world - 1), chunks_of(sum(lengths), world, 0)
    block = block_mask(rows_idx, segment[rows_idx], cols_idx, segment[cols_idx])
    covered = torch.zeros(len(rows_idx), len(cols_idx), dtype=torch.int64)
    for tile in [] if block is None else block.tiles(size):
        assert tile.shape[0] <= size and tile.shape[1] <= size
        assert torch.equal(tile.q_index, rows_idx[tile.rows]) and torch.equal(
            tile.kv_index, cols_idx[tile.cols]
        )
        covered[tile.rows, tile.cols] += tile.allowed().long()
    assert torch.equal(covered, full[rows_idx][:, cols_idx].long())


def test_untrimmed_block_keeps_empty_pairs() -> None:
    lengths = [6, 6, 6, 6]
    segment, index = segments_of(lengths), torch.arange(24)
    q, kv = index[18:], index[:6]
    assert block_mask(q, segment[q], kv, segment[kv]) is None
    block = block_mask(q, segment[q], kv, segment[kv], trim=False)
    assert block is not None and block.shape == (6, 6)
    assert not bool(block.row_has_key.any()) and not bool(block.allowed().any())


def test_varlen_layout_rejects_masks_it_cannot_express() -> None:
    index = torch.arange(8)
    # One segment interleaved with another: not a set of contiguous sequences.
    interleaved = torch.tensor([0, 1, 0, 1, 0, 1, 0, 1])
    block = block_mask(index, interleaved, index, interleaved)
    assert block is not None and block.varlen is None
    # Different token sets with partial causal overlap inside a segment: neither causal nor full.
    segment = torch.zeros(8, dtype=torch.int64)
    block = block_mask(index[4:], segment[4:], index[2:6], segment[2:6])
    assert block is not None and block.varlen is None
    assert torch.equal(block.allowed(), document_mask([8])[4:, 2:6])


def test_varlen_layout_pairs_keyless_queries_with_empty_sequences() -> None:
    segment = torch.tensor([0, 0, 1, 1, 2, 2])
    q, kv = torch.tensor([4, 5]), torch.tensor([0, 1, 2, 3])
    block = block_mask(q, segment[q], kv, segment[kv], trim=False)
    assert block is not None and block.varlen is not None
    assert not bool(varlen_to_dense(block.varlen, 2, 4).any())
    assert block.varlen.max_seqlen_k > 0 and block.varlen.cu_seqlens_q.tolist()[-1] == 2
