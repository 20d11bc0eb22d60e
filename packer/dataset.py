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
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from longctx.core.errors import ConfigError
from longctx.packer.format import FORMAT_VERSION
from longctx.packer.reader import PackedRow, ShardSet
from longctx.packer.rowcheck import RowTokens

IGNORE_INDEX = -100
_HOLDOUT_STREAM = 0x5EED0FF  # keeps the held-out draw apart from every epoch's shuffle

Sample = dict[str, torch.Tensor]
Batch = dict[str, torch.Tensor | int]


def batch_nbytes(rows: Sequence[RowTokens | PackedRow]) -> int:
    """Bytes of the one buffer :func:`write_batch` fills for ``rows``: three int64 and one bool
    ``[batch, seq_len]`` arrays and the batch's int32 ``cu_seqlens``."""
    return 25 * len(rows) * len(rows[0].input_ids) + 4 * (1 + sum(len(row.cu_seqlens) - 1 for row in rows))


def write_batch(rows: Sequence[RowTokens | PackedRow], buffer: np.ndarray) -> tuple[dict[str, np.ndarray], int]:
    """Write the training arrays of ``rows`` into ``buffer`` (uint8, at least :func:`batch_nbytes`
    long) and return numpy views of them, keyed like a batch of :func:`collate_packed`
    (``[batch, seq_len]`` arrays; ``cu_seqlens`` the segments of the flattened batch), and
    ``max_seqlen``. One buffer per batch: one allocation, and one block to hand across processes.

    Labels follow the module's shifted convention; each array is written in one or two passes from
    the shard's columns (no intermediate copies). Positions are widened without being checked here:
    serve only rows that passed :func:`~longctx.packer.rowcheck.check_row`."""
    batch, seq_len = len(rows), len(rows[0].input_ids)
    arrays = batch_views(buffer, batch, seq_len, 1 + sum(len(row.cu_seqlens) - 1 for row in rows))
    ids, labels, positions = arrays["input_ids"], arrays["labels"], arrays["position_ids"]
    targets, cu = arrays["loss_mask"], arrays["cu_seqlens"]
    k, longest = 0, 0
    for b, row in enumerate(rows):
        ids[b] = row.input_ids
        positions[b] = row.position_ids
        # labels[i] = ids[i + 1] where token i + 1 is a target of the same segment, else IGNORE_INDEX
        np.not_equal(row.loss_mask[1:], 0, out=targets[b, :-1])
        targets[b, -1] = False
        labels[b, :-1] = ids[b, 1:]
        labels[b, -1] = IGNORE_INDEX
        np.copyto(labels[b], IGNORE_INDEX, where=~targets[b])
        row_cu = row.cu_seqlens
        part = row_cu if b == batch - 1 else row_cu[:-1]  # a row's end is the next row's start
        np.add(part, b * seq_len, out=cu[k : k + len(part)], casting="unsafe")
        k += len(part)
        longest = max(longest, int((row_cu[1:] - row_cu[:-1]).max()))
    return arrays, longest


def batch_views(buffer: np.ndarray, batch: int, seq_len: int, cu_len: int) -> dict[str, np.ndarray]:
    """The arrays of a batch laid out in ``buffer`` by :func:`write_batch` (``cu_len`` entries of
    ``cu_seqlens``): int64 ``input_ids``, ``labels``, ``position_ids``, int32 ``cu_seqlens``, bool
    ``loss_mask``, in that order of bytes."""
    n, shape = batch * seq_len, (batch, seq_len)
    return {
        "input_ids": buffer[: 8 * n].view(np.int64).reshape(shape),
        "labels": buffer[8 * n : 16 * n].view(np.int64).reshape(shape),
        "position_ids": buffer[16 * n : 24 * n].view(np.int64).reshape(shape),
        "loss_mask": buffer[24 * n + 4 * cu_len : 25 * n + 4 * cu_len].view(np.bool_).reshape(shape),
        "cu_seqlens": buffer[24 * n : 24 * n + 4 * cu_len].view(np.int32),
    }


def tokens_to_sample(row: RowTokens | PackedRow) -> Sample:
    """Training tensors of one window (int64 tokens, labels and positions, int32 ``cu_seqlens``,
    bool mask), in the shifted label convention of this module; views of one new buffer."""
    buffer = np.empty(batch_nbytes([row]), dtype=np.uint8)
    arrays, _ = write_batch([row], buffer)
    return {key: torch.from_numpy(value[0] if value.ndim == 2 else value) for key, value in arrays.items()}


def tokens_to_batch(rows: Sequence[RowTokens | PackedRow]) -> Batch:
    """``collate_packed([tokens_to_sample(row) for row in rows])``, built in one buffer in one step."""
    arrays, longest = write_batch(rows, np.empty(batch_nbytes(rows), dtype=np.uint8))
    batch: Batch = {key: torch.from_numpy(value) for key, value in arrays.items()}
    batch["max_seqlen"] = longest
    return batch


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
    batch["max_seqlen"] = int(torch.diff(cu_seqlens).max())
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
    process, or through :class:`~longctx.packer.loader.PackedLoader` for worker processes (a plain ``DataLoader`` with
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
