"""Checks of a training run that need only its config and the shards' manifest: run by
``longctx train`` before any rank starts (and by each rank under a plain ``torchrun``), so a run that
cannot work is refused in one line instead of after N processes have started. The rules are the
mesh's (``longctx.trainer.mesh``); the shard folder is the run layout's."""

from __future__ import annotations

from pathlib import Path

from longctx.core.config import ContextConfig
from longctx.core.errors import ConfigError
from longctx.core.layout import RunLayout
from longctx.packer.manifest import load_manifest
from longctx.trainer.config import TrainConfig
from longctx.trainer.coverage import CoverageError, check_shard_coverage, required_position
from longctx.trainer.mesh import MeshShape
from longctx.trainer.stage_plan import resolve_stages, stage_train_config


def check_before_start(train: TrainConfig, context: ContextConfig, output: Path, world_size: int) -> None:
    """Refuse (``ConfigError``, or ``ShardError`` without a readable manifest) a ``train.cp x
    train.dp_replicate`` that does not divide ``world_size``, or shards whose ``seq_len`` (read from
    the manifest header, a small JSON file) the ``2 x cp`` zigzag chunks do not divide. With
    ``train.stages``, every stage's shards are checked, and must also hold windows of the stage's
    length whose positions reach the stage's required position (``train.coverage``)."""
    MeshShape.for_world(world_size, train.cp, train.dp_replicate)
    layout = RunLayout(output)
    stages = resolve_stages(train, layout)
    if not stages:
        shards = layout.training_shards(train.shards, context.target)
        seq_len = load_manifest(shards, train.storage_options).header.seq_len
        MeshShape.check_window(
            seq_len, train.cp, length_key=f"the shards' seq_len ({shards})", cp_key="train.cp"
        )
        return
    for stage in stages:
        shards = layout.training_shards(stage.config.shards, stage.seq_len)
        manifest = load_manifest(shards, train.storage_options)
        if manifest.header.seq_len != stage.seq_len:
            raise ConfigError(
                f"{stage.key}.seq_len = {stage.seq_len}, but its shards ({shards}) hold windows of "
                f"{manifest.header.seq_len} tokens: point {stage.key}.shards at windows of its length"
            )
        MeshShape.check_window(stage.seq_len, train.cp, length_key=f"{stage.key}.seq_len", cp_key="train.cp")
        coverage = stage_train_config(train, stage).coverage
        if not coverage.allow_short:
            required = required_position(context.original, stage.seq_len, coverage.required_position)
            try:
                check_shard_coverage(
                    manifest.max_position,
                    {name: s.max_position for name, s in manifest.sources.items()},
                    required,
                    context.original,
                )
            except CoverageError as err:
                raise CoverageError(f"{stage.describe()}, shards {shards}: {err}") from None
