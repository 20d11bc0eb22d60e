"""Checks of a training run that need only its config, the shards' manifest and the model's
``config.json``: run by ``longctx train`` before any rank starts (and by each rank under a plain
``torchrun``), so a run that cannot work is refused in one line instead of after N processes have
started. The rules are the mesh's (``longctx.trainer.mesh``) and the model's (``build.check_training_model``:
a model the chosen implementation cannot read, sliding windows shorter than the windows, a transformers
model the ring cannot train); the shard folder is the run layout's."""

from __future__ import annotations

from pathlib import Path

from longctx.core.config import ContextConfig
from longctx.core.layout import RunLayout
from longctx.packer.manifest import load_manifest
from longctx.trainer.config import TrainConfig
from longctx.trainer.mesh import MeshShape


def check_before_start(train: TrainConfig, context: ContextConfig, output: Path, world_size: int) -> None:
    """Refuse (``ConfigError``, or ``ShardError`` without a readable manifest) a ``train.cp x
    train.dp_replicate`` that does not divide ``world_size``, shards whose ``seq_len`` (read from the
    manifest header, a small JSON file) the ``2 x cp`` zigzag chunks do not divide, and a model that
    cannot train on them."""
    MeshShape.for_world(world_size, train.cp, train.dp_replicate)
    shards = RunLayout(output).training_shards(train.shards, context.target)
    header = load_manifest(shards, train.storage_options).header
    MeshShape.check_window(
        header.seq_len, train.cp, length_key=f"the shards' seq_len ({shards})", cp_key="train.cp"
    )
    from longctx.trainer.build import check_training_model  # torch: only once the cheap checks pass

    check_training_model(train, context, header.seq_len, header.tokenizer.vocab_size)
