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

from longctx.packer import IGNORE_INDEX, PackedDataset, PackedLoader, ShardError, collate_packed
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
    assert a.epoch == 1 and a.consumed == 0  # handing out the last row moved on to epoch 1
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
    with pytest.raises(ShardError, match="format version 2, this reader expects 3"):
        PackedDataset(packed_run.folder(SEQ_LEN), tokenizer=packed_run.tokenizer_path, format_version=3)
    with pytest.raises(ShardError, match=r"no manifest\.json"):
        PackedDataset(tmp_path, tokenizer=None)
    with pytest.raises(ValueError, match=r"tokenizer\.json path or a sha256"):
        PackedDataset(packed_run.folder(SEQ_LEN), tokenizer="no-such-tokenizer.json")
    newer = tmp_path / "newer"
    shutil.copytree(packed_run.folder(SEQ_LEN), newer)
    manifest = json.loads((newer / "manifest.json").read_text())
    manifest["header"]["format_version"] = 3
    (newer / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ShardError, match="written in format version 3; this version of longctx reads 2"):
        PackedDataset(newer, tokenizer=packed_run.tokenizer_path)


def test_heldout_rows_are_never_in_a_training_order(packed_run: PackedRun) -> None:
    folder = packed_run.folder(SEQ_LENS[0])
    total = len(PackedDataset(folder, tokenizer=packed_run.tokenizer_path))
    held = set(PackedDataset(folder, tokenizer=packed_run.tokenizer_path, holdout_rows=5).heldout_rows())
    assert len(held) == 5 and held <= set(range(total))
    assert held != set(range(total - 5, total))  # drawn at random, not the part-filled tail
    for world in (1, 2, 3):
        for rank in range(world):
            ds = PackedDataset(
                folder, tokenizer=packed_run.tokenizer_path, dp_rank=rank, dp_world_size=world, holdout_rows=5
            )
            assert set(ds.heldout_rows()) == held
            for epoch in range(3):
                assert not held & set(ds.order(epoch).tolist())
    ds = PackedDataset(folder, tokenizer=packed_run.tokenizer_path, holdout_rows=5)
    assert sorted(ds.order(0).tolist()) == sorted(set(range(total)) - held)
    assert (
        ds.heldout_rows()
        == PackedDataset(folder, tokenizer=packed_run.tokenizer_path, holdout_rows=5, seed=0).heldout_rows()
    )
    with pytest.raises(ValueError, match="holding out"):
        PackedDataset(folder, tokenizer=packed_run.tokenizer_path, holdout_rows=total)


# --- data order as a function of the global batch (notes/SPEC_dataset_order.md) ---------------------

G = 4


def step_rows(ds: PackedDataset, steps: int) -> list[list[int]]:
    """The next ``steps`` optimizer steps of one rank: ``rows_per_step`` rows each, by content."""
    seen = rows_seen(ds, steps * ds.rows_per_step)
    m = ds.rows_per_step
    return [seen[k * m : (k + 1) * m] for k in range(steps)]


def group(run: PackedRun, dp: int, **kwargs: object) -> list[PackedDataset]:
    return [
        dataset(run, seed=7, dp_rank=r, dp_world_size=dp, global_batch_rows=G, **kwargs) for r in range(dp)
    ]


def global_steps(ranks: list[PackedDataset], steps: int) -> list[list[int]]:
    """Each step's rows over the whole DP group, in rank order."""
    per_rank = [step_rows(ds, steps) for ds in ranks]
    return [[row for rank in per_rank for row in rank[k]] for k in range(steps)]


def test_the_rows_of_each_step_do_not_depend_on_the_data_parallel_size(packed_run: PackedRun) -> None:
    steps = group(packed_run, 1)[0].steps_per_epoch() + 2  # into the second epoch
    reference = global_steps(group(packed_run, 1), steps)
    assert all(len(step) == G for step in reference)
    for dp in (2, 4):
        ranks = group(packed_run, dp)
        assert all(ds.rows_per_step == G // dp for ds in ranks)
        assert global_steps(ranks, steps) == reference
    # every row of an epoch once; the second epoch is another permutation
    epoch0 = [r for step in reference[: steps - 2] for r in step]
    assert len(set(epoch0)) == len(epoch0) == group(packed_run, 1)[0].steps_per_epoch() * G
    assert reference[steps - 2] != reference[0]


def test_a_state_saved_at_dp4_resumes_at_dp2_with_the_rows_dp1_would_see(packed_run: PackedRun) -> None:
    total = group(packed_run, 1)[0].steps_per_epoch()
    after = 3
    uninterrupted = global_steps(group(packed_run, 1), total + after)
    for done in (0, 1, total - 1, total):  # including the epoch boundary
        ranks = group(packed_run, 4)
        global_steps(ranks, done)
        states = [ds.state_dict() for ds in ranks]
        assert all(s == states[0] for s in states)  # a step boundary: every rank has the same state
        assert "dp_world_size" not in states[0] and states[0]["partial_step"] is None
        assert states[0]["position"] == (done % total) * G
        resumed = group(packed_run, 2)
        for ds in resumed:
            ds.load_state_dict(states[0])
        assert global_steps(resumed, after) == uninterrupted[done : done + after]


def test_a_mid_step_state_resumes_only_at_its_data_parallel_size(packed_run: PackedRun) -> None:
    ranks = group(packed_run, 2)
    expected = global_steps(group(packed_run, 2), 2)
    for ds in ranks:
        rows_seen(ds, 1)  # one of the two rows of step 0
    state = ranks[0].state_dict()
    assert state["position"] == 2 and state["partial_step"] == {"dp_world_size": 2, "rows_per_rank": 1}
    with pytest.raises(ValueError, match="middle of an optimizer step at data-parallel size 2"):
        group(packed_run, 4)[0].load_state_dict(state)
    again = group(packed_run, 2)
    for ds, old in zip(again, ranks):
        ds.load_state_dict(old.state_dict())
    rest = [rows_seen(ds, 3) for ds in again]
    assert rest[0] + rest[1] == [expected[0][1], *expected[1][:2], expected[0][3], *expected[1][2:]]


def test_global_batch_must_be_a_multiple_of_the_data_parallel_size(packed_run: PackedRun) -> None:
    from longctx.core.errors import ConfigError

    with pytest.raises(
        ConfigError, match="global_batch_rows=6 must be a positive multiple of the data-parallel size 4"
    ):
        dataset(packed_run, dp_rank=0, dp_world_size=4, global_batch_rows=6)
    with pytest.raises(ConfigError, match="fewer than one optimizer step"):
        dataset(packed_run, global_batch_rows=10_000)
    with pytest.raises(ValueError, match="different global_batch_rows"):
        dataset(packed_run, global_batch_rows=2).load_state_dict(
            dataset(packed_run, global_batch_rows=4).state_dict()
        )


# --- PackedLoader: DataLoader workers with an exact position --------------------------------------


def batches_of(loader: PackedLoader, n: int | None = None) -> list[torch.Tensor]:
    return [b["input_ids"] for b in itertools.islice(loader, n)]


@pytest.mark.parametrize(("workers", "batch_size"), [(0, 3), (2, 1), (3, 2)])
def test_loader_workers_give_the_same_batches_and_resume_exactly(
    packed_run: PackedRun, workers: int, batch_size: int
) -> None:
    reference = dataset(packed_run, seed=9)
    n = len(reference)
    expected = [
        torch.stack([reference[int(r)]["input_ids"] for r in reference.order(0)[i : i + batch_size]])
        for i in range(0, n, batch_size)
    ]
    ds = dataset(packed_run, seed=9)
    loader = PackedLoader(ds, batch_size=batch_size, num_workers=workers)
    head = batches_of(loader, 3)  # stops while the workers have prefetched more
    assert ds.consumed == 3 * batch_size
    resumed = dataset(packed_run, seed=9)
    resumed.load_state_dict(ds.state_dict())
    tail = batches_of(PackedLoader(resumed, batch_size=batch_size, num_workers=2 - workers % 2))
    got = head + tail
    assert len(got) == len(expected) and all(torch.equal(a, b) for a, b in zip(got, expected))
    assert resumed.epoch == 1 and resumed.consumed == 0  # a complete pass ends the epoch


def test_a_plain_dataloader_with_workers_is_refused(packed_run: PackedRun) -> None:
    loader = DataLoader(dataset(packed_run), batch_size=1, num_workers=1, collate_fn=collate_packed)
    with pytest.raises(RuntimeError, match="PackedLoader"):
        next(iter(loader))
