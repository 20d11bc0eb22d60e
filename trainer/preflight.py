"""Checks of a training run that need only its config and the shards' manifest: run by
``longctx train`` before any rank starts (and by each rank under a plain ``torchrun``), so a run that
cannot work is refused in one line instead of after N processes have started. The rules are the
mesh's (``longctx.trainer.mesh``); the shard folder is the run layout's."""

from __future__ import annotations

from pathlib import Path

from longctx.core.config import ContextConfig
from longctx.core.layout import RunLayout
from longctx.packer.manifest import load_manifest
from longctx.trainer.config import TrainConfig
from longctx.trainer.mesh import MeshShape


def check_before_start(train: TrainConfig, context: ContextConfig, output: Path, world_size: int) -> None:
    """Refuse (``ConfigError``, or ``ShardError`` without a readable manifest) a ``train.cp x
    train.dp_replicate`` that does not divide ``world_size``, or shards whose ``seq_len`` (read from
    the manifest header, a small JSON file) the ``2 x cp`` zigzag chunks do not divide."""
    MeshShape.for_world(world_size, train.cp, train.dp_replicate)
    shards = RunLayout(output).training_shards(train.shards, context.target)
    seq_len = load_manifest(shards, train.storage_options).header.seq_len
    MeshShape.check_window(seq_len, train.cp, length_key=f"the shards' seq_len ({shards})", cp_key="train.cp")
