"""Batches of a :class:`~longctx.packer.dataset.PackedDataset` from DataLoader worker processes,
with the dataset's resume position exact and each batch handed across processes as one block.

torch's DataLoader sends every tensor a worker returns through its own shared-memory segment,
created, passed by file descriptor and mapped again for each tensor; with five tensors per batch that
costs milliseconds per batch, more than reading a 64K window. :class:`PackedLoader` instead gives the
workers a ring of shared-memory slots allocated once per pass: a worker builds several batches
(an *item*: up to :data:`TRANSFER_TOKENS` tokens, all slots within :data:`SLOT_MEMORY`) together
into one slot with :func:`~longctx.packer.dataset.write_batches` and sends only their sizes; the
training process copies the item out of the slot into memory it owns (one copy, no conversion) and
splits it into its batches, views of that memory. Without workers, items are built the same way,
straight into memory the training process owns. Every row is still checked in the process that reads
it (:meth:`ShardSet.tokens <longctx.packer.reader.ShardSet.tokens>`), before any of it is written.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from longctx.packer.dataset import (
    Batch,
    Buffers,
    PackedDataset,
    Sample,
    batch_views,
    collate_packed,
    read_rows,
    split_batches,
    tokens_to_batches,
    write_batches,
)

TRANSFER_TOKENS = 1 << 18
"""Tokens of one item (whole batches, at least one), what one DataLoader step carries: the cost per
step of the DataLoader (and with workers, of its queues: about a millisecond on a busy 2-core
machine) and of numpy's calls is then small against the work."""

SLOT_MEMORY = 32 << 20
"""Bytes of shared memory all slots of a pass take together at most (fewer batches per message when
needed, but one batch at least): containers often give ``/dev/shm`` only 64 MB."""

_HEADER = 64  # a slot starts with the number of the item it holds (-1 while it is being written)
_ALIGN = 64


def _aligned(nbytes: int) -> int:
    return -(-nbytes // _ALIGN) * _ALIGN


def _identity(item: Any) -> Any:
    return item


class _BatchStream(IterableDataset):
    """The batches of each pass of :class:`PackedLoader`, grouped into items of
    ``per_item`` consecutive batches: worker ``w`` of ``W`` builds items ``w, w + W, ...``, which
    DataLoader hands out in order (it takes one result from each worker in turn), so the stream is the
    same for any number of workers.

    An item is what one DataLoader step carries: with ``slots`` (shared memory, one slot per item the
    DataLoader can have in flight), the item's batches are written into slot ``item % len(slots)`` and
    the message is ``(item, places)`` (:func:`write_batches`); without, it is the list of batches
    itself (:func:`tokens_to_batches`, or with ``collate`` a list of one ``collate`` of the rows'
    samples). A row that cannot be served ends its item after the batches before it; the next step
    raises its error.

    ``position`` (int64 ``[epoch, start]``, in shared memory when there are workers) is where the
    pass starts: the training process sets it before each pass (:meth:`PackedLoader.__iter__`), and
    each iteration, in whichever process, reads it when it begins."""

    def __init__(
        self,
        dataset: PackedDataset,
        batch_size: int,
        drop_last: bool,
        collate: Callable[[list[Sample]], Any] | None,
        per_item: int = 1,
        slots: torch.Tensor | None = None,
        position: torch.Tensor | None = None,
    ) -> None:
        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.collate = collate
        self.per_item = per_item
        self.slots = slots
        self.position = torch.tensor([dataset.epoch, dataset.consumed]) if position is None else position

    def sizes(self, start: int) -> list[int]:
        """Rows of each batch of a pass from row ``start`` of the epoch (the last may be short unless
        ``drop_last``)."""
        left = len(self.dataset) - start
        full, rest = divmod(left, self.batch_size)
        return [self.batch_size] * full + ([rest] if rest and not self.drop_last else [])

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        epoch, start = self.position.tolist()
        order = self.dataset.order(epoch)[start:]
        sizes = self.sizes(start)
        rows_per_item, total = self.per_item * self.batch_size, sum(sizes)
        slots = None if self.slots is None else self.slots.numpy()
        buffers = Buffers()
        for item in range(worker, -(-len(sizes) // self.per_item), workers):
            rows = order[item * rows_per_item : min((item + 1) * rows_per_item, total)]
            if self.collate is not None:
                yield [self.collate([self.dataset[int(r)] for r in rows])]
                continue
            tokens, error = read_rows(self.dataset.shards, rows)
            if error is not None:  # only the whole batches before the row that cannot be served
                tokens = tokens[: len(tokens) - len(tokens) % self.batch_size]
            batches = [tokens[k : k + self.batch_size] for k in range(0, len(tokens), self.batch_size)]
            if batches and slots is None:
                yield tokens_to_batches(batches, buffers)
            elif batches:
                yield item, self._write(slots[item % len(slots)], item, batches)
            if error is not None:
                raise error

    def _write(self, slot: np.ndarray, item: int, batches: list[list]) -> list[tuple[int, int, int]]:
        """Write ``batches`` (checked rows) into ``slot`` after its header; their places."""
        header = slot[:8].view(np.int64)
        header[0] = -1
        _, places = write_batches(batches, slot[_HEADER:])
        header[0] = item
        return places


class PackedLoader:
    """Batches of a :class:`PackedDataset`, loaded by ``torch.utils.data.DataLoader`` (optionally in
    ``num_workers`` worker processes), with the dataset's position exact for checkpoints.

    Each pass yields the rest of the dataset's current epoch, ``batch_size`` rows at a time (the
    batches never cross an epoch), in the same order as iterating the dataset in-process, whatever
    ``num_workers``. The dataset's position moves in this process when a batch is handed out, not
    when a worker prefetches it, so ``dataset.state_dict()`` taken between batches resumes exactly.
    Other keyword arguments (``pin_memory``, ``prefetch_factor``, ``multiprocessing_context``...) go to
    the DataLoader.

    Workers are started by the first pass and kept for the next ones (``persistent_workers=False``
    starts them for each pass instead); each pass starts where the dataset's position is when the
    pass starts (after ``load_state_dict``, after a pass left before its end), which the workers are
    told then (see the module's docstring). Starting a new pass ends the previous one: its iterator
    raises if used again. :meth:`close` (or dropping the loader) stops the workers; they also exit
    with this process, and within seconds of it being killed (DataLoader's watchdog).

    With the default ``collate_fn`` (:func:`collate_packed`), the batches of an item (about
    :data:`TRANSFER_TOKENS` tokens) are built directly from the shard's columns into one buffer of
    the training process, and workers hand them over through shared-memory slots (see the module's
    docstring); each batch is a view of its own part of that buffer (a batch kept alive keeps its
    item's buffer). A custom ``collate_fn`` gets the rows' samples and its batches travel the
    DataLoader's usual way.
    """

    def __init__(
        self,
        dataset: PackedDataset,
        *,
        batch_size: int = 1,
        num_workers: int = 0,
        drop_last: bool = False,
        collate_fn: Callable[[list[Sample]], Any] = collate_packed,
        **loader_kwargs: Any,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        if loader_kwargs.get("in_order") is False:
            raise ValueError("PackedLoader hands out batches in order; in_order=False is not supported")
        self.dataset = dataset
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.drop_last = drop_last
        self.collate_fn = collate_fn
        if num_workers > 0:
            loader_kwargs.setdefault("persistent_workers", True)
        self.loader_kwargs = loader_kwargs
        self._loader: DataLoader | None = None  # made by the first pass, kept with its workers
        self._pass = 0  # passes started: an older pass's iterator refuses to go on
        self._pin = False  # whether batches copied out of the slots go to pinned memory

    def __len__(self) -> int:
        """Batches left in the current pass."""
        return len(_BatchStream(self.dataset, self.batch_size, self.drop_last, None).sizes(self.dataset.consumed))

    def close(self) -> None:
        """Stop the worker processes now (a later pass starts new ones); also done when the loader
        is dropped."""
        loader, self._loader = self._loader, None
        iterator = getattr(loader, "_iterator", None)
        if iterator is not None and hasattr(iterator, "_shutdown_workers"):
            iterator._shutdown_workers()  # what DataLoader's iterator does when it is deleted

    def __iter__(self) -> Iterator[Any]:
        self._pass += 1
        this_pass, epoch = self._pass, self.dataset.epoch
        if self._loader is None:
            self._loader = self._make_loader()
        stream: _BatchStream = self._loader.dataset
        stream.position.copy_(torch.tensor([epoch, self.dataset.consumed]))  # before the workers resume
        expected = stream.sizes(self.dataset.consumed)
        if stream.slots is None:
            items = (batch for item in self._items(this_pass) for batch in item)
            batches: Iterator[tuple[int, Any]] = zip(expected, items, strict=True)
        else:
            batches = self._through_slots(this_pass, stream, expected)
        for size, batch in batches:
            if this_pass != self._pass:
                raise RuntimeError("PackedLoader: a newer pass of this loader was started; this one has ended")
            self.dataset._advance(size)
            yield batch
        if self.drop_last and self.dataset.epoch == epoch:
            self.dataset._advance(len(self.dataset) - self.dataset.consumed)  # the dropped rows end the epoch

    def _make_loader(self) -> DataLoader:
        """The DataLoader of every pass: its stream, with shared-memory slots when workers build the
        batches for the default collate function, and the pass position shared with the workers."""
        custom = None if self.collate_fn is collate_packed else self.collate_fn
        kwargs = dict(self.loader_kwargs)
        tokens = self.batch_size * self.dataset.seq_len
        position = torch.zeros(2, dtype=torch.int64)
        slots = None
        if custom is not None:
            per_item = 1
        elif self.num_workers == 0:
            per_item = max(1, TRANSFER_TOKENS // tokens)
        else:
            # in flight: the item being copied out and prefetch_factor items per worker
            count = (kwargs.get("prefetch_factor") or 2) * self.num_workers + 1
            largest = 25 * tokens + 4 * (tokens + 1)  # a batch whose segments are one token long
            per_item = max(1, min(TRANSFER_TOKENS // tokens, (SLOT_MEMORY // count - _HEADER) // largest))
            slots = torch.empty(count, _aligned(_HEADER + per_item * largest), dtype=torch.uint8).share_memory_()
            self._pin = bool(kwargs.get("pin_memory")) and torch.cuda.is_available()
            kwargs["pin_memory"] = False  # messages are offsets; the batches are pinned here
        if self.num_workers > 0:
            position.share_memory_()
        stream = _BatchStream(self.dataset, self.batch_size, self.drop_last, custom, per_item, slots, position)
        return DataLoader(stream, batch_size=None, num_workers=self.num_workers, collate_fn=_identity, **kwargs)

    def _items(self, this_pass: int) -> Iterator[Any]:
        """The DataLoader's items of pass ``this_pass``, refused once a newer pass has started (the
        persistent workers' iterator then serves the newer pass)."""
        iterator = iter(self._loader)
        while True:
            if this_pass != self._pass:
                raise RuntimeError("PackedLoader: a newer pass of this loader was started; this one has ended")
            try:
                item = next(iterator)
            except StopIteration:
                return
            yield item

    def _through_slots(self, this_pass: int, stream: _BatchStream, expected: list[int]) -> Iterator[tuple[int, Batch]]:
        """``(rows, batch)`` of the pass, built by the workers into shared-memory slots and copied out."""
        seq_len, ring, buffers = self.dataset.seq_len, stream.slots.numpy(), Buffers()
        count = len(ring)
        handed = 0
        for item, places in self._items(this_pass):
            slot = ring[item % count]
            rows, cu_len = sum(place[0] for place in places), sum(place[1] for place in places)
            nbytes = 25 * rows * seq_len + 4 * cu_len
            data = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True).numpy() if self._pin else buffers.take(nbytes)
            np.copyto(data, slot[_HEADER : _HEADER + len(data)])
            if int(slot[:8].view(np.int64)[0]) != item:
                raise RuntimeError(
                    f"PackedLoader: slot {item % count} was overwritten while batch rows were copied out of it "
                    "(more items in flight than prefetch_factor x num_workers); please report this"
                )
            arrays = {key: torch.from_numpy(value) for key, value in batch_views(data, rows, seq_len, cu_len).items()}
            for batch in split_batches(arrays, places):
                size = batch["input_ids"].shape[0]
                if size != expected[handed]:
                    raise RuntimeError(f"PackedLoader: batch {handed} has {size} rows, expected {expected[handed]}")
                handed += 1
                yield size, batch
        if handed != len(expected):
            raise RuntimeError(f"PackedLoader: the workers gave {handed} batches of the {len(expected)} of the pass")
