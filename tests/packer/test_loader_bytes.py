"""The loader serves exactly the shards' bytes: every batch of ``PackedDataset`` (with
``collate_packed``) and of ``PackedLoader`` (workers 0 and 2, several batch sizes, shared-memory slots
reused many times over) equals the batch built independently from the shard files' Arrow columns,
read here with pyarrow alone, in the dataset's order and in the documented label convention."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
from torch.utils.data import DataLoader

from longctx.packer import IGNORE_INDEX, PackedDataset, PackedLoader, collate_packed
from longctx.packer import dataset as dataset_module
from longctx.packer import loader as loader_module
from tests.packer.test_pack_helpers import PackedRun

pytest_plugins = ["tests.packer.test_pack_helpers"]  # the shared packed_run fixture

SEQ_LEN = 256


def arrow_rows(folder: Path) -> list[dict[str, np.ndarray]]:
    """Every row of the folder, in manifest order, from the shard files read with pyarrow only."""
    import json

    rows = []
    for entry in json.loads((folder / "manifest.json").read_text())["shards"]:
        table = pa.ipc.open_stream(pa.OSFile(str(folder / entry["file"]))).read_all().to_pydict()
        for i in range(len(table["input_ids"])):
            rows.append(
                {
                    name: np.asarray(table[name][i])
                    for name in ("input_ids", "position_ids", "loss_mask", "cu_seqlens")
                }
            )
    return rows


def reference_batch(rows: list[dict[str, np.ndarray]]) -> dict[str, object]:
    """The batch the documented convention gives: labels[i] = input_ids[i + 1] where loss_mask[i + 1]
    is set (and IGNORE_INDEX at the window's end), segment boundaries of the flattened batch."""
    ids = np.stack([r["input_ids"] for r in rows]).astype(np.int64)
    following = np.stack([r["loss_mask"] for r in rows])[:, 1:] == 1
    targets = np.concatenate([following, np.zeros((len(rows), 1), bool)], axis=1)
    labels = np.full_like(ids, IGNORE_INDEX)
    labels[:, :-1] = np.where(following, ids[:, 1:], IGNORE_INDEX)
    cu = [int(c) + b * SEQ_LEN for b, r in enumerate(rows) for c in r["cu_seqlens"][:-1]] + [
        len(rows) * SEQ_LEN
    ]
    return {
        "input_ids": torch.from_numpy(ids),
        "labels": torch.from_numpy(labels),
        "position_ids": torch.from_numpy(np.stack([r["position_ids"] for r in rows]).astype(np.int64)),
        "loss_mask": torch.from_numpy(targets),
        "cu_seqlens": torch.tensor(cu, dtype=torch.int32),
        "max_seqlen": int(np.diff(cu).max()),
    }


def assert_same(batch: dict[str, object], expected: dict[str, object]) -> None:
    assert batch.keys() == expected.keys()
    for key, value in expected.items():
        if isinstance(value, torch.Tensor):
            got = batch[key]
            assert isinstance(got, torch.Tensor) and got.dtype == value.dtype and got.shape == value.shape, (
                key
            )
            assert torch.equal(got, value), key
        else:
            assert batch[key] == value, key


@pytest.fixture
def small_transfers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two windows per DataLoader item, with workers (so that a pass reuses every shared-memory slot
    many times) and without (so that a pass reuses the item buffers)."""
    monkeypatch.setattr(loader_module, "TRANSFER_TOKENS", 2 * SEQ_LEN)
    monkeypatch.setattr(loader_module, "CHUNK_TOKENS", 2 * SEQ_LEN)


def test_dataset_rows_are_the_arrow_columns(packed_run: PackedRun) -> None:
    folder = packed_run.folder(SEQ_LEN)
    rows = arrow_rows(folder)
    ds = PackedDataset(folder, tokenizer=packed_run.tokenizer_path, seed=3)
    order = ds.order(0)
    batches = list(DataLoader(ds, batch_size=1, collate_fn=collate_packed))
    assert len(batches) == len(order)
    for r, batch in zip(order, batches, strict=True):
        assert_same(batch, reference_batch([rows[int(r)]]))


@pytest.mark.usefixtures("small_transfers")
@pytest.mark.parametrize(("workers", "batch_size"), [(0, 1), (0, 3), (2, 1), (2, 3)])
def test_loader_batches_are_the_arrow_columns(packed_run: PackedRun, workers: int, batch_size: int) -> None:
    folder = packed_run.folder(SEQ_LEN)
    rows = arrow_rows(folder)
    ds = PackedDataset(folder, tokenizer=packed_run.tokenizer_path, seed=5)
    order = ds.order(0)
    batches = list(PackedLoader(ds, batch_size=batch_size, num_workers=workers))
    expected = [order[i : i + batch_size] for i in range(0, len(order), batch_size)]
    # far more worker messages than slots (prefetch_factor x workers + 1), so slots are reused
    assert workers == 0 or len(expected) / 2 > 2 * 2 * workers + 1
    assert len(batches) == len(expected)
    for batch, chunk in zip(batches, expected, strict=True):
        assert_same(batch, reference_batch([rows[int(r)] for r in chunk]))
    # each batch owns its memory: changing one changes no other
    batches[0]["input_ids"].fill_(-1)
    assert all(int(b["input_ids"].min()) >= 0 for b in batches[1:])


@pytest.mark.usefixtures("small_transfers")
def test_a_custom_collate_gets_the_samples(packed_run: PackedRun) -> None:
    folder = packed_run.folder(SEQ_LEN)
    rows = arrow_rows(folder)
    ds = PackedDataset(folder, tokenizer=packed_run.tokenizer_path, seed=5)
    order = ds.order(0)
    got = list(itertools.islice(PackedLoader(ds, batch_size=2, num_workers=2, collate_fn=lambda s: s), 3))
    for samples, chunk in zip(got, [order[0:2], order[2:4], order[4:6]], strict=True):
        for sample, r in zip(samples, chunk, strict=True):
            expected = reference_batch([rows[int(r)]])
            assert_same(
                {
                    **{k: v[None] for k, v in sample.items() if k != "cu_seqlens"},
                    "cu_seqlens": sample["cu_seqlens"],
                    "max_seqlen": expected["max_seqlen"],
                },
                expected,
            )


@pytest.mark.usefixtures("small_transfers")
@pytest.mark.parametrize("source", ["dataset", "loader-workers-0", "loader-workers-2"])
def test_reused_memory_never_changes_a_batch_still_held(
    packed_run: PackedRun, source: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Items are built into memory reused once nothing refers to an earlier item: every batch is right
    when it arrives (most are dropped at once, so memory is reused), and the batches the caller keeps
    are still right at the end of the pass."""
    monkeypatch.setattr(dataset_module, "CHUNK_TOKENS", 2 * SEQ_LEN)
    folder = packed_run.folder(SEQ_LEN)
    rows = arrow_rows(folder)
    ds = PackedDataset(folder, tokenizer=packed_run.tokenizer_path, seed=7)
    order = ds.order(0)
    if source == "dataset":
        batches = DataLoader(ds, batch_size=1, collate_fn=collate_packed)
    else:
        batches = PackedLoader(ds, batch_size=1, num_workers=int(source[-1]))
    kept = []
    for k, batch in enumerate(batches):
        expected = reference_batch([rows[int(order[k])]])
        assert_same(batch, expected)
        if k % 3 == 0:
            kept.append((batch, expected))
    assert k + 1 == len(order) > 12
    for batch, expected in kept:
        assert_same(batch, expected)


@pytest.mark.usefixtures("small_transfers")
@pytest.mark.parametrize("source", ["dataset", "loader-workers-0"])
def test_later_passes_build_into_the_memory_of_the_first(
    packed_run: PackedRun, source: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loop that drops each batch before the next lets every later pass (epoch) build its items into
    the memory the first pass took: no new item buffers, and every batch still right."""
    monkeypatch.setattr(dataset_module, "CHUNK_TOKENS", 2 * SEQ_LEN)
    folder = packed_run.folder(SEQ_LEN)
    rows = arrow_rows(folder)
    ds = PackedDataset(folder, tokenizer=packed_run.tokenizer_path, seed=7)
    loader = PackedLoader(ds, batch_size=1) if source != "dataset" else None

    def one_pass() -> int:
        order = ds.order(ds.epoch)
        batches = loader if loader is not None else DataLoader(ds, batch_size=1, collate_fn=collate_packed)
        for k, batch in enumerate(batches):
            assert_same(batch, reference_batch([rows[int(order[k])]]))
        return k + 1

    one_pass()
    allocated: list[int] = []
    empty = np.empty

    def counting(shape: object, *args: object, **kwargs: object) -> np.ndarray:
        array = empty(shape, *args, **kwargs)
        if array.nbytes >= 1 << 16:  # an item's buffer (rounded up to 64 KiB), not a row's scratch
            allocated.append(array.nbytes)
        return array

    monkeypatch.setattr(np, "empty", counting)
    assert one_pass() > 12 and one_pass() > 12
    assert allocated == []


def test_a_pickled_dataset_leaves_its_item_memory_behind(packed_run: PackedRun) -> None:
    """A copy sent to a spawned worker starts with no item memory of its own (it would be megabytes
    of this process's buffers, pickled for nothing), and builds the same samples. The copy is made
    with ``copy.deepcopy``, which takes the state from the same ``__getstate__`` that pickling uses,
    without deserializing any bytes."""
    import copy as copying

    ds = PackedDataset(packed_run.folder(SEQ_LEN), tokenizer=packed_run.tokenizer_path, seed=7)
    first = [sample["input_ids"].clone() for sample in ds]
    copy = copying.deepcopy(ds)
    assert ds._buffers._kept and copy._buffers._kept == []
    copy.set_epoch(0)  # the pass above ended the epoch: back to its start
    assert all(torch.equal(a, b["input_ids"]) for a, b in zip(first, copy, strict=True))
