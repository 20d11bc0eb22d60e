"""The training loop: packed shards -> zigzag context-parallel rows -> ring attention -> AdamW.

One optimizer step takes ``grad_accum`` packed rows per data-parallel rank; each row is split
across the ``cp`` ranks of its ring (zigzag). The loss is the sum of token losses over the whole
data- x context-parallel group divided by the group's number of loss-masked tokens, so it does not
depend on how windows are split; gradients are summed over all ranks.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from longctx.core.config import ContextConfig
from longctx.core.errors import ConfigError
from longctx.core.layout import RunLayout
from longctx.packer.dataset import PackedDataset
from longctx.trainer.attention.comm import WAIT_CLOCK
from longctx.trainer.attention.zigzag import zigzag_split
from longctx.trainer.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from longctx.trainer.config import TrainConfig
from longctx.trainer.coverage import CoverageError, CoverageTracker, check_shard_coverage, required_position
from longctx.trainer.flops import training_flops
from longctx.trainer.hf_io import load_config as load_hf_config
from longctx.trainer.hf_io import load_weights, save_model
from longctx.trainer.metrics import peak_flops, token_losses
from longctx.trainer.model import ModelConfig, RingAttention, Transformer
from longctx.trainer.parallel import (
    ParallelState,
    all_reduce_max,
    all_reduce_sum,
    init_parallel,
    shutdown,
    sync_gradients,
)
from longctx.trainer.schedule import make_scheduler
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


def shards_folder(train: TrainConfig, layout: RunLayout, target: int) -> Path:
    """``train.shards``, else the packer's output for the ``target`` context."""
    return train.shards or layout.shard_folder(target)


def tokenizer_file(layout: RunLayout, configured: Path | None) -> Path | None:
    """The tokenizer the shards were packed with: the run's ``tokenizer.json`` (curation copies it
    there), else the configured ``tokenizer.path``."""
    return layout.tokenizer if layout.tokenizer.exists() else configured


def build_model(
    tcfg: TrainConfig, context: ContextConfig, vocab_size: int, state: ParallelState
) -> Transformer:
    """The model of ``train.model`` with the run's RoPE settings, on the run's device."""
    section = tcfg.model
    if section.hf_path is not None:
        model_cfg = load_hf_config(section.hf_path)
    else:
        model_cfg = ModelConfig.tiny(vocab_size=vocab_size, **section.tiny.model_dump())
    model_cfg = model_cfg.with_rope(
        rope_scaling=section.rope_scaling, rope_theta=section.rope_theta, max_position_embeddings=context.target
    )
    if model_cfg.vocab_size < vocab_size:
        raise ValueError(f"the shards' vocabulary ({vocab_size}) is larger than the model's ({model_cfg.vocab_size})")
    model = Transformer(
        model_cfg, attention=RingAttention(group=state.cp_group), activation_checkpointing=tcfg.activation_checkpointing
    )
    if section.hf_path is not None:
        load_weights(model, section.hf_path)
    else:
        model.init_weights(generator=torch.Generator().manual_seed(tcfg.seed))
    return model.to(state.device)


def make_optimizer(model: Transformer, tcfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (not on norms and biases)."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [{"params": decay, "weight_decay": tcfg.optim.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=tcfg.optim.lr, betas=tcfg.optim.betas, eps=tcfg.optim.eps)


def _rows(dataset: PackedDataset) -> Iterator[dict[str, torch.Tensor]]:
    """Rows forever, epoch after epoch (the dataset moves its own epoch on)."""
    while True:
        yield from dataset


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
) -> TrainResult:
    """Run (or resume) training under the current torchrun job (or as one process).

    Reads the shards (``train.shards``, else ``<output>/shards/seq<context.target>``) and writes
    ``<output>/train``. ``tokenizer`` is the configured ``tokenizer.path``, used when the run folder
    holds no ``tokenizer.json``.
    """
    state = init_parallel(train.cp, train.comm_timeout_s)
    try:
        return _train(_Job(train, context, RunLayout(output), tokenizer), state, progress)
    finally:
        shutdown()


@dataclass(frozen=True)
class _Job:
    """What a training run was asked to do: its section, the context lengths and the run folder."""

    train: TrainConfig
    context: ContextConfig
    layout: RunLayout
    tokenizer: Path | None


@dataclass
class _Run:
    """Everything one training run holds between steps."""

    layout: RunLayout
    dataset: PackedDataset
    model: Transformer
    optimizer: torch.optim.AdamW
    scheduler: torch.optim.lr_scheduler.LambdaLR
    tracker: CoverageTracker
    meta: dict[str, Any]
    seq_len: int
    start_step: int


def _setup(job: _Job, state: ParallelState) -> _Run:
    """Data, coverage check, model, optimizer and schedule; restored from the latest checkpoint."""
    tcfg, layout = job.train, job.layout
    torch.manual_seed(tcfg.seed)
    dataset = PackedDataset(
        shards_folder(tcfg, layout, job.context.target),
        tokenizer=tokenizer_file(layout, job.tokenizer),
        seed=tcfg.seed,
        dp_rank=state.dp_rank,
        dp_world_size=state.dp_size,
        holdout_rows=tcfg.holdout_rows,
    )
    manifest = dataset.shards.manifest
    seq_len, original = dataset.seq_len, job.context.original
    if seq_len % (2 * state.cp_size):
        raise ConfigError(f"the shards' seq_len {seq_len} is not divisible by 2 * train.cp = {2 * state.cp_size}")
    required = required_position(original, job.context.target, tcfg.coverage.required_position)
    try:
        check_shard_coverage(
            manifest.max_position, {name: s.max_position for name, s in manifest.sources.items()}, required, original
        )
    except CoverageError as err:
        if not tcfg.coverage.allow_short:
            raise
        if state.is_main:
            print(f"warning (train.coverage.allow_short): {err}", flush=True)
    model = build_model(tcfg, job.context, manifest.header.tokenizer.vocab_size, state)
    model.config.check_context_length(seq_len)
    optimizer = make_optimizer(model, tcfg)
    scheduler = make_scheduler(optimizer, tcfg.optim.warmup_steps, tcfg.steps, tcfg.optim.min_lr_ratio)
    run = _Run(
        layout=layout,
        dataset=dataset,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        tracker=CoverageTracker(original, seq_len, tcfg.coverage.max_steps_without_long),
        meta={
            "world_size": state.world_size,
            "cp": state.cp_size,
            "shards_config_sha256": manifest.header.config_sha256,
            "seq_len": seq_len,
            "model": model.config.to_hf(),
            "seed": tcfg.seed,
            "grad_accum": tcfg.grad_accum,
        },
        seq_len=seq_len,
        start_step=0,
    )
    resume_from = latest_checkpoint(layout.checkpoints)
    if resume_from is not None:
        run.start_step, rank_state = load_checkpoint(resume_from, model, optimizer, scheduler, state.rank, run.meta)
        dataset.load_state_dict(rank_state["data"])
        for key, value in rank_state["coverage"].items():
            setattr(run.tracker, key, value)
        if state.is_main:
            print(f"resuming from {resume_from} (step {run.start_step})", flush=True)
    return run


@dataclass
class _StepStats:
    """One optimizer step's sums over all ranks."""

    loss: float
    bucket_loss: list[float]
    bucket_count: list[int]
    max_position: int
    comm_s: float
    attention_score_fraction: float | None


def _forward_backward(run: _Run, shards: list, state: ParallelState, bf16: bool, position_losses: bool) -> _StepStats:
    """Backward of every micro-batch with the loss divided by the group's token count, gradients
    summed over ranks, and the step's loss and per-bucket statistics reduced over ranks.

    Loss by position costs one more pass of the LM head, so it is computed only when
    ``position_losses`` is set (on logged steps); the position counts for coverage are always kept.
    """
    comm = 0.0
    n_buckets = len(run.tracker.edges)
    score_fractions: list[float] = []
    count = torch.tensor(float(sum(int(s.loss_mask.sum()) for s in shards)), dtype=torch.float64)
    t = time.perf_counter()
    all_reduce_sum(count, state)
    comm += time.perf_counter() - t
    if count.item() == 0:
        raise ValueError("no loss-masked token in the step's windows")
    run.optimizer.zero_grad(set_to_none=True)
    stats = torch.zeros(1 + 2 * n_buckets, dtype=torch.float64)  # loss sum, loss per bucket, tokens per bucket
    device = state.device
    for shard in shards:
        labels = torch.where(shard.loss_mask, shard.labels, -100).to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            hidden = run.model(
                shard.input_ids.to(device),
                shard.position_ids.to(device),
                shard.indices.to(device),
                shard.segment_ids.to(device),
                rope_seq_len=run.seq_len,
            )
            loss_sum = run.model.cross_entropy_sum(hidden, labels)
        ring_stats = getattr(run.model.attention, "last_stats", None)
        if ring_stats is not None:
            score_fractions.append(ring_stats.score_fraction)
        (loss_sum / count.item()).backward()
        stats[0] += float(loss_sum.detach())
        mask = shard.loss_mask
        if position_losses:
            per_token = token_losses(run.model, hidden.detach(), labels).double().cpu()
            stats[1 : 1 + n_buckets].index_add_(0, run.tracker.bucket_of(shard.position_ids)[mask], per_token[mask])
        stats[1 + n_buckets :] += run.tracker.local_counts(shard.position_ids, mask).double()
    max_pos = torch.tensor(max((int(s.position_ids[s.loss_mask].max()) for s in shards if s.loss_mask.any()), default=-1))
    t = time.perf_counter()
    sync_gradients([p for p in run.model.parameters() if p.requires_grad], state)
    all_reduce_sum(stats, state)
    all_reduce_max(max_pos, state)
    comm += time.perf_counter() - t
    return _StepStats(
        loss=float(stats[0] / count),
        bucket_loss=stats[1 : 1 + n_buckets].tolist(),
        bucket_count=stats[1 + n_buckets :].round().to(torch.int64).tolist(),
        max_position=int(max_pos),
        comm_s=comm,
        attention_score_fraction=sum(score_fractions) / len(score_fractions) if score_fractions else None,
    )


def _train(job: _Job, state: ParallelState, progress: bool) -> TrainResult:
    run = _setup(job, state)
    tcfg = job.train
    tracker, original = run.tracker, job.context.original
    run_config = {"train": tcfg.model_dump(mode="json"), **run.meta}
    writer = Tracker(tcfg.log, run.layout, run.start_step, run_config) if state.is_main else None
    bf16 = tcfg.precision == "bf16" or (tcfg.precision == "auto" and state.device.type == "cuda")
    peak = peak_flops(state.device, None)
    rows = _rows(run.dataset)
    params = [p for p in run.model.parameters() if p.requires_grad]
    bar = None
    if progress and state.is_main:
        from tqdm import tqdm

        bar = tqdm(total=tcfg.steps, initial=run.start_step, desc="train", unit="step", dynamic_ncols=True)
    losses: list[float] = []
    records: list[dict[str, Any]] = []
    tokens_seen, time_spent = 0, 0.0
    for step in range(run.start_step, tcfg.steps):
        start, ring_wait_before = time.perf_counter(), WAIT_CLOCK.seconds
        micro = [next(rows) for _ in range(tcfg.grad_accum)]
        shards = [zigzag_split(m, state.cp_size, state.cp_rank) for m in micro]
        logged = (step + 1) % tcfg.log.every == 0 or step + 1 == tcfg.steps
        stats = _forward_backward(run, shards, state, bf16, position_losses=logged)
        if not math.isfinite(stats.loss):
            raise FloatingPointError(f"step {step + 1}: loss is {stats.loss}")
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, tcfg.optim.grad_clip))
        lr = run.scheduler.get_last_lr()[0]
        run.optimizer.step()
        run.scheduler.step()
        tracker.add(stats.bucket_count, stats.max_position)
        elapsed = time.perf_counter() - start
        comm = stats.comm_s + WAIT_CLOCK.seconds - ring_wait_before
        step_tokens = run.seq_len * tcfg.grad_accum * state.dp_size
        tokens_seen += step_tokens
        time_spent += elapsed
        pairs = sum(_causal_pairs(m["cu_seqlens"]) for m in micro) * state.dp_size
        flops = training_flops(run.model.config.shape, step_tokens, pairs)
        counts = stats.bucket_count
        record = {
            "step": step + 1,
            "loss": stats.loss,
            "lr": lr,
            "grad_norm": grad_norm,
            "tokens_per_s": step_tokens / elapsed,
            "mfu": flops / elapsed / (peak * state.world_size) if peak else None,
            "comm_fraction": comm / elapsed,
            "attention_score_fraction": stats.attention_score_fraction,
            "max_position": tracker.max_position,
            "long_token_fraction": sum(c for e, c in zip(tracker.edges, counts) if e >= original) / max(1, sum(counts)),
            "loss_by_position": {
                str(edge): total / n if n and logged else None
                for edge, total, n in zip(tracker.edges, stats.bucket_loss, counts)
            },
        }
        losses.append(stats.loss)
        records.append(record)
        if writer is not None and logged:
            writer.write(record)
        if bar is not None:
            bar.set_postfix(loss=f"{stats.loss:.3f}", tok_s=f"{record['tokens_per_s']:.0f}")
            bar.update(1)
        if not tcfg.coverage.allow_short:
            tracker.check()
        if (step + 1) % tcfg.checkpoint.every == 0 or step + 1 == tcfg.steps:
            save_checkpoint(
                run.layout.checkpoints,
                step + 1,
                run.model,
                run.optimizer,
                run.scheduler,
                {"data": run.dataset.state_dict(), "coverage": _tracker_state(tracker)},
                run.meta,
                state.rank,
                tcfg.checkpoint.keep,
            )
    if bar is not None:
        bar.close()
    if writer is not None:
        writer.close()
    final = None
    if state.is_main:
        shutil.rmtree(run.layout.final_model, ignore_errors=True)
        save_model(run.model, run.layout.final_model)
        final = run.layout.final_model
    return TrainResult(
        steps=tcfg.steps,
        losses=losses,
        coverage=tracker.summary(),
        final_model=final,
        tokens_per_s=tokens_seen / time_spent if time_spent else 0.0,
        resumed_from=run.start_step,
        records=records,
    )


def _tracker_state(tracker: CoverageTracker) -> dict[str, Any]:
    return {
        "histogram": list(tracker.histogram),
        "max_position": tracker.max_position,
        "steps_without_long": tracker.steps_without_long,
        "long_tokens": tracker.long_tokens,
    }
