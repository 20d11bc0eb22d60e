"""The rows of each optimizer step, as a function of the global batch, not of the world size.

``train.global_batch_rows`` (G) rows make one optimizer step over all data-parallel ranks; rank ``r``
of ``dp`` takes the contiguous part ``[r G/dp, (r+1) G/dp)`` of the step's rows and accumulates
gradients over them, one row per micro-batch. The set of rows of each step and their order do not
depend on ``dp``, so a run resumed at another world size sees exactly the rows an uninterrupted run
would have seen (the contract of ``longctx.packer.dataset.PackedDataset``'s ``global_batch_rows``).

TEMPORARY ADAPTER: until the packer's dataset implements that contract, :class:`StepRows` derives it
from the dataset's public API (one epoch's order at ``dp_world_size = 1``, cut to a multiple of G);
the position it saves is counted in global rows, so it resumes at any ``dp`` dividing G.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from longctx.core.errors import ConfigError
from longctx.packer.dataset import PackedDataset


def accumulation_steps(global_batch_rows: int, dp_size: int) -> int:
    """Micro-batches (rows) per optimizer step on each data-parallel rank."""
    if global_batch_rows % dp_size:
        raise ConfigError(
            f"train.global_batch_rows = {global_batch_rows} is not a multiple of the data-parallel size {dp_size} "
            "(world size / train.cp); choose a multiple, or another number of processes"
        )
    return global_batch_rows // dp_size


def _has_global_batches() -> bool:
    return "global_batch_rows" in inspect.signature(PackedDataset.__init__).parameters


class StepRows:
    """This rank's rows of every optimizer step, with a resumable position in global rows."""

    def __init__(
        self,
        folder: str | Path,
        *,
        tokenizer: Path | None,
        seed: int,
        holdout_rows: int,
        global_batch_rows: int,
        dp_rank: int,
        dp_size: int,
        cache: Path | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        """``folder`` may be an fsspec URL: its shards are then copied and checked into ``cache``
        first (see :class:`~longctx.packer.dataset.PackedDataset`)."""
        self.global_batch_rows = global_batch_rows
        self.accumulation = accumulation_steps(global_batch_rows, dp_size)
        self.dp_rank = dp_rank
        self._native = _has_global_batches()
        if self._native:
            self.dataset = PackedDataset(
                folder,
                tokenizer=tokenizer,
                seed=seed,
                dp_rank=dp_rank,
                dp_world_size=dp_size,
                holdout_rows=holdout_rows,
                global_batch_rows=global_batch_rows,
                cache=cache,
                storage_options=storage_options,
            )
            self._rows = None
        else:
            self.dataset = PackedDataset(
                folder,
                tokenizer=tokenizer,
                seed=seed,
                holdout_rows=holdout_rows,
                cache=cache,
                storage_options=storage_options,
            )
            if len(self.dataset) < global_batch_rows:
                raise ConfigError(
                    f"{folder} has {len(self.dataset)} training rows, fewer than train.global_batch_rows = "
                    f"{global_batch_rows}"
                )
            self.epoch, self.position = 0, 0

    @property
    def seq_len(self) -> int:
        return self.dataset.seq_len

    def next_step(self) -> list[dict[str, torch.Tensor]]:
        """This rank's rows of the next optimizer step, in order."""
        if self._native:
            if self._rows is None:
                self._rows = self._forever()
            return [next(self._rows) for _ in range(self.accumulation)]
        usable = len(self.dataset) - len(self.dataset) % self.global_batch_rows
        if self.position + self.global_batch_rows > usable:
            self.epoch, self.position = self.epoch + 1, 0
        order = self.dataset.order(self.epoch)
        first = self.position + self.dp_rank * self.accumulation
        self.position += self.global_batch_rows
        return [self.dataset[int(i)] for i in order[first : first + self.accumulation]]

    def _forever(self):
        while True:
            yield from self.dataset

    def state_dict(self) -> dict[str, Any]:
        """The position (in global rows) and what it depends on; the same on every rank."""
        if self._native:
            return self.dataset.state_dict()
        inner = self.dataset.state_dict()
        return inner | {"epoch": self.epoch, "position": self.position, "global_batch_rows": self.global_batch_rows}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self._native:
            self.dataset.load_state_dict(state)
            self._rows = None
            return
        if state.get("global_batch_rows") != self.global_batch_rows:
            raise ConfigError(
                f"cannot resume: the checkpoint's data order was cut in steps of {state.get('global_batch_rows')} "
                f"rows, this run's train.global_batch_rows is {self.global_batch_rows}"
            )
        self.dataset.load_state_dict(state | {"epoch": 0, "position": 0})  # checks the data, seed and order
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
