"""Checks of a training run that need only its config and the shards' manifest: run by
``longctx train`` before any rank starts (and by each rank under a plain ``torchrun``), so a run that
cannot work is refused in one line instead of after N processes have started."""

from __future__ import annotations

from pathlib import Path

from longctx.core.config import ContextConfig
from longctx.core.errors import ConfigError
from longctx.core.layout import RunLayout
from longctx.packer.manifest import load_manifest
from longctx.trainer.config import TrainConfig


def check_before_start(train: TrainConfig, context: ContextConfig, output: Path, world_size: int) -> None:
    """Refuse (``ConfigError``, or ``ShardError`` without a readable manifest) a ``train.cp`` that
    does not divide ``world_size``, or whose ``2 x cp`` zigzag chunks do not divide the shards'
    ``seq_len`` (read from the manifest header, a small JSON file)."""
    cp = train.cp
    if world_size % cp:
        raise ConfigError(
            f"train.cp = {cp} must divide the number of processes ({world_size}); start {cp} or a multiple "
            f"of {cp} processes (longctx train --nproc, or torchrun --nproc-per-node)"
        )
    shards = train.shards or RunLayout(output).shard_folder(context.target)
    seq_len = load_manifest(shards, train.storage_options).header.seq_len
    if seq_len % (2 * cp):
        raise ConfigError(
            f"train.cp = {cp}: the shards' seq_len {seq_len} ({shards}) is not divisible by 2 x train.cp = "
            f"{2 * cp} (zigzag context parallelism gives each rank two chunks of every window); choose a cp "
            f"that divides {seq_len // 2}, or pack windows of a length divisible by {2 * cp}"
        )
