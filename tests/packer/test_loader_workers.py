"""PackedLoader's workers outlive a pass, and every pass still yields exactly the rows an uninterrupted
in-process run would: the reference is the same sequence of passes, position changes and resumes
run by iterating the dataset itself in this process and collating its samples (``collate_packed``);
the ``num_workers=0`` loader is held to the same reference.

The workers are the same processes from pass to pass (``multiprocessing.active_children``), and
none outlives the loader: closed, dropped, its process exiting, or its process killed (the kernel's
process table, tests/core/processes.py).
"""

from __future__ import annotations

import gc
import itertools
import multiprocessing
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable

import pytest
import torch

from longctx.packer import PackedDataset, PackedLoader, collate_packed
from longctx.packer import loader as loader_module
from tests.core.processes import HAS_PROC, describe, kill_survivors, marked_env, survivors_after
from tests.packer.test_pack_helpers import PackedRun

pytest_plugins = ["tests.packer.test_pack_helpers"]  # the shared packed_run fixture

SEQ_LEN = 256


def dataset(run: PackedRun) -> PackedDataset:
    return PackedDataset(run.folder(SEQ_LEN), tokenizer=run.tokenizer_path, seed=3)


def copied(value: object) -> object:
    if isinstance(value, dict):
        return {key: copied(v) for key, v in value.items()}
    return value.clone() if isinstance(value, torch.Tensor) else value


def take(loader: PackedLoader, n: int | None = None) -> list:
    """The next ``n`` batches of a new pass (all of the pass when None), copied."""
    return [copied(batch) for batch in itertools.islice(loader, n)]


def in_process(ds: PackedDataset, batch_size: int, collate: Callable = collate_packed) -> Callable:
    """A ``take`` that iterates the dataset itself and collates ``batch_size`` samples at a time."""

    def take_rows(_: object, n: int | None = None) -> list:
        samples, batches = iter(ds), []
        while n is None or len(batches) < n:
            rows = list(itertools.islice(samples, batch_size))
            if not rows:
                break
            batches.append(copied(collate(rows)))
        return batches

    return take_rows


def script(ds: PackedDataset, loader: object, saved: dict, other: dict, take: Callable = take) -> list[list]:
    """Passes of every kind a training run makes, and the batches of each: left mid-pass (workers
    have prefetched beyond), continued to the epoch's end, the next epoch, a resume to a state of
    another epoch and position, ``set_epoch``, and a resume back to an earlier position."""
    passes = [take(loader, 3), take(loader), take(loader, 2)]
    ds.load_state_dict(other)
    passes += [take(loader, 4)]
    ds.set_epoch(7)
    passes += [take(loader, 1), take(loader, 5)]
    ds.load_state_dict(saved)
    passes += [take(loader)]
    return passes


def states(run: PackedRun) -> tuple[dict, dict]:
    """A state at the start of epoch 0 and one 7 rows into epoch 2."""
    ds = dataset(run)
    saved = ds.state_dict()
    ds.epoch, ds.consumed = 2, 7
    return saved, ds.state_dict()


@pytest.mark.parametrize(
    ("workers", "batch_size", "context", "persistent"),
    [
        (0, 2, None, True),
        (1, 1, None, True),
        (2, 1, None, True),
        (2, 3, None, True),
        (1, 2, "spawn", True),
        (2, 2, None, False),
    ],
)
def test_workers_kept_across_passes_give_the_rows_of_in_process_iteration(
    packed_run: PackedRun, workers: int, batch_size: int, context: str | None, persistent: bool
) -> None:
    saved, other = states(packed_run)
    reference_ds = dataset(packed_run)
    expected = script(reference_ds, None, saved, other, in_process(reference_ds, batch_size))
    ds = dataset(packed_run)
    kwargs = {"multiprocessing_context": context} if context else {}
    if not persistent:
        kwargs["persistent_workers"] = False  # workers and slots started anew for each pass
    loader = PackedLoader(ds, batch_size=batch_size, num_workers=workers, **kwargs)
    before = {p.pid for p in multiprocessing.active_children()}
    got = script(ds, loader, saved, other)
    workers_seen = {p.pid for p in multiprocessing.active_children()} - before
    if persistent:
        assert len(workers_seen) == workers  # the same processes served every pass
    assert [len(p) for p in got] == [len(p) for p in expected] and sum(map(len, got)) > 20
    for got_pass, expected_pass in zip(got, expected):
        for batch, reference in zip(got_pass, expected_pass):
            assert batch.keys() == reference.keys()
            for key, value in reference.items():
                assert (
                    torch.equal(batch[key], value) if isinstance(value, torch.Tensor) else batch[key] == value
                ), key
    assert (ds.epoch, ds.consumed) == (reference_ds.epoch, reference_ds.consumed)
    loader.close()
    assert not {p.pid for p in multiprocessing.active_children()} - before


def test_a_custom_collate_follows_the_position_across_passes(packed_run: PackedRun) -> None:
    def ids(samples: list[dict]) -> torch.Tensor:
        return torch.stack([s["input_ids"] for s in samples])

    saved, other = states(packed_run)
    reference_ds, ds = dataset(packed_run), dataset(packed_run)
    expected = script(reference_ds, None, saved, other, in_process(reference_ds, 2, ids))
    with_workers = PackedLoader(ds, batch_size=2, num_workers=2, collate_fn=ids)
    got = script(ds, with_workers, saved, other)
    assert [len(p) for p in got] == [len(p) for p in expected]
    assert all(torch.equal(a, b) for g, e in zip(got, expected) for a, b in zip(g, e))
    with_workers.close()


def test_an_earlier_pass_ends_when_a_new_one_starts(packed_run: PackedRun) -> None:
    ds = dataset(packed_run)
    loader = PackedLoader(ds, num_workers=2)
    first = iter(loader)
    next(first)
    second = iter(loader)
    row = next(second)["input_ids"]
    with pytest.raises(RuntimeError, match="a newer pass of this loader was started"):
        next(first)
    assert ds.consumed == 2  # the refused pass moved nothing
    assert torch.equal(row[0], ds[int(ds.order(0)[1])]["input_ids"])
    loader.close()
    with pytest.raises(RuntimeError, match="the loader was closed"):
        next(second)
    assert ds.consumed == 2
    third = [
        b["input_ids"][0] for b in itertools.islice(loader, 2)
    ]  # new workers, from where the position is
    assert all(torch.equal(r, ds[int(ds.order(0)[i])]["input_ids"]) for i, r in zip((2, 3), third))
    loader.close()


def test_dropping_the_loader_stops_its_workers(packed_run: PackedRun) -> None:
    before = {p.pid for p in multiprocessing.active_children()}
    loader = PackedLoader(dataset(packed_run), num_workers=2)
    take(loader, 2)
    assert len({p.pid for p in multiprocessing.active_children()} - before) == 2
    del loader
    gc.collect()
    assert not {p.pid for p in multiprocessing.active_children()} - before


_CHILD = """
import sys, time
from longctx.packer import PackedDataset, PackedLoader, collate_packed
from longctx.packer import loader as loader_module
ds = PackedDataset(sys.argv[1], tokenizer=sys.argv[2], seed=3)
loader = PackedLoader(ds, num_workers=2)
for _ in loader:
    pass
next(iter(loader))  # a second pass, left with items in flight
print("ready", flush=True)
if sys.argv[3] == "wait":
    time.sleep(120)
"""


def _torch_shared_memory(pids: list[int]) -> list[str]:
    """Files in /dev/shm named by torch for any of ``pids`` (torch_<pid>_...)."""
    names = os.listdir("/dev/shm") if os.path.isdir("/dev/shm") else []
    return [n for n in names if any(n.startswith(f"torch_{pid}_") for pid in pids)]


@pytest.mark.slow
@pytest.mark.skipif(not HAS_PROC, reason="finding a killed process's workers needs Linux /proc")
@pytest.mark.parametrize("end", ["exit", "killed"])
def test_no_worker_or_shared_memory_outlives_the_process(packed_run: PackedRun, end: str) -> None:
    env, mark = marked_env()
    command = [
        sys.executable,
        "-c",
        textwrap.dedent(_CHILD),
        str(packed_run.folder(SEQ_LEN)),
        str(packed_run.tokenizer_path),
    ]
    process = subprocess.Popen(
        [*command, "wait" if end == "killed" else "exit"], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None and process.stdout.readline().strip() == "ready"
        started = list(survivors_after(mark, 0))
        assert len(started) == 3, describe(started)  # the script and its two workers
        if end == "killed":
            os.kill(process.pid, signal.SIGKILL)  # as the OOM killer would: the workers get no signal
        process.wait(timeout=60)
        # the workers notice a dead parent within DataLoader's watchdog interval (5 s)
        left = survivors_after(mark, 20)
        assert not left, f"processes left after the loader's process {end}:\n{describe(left)}"
        assert not _torch_shared_memory(started)
    finally:
        process.kill()
        kill_survivors(survivors_after(mark, 0))


def in_slots(loader: PackedLoader, batch: dict) -> bool:
    """Whether ``batch`` is a view of the loader's shared-memory slots (not sent the DataLoader's way)."""
    slots = loader._loader.dataset.slots
    start, ptr = slots.data_ptr(), batch["input_ids"].data_ptr()
    return start <= ptr < start + slots.numel()


def test_a_training_loop_gets_every_batch_from_the_slots_also_after_passes_left_midway(
    packed_run: PackedRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A loop that drops each batch before the next frees every slot it read: after passes left
    midway (their prefetched items dropped unread by DataLoader) the workers still find free slots,
    and batches the caller keeps are never changed by later items (fallback to the usual way)."""
    monkeypatch.setattr(loader_module, "TRANSFER_TOKENS", 2 * SEQ_LEN)  # many items per pass
    ds = dataset(packed_run)
    loader = PackedLoader(ds, batch_size=1, num_workers=2, prefetch_factor=1)
    reference = dataset(packed_run)
    for n in (1, 2, 1):
        take(loader, n)
    for _ in range(2):
        assert all(in_slots(loader, batch) for batch in loader)  # one batch held at a time
    held = list(loader)  # every batch held: the workers run out of slots and send the rest
    assert not all(in_slots(loader, batch) for batch in held) and any(
        in_slots(loader, batch) for batch in held
    )
    expected = [reference[int(r)]["input_ids"] for r in reference.order(ds.epoch - 1)]
    assert len(held) == len(expected) and all(
        torch.equal(b["input_ids"][0], e) for b, e in zip(held, expected)
    )
    loader.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_held_across_passes_never_change(
    packed_run: PackedRun, monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    """Batches kept from a pass left midway stay as they were while later passes reuse the slots (with
    workers) or the item memory the loader keeps from pass to pass (without)."""
    monkeypatch.setattr(loader_module, "TRANSFER_TOKENS", 2 * SEQ_LEN)  # many items per pass
    monkeypatch.setattr(loader_module, "CHUNK_TOKENS", 2 * SEQ_LEN)  # the same without workers
    extra = {"prefetch_factor": 1} if workers else {}
    loader = PackedLoader(dataset(packed_run), batch_size=1, num_workers=workers, **extra)
    held = list(itertools.islice(loader, 5))  # the batches themselves, views of the slots or buffers
    assert not workers or all(in_slots(loader, batch) for batch in held)
    kept = [copied(batch) for batch in held]
    for _ in range(2):
        for _ in loader:
            pass
    for batch, copy in zip(held, kept):
        assert all(
            torch.equal(batch[k], v) if isinstance(v, torch.Tensor) else batch[k] == v
            for k, v in copy.items()
        )
    loader.close()


def item_sizes(places: list[int]) -> list[int]:
    """Lengths of the runs of equal values in ``places`` (the item each batch came in, in order)."""
    return [len(list(run)) for _, run in itertools.groupby(places)]


@pytest.mark.parametrize("workers", [0, 2])
def test_items_hold_chunk_tokens_without_workers_and_transfer_tokens_from_workers(
    packed_run: PackedRun, monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    """Batches come in items of ``CHUNK_TOKENS`` built in the training process (they stay in the
    cache) and of ``TRANSFER_TOKENS`` from workers (each costs the DataLoader's queues), each item one
    buffer: one storage without workers, one slot with."""
    monkeypatch.setattr(loader_module, "CHUNK_TOKENS", 2 * SEQ_LEN)
    monkeypatch.setattr(loader_module, "TRANSFER_TOKENS", 3 * SEQ_LEN)
    ds = dataset(packed_run)
    loader = PackedLoader(ds, batch_size=1, num_workers=workers)
    places = []
    for batch in loader:  # each batch dropped before the next: the workers always find a free slot
        if workers:
            slots = loader._loader.dataset.slots
            assert in_slots(loader, batch)
            places.append((batch["input_ids"].data_ptr() - slots.data_ptr()) // slots.shape[1])
        else:
            places.append(batch["input_ids"].untyped_storage().data_ptr())
    loader.close()
    rows = 3 if workers else 2
    sizes = item_sizes(places)
    assert len(places) == len(ds) > 2 * rows
    assert sizes[:-1] == [rows] * (len(sizes) - 1) and 1 <= sizes[-1] <= rows


@pytest.mark.parametrize(
    ("free", "forked", "expected"),
    [
        (64 << 20, False, loader_module.SLOT_MEMORY),
        (8 << 30, False, loader_module.SLOT_MEMORY_ROOMY),
        (64 << 20, True, loader_module.SLOT_MEMORY_ROOMY),  # an anonymous mapping, not in /dev/shm
    ],
)
def test_slots_take_more_memory_only_outside_a_small_dev_shm(
    monkeypatch: pytest.MonkeyPatch, free: int, forked: bool, expected: int
) -> None:
    real = os.statvfs

    def statvfs(path: str) -> os.statvfs_result:
        if path != "/dev/shm":
            return real(path)
        return os.statvfs_result((4096, 4096, free // 4096, free // 4096, free // 4096, 0, 0, 0, 0, 255))

    monkeypatch.setattr(os, "statvfs", statvfs)
    assert loader_module.slot_memory(forked) == expected
