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
exactly the rows an uninterrupted run would have seen. :class:`PackedLoader` runs the loading in
DataLoader worker processes while the position stays exact.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from longctx.core.errors import ConfigError
from longctx.packer.format import FORMAT_VERSION
from longctx.packer.reader import PackedRow, ShardSet
from longctx.packer.rowcheck import RowTokens

IGNORE_INDEX = -100
_HOLDOUT_STREAM = 0x5EED0FF  # keeps the held-out draw apart from every epoch's shuffle

Sample = dict[str, torch.Tensor]
Batch = dict[str, torch.Tensor | int]


def tokens_to_sample(row: RowTokens | PackedRow) -> Sample:
    """Training tensors of one window (int64 tokens, labels and positions, int32 ``cu_seqlens``,
    bool mask), in the shifted label convention of this module."""
    ids, mask = row.input_ids, row.loss_mask
    targets = np.empty(len(ids), dtype=bool)
    np.not_equal(mask[1:], 0, out=targets[:-1])
    targets[-1] = False
    labels = np.empty(len(ids), dtype=np.int64)
    labels[:-1] = ids[1:]
    labels[-1] = IGNORE_INDEX
    np.putmask(labels, ~targets, IGNORE_INDEX)
    return {
        "input_ids": torch.from_numpy(ids.astype(np.int64)),
        "labels": torch.from_numpy(labels),
        "position_ids": torch.from_numpy(row.position_ids.astype(np.int64)),
        "cu_seqlens": torch.from_numpy(np.array(row.cu_seqlens, dtype=np.int32)),
        "loss_mask": torch.from_numpy(targets),
    }


row_to_sample = tokens_to_sample  # the name earlier code imports


def collate_packed(samples: list[Sample]) -> Batch:
    """Stack windows into ``[batch, seq_len]`` tensors; ``cu_seqlens`` becomes the boundaries of all
    segments of the flattened batch (the varlen-attention layout) and ``max_seqlen`` its longest."""
    seq_len = samples[0]["input_ids"].numel()
    keys = ("input_ids", "labels", "position_ids", "loss_mask")
    if len(samples) == 1:  # views, not copies: a batch of one row is the common case in training
        batch: Batch = {key: samples[0][key][None] for key in keys}
        cu_seqlens = samples[0]["cu_seqlens"]
    else:
        batch = {key: torch.stack([s[key] for s in samples]) for key in keys}
        cu = torch.cat([s["cu_seqlens"][:-1] + i * seq_len for i, s in enumerate(samples)])
        cu_seqlens = torch.cat([cu, torch.tensor([len(samples) * seq_len], dtype=torch.int32)]).to(torch.int32)
    batch["cu_seqlens"] = cu_seqlens
    batch["max_seqlen"] = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
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
    process, or through :class:`PackedLoader` for worker processes (a plain ``DataLoader`` with
    workers would leave the position in the workers, so it is refused).

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
                f"{folder} has {len(self.shards)} rows: holding out {holdout_rows} leaves fewer than one "
                f"optimizer step of global_batch_rows={global_rows}"
            )
        self.holdout = holdout_rows
        self.seed = seed
        self.shuffle = shuffle
        self.dp_rank = dp_rank
        self.dp_world_size = dp_world_size
        self.global_batch_rows = global_rows
        self.epoch = 0
        self.consumed = 0  # rows of this rank's order handed out in the current epoch

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
        return self.global_order(epoch).reshape(-1, self.global_batch_rows)[:, r * m : (r + 1) * m].reshape(-1)

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
                "PackedDataset iterated in a DataLoader worker: the resume position would stay in the worker. "
                "Use longctx.packer.PackedLoader(dataset, num_workers=N) for worker processes"
            )
        order = self.order(self.epoch)
        for k in range(self.consumed, len(order)):
            # the state moves before the row is handed out, so it always names the next row
            self._advance(1)
            yield self[int(order[k])]

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
            "partial_step": {"dp_world_size": self.dp_world_size, "rows_per_rank": within} if within else None,
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
                    f"cannot resume: the state was saved in the middle of an optimizer step at data-parallel size "
                    f"{saved}; it resumes only at that size (checkpoints taken at step boundaries resume at any)"
                )
            within //= self.dp_world_size
        self.epoch, self.consumed = int(state["epoch"]), step * self.rows_per_step + within


def _identity(batch: Batch) -> Batch:
    return batch


class _BatchStream(IterableDataset):
    """The batches of one pass of :class:`PackedLoader` from a fixed start: worker ``w`` of ``W``
    builds batches ``w, w + W, ...``, which DataLoader hands out in order (it takes one result from
    each worker in turn), so the stream is the same for any number of workers."""

    def __init__(self, dataset: PackedDataset, batch_size: int, drop_last: bool, collate: Callable[[list[Sample]], Any]) -> None:
        self.dataset = dataset
        self.batch_size = batch_size
        self.drop_last = drop_last
        self.collate = collate
        self.epoch, self.start = dataset.epoch, dataset.consumed

    def sizes(self) -> list[int]:
        """Rows of each batch of the pass (the last may be short unless ``drop_last``)."""
        left = len(self.dataset) - self.start
        full, rest = divmod(left, self.batch_size)
        return [self.batch_size] * full + ([rest] if rest and not self.drop_last else [])

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        order = self.dataset.order(self.epoch)[self.start :]
        for j in range(worker, len(self.sizes()), workers):
            rows = order[j * self.batch_size : (j + 1) * self.batch_size]
            yield self.collate([self.dataset[int(r)] for r in rows])


class PackedLoader:
    """Batches of a :class:`PackedDataset`, loaded by ``torch.utils.data.DataLoader`` (optionally in
    ``num_workers`` worker processes), with the dataset's position exact for checkpoints.

    Each pass yields the rest of the dataset's current epoch, ``batch_size`` rows at a time (the
    batches never cross an epoch), in the same order as iterating the dataset in-process, whatever
    ``num_workers``. The dataset's position moves in this process when a batch is handed out, not
    when a worker prefetches it, so ``dataset.state_dict()`` taken between batches resumes exactly.
    Other keyword arguments (``pin_memory``, ``prefetch_factor``, ``multiprocessing_context``...) go to
    the DataLoader; workers are started for each pass (not persistent: each pass starts from the
    dataset's position at that time).
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
        if loader_kwargs.get("persistent_workers"):
            raise ValueError("PackedLoader starts its workers for each pass; persistent_workers is not supported")
        self.dataset = dataset
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.drop_last = drop_last
        self.collate_fn = collate_fn
        self.loader_kwargs = loader_kwargs

    def __len__(self) -> int:
        """Batches left in the current pass."""
        return len(_BatchStream(self.dataset, self.batch_size, self.drop_last, self.collate_fn).sizes())

    def __iter__(self) -> Iterator[Any]:
        stream = _BatchStream(self.dataset, self.batch_size, self.drop_last, self.collate_fn)
        sizes = stream.sizes()
        loader = DataLoader(
            stream, batch_size=None, num_workers=self.num_workers, collate_fn=_identity, **self.loader_kwargs
        )
        epoch = self.dataset.epoch
        for size, batch in zip(sizes, loader, strict=True):
            self.dataset._advance(size)
            yield batch
        if self.drop_last and self.dataset.epoch == epoch:
            self.dataset._advance(len(self.dataset) - self.dataset.consumed)  # the dropped rows end the epoch

