"""Checks of a training run that need only its config, the shards' manifest, the model's
``config.json`` and the output folder: run by ``longctx train`` before any rank starts (and by each
rank under a plain ``torchrun``), so a run that cannot work is refused in one line instead of after N
processes have started. The rules are the mesh's (``longctx.trainer.parallel.mesh``) and the model's
(``build.check_training_model``: a model the chosen implementation cannot read, sliding windows shorter
than the windows, a transformers model the ring cannot train); the folders are the run layout's; the
output folders are checked as curate and pack check theirs (``longctx.core.preflight``)."""

from __future__ import annotations

from pathlib import Path

from longctx.core.config import ContextConfig
from longctx.core.errors import ConfigError
from longctx.core.layout import RunLayout
from longctx.core.preflight import check_output_folder
from longctx.core.remote import is_remote
from longctx.packer.manifest import load_manifest
from longctx.trainer.config import TrainConfig
from longctx.trainer.coverage import CoverageError, check_shard_coverage, required_position
from longctx.trainer.parallel.mesh import MeshShape
from longctx.trainer.stage_plan import export_paths, resolve_stages, stage_context, stage_train_config


def check_before_start(train: TrainConfig, context: ContextConfig, output: Path, world_size: int) -> None:
    """Refuse (``ConfigError``, or ``ShardError`` without a readable manifest) a ``train.cp x
    train.dp_replicate`` that does not divide ``world_size``, shards whose ``seq_len`` (read from the
    manifest header, a small JSON file) the ``2 x cp`` zigzag chunks do not divide, a base checkpoint
    folder that is damaged (``ModelFolderError``: truncated weights, an unreadable config), a model
    that cannot train on the shards, and (``OutputError``) folders the run could not write
    (:func:`check_output_folders`). With ``train.stages``, every stage's shards are checked, and must
    also hold windows of the stage's length whose positions reach the stage's required position
    (``train.coverage``), and the model must train at every stage's length with its RoPE."""
    MeshShape.for_world(world_size, train.cp, train.dp_replicate)
    layout = RunLayout(output)
    stages = resolve_stages(train, layout)
    runs: list[tuple[TrainConfig, ContextConfig, int, int]] = []
    if not stages:
        shards = layout.training_shards(train.shards, context.target)
        header = load_manifest(shards, train.storage_options).header
        MeshShape.check_window(
            header.seq_len, train.cp, length_key=f"the shards' seq_len ({shards})", cp_key="train.cp"
        )
        runs.append((train, context, header.seq_len, header.tokenizer.vocab_size))
    for stage in stages:
        shards = layout.training_shards(stage.config.shards, stage.seq_len)
        manifest = load_manifest(shards, train.storage_options)
        if manifest.header.seq_len != stage.seq_len:
            raise ConfigError(
                f"{stage.key}.seq_len = {stage.seq_len}, but its shards ({shards}) hold windows of "
                f"{manifest.header.seq_len} tokens: point {stage.key}.shards at windows of its length"
            )
        MeshShape.check_window(stage.seq_len, train.cp, length_key=f"{stage.key}.seq_len", cp_key="train.cp")
        stage_train = stage_train_config(train, stage)
        coverage = stage_train.coverage
        if not coverage.allow_short:
            required = required_position(stage.seq_len, coverage.required_position)
            try:
                check_shard_coverage(
                    manifest.max_position,
                    {name: s.max_position for name, s in manifest.sources.items()},
                    required,
                    context.original,
                    configured=coverage.required_position,
                    allow_short=coverage.allow_short,
                )
            except CoverageError as err:
                raise CoverageError(f"{stage.describe()}, shards {shards}: {err}") from None
        runs.append(
            (stage_train, stage_context(context, stage), stage.seq_len, manifest.header.tokenizer.vocab_size)
        )
    # torch: only once the cheap checks pass
    from longctx.trainer.build import check_training_model
    from longctx.trainer.models.files import check_model_folder

    if train.model.hf_path is not None:
        check_model_folder(train.model.hf_path)
    for run_train, run_context, seq_len, vocab_size in runs:
        check_training_model(run_train, run_context, seq_len, vocab_size)
    check_output_folders(train, output)


def check_output_folders(train: TrainConfig, output: Path) -> None:
    """Refuse (``OutputError``, one line naming the path and the key) a run whose ``<output>/train``
    (checkpoints, metrics, the exported model), shard cache (when ``train.shards`` or a stage's
    ``shards`` is a URL) or local ``train.export.output`` is a file, is read-only or cannot be
    created."""
    layout = RunLayout(output)
    check_output_folder(layout.train, key="output")
    shards = [train.shards, *(stage.shards for stage in train.stages or [])]
    if any(s is not None and is_remote(s) for s in shards):
        check_output_folder(train.cache or layout.cache, key="train.cache" if train.cache else "output")
    published = train.export.output
    if published is not None and "://" not in published:
        check_output_folder(Path(published), key="train.export.output")


def check_before_export(train: TrainConfig, output: Path, step: int, stage: int | None = None) -> None:
    """Refuse ``longctx train --export STEP [--stage K]`` without a checkpoint of ``step`` (in stage
    ``stage``'s folder for a staged run; naming the steps there are), or with a ``<output>/train`` it
    could not write. The export reads the checkpoint at any world size, so neither ``train.cp`` nor
    the shards are checked."""
    from longctx.trainer.checkpoint import CheckpointError, checkpoint_folder, list_checkpoints

    checkpoints = export_paths(train, RunLayout(output), stage).checkpoints
    if not checkpoint_folder(checkpoints, step).is_dir():
        steps = sorted(c.step for c in list_checkpoints(checkpoints))
        there = f"its checkpoints are of steps {', '.join(map(str, steps))}" if steps else "it holds none"
        raise CheckpointError(f"no checkpoint of step {step} in {checkpoints}: {there}")
    check_output_folders(train, output)
