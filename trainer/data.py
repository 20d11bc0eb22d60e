"""The rows of each optimizer step, as a function of the global batch, not of the world size.

``train.global_batch_rows`` (G) rows make one optimizer step over all data-parallel ranks; rank ``r``
of ``dp`` takes its part of the step's rows and accumulates gradients over them, one row per
micro-batch. The set of rows of each step and their order do not depend on ``dp``, so a run resumed
at another world size sees exactly the rows an uninterrupted run would have seen: the contract of
``longctx.packer.dataset.PackedDataset``'s ``global_batch_rows``, whose resumable position is counted
in global rows. :class:`StepRows` cuts the dataset's stream of this rank's rows into steps.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from longctx.core.errors import ConfigError
from longctx.packer.dataset import PackedDataset


def accumulation_steps(global_batch_rows: int, dp_size: int) -> int:
    """Micro-batches (rows) per optimizer step on each data-parallel rank."""
    if global_batch_rows % dp_size:
        raise ConfigError(
            f"train.global_batch_rows = {global_batch_rows} is not a multiple of the data-parallel size "
            f"{dp_size} (world size / train.cp); choose a multiple, or another number of processes"
        )
    return global_batch_rows // dp_size


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
        self._rows: Iterator[dict[str, torch.Tensor]] | None = None

    @property
    def seq_len(self) -> int:
        return self.dataset.seq_len

    def next_step(self) -> list[dict[str, torch.Tensor]]:
        """This rank's rows of the next optimizer step, in order."""
        if self._rows is None:
            self._rows = self._forever()
        return [next(self._rows) for _ in range(self.accumulation)]

    def _forever(self) -> Iterator[dict[str, torch.Tensor]]:
        while True:  # each pass is one epoch; the dataset moves to the next epoch itself
            yield from self.dataset

    def state_dict(self) -> dict[str, Any]:
        """The position (in global rows) and what it depends on; the same on every rank."""
        return self.dataset.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.dataset.load_state_dict(state)
        self._rows = None
