"""The training loop: packed shards -> zigzag context-parallel rows -> ring attention ->
AdamW on FSDP2 shards.

One optimizer step takes ``train.global_batch_rows`` packed rows over all data-parallel ranks
(``longctx.trainer.data``); each row is split across the ``cp`` ranks of its ring (zigzag). Every rank
backpropagates the plain sum of its tokens' losses; after the step's micro-batches, one collective
gathers every rank's token count and statistics, and the gradients (summed over ranks by FSDP2, see
``longctx.trainer.parallel.sharding``) are divided by the token count of the whole batch. So the loss is the
mean over the batch's loss-masked tokens, whatever the mesh.

Around the loop: the mesh (``parallel``), the model built on the meta device and filled shard by shard
(``build``), distributed checkpoints (``checkpoint``, ``resume``) and the Hugging Face export
(``export``); the memory estimate of ``longctx plan`` (``memory``) is checked before anything loads.
"""

from __future__ import annotations

import contextlib
import math
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from longctx.core import remote
from longctx.core.config import ContextConfig
from longctx.core.errors import ConfigError, LongctxError
from longctx.core.layout import RunLayout, StageLayout
from longctx.core.runlock import run_lock
from longctx.trainer.attention.comm import WAIT_CLOCK
from longctx.trainer.build import (
    build_model,
    cp_choice,
    cp_mode_warning,
    fill_base_weights,
    model_config,
    use_bf16,
)
from longctx.trainer.checkpoint import (
    Checkpoint,
    CheckpointError,
    checkpoint_folder,
    damage,
    find_resume_checkpoint,
    load_checkpoint,
    read_trainer_state,
    save_checkpoint,
)
from longctx.trainer.config import TrainConfig
from longctx.trainer.coverage import CoverageError, CoverageTracker, check_shard_coverage, required_position
from longctx.trainer.data import StepRows
from longctx.trainer.export import EXPORT_DTYPES, export_model
from longctx.trainer.metrics import peak_flops
from longctx.trainer.models import interface
from longctx.trainer.models.files import CONFIG_NAME
from longctx.trainer.models.interface import AnyModelConfig, TrainedModel
from longctx.trainer.models.weights import stored_dtype
from longctx.trainer.parallel.layout import context_split
from longctx.trainer.parallel.mesh import CpChoice, MeshShape
from longctx.trainer.parallel.sharding import local_bytes, optimizer_tensors, scale_gradients
from longctx.trainer.parallel.state import ParallelState, all_gather_stats, init_parallel, settle, shutdown
from longctx.trainer.planning.flops import training_flops
from longctx.trainer.planning.memory import checkpointing_that_fits
from longctx.trainer.resume import check_settings, prepare_metrics
from longctx.trainer.schedule import make_scheduler
from longctx.trainer.stage_plan import Stage, export_paths
from longctx.trainer.tracking import Tracker


@dataclass
class TrainResult:
    steps: int
    losses: list[float]
    coverage: dict[str, Any]
    final_model: Path | None
    tokens_per_s: float
    resumed_from: int = 0
    records: list[dict[str, Any]] = field(default_factory=list)
    state_bytes: dict[str, int] = field(default_factory=dict)
    """This rank's and the whole model's parameter and optimizer-state bytes (see :func:`state_bytes`)."""


def state_bytes(model: TrainedModel, optimizer: torch.optim.Optimizer) -> dict[str, int]:
    """Bytes of parameters and optimizer state: this rank's shards (``*_local``) and the whole
    (``*_total``)."""
    params = list(model.parameters())
    states = list(optimizer_tensors(optimizer))
    return {
        "params_local": local_bytes(params),
        "params_total": sum(p.numel() * p.element_size() for p in params),
        "optimizer_local": local_bytes(states),
        "optimizer_total": sum(t.numel() * t.element_size() for t in states),
    }


def check_vocabulary(config: AnyModelConfig, vocab_size: int, folder: str | Path) -> None:
    """Refuse shards whose token ids may not fit an embedding of the model (``input_embedding``)."""
    rows, embedding = config.input_embedding
    if vocab_size > rows:
        raise ConfigError(
            f"the shards in {folder} use a vocabulary of {vocab_size} tokens but the model's {embedding} "
            f"has {rows} rows: pack with the model's tokenizer (or a model whose vocabulary covers it)"
        )


def device_memory(device: torch.device) -> int | None:
    """Bytes of memory one rank may count on: a GPU's own memory, or on the CPU this machine's physical
    memory shared by the ranks it runs (``LOCAL_WORLD_SIZE``); None where the machine does not say."""
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).total_memory
    try:
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None
    return physical // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))


def memory_name(device: torch.device) -> str:
    """How a refusal names the memory it checked against."""
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return "this machine's memory" + (f" shared by {ranks} ranks" if ranks > 1 else "")


def check_memory(
    tcfg: TrainConfig, config: AnyModelConfig, seq_len: int, state: ParallelState, bf16: bool
) -> str:
    """The activation checkpointing mode to build with (``memory.checkpointing_that_fits``: ``auto``
    resolved); refuses a run whose memory estimate (``longctx plan``'s) exceeds the device's memory.
    A transformers model is estimated by its dense shape (``HFModelConfig.shape``), an approximation."""
    return checkpointing_that_fits(
        tcfg.activation_checkpointing,
        config.shape,
        seq_len,
        state.cp_size,
        device_memory(state.device),
        state_shards=state.shape.shard_size,
        compute_bytes=2 if bf16 else 4,
        residual_bytes=(2 if bf16 else 4) if state.sharded else 4,
        where=memory_name(state.device),
        settings=f"{state.shape.describe()}, {seq_len}-token windows",
        report=(lambda line: print(line, flush=True)) if state.is_main else None,
    )


def make_optimizer(model: TrainedModel, tcfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on norms and biases)."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": tcfg.optim.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=tcfg.optim.lr, betas=tcfg.optim.betas, eps=tcfg.optim.eps)


def _causal_pairs(cu_seqlens: torch.Tensor) -> int:
    lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).to(torch.int64)
    return int((lengths * (lengths + 1) // 2).sum())


def train(
    train: TrainConfig,
    *,
    context: ContextConfig,
    output: Path,
    tokenizer: Path | None = None,
    progress: bool = True,
    restart: bool = False,
) -> TrainResult:
    """Run (or resume) training under the current torchrun job (or as one process).

    Reads the shards (``train.shards``, else ``<output>/shards/seq<context.target>``) and writes
    ``<output>/train``. ``tokenizer`` is the configured ``tokenizer.path``, used when the run folder
    holds no ``tokenizer.json``. ``restart`` starts from step 0 when the folder holds checkpoints but
    none is intact (see ``longctx.trainer.resume``). A staged run (``train.stages``) is
    ``longctx.trainer.stages.train_staged``'s.
    """
    if train.stages:
        raise ConfigError("train.stages: a staged run is longctx.trainer.stages.train_staged's (jobs.train)")
    with training_session(train, output) as state:
        return train_job(TrainJob(train, context, RunLayout(output), tokenizer, restart), state, progress)


@contextlib.contextmanager
def training_session(train: TrainConfig, output: Path) -> Iterator[ParallelState]:
    """This job's process group (started here unless the caller already did, and then shut down)
    and the output folder's run lock (one run per output folder, ``core/runlock.py``)."""
    import torch.distributed as dist

    owned = not (dist.is_available() and dist.is_initialized())
    state = init_parallel(train.cp, train.comm_timeout_s, train.dp_replicate)
    try:
        with run_lock(RunLayout(output).train, "train"):
            yield state
        settle(state)  # after the job's last collective (an error settles where the ranks agree on it)
    finally:
        shutdown(owned)


@dataclass(frozen=True)
class StageStart:
    """Where a stage's run starts when it has no checkpoint of its own: the previous stage's last
    checkpoint (None: the base model), with or without its optimizer state, and that checkpoint's
    :func:`~longctx.trainer.checkpoint.manifest_digest`."""

    checkpoint: Checkpoint | None
    keep_optimizer: bool = False
    manifest: str | None = None

    def origin(self, train_folder: Path) -> dict[str, str | None]:
        """What the stage starts from, as its checkpoints record it: the checkpoint's folder under
        ``train_folder`` (``base``: the base model) and its manifest digest."""
        if self.checkpoint is None:
            return {"starts_from": "base", "starts_from_manifest": None}
        folder = self.checkpoint.folder.relative_to(train_folder).as_posix()
        return {"starts_from": folder, "starts_from_manifest": self.manifest}


@dataclass(frozen=True)
class TrainJob:
    """What a training run was asked to do: its section, the context lengths and the run folder; for
    one stage of a staged run, also the stage and where it starts."""

    train: TrainConfig
    context: ContextConfig
    layout: RunLayout
    tokenizer: Path | None
    restart: bool = False
    stage: Stage | None = None
    start: StageStart | None = None

    @property
    def paths(self) -> RunLayout | StageLayout:
        """Where this run's checkpoints, metrics and exported model go: the stage's folder, or
        ``train/``."""
        return self.stage.layout if self.stage is not None else self.layout

    @property
    def steps_before(self) -> int:
        """Optimizer steps of the stages before this one (0 for an unstaged run)."""
        return self.stage.steps_before if self.stage is not None else 0


@dataclass
class _Run:
    """Everything one training run holds between steps."""

    layout: RunLayout
    rows: StepRows
    model: TrainedModel
    loss_multiplier: float
    optimizer: torch.optim.AdamW
    scheduler: torch.optim.lr_scheduler.LambdaLR
    tracker: CoverageTracker
    meta: dict[str, Any]
    seq_len: int
    bf16: bool
    cp: CpChoice
    start_step: int = 0

    @property
    def params(self) -> list[torch.nn.Parameter]:
        """The parameters the optimizer updates (and gradient clipping measures)."""
        return [p for p in self.model.parameters() if p.requires_grad]


def _settings(job: TrainJob, config: AnyModelConfig, rows: StepRows, shards_sha: str) -> dict[str, Any]:
    """What a resumed run must share with the checkpoint: data, order and model (not the mesh); for a
    stage, also the stage and the checkpoint it started from."""
    tcfg = job.train
    settings = {
        "shards_config_sha256": shards_sha,
        "seq_len": rows.seq_len,
        "model": config.to_hf(),
        "seed": tcfg.seed,
        "global_batch_rows": rows.global_batch_rows,
        "holdout_rows": tcfg.holdout_rows,
    }
    if job.stage is not None:
        start = job.start or StageStart(None)
        settings["stage"] = {
            "number": job.stage.number,
            **start.origin(job.layout.train),
            "keep_optimizer": start.keep_optimizer,
        }
    return settings


def _setup(job: TrainJob, state: ParallelState) -> _Run:
    """Data, coverage, vocabulary and memory checks, model, optimizer and schedule; restored from the
    newest intact checkpoint when there is one."""
    torch.manual_seed(job.train.seed)
    rows = _open_rows(job, state)
    _check_rows(job, rows, state)
    bf16 = use_bf16(job.train.precision, state.device)
    config, checkpointing = _checked_model_config(job, rows, state, bf16)
    cp = cp_choice(job.train, config, rows.seq_len)
    if state.is_main and state.cp_size > 1:
        how = " (auto: longctx plan's recommendation)" if job.train.cp_mode == "auto" else ""
        print(f"context parallelism: cp {state.cp_size}, {cp.describe()}{how}", flush=True)
        warning = cp_mode_warning(job.train, config, rows.seq_len, cp)
        if warning is not None:
            print(warning, flush=True)
    meta = _settings(job, config, rows, rows.dataset.shards.manifest.header.config_sha256)
    resume_from = _resume_checkpoint(job, state, meta)
    run = _build_run(
        job, state, rows, config, meta, bf16, checkpointing=checkpointing, cp=cp, start=resume_from is None
    )
    if resume_from is not None:
        _restore(run, resume_from, state)
    return run


def _open_rows(job: TrainJob, state: ParallelState) -> StepRows:
    """This rank's rows of every step, from the run's shards (copied into the cache when remote)."""
    tcfg, layout = job.train, job.layout
    return StepRows(
        layout.training_shards(tcfg.shards, job.context.target),
        tokenizer=layout.tokenizer_file(job.tokenizer),
        seed=tcfg.seed,
        holdout_rows=tcfg.holdout_rows,
        global_batch_rows=tcfg.global_batch_rows or state.dp_size,
        dp_rank=state.dp_rank,
        dp_size=state.dp_size,
        cache=tcfg.cache or layout.cache,
        storage_options=tcfg.storage_options,
    )


def _check_rows(job: TrainJob, rows: StepRows, state: ParallelState) -> None:
    """Refuse windows the ring cannot split, and shards whose positions never reach the required
    one (a warning instead with ``train.coverage.allow_short``)."""
    manifest, original = rows.dataset.shards.manifest, job.context.original
    shards = f"the shards' seq_len ({rows.dataset.shards.source})"
    MeshShape.check_window(rows.seq_len, state.cp_size, length_key=shards, cp_key="train.cp")
    coverage = job.train.coverage
    required = required_position(job.context.target, coverage.required_position)
    try:
        check_shard_coverage(
            manifest.max_position,
            {name: s.max_position for name, s in manifest.sources.items()},
            required,
            original,
            configured=coverage.required_position,
            allow_short=coverage.allow_short,
        )
    except CoverageError as err:
        if not coverage.allow_short:
            raise
        if state.is_main:
            print(f"warning (train.coverage.allow_short): {err}", flush=True)


def _checked_model_config(
    job: TrainJob, rows: StepRows, state: ParallelState, bf16: bool
) -> tuple[AnyModelConfig, str]:
    """The model to train, once its embedding covers the shards' vocabulary, its attention the
    windows, and the memory estimate the device; and the activation checkpointing mode it fits with
    (``train.activation_checkpointing``, ``auto`` resolved)."""
    header = rows.dataset.shards.manifest.header
    config = model_config(job.train, job.context, header.tokenizer.vocab_size)
    check_vocabulary(config, header.tokenizer.vocab_size, rows.dataset.shards.source)
    interface.check(config, rows.seq_len)
    return config, check_memory(job.train, config, rows.seq_len, state, bf16)


def _resume_checkpoint(job: TrainJob, state: ParallelState, meta: dict[str, Any]) -> Checkpoint | None:
    """The newest intact checkpoint to resume from, once its settings match this run's; None to
    start at step 0."""
    found = find_resume_checkpoint(
        job.paths.checkpoints, state, restart=job.restart, report=lambda m: print(m, flush=True)
    )
    if found is not None:
        check_settings(found.folder, read_trainer_state(found.folder)["meta"], meta)
    return found


def _build_run(
    job: TrainJob,
    state: ParallelState,
    rows: StepRows,
    config: AnyModelConfig,
    meta: dict[str, Any],
    bf16: bool,
    *,
    checkpointing: str,
    cp: CpChoice,
    start: bool,
) -> _Run:
    """The sharded model, its optimizer, schedule and coverage tracker, at step 0; with ``start``,
    the weights (and optimizer state) the run starts from (:func:`_start_weights`)."""
    tcfg = job.train
    built = build_model(
        config,
        state,
        activation_checkpointing=checkpointing,
        bf16=bf16,
        kernels=tcfg.kernels,
        compile_cache=job.layout.compile_cache,
        cp=cp,
    )
    optimizer = make_optimizer(built.model, tcfg)
    if start:
        _start_weights(job, built.model, optimizer, state)
    return _Run(
        layout=job.layout,
        rows=rows,
        model=built.model,
        loss_multiplier=built.loss_multiplier,
        optimizer=optimizer,
        scheduler=make_scheduler(optimizer, tcfg.optim.warmup_steps, tcfg.steps, tcfg.optim.min_lr_ratio),
        tracker=CoverageTracker(job.context.original, rows.seq_len, tcfg.coverage.max_steps_without_long),
        meta=meta,
        seq_len=rows.seq_len,
        bf16=bf16,
        cp=cp,
    )


def _start_weights(
    job: TrainJob, model: TrainedModel, optimizer: torch.optim.AdamW, state: ParallelState
) -> None:
    """The base model's weights, or a later stage's start: the previous stage's last checkpoint's
    weights and, with ``keep_optimizer``, its AdamW moments under this stage's hyperparameters (the
    learning-rate schedule restarts; the checkpoint's RNG states are not taken)."""
    start = job.start
    if start is None or start.checkpoint is None or job.stage is None:
        fill_base_weights(model, job.train)
        return
    checkpoint, name = start.checkpoint, job.stage.describe()
    problem = damage(checkpoint.folder, state)
    if problem is not None:
        raise CheckpointError(f"{name} starts from {checkpoint.folder}, which is damaged: {problem}")
    kept = optimizer if start.keep_optimizer else None
    load_checkpoint(checkpoint, model, kept, state, restore_rng=False)
    if kept is not None:
        optim = job.train.optim
        for group, decay in zip(kept.param_groups, (optim.weight_decay, 0.0), strict=True):
            group.update(lr=optim.lr, betas=optim.betas, eps=optim.eps, weight_decay=decay)
            group.pop("initial_lr", None)  # the new schedule takes this stage's lr as its peak
    if state.is_main:
        what = "weights and optimizer state" if kept is not None else "weights"
        print(f"{name} starts from the {what} of {checkpoint.folder}", flush=True)


def _restore(run: _Run, checkpoint: Checkpoint, state: ParallelState) -> None:
    """Weights, optimizer, schedule, data position and coverage from ``checkpoint``."""
    saved = load_checkpoint(checkpoint, run.model, run.optimizer, state)
    run.start_step = checkpoint.step
    run.scheduler.load_state_dict(saved["scheduler"])
    run.rows.load_state_dict(saved["data"])
    for key, value in saved["coverage"].items():
        setattr(run.tracker, key, value)
    if state.is_main:
        print(
            f"resuming from {checkpoint.folder} (step {run.start_step}, {state.shape.describe()})", flush=True
        )


@dataclass
class _StepStats:
    """One optimizer step's sums over all ranks."""

    loss: float
    bucket_loss: list[float]
    bucket_count: list[int]
    max_position: int
    comm_s: float
    attention_score_fraction: float | None


def _forward_backward(
    run: _Run, shards: list, state: ParallelState, bf16: bool, position_losses: bool
) -> _StepStats:
    """Backward of every micro-batch's summed token losses, then one collective for the step's token
    count and statistics, and the gradients divided by the batch's token count.

    Loss by position is binned only when ``position_losses`` is set (logged steps); the position
    counts for coverage are always kept.
    """
    n_buckets = len(run.tracker.edges)
    score_fractions: list[float] = []
    # local token count, loss sum, largest trained position, loss per bucket, tokens per bucket
    stats = torch.zeros(3 + 2 * n_buckets, dtype=torch.float64)
    stats[2] = -1
    device = state.device
    for shard in shards:
        labels = torch.where(shard.loss_mask, shard.labels, -100).to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            token_losses = run.model(
                shard.input_ids.to(device),
                shard.position_ids.to(device),
                shard.indices.to(device),
                shard.segment_ids.to(device),
                rope_seq_len=run.seq_len,
                labels=labels,
            )
        loss_sum = token_losses.sum()
        (loss_sum * run.loss_multiplier if run.loss_multiplier != 1.0 else loss_sum).backward()
        ring_stats = getattr(run.model.attention, "last_stats", None)
        if ring_stats is not None:
            score_fractions.append(ring_stats.score_fraction)
        mask = shard.loss_mask
        stats[0] += int(mask.sum())
        stats[1] += float(loss_sum.detach())
        if mask.any():
            stats[2] = max(float(stats[2]), float(shard.position_ids[mask].max()))
        if position_losses:
            per_token = token_losses.detach().double().cpu()
            stats[3 : 3 + n_buckets].index_add_(
                0, run.tracker.bucket_of(shard.position_ids)[mask], per_token[mask]
            )
        stats[3 + n_buckets :] += run.tracker.local_counts(shard.position_ids, mask).double()
    start = time.perf_counter()
    every_rank = all_gather_stats(stats, state)
    comm = time.perf_counter() - start
    total = every_rank.sum(0)
    count = float(total[0])
    if count == 0:
        raise ValueError("no loss-masked token in the step's windows")
    scale_gradients([p for p in run.model.parameters() if p.requires_grad], 1.0 / count)
    return _StepStats(
        loss=float(total[1]) / count,
        bucket_loss=total[3 : 3 + n_buckets].tolist(),
        bucket_count=total[3 + n_buckets :].round().to(torch.int64).tolist(),
        max_position=int(every_rank[:, 2].max()),
        comm_s=comm,
        attention_score_fraction=sum(score_fractions) / len(score_fractions) if score_fractions else None,
    )


def _trainer_state(run: _Run, job: TrainJob, state: ParallelState) -> dict[str, Any]:
    """``trainer.json`` of a checkpoint: schedule, data position, coverage, settings and config."""
    return {
        "meta": run.meta,
        "scheduler": run.scheduler.state_dict(),
        "data": run.rows.state_dict(),
        "coverage": _tracker_state(run.tracker),
        "mesh": {"world_size": state.world_size, **state.shape.__dict__},
        "config": {
            "train": job.train.model_dump(mode="json"),
            "context": job.context.model_dump(mode="json"),
        },
    }


def export_dtype(tcfg: TrainConfig) -> torch.dtype:
    """``train.export.dtype``; ``auto``: the base checkpoint's dtype, float32 for the tiny model."""
    if tcfg.export.dtype != "auto":
        return EXPORT_DTYPES[tcfg.export.dtype]
    return stored_dtype(tcfg.model.hf_path) if tcfg.model.hf_path is not None else torch.float32


def _export(model: TrainedModel, job: TrainJob, state: ParallelState, folder: Path) -> Path:
    """Write the Hugging Face folder ``folder``; with ``train.export.output``, rank 0 then publishes it
    to ``<train.export.output>/<its path under <output>/train>`` (``config.json`` last)."""
    written = export_model(
        model,
        folder,
        state,
        dtype=export_dtype(job.train),
        tokenizer=job.layout.tokenizer_file(job.tokenizer),
        base=job.train.model.hf_path,
        max_shard_size=job.train.export.max_shard_size,
    )
    url = job.train.export.output
    if url is not None and state.is_main:
        target = remote.join(url, folder.relative_to(job.layout.train).as_posix())
        remote.publish_folder(folder, target, last=CONFIG_NAME, storage_options=job.train.storage_options)
        print(f"published {folder} to {target}", flush=True)
    return written


def train_job(job: TrainJob, state: ParallelState, progress: bool) -> TrainResult:
    """Set the run up, take its remaining steps (recording, logging and checkpointing each), and
    export the trained model."""
    run = _setup(job, state)
    tcfg, paths = job.train, job.paths
    if state.is_main:
        prepare_metrics(paths.metrics, run.start_step, job.restart)
    run_config = {"train": tcfg.model_dump(mode="json"), **run.meta}
    writer = None
    if state.is_main:  # the trackers' step is the run's global one: one run across stages
        resumed = job.steps_before + run.start_step
        writer = Tracker(tcfg.log, run.layout, resumed, run_config, metrics=paths.metrics)
    peak = peak_flops(state.device, None)
    desc = f"stage {job.stage.number} ({job.stage.seq_len})" if job.stage is not None else "train"
    bar = _progress_bar(tcfg.steps, run.start_step, desc) if progress and state.is_main else None
    records: list[dict[str, Any]] = []
    tokens_seen, time_spent = 0, 0.0
    try:  # the bar's line is ended even when a step fails, so an error prints on a line of its own
        for step in range(run.start_step, tcfg.steps):
            logged = (step + 1) % tcfg.log.every == 0 or step + 1 == tcfg.steps
            measured = _optimizer_step(run, state, step, tcfg.optim.grad_clip, logged)
            tokens_seen += measured.tokens
            time_spent += measured.seconds
            record = _step_record(run, state, step, measured, peak, job.context.original, logged)
            if job.stage is not None:
                record |= {"stage": job.stage.number, "global_step": job.steps_before + step + 1}
            records.append(record)
            if writer is not None and logged:
                writer.write(record)
            if bar is not None:
                bar.set_postfix(loss=f"{record['loss']:.3f}", tok_s=f"{record['tokens_per_s']:.0f}")
                bar.update(1)
            if not tcfg.coverage.allow_short:
                run.tracker.check()
            if (step + 1) % tcfg.checkpoint.every == 0 or step + 1 == tcfg.steps:
                _save_checkpoint(run, job, state, step + 1)
    finally:
        if bar is not None:
            bar.close()
    if writer is not None:
        writer.close()
    final = _export(run.model, job, state, paths.final_model)
    return TrainResult(
        steps=tcfg.steps,
        losses=[r["loss"] for r in records],
        coverage=run.tracker.summary(),
        final_model=final if state.is_main else None,
        tokens_per_s=tokens_seen / time_spent if time_spent else 0.0,
        resumed_from=run.start_step,
        records=records,
        state_bytes=state_bytes(run.model, run.optimizer),
    )


def _progress_bar(steps: int, start: int, desc: str) -> Any:
    """The training progress bar (rank 0), starting at ``start`` of ``steps``."""
    from tqdm import tqdm

    return tqdm(total=steps, initial=start, desc=desc, unit="step", dynamic_ncols=True)


@dataclass(frozen=True)
class _Measured:
    """What one optimizer step did, summed over all ranks."""

    stats: _StepStats
    grad_norm: float
    lr: float
    seconds: float
    comm_s: float
    """Seconds spent in collectives: the step's statistics and the ring's waits."""
    tokens: int
    causal_pairs: int
    """(query, key) pairs causal attention computed over the step's windows (its FLOPs)."""


def _optimizer_step(run: _Run, state: ParallelState, step: int, grad_clip: float, logged: bool) -> _Measured:
    """Step ``step + 1``: the next rows, split over the ring, forward and backward, gradients clipped
    to ``grad_clip``, AdamW and the schedule; loss by position binned when ``logged``."""
    start, ring_wait_before = time.perf_counter(), WAIT_CLOCK.seconds
    micro = run.rows.next_step()
    shards = [
        context_split(
            m, cp=state.cp_size, cp_rank=state.cp_rank, layout=run.cp.layout, ulysses=run.cp.ulysses
        )
        for m in micro
    ]
    stats = _forward_backward(run, shards, state, run.bf16, position_losses=logged)
    if not math.isfinite(stats.loss):
        raise FloatingPointError(f"step {step + 1}: loss is {stats.loss}")
    grad_norm = float(torch.nn.utils.clip_grad_norm_(run.params, grad_clip))
    lr = run.scheduler.get_last_lr()[0]
    run.optimizer.step()
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    run.tracker.add(stats.bucket_count, stats.max_position)
    elapsed = time.perf_counter() - start
    return _Measured(
        stats=stats,
        grad_norm=grad_norm,
        lr=lr,
        seconds=elapsed,
        comm_s=stats.comm_s + WAIT_CLOCK.seconds - ring_wait_before,
        tokens=run.seq_len * run.rows.global_batch_rows,
        causal_pairs=sum(_causal_pairs(m["cu_seqlens"]) for m in micro) * state.dp_size,
    )


def _step_record(
    run: _Run,
    state: ParallelState,
    step: int,
    measured: _Measured,
    peak: float | None,
    original: int,
    logged: bool,
) -> dict[str, Any]:
    """The metrics record of step ``step + 1`` (``metrics.jsonl``, trackers); loss by position only
    when ``logged``."""
    stats, tracker, elapsed = measured.stats, run.tracker, measured.seconds
    flops = training_flops(run.model.config.shape, measured.tokens, measured.causal_pairs)
    counts = stats.bucket_count
    return {
        "step": step + 1,
        "loss": stats.loss,
        "lr": measured.lr,
        "grad_norm": measured.grad_norm,
        "tokens_per_s": measured.tokens / elapsed,
        "mfu": flops / elapsed / (peak * state.world_size) if peak else None,
        "comm_fraction": measured.comm_s / elapsed,
        "attention_score_fraction": stats.attention_score_fraction,
        "max_position": tracker.max_position,
        "long_token_fraction": sum(c for e, c in zip(tracker.edges, counts) if e >= original)
        / max(1, sum(counts)),
        "loss_by_position": {
            str(edge): total / n if n and logged else None
            for edge, total, n in zip(tracker.edges, stats.bucket_loss, counts)
        },
    }


def _save_checkpoint(run: _Run, job: TrainJob, state: ParallelState, step: int) -> None:
    """The distributed checkpoint of ``step`` (the oldest beyond ``train.checkpoint.keep`` removed)."""
    save_checkpoint(
        job.paths.checkpoints,
        step,
        run.model,
        run.optimizer,
        _trainer_state(run, job, state),
        state,
        job.train.checkpoint.keep,
    )


def export_checkpoint(
    train: TrainConfig,
    *,
    context: ContextConfig,
    output: Path,
    step: int,
    tokenizer: Path | None = None,
    stage: int | None = None,
) -> Path:
    """``longctx train --export STEP [--stage K]``: write checkpoint ``step`` (of stage ``stage`` in a
    staged run) as a Hugging Face folder under ``<output>/train/export/`` (the stage's ``export/``), at
    any world size: the model is sharded over every rank of this job (no ring: exporting runs no
    attention, so ``train.cp`` and ``train.dp_replicate`` do not apply) and DCP reshards the checkpoint
    onto it, whatever mesh wrote it."""
    import torch.distributed as dist

    layout = RunLayout(output)
    paths = export_paths(train, layout, stage)
    owned = not (dist.is_available() and dist.is_initialized())
    state = init_parallel(1, train.comm_timeout_s)
    try:
        folder = checkpoint_folder(paths.checkpoints, step)
        if not folder.is_dir():
            raise CheckpointError(f"no checkpoint of step {step} in {paths.checkpoints}")
        problem = damage(folder, state)
        if problem is not None:
            raise CheckpointError(f"checkpoint {folder} is damaged: {problem}")
        saved = read_trainer_state(folder)
        config = interface.from_hf(saved["meta"]["model"], train.model.implementation)
        built = build_model(config, state, activation_checkpointing="none", bf16=False)
        load_checkpoint(Checkpoint(folder, step), built.model, None, state)
        exported = _export(
            built.model, TrainJob(train, context, layout, tokenizer), state, paths.export(step)
        )
    except LongctxError:
        settle(state)  # every rank raises these together: the same checks, or agreed by first_problem
        raise
    else:
        settle(state)  # after the export's last collective
        return exported
    finally:
        shutdown(owned)


def _tracker_state(tracker: CoverageTracker) -> dict[str, Any]:
    return {
        "histogram": list(tracker.histogram),
        "max_position": tracker.max_position,
        "steps_without_long": tracker.steps_without_long,
        "long_tokens": tracker.long_tokens,
    }
