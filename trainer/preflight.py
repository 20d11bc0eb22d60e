"""Checks of a training run that need only its config, the shards' manifest, the model's
``config.json`` and the output folder: run by ``longctx train`` before any rank starts (and by each
rank under a plain ``torchrun``), so a run that cannot work is refused in one line instead of after N
processes have started. The rules are the mesh's (``longctx.trainer.mesh``) and the model's
(``build.check_training_model``: a model the chosen implementation cannot read, sliding windows shorter
than the windows, a transformers model the ring cannot train); the folders are the run layout's; the
output folders are checked as curate and pack check theirs (``longctx.core.preflight``)."""

from __future__ import annotations

from pathlib import Path

from longctx.core.config import ContextConfig
from longctx.core.layout import RunLayout
from longctx.core.preflight import check_output_folder
from longctx.core.remote import is_remote
from longctx.packer.manifest import load_manifest
from longctx.trainer.config import TrainConfig
from longctx.trainer.mesh import MeshShape


def check_before_start(train: TrainConfig, context: ContextConfig, output: Path, world_size: int) -> None:
    """Refuse (``ConfigError``, or ``ShardError`` without a readable manifest) a ``train.cp x
    train.dp_replicate`` that does not divide ``world_size``, shards whose ``seq_len`` (read from the
    manifest header, a small JSON file) the ``2 x cp`` zigzag chunks do not divide, a base checkpoint
    folder that is damaged (``ModelFolderError``: truncated weights, an unreadable config), a model
    that cannot train on the shards, and (``OutputError``) folders the run could not write
    (:func:`check_output_folders`)."""
    MeshShape.for_world(world_size, train.cp, train.dp_replicate)
    shards = RunLayout(output).training_shards(train.shards, context.target)
    header = load_manifest(shards, train.storage_options).header
    MeshShape.check_window(
        header.seq_len, train.cp, length_key=f"the shards' seq_len ({shards})", cp_key="train.cp"
    )
    # torch: only once the cheap checks pass
    from longctx.trainer.build import check_training_model
    from longctx.trainer.hf_io import check_model_folder

    if train.model.hf_path is not None:
        check_model_folder(train.model.hf_path)
    check_training_model(train, context, header.seq_len, header.tokenizer.vocab_size)
    check_output_folders(train, output)


def check_output_folders(train: TrainConfig, output: Path) -> None:
    """Refuse (``OutputError``, one line naming the path and the key) a run whose ``<output>/train``
    (checkpoints, metrics, the exported model), shard cache (when ``train.shards`` is a URL) or local
    ``train.export.output`` is a file, is read-only or cannot be created."""
    layout = RunLayout(output)
    check_output_folder(layout.train, key="output")
    if train.shards is not None and is_remote(train.shards):
        check_output_folder(train.cache or layout.cache, key="train.cache" if train.cache else "output")
    published = train.export.output
    if published is not None and "://" not in published:
        check_output_folder(Path(published), key="train.export.output")


def check_before_export(train: TrainConfig, output: Path, step: int) -> None:
    """Refuse ``longctx train --export STEP`` without a checkpoint of ``step`` (naming the steps there
    are), or with a ``<output>/train`` it could not write. The export reads the checkpoint at any
    world size, so neither ``train.cp`` nor the shards are checked."""
    from longctx.trainer.checkpoint import CheckpointError, checkpoint_folder, list_checkpoints

    layout = RunLayout(output)
    if not checkpoint_folder(layout.checkpoints, step).is_dir():
        steps = sorted(c.step for c in list_checkpoints(layout.checkpoints))
        there = f"its checkpoints are of steps {', '.join(map(str, steps))}" if steps else "it holds none"
        raise CheckpointError(f"no checkpoint of step {step} in {layout.checkpoints}: {there}")
    check_output_folders(train, output)
