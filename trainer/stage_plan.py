"""What each stage of ``train.stages`` trains, and the checks of a stage plan at load (no torch, so
configs load fast).

A staged run extends the context in steps, each with a small RoPE rescale (the recipe of the Llama 3
report and ProLong): stage ``k`` trains ``steps`` optimizer steps on windows of ``seq_len`` tokens,
from the previous stage's final weights. Each stage is an ordinary training run
(``longctx.trainer.train``) over its own section (:func:`stage_train_config`) and context
(:func:`stage_context`: the stage's length is its target), in its own folder
(``RunLayout.stage``); ``longctx.trainer.stages`` runs them one after the other.

The rules a plan must follow, checked when the config is loaded (:func:`check_stage_plan`, called by
``longctx.config.check_sections``): the lengths grow and end at ``context.target``, never start below
``context.original``; each length is packed and splits over the ring (the mesh's rule); and the RoPE
factors never shrink from stage to stage, lie in ``[1, context.target / context.original]`` and,
where the scaling names ``original_max_position_embeddings``, it is ``context.original``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from longctx.core.config import ContextConfig
from longctx.core.errors import ConfigError
from longctx.core.layout import RunLayout, StageLayout
from longctx.trainer.config import GateConfig, StageConfig, TrainConfig
from longctx.trainer.parallel.mesh import MeshShape


@dataclass(frozen=True)
class Stage:
    """One stage of a plan, resolved: its settings with the run's defaults filled in, its folder
    and the optimizer steps of the stages before it (its global step offset)."""

    number: int
    """From 1."""
    config: StageConfig
    layout: StageLayout
    rope_scaling: dict[str, Any] | None
    """The stage's RoPE scaling (None: the checkpoint's own)."""
    steps_before: int

    @property
    def seq_len(self) -> int:
        return self.config.seq_len

    @property
    def steps(self) -> int:
        return self.config.steps

    @property
    def key(self) -> str:
        """How messages name the stage's settings: ``train.stages[k]`` (from 0, as in the YAML list)."""
        return f"train.stages[{self.number - 1}]"

    @property
    def gate(self) -> GateConfig | None:
        return self.config.gate

    def describe(self) -> str:
        """``stage 2/3 (2048 tokens)``-style name, without the count."""
        return f"stage {self.number} ({self.seq_len} tokens)"


def stage_rope_scaling(model_scaling: dict[str, Any] | None, stage: StageConfig) -> dict[str, Any] | None:
    """The RoPE scaling stage ``stage`` trains with: its own ``rope_scaling``, else the model
    section's with the stage's ``factor``, else the model section's as it is."""
    if stage.rope_scaling is not None:
        return dict(stage.rope_scaling)
    if stage.factor is not None and model_scaling is not None:
        return {**model_scaling, "factor": stage.factor}
    return dict(model_scaling) if model_scaling is not None else None


def resolve_stages(train: TrainConfig, layout: RunLayout) -> list[Stage]:
    """The stages of ``train.stages`` in order (empty for an unstaged run)."""
    stages, before = [], 0
    for number, config in enumerate(train.stages or [], start=1):
        scaling = stage_rope_scaling(train.model.rope_scaling, config)
        stages.append(Stage(number, config, layout.stage(number, config.seq_len), scaling, before))
        before += config.steps
    return stages


def stage_train_config(train: TrainConfig, stage: Stage) -> TrainConfig:
    """The ``train`` section of one stage's run: the run's section with the stage's steps, shards,
    RoPE scaling, learning rate and batch, no stages, and a configured
    ``coverage.required_position`` capped at the stage's last position."""
    model = train.model.model_copy(update={"rope_scaling": stage.rope_scaling})
    optim = train.optim.model_copy(update={"lr": stage.config.lr or train.optim.lr})
    required = train.coverage.required_position
    coverage = train.coverage.model_copy(
        update={"required_position": min(required, stage.seq_len - 1) if required is not None else None}
    )
    return train.model_copy(
        update={
            "stages": None,
            "steps": stage.steps,
            "shards": stage.config.shards,
            "model": model,
            "optim": optim,
            "coverage": coverage,
            "global_batch_rows": stage.config.global_batch_rows or train.global_batch_rows,
        }
    )


def stage_context(context: ContextConfig, stage: Stage) -> ContextConfig:
    """The context of one stage's run: the stage's length is its target (the positions its shards
    must reach, the exported ``max_position_embeddings``)."""
    return context.model_copy(update={"target": stage.seq_len})


def export_paths(train: TrainConfig, layout: RunLayout, stage: int | None) -> RunLayout | StageLayout:
    """Where ``longctx train --export STEP [--stage K]`` reads checkpoints and writes: ``train/``, or
    stage ``stage``'s folder (a staged run must name one)."""
    stages = resolve_stages(train, layout)
    if not stages:
        if stage is not None:
            raise ConfigError("--stage names a stage of train.stages, and this config has none")
        return layout
    if stage is None or not 1 <= stage <= len(stages):
        raise ConfigError(
            f"train.stages: name the stage whose checkpoint to export with --stage K (1 to {len(stages)})"
        )
    return stages[stage - 1].layout


def final_model(layout: RunLayout, train: TrainConfig | None) -> Path:
    """The run's trained model: the last stage's export in a staged run, else ``train/final``."""
    if train is not None and train.stages:
        return resolve_stages(train, layout)[-1].layout.final_model
    return layout.final_model


def _factor(scaling: dict[str, Any] | None) -> float | None:
    value = (scaling or {}).get("factor")
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def check_stage_plan(train: TrainConfig, context: ContextConfig, packed: Sequence[int] | None) -> None:
    """Refuse (``ConfigError`` naming the keys) a plan that could not run or would not extend as
    declared: see the module docstring. ``packed`` are the lengths ``pack`` builds (None: the config
    has no pack section, nothing to compare)."""
    stages = resolve_stages(train, RunLayout(Path(".")))
    if not stages:
        return
    last = stages[-1]
    if last.seq_len != context.target:
        raise ConfigError(
            f"{last.key}.seq_len = {last.seq_len}, the last stage, must be context.target = {context.target} "
            "(the length the run extends to): make them equal"
        )
    factors: list[tuple[Stage, float]] = []
    for stage in stages:
        key = stage.key
        if stage.seq_len < context.original:
            raise ConfigError(
                f"{key}.seq_len = {stage.seq_len} is below context.original = {context.original}: stages "
                "extend the context, start at context.original or above"
            )
        if stage.config.shards is None and packed is not None and stage.seq_len not in packed:
            raise ConfigError(
                f"{key}.seq_len = {stage.seq_len} is not packed: pack.seq_lens {list(packed)} does not build "
                f"it; add {stage.seq_len} to pack.seq_lens, or set {key}.shards"
            )
        MeshShape.check_window(stage.seq_len, train.cp, length_key=f"{key}.seq_len", cp_key="train.cp")
        scaling = stage.rope_scaling or {}
        declared = scaling.get("original_max_position_embeddings")
        if declared is not None and declared != context.original:
            raise ConfigError(
                f"{key}: its RoPE scaling's original_max_position_embeddings = {declared} is not "
                f"context.original = {context.original}; make them equal"
            )
        factor = _factor(stage.rope_scaling)
        if factor is None:
            continue
        largest = context.target / context.original
        if not 1 <= factor <= largest:
            raise ConfigError(
                f"{key}: RoPE factor {factor:g} is outside [1, context.target / context.original = "
                f"{largest:g}]: a factor scales the pretrained window ({context.original}) up to at most "
                "the run's target"
            )
        if factors and factor < factors[-1][1]:
            before, previous = factors[-1]
            raise ConfigError(
                f"{key}: RoPE factor {factor:g} is below {before.key}'s {previous:g}: factors must not "
                "shrink as the stages grow"
            )
        factors.append((stage, factor))


def training_shards(train: TrainConfig, layout: RunLayout, context: ContextConfig) -> list[str | Path]:
    """Every shard folder (or URL) the run trains on: each stage's, or the unstaged run's one."""
    if train.stages:
        return [layout.training_shards(s.config.shards, s.seq_len) for s in resolve_stages(train, layout)]
    return [layout.training_shards(train.shards, context.target)]
