"""A PyTorch dataset over one output folder: shuffled, sharded by data-parallel rank, resumable.

Label convention (see ``packer/FORMAT.md``): ``labels`` are already shifted. ``labels[i]`` is the
token the model must predict from position ``i``, i.e. ``input_ids[i + 1]`` when that token belongs
to the same document segment, and ``IGNORE_INDEX`` otherwise (the last token of every segment, the
padding, the window's last position). ``loss_mask`` is ``labels != IGNORE_INDEX``. With attention
restricted to segments (``cu_seqlens``) and positions restarting per segment, the packed loss over
a document equals the loss of that document trained alone. Do not hand ``labels`` to a Hugging
Face model's ``labels=`` argument, which would shift them again (``longctx.packer.hf`` gives
batches in transformers' convention).

Data order is a function of the global batch (``global_batch_rows`` rows per optimizer step over the
whole data-parallel group), not of the data-parallel size, so a run resumed at another DP size sees
exactly the rows an uninterrupted run would have seen. :class:`~longctx.packer.loader.PackedLoader` runs
the loading in DataLoader worker processes while the position stays exact.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from longctx.core.errors import ConfigError
from longctx.core.text import plural
from longctx.packer.format import FORMAT_VERSION, ShardError
from longctx.packer.reader import PackedRow, ShardSet
from longctx.packer.rowcheck import RowTokens

IGNORE_INDEX = -100
_HOLDOUT_STREAM = 0x5EED0FF  # keeps the held-out draw apart from every epoch's shuffle

Sample = dict[str, torch.Tensor]
Batch = dict[str, torch.Tensor | int]


CHUNK_TOKENS = 1 << 18
"""Rows are read and built this many tokens at a time (at least one row): by :meth:`PackedDataset.__iter__`
into the samples it yields, by :class:`~longctx.packer.loader.PackedLoader` without workers into the
batches of one DataLoader item (workers send larger items:
:data:`~longctx.packer.loader.TRANSFER_TOKENS`). At 16K tokens a row costs more in Python and numpy
calls than in bytes; built together, the calls per row drop to six (:func:`write_batches`)."""


class Buffers:
    """Memory for the items one pass builds, reused once nothing refers to an item any more.

    A new item buffer of megabytes comes from the operating system as fresh pages, each zeroed on
    first write (tens of thousands of page faults per pass measured at 64K windows); reusing the
    buffer of an item whose arrays and tensors are all gone avoids it. Every numpy view of a buffer,
    and every tensor made from one, holds a reference to the buffer itself (numpy points views at
    the array that owns the memory), so a buffer that only this pool refers to is free. At most
    ``keep`` buffers are kept; beyond that (items the caller holds) new ones are allocated.

    Keep one pool for every pass of an iterator, not one per pass: a new pool's first items come
    from the operating system again (at 64K windows about 660 page faults, 2 ms, per pass measured).
    A copy in another process (a pickled dataset) starts empty: the memory is this process's.
    """

    def __init__(self, keep: int = 4) -> None:
        self.keep = keep
        self._kept: list[np.ndarray] = []

    def __getstate__(self) -> dict[str, Any]:
        return {"keep": self.keep, "_kept": []}

    def take(self, nbytes: int) -> np.ndarray:
        """A uint8 array of ``nbytes`` that nothing else refers to."""
        for k in range(len(self._kept)):
            # 2: the pool's list and getrefcount's own argument
            if sys.getrefcount(self._kept[k]) == 2 and len(self._kept[k]) >= nbytes:
                return self._kept[k][:nbytes]
        base = np.empty(-(-nbytes // (1 << 16)) << 16, dtype=np.uint8)  # room for items a little larger
        if len(self._kept) < self.keep:
            self._kept.append(base)
        return base[:nbytes]


def batches_nbytes(batches: Sequence[Sequence[RowTokens | PackedRow]]) -> int:
    """Bytes of the buffer :func:`write_batches` fills for ``batches``."""
    rows = sum(len(batch) for batch in batches)
    cu_len = sum(1 + sum(len(row.cu_seqlens) - 1 for row in batch) for batch in batches)
    return 25 * rows * len(batches[0][0].input_ids) + 4 * cu_len


def write_batches(
    batches: Sequence[Sequence[RowTokens | PackedRow]], buffer: np.ndarray
) -> tuple[dict[str, np.ndarray], list[tuple[int, int, int]]]:
    """Write the training arrays of several batches into ``buffer`` (uint8, at least
    :func:`batches_nbytes` long), laid out as :func:`batch_views` of all their rows, with each
    batch's ``cu_seqlens`` after the previous batch's. Returns the views of all rows and, per batch,
    ``(rows, len(cu_seqlens), max_seqlen)``: batch ``k`` is rows ``[r_k, r_k + rows)`` of every
    ``[rows, seq_len]`` array and entries ``[c_k, c_k + len)`` of ``cu_seqlens`` (:func:`split_batches`).

    Labels follow the module's shifted convention. Six numpy calls per row and a constant number per
    call; every array of a row is written from the shard's columns while that row is in the cache
    (labels from the int32 ids, not read back from the int64 ones: 13% less time at 64K windows
    when the buffer is not in the cache, as in the workers' rotating slots).
    Positions are widened without being checked here: serve only rows that passed
    :func:`~longctx.packer.rowcheck.check_row`."""
    rows = [row for batch in batches for row in batch]
    sizes = np.array([len(batch) for batch in batches])
    count, seq_len = len(rows), len(rows[0].input_ids)
    cus = [row.cu_seqlens for row in rows]
    entries = np.fromiter(map(len, cus), np.int64, count)
    first_row = np.cumsum(sizes) - sizes
    ends = np.cumsum(entries)
    # a batch's cu_seqlens: its rows' boundaries shifted by the row's place in the batch, each row's
    # end dropped (it is the next row's start) except the batch's last
    cu_lens = 1 + np.add.reduceat(entries - 1, first_row)
    arrays = batch_views(buffer, count, seq_len, int(cu_lens.sum()))
    ids, labels, positions, targets = (
        arrays["input_ids"],
        arrays["labels"],
        arrays["position_ids"],
        arrays["loss_mask"],
    )
    # labels[i] = ids[i + 1] where token i + 1 is a target of the same segment, else IGNORE_INDEX
    ignored = np.empty(seq_len, bool)
    ignored[-1] = True  # the window's last position predicts nothing
    for j, row in enumerate(rows):
        np.copyto(ids[j], row.input_ids)
        np.copyto(labels[j, :-1], row.input_ids[1:])
        np.equal(row.loss_mask[1:], 0, out=ignored[:-1])
        np.copyto(labels[j], IGNORE_INDEX, where=ignored)
        np.logical_not(ignored, out=targets[j])
        np.copyto(positions[j], row.position_ids)
    flat = np.concatenate(cus) if count > 1 else cus[0]
    in_batch = np.arange(count) - np.repeat(first_row, sizes)
    keep = np.ones(len(flat), bool)
    last = np.zeros(count, bool)
    last[first_row + sizes - 1] = True
    keep[ends[~last] - 1] = False
    np.copyto(arrays["cu_seqlens"], (flat + np.repeat(in_batch * seq_len, entries))[keep], casting="unsafe")
    # longest segment per batch: steps across a row boundary are negative and never the largest
    longest = np.maximum.reduceat(np.diff(flat), (ends - entries)[first_row])
    return arrays, list(zip(sizes.tolist(), cu_lens.tolist(), longest.tolist()))


def split_batches(arrays: Mapping[str, torch.Tensor], places: Sequence[tuple[int, int, int]]) -> list[Batch]:
    """The batches of :func:`write_batches` as tensors: views of ``arrays`` (its output as tensors)."""
    batches, r, c = [], 0, 0
    for rows, cu_len, longest in places:
        batch: Batch = {
            key: arrays[key][r : r + rows] for key in ("input_ids", "labels", "position_ids", "loss_mask")
        }
        batch["cu_seqlens"] = arrays["cu_seqlens"][c : c + cu_len]
        batch["max_seqlen"] = longest
        batches.append(batch)
        r, c = r + rows, c + cu_len
    return batches


def batch_views(buffer: np.ndarray, batch: int, seq_len: int, cu_len: int) -> dict[str, np.ndarray]:
    """The arrays of a batch laid out in ``buffer`` by :func:`write_batches` (``cu_len`` entries of
    ``cu_seqlens``): int64 ``input_ids``, ``labels``, ``position_ids``, int32 ``cu_seqlens``, bool
    ``loss_mask``, in that order of bytes."""
    n, shape = batch * seq_len, (batch, seq_len)
    return {
        "input_ids": np.ndarray(shape, np.int64, buffer, 0),
        "labels": np.ndarray(shape, np.int64, buffer, 8 * n),
        "position_ids": np.ndarray(shape, np.int64, buffer, 16 * n),
        "loss_mask": np.ndarray(shape, np.bool_, buffer, 24 * n + 4 * cu_len),
        "cu_seqlens": np.ndarray(cu_len, np.int32, buffer, 24 * n),
    }


def tokens_to_sample(row: RowTokens | PackedRow) -> Sample:
    """Training tensors of one window (int64 tokens, labels and positions, int32 ``cu_seqlens``,
    bool mask), in the shifted label convention of this module; views of one new buffer."""
    return tokens_to_samples([row])[0]


def tokens_to_samples(rows: Sequence[RowTokens | PackedRow], buffers: Buffers | None = None) -> list[Sample]:
    """:func:`tokens_to_sample` of each of ``rows``, built together into one buffer (new, or free in
    ``buffers``), each sample a view of its own part of it."""
    batches = [[row] for row in rows]
    nbytes = batches_nbytes(batches)
    buffer = np.empty(nbytes, dtype=np.uint8) if buffers is None else buffers.take(nbytes)
    arrays, places = write_batches(batches, buffer)
    tensors = {key: torch.from_numpy(value) for key, value in arrays.items()}
    samples, c = [], 0
    for j, (_, cu_len, _) in enumerate(places):
        sample = {key: tensors[key][j] for key in ("input_ids", "labels", "position_ids", "loss_mask")}
        sample["cu_seqlens"] = tensors["cu_seqlens"][c : c + cu_len]
        samples.append(sample)
        c += cu_len
    return samples


def tokens_to_batches(
    batches: Sequence[Sequence[RowTokens | PackedRow]], buffers: Buffers | None = None
) -> list[Batch]:
    """``collate_packed`` of the samples of each of ``batches`` (lists of rows), built together into one
    buffer (new, or free in ``buffers``), each batch a view of its own part of it."""
    nbytes = batches_nbytes(batches)
    buffer = np.empty(nbytes, dtype=np.uint8) if buffers is None else buffers.take(nbytes)
    arrays, places = write_batches(batches, buffer)
    return split_batches({key: torch.from_numpy(value) for key, value in arrays.items()}, places)


row_to_sample = tokens_to_sample  # the name earlier code imports


def read_rows(shards: ShardSet, rows: Sequence[int]) -> tuple[list[RowTokens], ShardError | None]:
    """The checked token columns of ``rows`` (global indices) up to the first that cannot be served,
    and the error that stopped there (None when all could)."""
    tokens: list[RowTokens] = []
    try:
        for row in rows:
            tokens.append(shards.tokens(int(row)))
    except ShardError as error:
        return tokens, error
    return tokens, None


def collate_packed(samples: list[Sample]) -> Batch:
    """Stack windows into ``[batch, seq_len]`` tensors; ``cu_seqlens`` becomes the boundaries of all
    segments of the flattened batch (the varlen-attention layout) and ``max_seqlen`` its longest."""
    seq_len = samples[0]["input_ids"].numel()
    keys = ("input_ids", "labels", "position_ids", "loss_mask")
    if len(samples) == 1:  # views, not copies: a batch of one row is the common case in training
        batch: Batch = {key: samples[0][key].unsqueeze(0) for key in keys}
        cu_seqlens = samples[0]["cu_seqlens"]
    else:
        batch = {key: torch.stack([s[key] for s in samples]) for key in keys}
        cu = torch.cat([s["cu_seqlens"][:-1] + i * seq_len for i, s in enumerate(samples)])
        cu_seqlens = torch.cat([cu, torch.tensor([len(samples) * seq_len], dtype=torch.int32)]).to(
            torch.int32
        )
    batch["cu_seqlens"] = cu_seqlens
    bounds = cu_seqlens.numpy()  # numpy: a few microseconds less per batch than torch.diff
    batch["max_seqlen"] = int((bounds[1:] - bounds[:-1]).max())
    return batch


class PackedDataset(IterableDataset):
    """Windows of ``folder`` for one data-parallel rank, in a seeded order that changes every epoch.

    **Order.** ``global_batch_rows`` (G, default ``dp_world_size``) is the number of rows per
    optimizer step over the whole data-parallel group; it must be a multiple of ``dp_world_size``.
    Epoch ``e`` is the training rows permuted by ``(seed, e)`` (in order with ``shuffle=False``), cut
    to a multiple of G. Global step ``k`` takes ``perm[k*G:(k+1)*G]``, and DP rank ``r`` takes the
    contiguous part ``[r*G/dp, (r+1)*G/dp)`` of it, in order, as ``G/dp`` micro-batches of one row.
    The rows of each optimizer step, and their order, therefore do not depend on the DP size.

    **Position.** Iterating yields the rest of the current epoch from where the last iteration
    stopped; handing out an epoch's last row moves on to the next epoch. :meth:`state_dict` records
    the position in *global* rows consumed in the epoch (a multiple of G at step boundaries), so a
    checkpoint taken at a step boundary resumes at any DP size that divides G. Iterate in the training
    process, or through :class:`~longctx.packer.loader.PackedLoader` for worker processes. A plain
    ``DataLoader`` with workers (as ``transformers.Trainer`` builds with ``dataloader_num_workers``) is
    refused: each worker would serve every row, and the position would stay in the workers. An
    iterable dataset cannot be split among them exactly, as each worker collates batches of a size
    only the DataLoader knows.

    **Trust.** ``tokenizer`` (the ``tokenizer.json`` you train with, or its sha256) and
    ``format_version`` are checked against the shards; each shard's bytes are hashed against the
    manifest when first opened, and every row served is checked (:mod:`longctx.packer.rowcheck`),
    with ids below ``vocab_size`` (e.g. the model's embedding rows) as well as below the tokenizer's
    vocabulary. A violation raises :class:`~longctx.packer.format.ShardError` naming file, row and field.

    ``holdout_rows`` sets that many rows aside for evaluation, drawn at random by ``seed`` alone (so
    they are typical windows, not the part-filled ones that end each task's output): they are never
    in a training order, and :meth:`heldout_rows` lists them. They are windows the model never
    trained on; when ``pack.mix`` repeats documents, copies of their documents may still appear in
    training windows.

    **Remote shards.** ``folder`` may be an fsspec URL (``s3://bucket/run/shards/seq65536``): the
    shards are copied into ``cache`` (default ``~/.cache/longctx``, or ``$LONGCTX_CACHE``) and checked
    against the manifest first, then read from there; ``storage_options`` go to fsspec.
    """

    def __init__(
        self,
        folder: str | os.PathLike,
        *,
        tokenizer: str | os.PathLike | None,
        seed: int = 0,
        shuffle: bool = True,
        dp_rank: int = 0,
        dp_world_size: int = 1,
        global_batch_rows: int | None = None,
        holdout_rows: int = 0,
        vocab_size: int | None = None,
        format_version: int = FORMAT_VERSION,
        cache: str | os.PathLike | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        if not 0 <= dp_rank < dp_world_size:
            raise ValueError(f"dp_rank must be in [0, {dp_world_size}), got {dp_rank}")
        global_rows = dp_world_size if global_batch_rows is None else global_batch_rows
        if global_rows <= 0 or global_rows % dp_world_size:
            raise ConfigError(
                f"global_batch_rows={global_rows} must be a positive multiple of the data-parallel size "
                f"{dp_world_size} (each DP rank takes global_batch_rows / DP rows per optimizer step)"
            )
        self.shards = ShardSet(
            folder,
            tokenizer=tokenizer,
            format_version=format_version,
            vocab_size=vocab_size,
            cache=cache,
            storage_options=storage_options,
        )
        if holdout_rows < 0 or len(self.shards) - holdout_rows < global_rows:
            raise ConfigError(
                f"{folder} has {plural(len(self.shards), 'row')}: holding out {holdout_rows} leaves fewer "
                f"than one optimizer step of global_batch_rows={global_rows}"
            )
        self.holdout = holdout_rows
        self.seed = seed
        self.shuffle = shuffle
        self.dp_rank = dp_rank
        self.dp_world_size = dp_world_size
        self.global_batch_rows = global_rows
        self.epoch = 0
        self.consumed = 0  # rows of this rank's order handed out in the current epoch
        self._buffers = Buffers()  # the memory of the samples of every iteration

    @property
    def seq_len(self) -> int:
        return self.shards.seq_len

    @property
    def rows_per_step(self) -> int:
        """Rows this rank takes per optimizer step (the gradient accumulation in rows)."""
        return self.global_batch_rows // self.dp_world_size

    def steps_per_epoch(self) -> int:
        """Optimizer steps in one epoch (the same at every DP size)."""
        return (len(self.shards) - self.holdout) // self.global_batch_rows

    def __len__(self) -> int:
        """Rows this rank gets per epoch."""
        return self.steps_per_epoch() * self.rows_per_step

    def heldout_rows(self) -> list[int]:
        """Global indices of the rows set aside by ``holdout_rows``, in increasing order."""
        return sorted(self._split()[0].tolist())

    def training_rows(self) -> list[int]:
        """Global indices of the rows training may read (all but the held-out ones), in increasing order."""
        return self._split()[1].tolist()

    def _split(self) -> tuple[np.ndarray, np.ndarray]:
        """``(held-out rows, training rows)``; the draw depends on ``seed`` only, not on the epoch."""
        rows = len(self.shards)
        if not self.holdout:
            return np.arange(0), np.arange(rows)
        drawn = np.random.default_rng([self.seed, _HOLDOUT_STREAM]).permutation(rows)
        return drawn[: self.holdout], np.sort(drawn[self.holdout :])

    def global_order(self, epoch: int) -> np.ndarray:
        """Global row indices of ``epoch`` over the whole DP group: step ``k`` is ``[k*G, (k+1)*G)``."""
        train = self._split()[1]
        if self.shuffle:
            train = train[np.random.default_rng([self.seed, epoch]).permutation(len(train))]
        return train[: self.steps_per_epoch() * self.global_batch_rows]

    def order(self, epoch: int) -> np.ndarray:
        """Global row indices this rank reads in ``epoch``, in order."""
        m, r = self.rows_per_step, self.dp_rank
        return (
            self.global_order(epoch).reshape(-1, self.global_batch_rows)[:, r * m : (r + 1) * m].reshape(-1)
        )

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning (no-op when it is the current epoch, so a resumed
        position survives the usual ``set_epoch`` call at the top of the epoch loop)."""
        if epoch != self.epoch:
            self.epoch, self.consumed = epoch, 0

    def __getitem__(self, row: int) -> Sample:
        """The window at global row index ``row`` (ignores rank and order), checked."""
        return tokens_to_sample(self.shards.tokens(row))

    def _advance(self, rows: int) -> None:
        """Count ``rows`` more rows of this rank's order as handed out."""
        self.consumed += rows
        if self.consumed >= len(self):
            self.epoch, self.consumed = self.epoch + 1, 0

    def __iter__(self) -> Iterator[Sample]:
        if get_worker_info() is not None:
            raise RuntimeError(
                "PackedDataset iterated in a DataLoader worker process: each worker holds a whole copy "
                "of it, so every row would be served once per worker, and the resume position would "
                "stay in the workers. With transformers.Trainer or TRL, set "
                "TrainingArguments(dataloader_num_workers=0), the default: the training process then "
                "reads the rows from the memory-mapped shards itself. In a loop of your own, "
                "longctx.packer.PackedLoader(dataset, num_workers=N) loads in worker processes exactly"
            )
        order = self.order(self.epoch)
        chunk = max(1, CHUNK_TOKENS // self.seq_len)
        for first in range(self.consumed, len(order), chunk):
            # rows are read and built a chunk at a time; a damaged row ends the chunk after the rows
            # before it are served
            tokens, error = read_rows(self.shards, order[first : first + chunk])
            for sample in tokens_to_samples(tokens, self._buffers) if tokens else []:
                # the state moves before the row is handed out, so it always names the next row
                self._advance(1)
                yield sample
            if error is not None:
                raise error

    def state_dict(self) -> dict[str, Any]:
        """Where iteration stands, plus what it depends on (checked by :meth:`load_state_dict`).

        ``position`` counts global rows consumed in the epoch: ``k * G`` after ``k`` optimizer steps,
        plus ``j * dp`` when every rank has taken ``j`` rows of the next step; the DP size is then
        recorded under ``partial_step`` (such a state resumes only at that DP size).
        """
        m = self.rows_per_step
        step, within = divmod(self.consumed, m)
        return {
            "epoch": self.epoch,
            "position": step * self.global_batch_rows + within * self.dp_world_size,
            "partial_step": {"dp_world_size": self.dp_world_size, "rows_per_rank": within}
            if within
            else None,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "rows": len(self.shards),
            "holdout_rows": self.holdout,
            "global_batch_rows": self.global_batch_rows,
            "config_sha256": self.shards.manifest.header.config_sha256,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (taken at any DP size that divides G, at a step boundary); refuses a
        state taken over other data, seed, order or global batch, or mid-step at another DP size."""
        mine = self.state_dict()
        fixed = ("seed", "shuffle", "rows", "holdout_rows", "global_batch_rows", "config_sha256")
        changed = sorted(k for k in fixed if state.get(k) != mine[k])
        if changed:
            raise ValueError(f"cannot resume: the state was saved with a different {', '.join(changed)}")
        step, within = divmod(int(state["position"]), self.global_batch_rows)
        partial = state.get("partial_step")
        if within:
            if not partial or partial.get("dp_world_size") != self.dp_world_size:
                saved = partial.get("dp_world_size") if partial else "unknown"
                raise ValueError(
                    "cannot resume: the state was saved in the middle of an optimizer step at data-parallel "
                    f"size {saved}; it resumes only at that size (checkpoints taken at "
                    "step boundaries resume at any)"
                )
            within //= self.dp_world_size
        self.epoch, self.consumed = int(state["epoch"]), step * self.rows_per_step + within
