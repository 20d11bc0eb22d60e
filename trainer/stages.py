"""Running a staged run (``train.stages``): each stage in turn, then its gate.

Every rank runs this loop, under ``longctx train --nproc``, a plain ``torchrun`` or alone. For
each stage (``longctx.trainer.stage_plan``):

1. **Train.** A stage whose last checkpoint is at its last step and whose model is exported is
   finished and left as it is (not even re-exported). Otherwise it is an ordinary training run
   (``longctx.trainer.train.train_job``) in its own folder: it resumes from its newest intact
   checkpoint, or starts from the previous stage's last checkpoint (weights, and with
   ``keep_optimizer`` the AdamW moments; the learning-rate schedule restarts with the stage's
   ``lr``), the first stage from the base model. So a run killed mid-stage resumes in that stage,
   and one killed between stages starts the next one. Each stage's checkpoints record the
   checkpoint it started from (its folder and manifest digest); a stage that started from another
   one than the previous stage ends with now (that stage's steps were raised, or it was trained
   again) is out of date, finished or not: its folder is set aside as
   ``<k>-<N>.superseded-<m>`` and it is trained again, and so in turn are the stages after it.
2. **Gate.** With a ``gate``, rank 0 measures it once every rank has freed the stage's model
   (``longctx.trainer.evaluation.gates``; a result recorded for the same step and settings is reused) and
   hands the verdict to the other ranks. A failed gate stops every rank with one line
   (:class:`~longctx.trainer.evaluation.gates.GateFailed`, exit status 2), leaving the finished stages as they
   are; with ``train.on_gate_fail: continue`` the failure is printed and the next stage starts.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass, replace
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from longctx.core.config import ContextConfig
from longctx.core.errors import OutputError
from longctx.core.layout import RunLayout
from longctx.core.preflight import disk_faults
from longctx.trainer.checkpoint import (
    Checkpoint,
    checkpoint_folder,
    latest_checkpoint,
    manifest_digest,
    read_trainer_state,
)
from longctx.trainer.config import TrainConfig
from longctx.trainer.evaluation.gates import (
    GateFailed,
    GateMemo,
    GateResult,
    GateSettings,
    evaluate_gate,
    failure_line,
    recorded_gate,
)
from longctx.trainer.models.files import is_model_folder
from longctx.trainer.parallel.state import ParallelState, barrier, first_problem
from longctx.trainer.resume import finished_run
from longctx.trainer.stage_plan import Stage, resolve_stages, stage_context, stage_train_config
from longctx.trainer.train import StageStart, TrainJob, TrainResult, train_job, training_session

GATE_WAIT = timedelta(hours=24)
"""How long the other ranks wait for rank 0's gate evaluation (a hang guard, not a budget)."""


@dataclass(frozen=True)
class StageOutcome:
    """What one stage did in this run: ``result`` (None: finished in an earlier run) and its gate
    (None: no gate)."""

    stage: Stage
    result: TrainResult | None
    gate: GateResult | None


@dataclass(frozen=True)
class StagedResult:
    """Every stage's outcome, in order, and the run's trained model (the last stage's export; None
    on ranks other than 0)."""

    stages: list[StageOutcome]
    final_model: Path | None


def stage_finished(stage: Stage) -> bool:
    """Whether the stage's last checkpoint is at its last step and its model is exported."""
    latest = latest_checkpoint(stage.layout.checkpoints)
    done = latest is not None and latest.step >= stage.steps
    return done and is_model_folder(stage.layout.final_model)


def finished_stages(
    train: TrainConfig, layout: RunLayout, settings: GateSettings
) -> list[StageOutcome] | None:
    """Every stage of a finished staged run with its recorded gate, or None when training, an export
    or a gate is left to do: finished means each stage is, by ``resume.finished_run``'s rule in its
    folder, started from the checkpoint the stage before it ends with (:func:`out_of_date`), and
    each gate has a result recorded for the stage's last step and ``settings`` that passed (or
    failed under ``on_gate_fail: continue``; a failed gate that stops the run is not finished:
    started again, the run stops again with its line)."""
    outcomes = []
    previous: Stage | None = None
    for stage in resolve_stages(train, layout):
        if finished_run(stage.layout, stage.steps) is None:
            return None
        if previous is not None and out_of_date(stage, previous, stage_start(previous, stage), layout):
            return None
        previous = stage
        gate = recorded_gate(stage, settings) if stage.gate is not None else None
        if stage.gate is not None and (gate is None or (not gate.passed and train.on_gate_fail == "stop")):
            return None
        outcomes.append(StageOutcome(stage, None, gate))
    return outcomes


def describe_finished_stages(outcomes: list[StageOutcome]) -> str:
    """What ``longctx train`` prints for a finished staged run: each stage's results and gate, the
    trained model, and how to go on."""
    lines = ["training already finished: every stage of train.stages is trained; nothing to do"]
    for outcome in outcomes:
        stage = outcome.stage
        lines.append(f"{stage.describe()}: model {stage.layout.final_model}; metrics {stage.layout.metrics}")
        if outcome.gate is not None:
            verdict = "passed" if outcome.gate.passed else "FAILED (train.on_gate_fail: continue)"
            lines.append(f"  gate {verdict}: {outcome.gate.summary()}")
    lines += [
        f"final model: {outcomes[-1].stage.layout.final_model}",
        "add steps or stages to train.stages to train further, or train into another output folder",
    ]
    return "\n".join(lines)


def stage_start(previous: Stage | None, stage: Stage) -> StageStart:
    """Where ``stage`` starts without a checkpoint of its own: the previous stage's newest checkpoint,
    at its last step (or beyond, when its steps were lowered after it trained: its model is that
    checkpoint's); the first stage from the base model."""
    if previous is None:
        return StageStart(None)
    newest = latest_checkpoint(previous.layout.checkpoints)
    if newest is None or newest.step < previous.steps:  # not trained yet: the step it will end at
        newest = Checkpoint(checkpoint_folder(previous.layout.checkpoints, previous.steps), previous.steps)
    return StageStart(newest, stage.config.keep_optimizer, manifest_digest(newest.folder))


def out_of_date(stage: Stage, previous: Stage, start: StageStart, layout: RunLayout) -> str | None:
    """Why ``stage``'s checkpoints (and model) no longer follow from ``previous``: their newest
    records that it started from another checkpoint than ``start``, or from the same folder with
    other contents (``previous`` was trained again). None when the stage has no checkpoint yet, or
    started from ``start`` (a damaged newest checkpoint is left to the resume, which reports it)."""
    newest = latest_checkpoint(stage.layout.checkpoints)
    if newest is None or start.checkpoint is None:
        return None
    try:
        recorded = read_trainer_state(newest.folder)["meta"]["stage"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    expected = start.origin(layout.train)
    if all(recorded.get(key) == value for key, value in expected.items()):
        return None
    began = f"{stage.describe()} started from {layout.train / str(recorded.get('starts_from'))}"
    if recorded.get("starts_from") == expected["starts_from"]:
        return f"{began}, which {previous.describe()} has written again since"
    return f"{began}, but {previous.describe()} now ends with {start.checkpoint.folder}"


def _set_aside(stage: Stage, reason: str, state: ParallelState) -> None:
    """Move an out-of-date stage's folder to ``<k>-<N>.superseded-<m>`` (rank 0, once every rank has
    read it), so that it is trained again from the start; a disk fault stops every rank."""
    barrier(state)
    problem = None
    if state.is_main:
        number = 1
        while (aside := stage.layout.superseded(number)).exists():
            number += 1
        try:
            with disk_faults(aside):
                stage.layout.folder.rename(aside)
        except OutputError as err:
            problem = str(err)
        else:
            print(f"{reason}: training it again; its earlier results are kept in {aside}", flush=True)
    problem = first_problem(problem, state)
    if problem is not None:
        raise OutputError(problem)


def _free_memory(state: ParallelState) -> None:
    """Return the finished stage's model and optimizer memory before the gate loads models."""
    gc.collect()
    if state.device.type == "cuda":
        torch.cuda.empty_cache()


def train_staged(
    train: TrainConfig,
    *,
    context: ContextConfig,
    output: Path,
    tokenizer: Path | None = None,
    progress: bool = True,
    restart: bool = False,
    gates: GateSettings | None = None,
) -> StagedResult:
    """Run (or resume) a staged run under the current torchrun job (or as one process): the
    arguments of ``longctx.trainer.train.train``, and ``gates``, the settings the gates measure with
    (the run's ``eval`` section and curated documents)."""
    with training_session(train, output) as state:
        job = TrainJob(train, context, RunLayout(output), tokenizer, restart)
        return train_stages(job, state, progress, gates)


def train_stages(
    job: TrainJob, state: ParallelState, progress: bool, gates: GateSettings | None
) -> StagedResult:
    """Run (or resume) every stage of ``job.train.stages`` and check their gates (see the module
    docstring). ``job`` is the whole run's; ``gates`` the settings the gates measure with."""
    settings = gates or GateSettings()
    stages = resolve_stages(job.train, job.layout)
    wait_group = None
    if state.world_group is not None and any(s.gate is not None for s in stages):
        wait_group = dist.new_group(backend="gloo", timeout=GATE_WAIT)
    outcomes: list[StageOutcome] = []
    previous: Stage | None = None
    memo = GateMemo()  # what the gates measure alike (the guard's windows, the baseline's figures)
    for stage in stages:
        start = stage_start(previous, stage)
        stale = out_of_date(stage, previous, start, job.layout) if previous is not None else None
        if stale is not None:
            _set_aside(stage, stale, state)
        result = None
        if stage_finished(stage):
            if state.is_main:
                print(f"{stage.describe()}: finished in an earlier run ({stage.layout.folder})", flush=True)
        else:
            stage_job = replace(
                job,
                train=stage_train_config(job.train, stage),
                context=stage_context(job.context, stage),
                stage=stage,
                start=start,
            )
            result = train_job(stage_job, state, progress)
            _free_memory(state)
        gate = _gate(stage, job, state, settings, memo, wait_group) if stage.gate is not None else None
        outcomes.append(StageOutcome(stage, result, gate))
        if gate is not None and not gate.passed:
            line = failure_line(
                gate,
                stage,
                job.layout,
                on_gate_fail=job.train.on_gate_fail,
                effective=settings.section.effective,
            )
            if job.train.on_gate_fail == "stop":
                raise GateFailed(line)
            if state.is_main:
                print(f"warning: {line}; going on (train.on_gate_fail: continue)", flush=True)
        elif gate is not None and state.is_main:
            print(f"{stage.describe()}: gate passed ({gate.summary()})", flush=True)
        previous = stage
    return StagedResult(outcomes, stages[-1].layout.final_model if state.is_main else None)


def _gate(
    stage: Stage,
    job: TrainJob,
    state: ParallelState,
    settings: GateSettings,
    memo: GateMemo,
    group: dist.ProcessGroup | None,
) -> GateResult:
    """The stage's gate result: recorded, or measured on rank 0 and written to the stage's folder;
    every rank gets rank 0's."""
    from longctx.core.atomic import write_json

    found: GateResult | None = None
    if state.is_main:
        found = recorded_gate(stage, settings)
        if found is not None:
            print(f"{stage.describe()}: gate result recorded in {stage.layout.gate}", flush=True)
        else:
            found = evaluate_gate(
                stage,
                train=job.train,
                context=job.context,
                layout=job.layout,
                tokenizer=job.tokenizer,
                settings=settings,
                device=state.device,
                memo=memo,
            )
            write_json(stage.layout.gate, found.as_json())
            _free_memory(state)
    if group is not None:
        box = [found.as_json() if found is not None else None]
        dist.broadcast_object_list(box, src=0, group=group)
        found = GateResult.from_json(box[0])
    assert found is not None
    return found
