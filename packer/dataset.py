"""A PyTorch dataset over one output folder: shuffled, sharded by data-parallel rank, resumable.

Label convention (see ``packer/FORMAT.md``): ``labels`` are already shifted. ``labels[i]`` is the
token the model must predict from position ``i``, i.e. ``input_ids[i + 1]`` when that token belongs
to the same document segment, and ``IGNORE_INDEX`` otherwise (the last token of every segment, the
padding, the window's last position). ``loss_mask`` is ``labels != IGNORE_INDEX``. With attention
restricted to segments (``cu_seqlens``) and positions restarting per segment, the packed loss over
a document equals the loss of that document trained alone. Do not hand ``labels`` to a Hugging
Face model's ``labels=`` argument, which would shift them again.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from longctx.packer.format import FORMAT_VERSION
from longctx.packer.reader import PackedRow, ShardSet

IGNORE_INDEX = -100
_HOLDOUT_STREAM = 0x5EED0FF  # keeps the held-out draw apart from every epoch's shuffle


def row_to_sample(row: PackedRow) -> dict[str, torch.Tensor]:
    """Training tensors of one window (int64 tokens and positions, int32 ``cu_seqlens``, bool mask)."""
    targets = np.zeros(len(row.input_ids), dtype=bool)
    targets[:-1] = row.loss_mask[1:] == 1
    labels = np.full(len(row.input_ids), IGNORE_INDEX, dtype=np.int64)
    labels[:-1][targets[:-1]] = row.input_ids[1:][targets[:-1]]
    return {
        "input_ids": torch.from_numpy(row.input_ids.astype(np.int64)),
        "labels": torch.from_numpy(labels),
        "position_ids": torch.from_numpy(row.position_ids.astype(np.int64)),
        "cu_seqlens": torch.from_numpy(row.cu_seqlens.astype(np.int32)),
        "loss_mask": torch.from_numpy(targets),
    }


def collate_packed(samples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor | int]:
    """Stack windows into ``[batch, seq_len]`` tensors; ``cu_seqlens`` becomes the boundaries of all
    segments of the flattened batch (the varlen-attention layout) and ``max_seqlen`` its longest."""
    seq_len = samples[0]["input_ids"].numel()
    batch: dict[str, torch.Tensor | int] = {
        key: torch.stack([s[key] for s in samples])
        for key in ("input_ids", "labels", "position_ids", "loss_mask")
    }
    cu = torch.cat([s["cu_seqlens"][:-1] + i * seq_len for i, s in enumerate(samples)])
    cu_seqlens = torch.cat([cu, torch.tensor([len(samples) * seq_len], dtype=torch.int32)]).to(torch.int32)
    batch["cu_seqlens"] = cu_seqlens
    batch["max_seqlen"] = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
    return batch


class PackedDataset(IterableDataset):
    """Windows of ``folder`` for one data-parallel rank, in a seeded order that changes every epoch.

    Each epoch is a permutation of all rows drawn from ``(seed, epoch)``, cut to a multiple of
    ``dp_world_size`` and dealt round-robin, so ranks see disjoint rows and the same number of them.
    Iterating yields the rest of the current epoch, from where the last iteration stopped; handing
    out an epoch's last row moves on to the next epoch.
    :meth:`state_dict` records ``(epoch, position)`` after every row handed out, so resuming from a
    checkpoint yields exactly the rows that had not been consumed. Iterate in the training process
    (``DataLoader(num_workers=0)``, the default): rows are memory-mapped and need no decoding, and a
    worker process would hold the position where the checkpoint cannot see it.

    ``tokenizer`` (the ``tokenizer.json`` you train with, or its sha256) and ``format_version`` are
    checked against the shards; a mismatch raises :class:`~longctx.packer.format.ShardError`.

    ``holdout_rows`` sets that many rows aside for evaluation, drawn at random by ``seed`` alone (so
    they are typical windows, not the part-filled ones that end each task's output): they are never
    in a training order, and :meth:`heldout_rows` lists them. They are windows the model never
    trained on; when ``pack.mix`` repeats documents, copies of their documents may still appear in
    training windows.
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
        format_version: int = FORMAT_VERSION,
        holdout_rows: int = 0,
    ) -> None:
        if not 0 <= dp_rank < dp_world_size:
            raise ValueError(f"dp_rank must be in [0, {dp_world_size}), got {dp_rank}")
        self.shards = ShardSet(folder, tokenizer=tokenizer, format_version=format_version)
        if holdout_rows < 0 or len(self.shards) - holdout_rows < dp_world_size:
            raise ValueError(
                f"{folder} has {len(self.shards)} rows: holding out {holdout_rows} leaves fewer than "
                f"dp_world_size={dp_world_size}"
            )
        self.holdout = holdout_rows
        self.seed = seed
        self.shuffle = shuffle
        self.dp_rank = dp_rank
        self.dp_world_size = dp_world_size
        self.epoch = 0
        self.position = 0

    @property
    def seq_len(self) -> int:
        return self.shards.seq_len

    def __len__(self) -> int:
        """Rows this rank gets per epoch."""
        return (len(self.shards) - self.holdout) // self.dp_world_size

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

    def order(self, epoch: int) -> np.ndarray:
        """Global row indices this rank reads in ``epoch``, in order."""
        train = self._split()[1]
        perm = train[np.random.default_rng([self.seed, epoch]).permutation(len(train))] if self.shuffle else train
        return perm[: len(self) * self.dp_world_size][self.dp_rank :: self.dp_world_size]

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning (no-op when it is the current epoch, so a resumed
        position survives the usual ``set_epoch`` call at the top of the epoch loop)."""
        if epoch != self.epoch:
            self.epoch, self.position = epoch, 0

    def __getitem__(self, row: int) -> dict[str, torch.Tensor]:
        """The window at global row index ``row`` (ignores rank and order)."""
        return row_to_sample(self.shards.row(row))

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        worker = get_worker_info()
        if worker is not None and worker.num_workers > 1:
            raise RuntimeError(
                "PackedDataset must be iterated in one process (DataLoader(num_workers=0)): rows are "
                "memory-mapped, and the resume position lives in the iterating process"
            )
        order = self.order(self.epoch)
        for k in range(self.position, len(order)):
            # the state moves before the row is handed out, so it always names the next row
            self.position = k + 1
            if self.position == len(order):
                self.epoch, self.position = self.epoch + 1, 0
            yield self[int(order[k])]

    def state_dict(self) -> dict[str, Any]:
        """Where iteration stands, plus what it depends on (checked by :meth:`load_state_dict`)."""
        return {
            "epoch": self.epoch,
            "position": self.position,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "dp_world_size": self.dp_world_size,
            "rows": len(self.shards),
            "holdout_rows": self.holdout,
            "config_sha256": self.shards.manifest.header.config_sha256,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``; refuses a state taken over other data, seed, order or world size."""
        mine = self.state_dict()
        changed = sorted(k for k in mine if k not in ("epoch", "position") and state.get(k) != mine[k])
        if changed:
            raise ValueError(f"cannot resume: the state was saved with a different {', '.join(changed)}")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
