"""PackedDataset: label convention, seeded epoch order, data-parallel sharding, exact resume,
and refusal of shards made for another tokenizer or format version."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from longctx.packer import IGNORE_INDEX, PackedDataset, ShardError, collate_packed
from tests.packer.test_pack_helpers import SEQ_LENS, PackedRun

pytest_plugins = ["tests.packer.test_pack_helpers"]  # the shared packed_run fixture

SEQ_LEN = 256


def dataset(run: PackedRun, **kwargs: object) -> PackedDataset:
    return PackedDataset(run.folder(SEQ_LEN), tokenizer=run.tokenizer_path, **kwargs)


def rows_seen(ds: PackedDataset, n: int) -> list[int]:
    """The global rows of the next ``n`` items (iterating epoch after epoch), identified by content."""
    index = {ds[i]["input_ids"].numpy().tobytes(): i for i in range(len(ds.shards))}
    seen: list[int] = []
    while len(seen) < n:
        seen += [
            index[item["input_ids"].numpy().tobytes()] for item in itertools.islice(iter(ds), n - len(seen))
        ]
    return seen


def test_labels_and_loss_mask_follow_the_documented_convention(packed_run: PackedRun) -> None:
    ds = dataset(packed_run)
    for i in range(len(ds.shards)):
        item, row = ds[i], ds.shards.row(i)
        ids, labels, mask, cu = (
            item["input_ids"],
            item["labels"],
            item["loss_mask"],
            item["cu_seqlens"].tolist(),
        )
        assert ids.dtype == labels.dtype == item["position_ids"].dtype == torch.int64
        assert item["cu_seqlens"].dtype == torch.int32 and mask.dtype == torch.bool
        assert torch.equal(mask, labels != IGNORE_INDEX)
        for j, (a, b) in enumerate(itertools.pairwise(cu)):
            if row.doc_id[j] is None:
                assert not mask[a:b].any()
                continue
            # inside a segment, position p predicts the segment's token p + 1; its last token predicts nothing
            assert torch.equal(labels[a : b - 1], ids[a + 1 : b]) and labels[b - 1] == IGNORE_INDEX
            assert torch.equal(item["position_ids"][a:b], torch.arange(b - a))
        # as many predictions as an unpacked document of each segment's length would have
        assert int(mask.sum()) == sum(
            b - a - 1 for j, (a, b) in enumerate(itertools.pairwise(cu)) if row.doc_id[j]
        )


def test_order_is_seeded_per_epoch(packed_run: PackedRun) -> None:
    a, b, other = dataset(packed_run, seed=1), dataset(packed_run, seed=1), dataset(packed_run, seed=2)
    n = len(a)
    first = rows_seen(a, n)
    assert a.epoch == 1 and a.position == 0  # handing out the last row moved on to epoch 1
    assert first == rows_seen(b, n) and sorted(first) == list(range(n))
    assert first != rows_seen(other, n)
    second = rows_seen(a, n)
    assert a.epoch == 2 and second != first and sorted(second) == sorted(first)
    assert rows_seen(dataset(packed_run, shuffle=False), n) == list(range(n))


@pytest.mark.parametrize("world", [2, 3])
def test_data_parallel_ranks_are_disjoint_and_equal(packed_run: PackedRun, world: int) -> None:
    ranks = [dataset(packed_run, seed=5, dp_rank=r, dp_world_size=world) for r in range(world)]
    seen = [rows_seen(ds, len(ds)) for ds in ranks]
    total = len(ranks[0].shards)
    assert all(len(s) == total // world for s in seen)
    flat = [r for s in seen for r in s]
    assert len(set(flat)) == len(flat) == total // world * world


def test_resume_continues_exactly(packed_run: PackedRun) -> None:
    reference = dataset(packed_run, seed=3, dp_rank=1, dp_world_size=2)
    n = len(reference)
    expected = rows_seen(reference, 2 * n)  # two epochs
    for stop in (0, 1, n - 1, n, n + 2):
        ds = dataset(packed_run, seed=3, dp_rank=1, dp_world_size=2)
        head = rows_seen(ds, stop)
        resumed = dataset(packed_run, seed=3, dp_rank=1, dp_world_size=2)
        resumed.load_state_dict(ds.state_dict())
        resumed.set_epoch(resumed.epoch)  # the usual call at the top of an epoch keeps the position
        assert head + rows_seen(resumed, 2 * n - stop) == expected


def test_resume_through_a_dataloader(packed_run: PackedRun) -> None:
    ds = dataset(packed_run, seed=4)
    loader = DataLoader(ds, batch_size=2, collate_fn=collate_packed)
    batches = iter(loader)
    next(batches)
    state = ds.state_dict()
    rest = [b["input_ids"] for b in batches]
    resumed = dataset(packed_run, seed=4)
    resumed.load_state_dict(state)
    again = [b["input_ids"] for b in DataLoader(resumed, batch_size=2, collate_fn=collate_packed)]
    assert state["position"] == 2 and len(rest) == len(again)
    assert all(torch.equal(x, y) for x, y in zip(rest, again))


def test_a_state_from_other_data_or_settings_is_refused(packed_run: PackedRun) -> None:
    state = dataset(packed_run, seed=1).state_dict()
    with pytest.raises(ValueError, match="different seed"):
        dataset(packed_run, seed=2).load_state_dict(state)
    other = PackedDataset(packed_run.folder(1024), tokenizer=packed_run.tokenizer_path, seed=1)
    with pytest.raises(ValueError, match=r"config_sha256|rows"):
        other.load_state_dict(state)


def test_collate_gives_varlen_boundaries_of_the_flattened_batch(packed_run: PackedRun) -> None:
    ds = dataset(packed_run)
    items = [ds[0], ds[1]]
    batch = collate_packed(items)
    assert batch["input_ids"].shape == (2, SEQ_LEN)
    expected = items[0]["cu_seqlens"].tolist() + (items[1]["cu_seqlens"][1:] + SEQ_LEN).tolist()
    assert batch["cu_seqlens"].tolist() == expected
    assert batch["max_seqlen"] == int(np.diff(expected).max())


def test_mismatched_tokenizer_or_format_version_is_refused(packed_run: PackedRun, tmp_path: Path) -> None:
    with pytest.raises(ShardError, match="encoded with tokenizer"):
        PackedDataset(packed_run.folder(SEQ_LEN), tokenizer="f" * 64)
    with pytest.raises(ShardError, match="format version 1, this reader expects 2"):
        PackedDataset(packed_run.folder(SEQ_LEN), tokenizer=packed_run.tokenizer_path, format_version=2)
    with pytest.raises(ShardError, match=r"no manifest\.json"):
        PackedDataset(tmp_path, tokenizer=None)
    with pytest.raises(ValueError, match=r"tokenizer\.json path or a sha256"):
        PackedDataset(packed_run.folder(SEQ_LEN), tokenizer="no-such-tokenizer.json")
    newer = tmp_path / "newer"
    shutil.copytree(packed_run.folder(SEQ_LEN), newer)
    manifest = json.loads((newer / "manifest.json").read_text())
    manifest["header"]["format_version"] = 2
    (newer / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ShardError, match="written in format version 2; this version of longctx reads 1"):
        PackedDataset(newer, tokenizer=packed_run.tokenizer_path)


def test_heldout_rows_are_never_in_a_training_order(packed_run: PackedRun) -> None:
    folder = packed_run.folder(SEQ_LENS[0])
    total = len(PackedDataset(folder, tokenizer=packed_run.tokenizer_path))
    held = set(PackedDataset(folder, tokenizer=packed_run.tokenizer_path, holdout_rows=5).heldout_rows())
    assert len(held) == 5 and held <= set(range(total))
    assert held != set(range(total - 5, total))  # drawn at random, not the part-filled tail
    for world in (1, 2, 3):
        for rank in range(world):
            ds = PackedDataset(folder, tokenizer=packed_run.tokenizer_path, dp_rank=rank, dp_world_size=world,
                               holdout_rows=5)
            assert set(ds.heldout_rows()) == held
            for epoch in range(3):
                assert not held & set(ds.order(epoch).tolist())
    ds = PackedDataset(folder, tokenizer=packed_run.tokenizer_path, holdout_rows=5)
    assert sorted(ds.order(0).tolist()) == sorted(set(range(total)) - held)
    assert ds.heldout_rows() == PackedDataset(folder, tokenizer=packed_run.tokenizer_path, holdout_rows=5, seed=0).heldout_rows()
    with pytest.raises(ValueError, match="holding out"):
        PackedDataset(folder, tokenizer=packed_run.tokenizer_path, holdout_rows=total)
