"""The zigzag context-parallel splitter against a plain-loop reference, on packed rows and on
random segment layouts, including the block masks ring attention derives from it."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from longctx.packer import IGNORE_INDEX, PackedDataset, collate_packed
from longctx.trainer.parallel.layout import context_split
from longctx.trainer.parallel.zigzag import ContextParallelShard, zigzag_indices
from tests.packer.test_pack_helpers import PackedRun

pytest_plugins = ["tests.packer.test_pack_helpers"]  # the shared packed_run fixture


def reference_split(sample: dict[str, torch.Tensor], cp_size: int, cp_rank: int) -> dict[str, list[int]]:
    """Rank ``cp_rank``'s tokens by explicit loops: chunks ``cp_rank`` and ``2 * cp_size - 1 - cp_rank``."""
    length = len(sample["input_ids"])
    chunk = length // (2 * cp_size)
    indices = [i for c in (cp_rank, 2 * cp_size - 1 - cp_rank) for i in range(c * chunk, (c + 1) * chunk)]
    bounds = sample["cu_seqlens"].tolist()
    segment = [
        next(j for j in range(len(bounds) - 1) if bounds[j] <= t < bounds[j + 1]) for t in range(length)
    ]
    out = {
        key: [int(sample[key][i]) for i in indices]
        for key in ("input_ids", "labels", "position_ids", "loss_mask")
    }
    return out | {"indices": indices, "segment_ids": [segment[i] for i in indices]}


FIELDS = ("indices", "input_ids", "labels", "position_ids", "loss_mask", "segment_ids")


def as_lists(shard: ContextParallelShard) -> dict[str, list[int]]:
    return {key: [int(v) for v in getattr(shard, key).tolist()] for key in FIELDS}


@pytest.mark.parametrize("cp_size", [1, 2, 4, 8])
def test_packed_rows_match_the_reference(packed_run: PackedRun, cp_size: int) -> None:
    ds = PackedDataset(packed_run.folder(256), tokenizer=packed_run.tokenizer_path)
    for row in (0, len(ds.shards) // 2, len(ds.shards) - 1):
        sample = ds[row]
        for rank in range(cp_size):
            assert as_lists(context_split(sample, cp=cp_size, cp_rank=rank)) == reference_split(
                sample, cp_size, rank
            )


@st.composite
def layouts(draw: st.DrawFn) -> tuple[dict[str, torch.Tensor], int]:
    cp_size = draw(st.integers(1, 6))
    length = 2 * cp_size * draw(st.integers(1, 12))
    cuts = sorted(draw(st.sets(st.integers(1, length - 1), max_size=length - 1))) if length > 1 else []
    bounds = [0, *cuts, length]
    positions = torch.cat([torch.arange(b - a) for a, b in itertools.pairwise(bounds)])
    ids = torch.tensor(draw(st.lists(st.integers(0, 999), min_size=length, max_size=length)))
    mask = positions > 0
    labels = torch.full((length,), IGNORE_INDEX)
    labels[:-1] = torch.where(mask[1:], ids[1:], IGNORE_INDEX)
    sample = {
        "input_ids": ids,
        "labels": labels,
        "position_ids": positions,
        "loss_mask": mask,
        "cu_seqlens": torch.tensor(bounds, dtype=torch.int32),
    }
    return sample, cp_size


@given(layouts())
@settings(max_examples=150, deadline=None)
def test_random_layouts_match_the_reference_and_preserve_masks(
    layout: tuple[dict[str, torch.Tensor], int],
) -> None:
    sample, cp_size = layout
    length = len(sample["input_ids"])
    shards = [context_split(sample, cp=cp_size, cp_rank=rank) for rank in range(cp_size)]
    for rank, shard in enumerate(shards):
        assert as_lists(shard) == reference_split(sample, cp_size, rank)
        assert len(shard.indices) == length // cp_size
    assert sorted(torch.cat([s.indices for s in shards]).tolist()) == list(range(length))
    # every rank pair rebuilds exactly its block of the full packed causal mask
    bounds = sample["cu_seqlens"].tolist()
    segment = torch.cat([torch.full((b - a,), j) for j, (a, b) in enumerate(itertools.pairwise(bounds))])
    position = torch.arange(length)
    full = (segment[:, None] == segment[None, :]) & (position[None, :] <= position[:, None])
    for q in shards:
        for k in shards:
            block = (q.segment_ids[:, None] == k.segment_ids[None, :]) & (
                k.indices[None, :] <= q.indices[:, None]
            )
            assert torch.equal(block, full[q.indices][:, k.indices])


def test_batches_are_split_along_the_sequence(packed_run: PackedRun) -> None:
    ds = PackedDataset(packed_run.folder(256), tokenizer=packed_run.tokenizer_path)
    batch = collate_packed([ds[0], ds[1], ds[2]])
    shard = context_split(batch, cp=4, cp_rank=1)
    assert shard.input_ids.shape == (3, 64)
    for b in range(3):
        single = context_split(ds[b], cp=4, cp_rank=1)
        assert torch.equal(shard.input_ids[b], single.input_ids)
        assert torch.equal(shard.position_ids[b], single.position_ids)


def test_only_the_total_length_must_divide() -> None:
    assert zigzag_indices(12, 3, 0).tolist() == [0, 1, 10, 11]
    assert zigzag_indices(12, 3, 2).tolist() == [4, 5, 6, 7]
    message = "sequence length = 12 must be a positive multiple of 2 x cp_size = 8"
    with pytest.raises(ValueError, match=message):
        zigzag_indices(12, 4, 0)
    with pytest.raises(ValueError, match="cp_rank"):
        zigzag_indices(12, 3, 3)
