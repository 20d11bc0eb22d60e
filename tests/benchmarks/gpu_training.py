"""The GPU suite's training sections: throughput, MFU, step breakdown and memory of ~1B and ~3B models,
and the longest context that fits (see ``gpu_suite.py``).

The model and optimizer are built the way ``longctx train`` builds them at world size 1
(``longctx.trainer.train.model_config``; ``check_memory``, which resolves ``activation_checkpointing:
auto``; ``longctx.trainer.build.build_model`` on the meta device then ``fill_random``; the kernels of
``train.kernels`` through ``longctx.trainer.models.kernels.apply_kernels``; ``make_optimizer``), with
``precision: auto``: bf16 autocast on CUDA, float32 on CPU. At world size 1 the trainer does not shard
(FSDP2 needs more than one rank), so neither does the suite. Windows are synthetic packed rows in the
packer's format (random token ids; documents of the many-document layout of ``layouts.py``, or of random
lengths up to a maximum for the longest-context search; a padding tail), turned into training tensors by
the dataloader's ``row_to_sample`` and split by the trainer's ``context_split``; one step is what the
trainer's ``_forward_backward`` and step do with one row: the model's forward with ``labels`` (the loss
inside forward), backward of the summed token losses, gradients divided by the row's loss-masked tokens,
gradient clipping and AdamW.

MFU counts model FLOPs only (``longctx.trainer.planning.flops.training_flops``: 3x the forward, attention
pairs
counted with the causal and document masks of each row, recomputation not counted) against the device's
dense bf16 peak (``longctx.trainer.metrics.peak_flops``). The memory estimate is the one memory model
``longctx plan`` prints and ``longctx train`` checks (``longctx.trainer.planning.memory.rank_memory``) for
the same
model, length, state sharding (one rank), activation checkpointing and compute dtype.
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch
from gpu_attention import random_lengths
from gpu_cases import TrainCase
from gpu_measure import Deadline, free_memory, is_out_of_memory, peak_gib, reset_peak, synchronize
from gpu_profile import profile_step
from layouts import document_lengths

from longctx.core.config import ContextConfig
from longctx.core.errors import ConfigError
from longctx.packer.dataset import row_to_sample
from longctx.packer.reader import PackedRow
from longctx.trainer.attention.comm import WAIT_CLOCK
from longctx.trainer.build import build_model, fill_random, model_config, use_bf16
from longctx.trainer.config import KernelsConfig, ModelSection, TinyModelConfig, TrainConfig
from longctx.trainer.metrics import peak_flops
from longctx.trainer.models.decoder import Transformer
from longctx.trainer.models.kernels import KernelChoice, apply_kernels
from longctx.trainer.models.shape import ModelShape
from longctx.trainer.parallel.layout import context_split
from longctx.trainer.parallel.sharding import scale_gradients
from longctx.trainer.parallel.state import ParallelState, init_parallel
from longctx.trainer.parallel.zigzag import ContextParallelShard
from longctx.trainer.planning.flops import causal_pair_count, param_count, training_flops
from longctx.trainer.planning.memory import rank_memory
from longctx.trainer.train import check_memory, make_optimizer

Emit = Callable[[dict], None]

ORIGINAL_CONTEXT = 8192
"""The pretraining window the synthetic run extends from (a quarter of the window in the smoke run)."""

MFU_GOAL = 0.40
"""Issue 30's goal for the 1.1B model on packed 32K windows (model FLOPs, recompute not counted)."""


def rope_section(original: int) -> dict:
    """A continued-pretraining RoPE setting (Llama-3's base, YaRN x4 from ``original``); it does not
    change the cost, but it is what a real run configures."""
    scaling = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": original}
    return {"rope_theta": 500000.0, "rope_scaling": scaling}


# Data ------------------------------------------------------------------------------------------------------
def packed_row(lengths: Sequence[int], vocab: int, seed: int) -> PackedRow:
    """A packed window in the packer's format: documents of ``lengths[:-1]`` tokens (random ids), then a
    padding segment of ``lengths[-1]``."""
    seq_len = sum(lengths)
    documents = list(lengths[:-1])
    ids = np.random.default_rng(seed).integers(0, vocab, seq_len, dtype=np.int64)
    positions = np.concatenate([np.arange(n) for n in lengths])
    loss_mask = np.ones(seq_len, dtype=np.uint8)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    loss_mask[cu[:-1]] = 0  # the first token of every segment
    loss_mask[cu[-2] :] = 0  # padding
    return PackedRow(
        input_ids=ids,
        position_ids=positions,
        loss_mask=loss_mask,
        cu_seqlens=cu,
        doc_id=[f"doc{i}" for i in range(len(documents))] + [None],
        doc_source=["synthetic"] * len(documents) + [None],
        doc_offset=[0] * len(documents) + [None],
        doc_length=[*documents, None],
    )


def synthetic_row(seq_len: int, vocab: int, max_document: int, seed: int) -> tuple[PackedRow, list[int]]:
    """A packed window of documents of ``seq_len / 16`` to ``max_document`` tokens, then a padding segment
    of ``seq_len / 64`` tokens; returns it and its segment lengths (the longest-context search's rows)."""
    rng = random.Random(seed)
    padding = max(1, seq_len // 64)
    documents = random_lengths(
        seq_len - padding, max(1, seq_len // 16), max(2, min(seq_len // 2, max_document)), rng
    )
    lengths = [*documents, padding]
    return packed_row(lengths, vocab, seed), lengths


def many_document_row(seq_len: int, vocab: int, mean_document: int, seed: int) -> tuple[PackedRow, list[int]]:
    """A packed window of the many-document layout (``layouts.document_lengths``: documents of 1 to
    ``2 mean_document - 1`` tokens) and a padding segment of ``seq_len / 64`` tokens; the row and its
    segment lengths (the training section's rows)."""
    padding = max(1, seq_len // 64)
    lengths = [*document_lengths(seq_len - padding, mean_document, seed), padding]
    return packed_row(lengths, vocab, seed), lengths


def training_shard(row: PackedRow) -> ContextParallelShard:
    """The row as the trainer feeds it at world size 1: dataloader sample, then the (P = 1) zigzag split."""
    return context_split(row_to_sample(row), cp=1, cp_rank=0)


# The trainer under test ------------------------------------------------------------------------------------
@dataclass
class Trainer:
    """Model, optimizer and settings of the run under test, built by the trainer's entry points."""

    model: Transformer
    loss_multiplier: float
    optimizer: torch.optim.Optimizer
    config: TrainConfig
    state: ParallelState
    bf16: bool
    kind: str
    checkpointing: str
    """The activation checkpointing the model runs with (``auto`` resolved by the trainer's check)."""
    kernels: KernelChoice | None = None

    @property
    def device(self) -> torch.device:
        return self.state.device


def build_trainer(
    dims: dict,
    seq_len: int,
    vocab: int,
    activation_checkpointing: str = "full",
    kernels: KernelsConfig | None = None,
    compile_backend: str = "inductor",
    compile_cache: Path | None = None,
    refuse: bool = True,
) -> Trainer:
    """The model (``dims``: a ``train.model.tiny`` section) and AdamW, as ``longctx train`` builds them at
    world size 1 with ``activation_checkpointing`` (``full`` unless told otherwise; ``auto`` resolved as
    the trainer resolves it), ``train.kernels`` (default: the plain model, PyTorch's ops) and ``precision:
    auto`` (bf16 autocast on CUDA, float32 on CPU). Raises ``ConfigError`` when the memory estimate does not
    fit the device, as ``longctx train`` refuses, unless ``refuse`` is false (the longest-context search
    tries lengths beyond the estimate; it needs a mode that is not ``auto``)."""
    original = min(ORIGINAL_CONTEXT, seq_len // 4)
    config = TrainConfig(
        model=ModelSection(tiny=TinyModelConfig(**dims), **rope_section(original)),
        activation_checkpointing=activation_checkpointing,
        kernels=kernels or KernelsConfig(),
        precision="auto",
    )
    state = init_parallel(config.cp, config.comm_timeout_s, config.dp_replicate)
    bf16 = use_bf16(config.precision, state.device)
    model_cfg = model_config(config, ContextConfig(original=original, target=seq_len), vocab)
    mode = check_memory(config, model_cfg, seq_len, state, bf16) if refuse else activation_checkpointing
    built = build_model(model_cfg, state, activation_checkpointing=mode, bf16=bf16)
    choice = None
    if kernels is not None:  # the trainer's own choice, with the suite's compile backend (smoke: aot_eager)
        choice = apply_kernels(
            built.model,
            attention=kernels.attention,
            fused=kernels.fused,
            compile_blocks=kernels.compile,
            device=state.device,
            dtype=torch.bfloat16 if bf16 else torch.float32,
            compile_cache=compile_cache,
            compile_backend=compile_backend,
        )
    fill_random(built.model, config.seed)
    sharding = f"FSDP2 over {state.shape.describe()}" if state.sharded else "unsharded (one rank)"
    return Trainer(
        model=built.model,
        loss_multiplier=built.loss_multiplier,
        optimizer=make_optimizer(built.model, config),
        config=config,
        state=state,
        bf16=bf16,
        kind=f"longctx.trainer (build_model, AdamW), world size {state.world_size}, {sharding}",
        checkpointing=mode,
        kernels=choice,
    )


def train_step(trainer: Trainer, shard: ContextParallelShard, seq_len: int) -> float:
    """One optimizer step on one row, as the trainer's ``_forward_backward`` and step do: returns the loss."""
    device, model = trainer.device, trainer.model
    labels = torch.where(shard.loss_mask, shard.labels, -100).to(device)
    count = float(shard.loss_mask.sum())
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=trainer.bf16):
        token_losses = model(
            shard.input_ids.to(device),
            shard.position_ids.to(device),
            shard.indices.to(device),
            shard.segment_ids.to(device),
            rope_seq_len=seq_len,
            labels=labels,
        )
    loss_sum = token_losses.sum()
    (loss_sum * trainer.loss_multiplier if trainer.loss_multiplier != 1.0 else loss_sum).backward()
    params = [p for p in model.parameters() if p.requires_grad]
    scale_gradients(params, 1.0 / count)
    torch.nn.utils.clip_grad_norm_(params, trainer.config.optim.grad_clip)
    trainer.optimizer.step()
    trainer.optimizer.zero_grad(set_to_none=True)
    return float(loss_sum.detach()) / count


def timed_step(trainer: Trainer, shard: ContextParallelShard, seq_len: int) -> tuple[float, float]:
    """``(seconds, loss)`` of one step, the device synchronized on both sides."""
    synchronize(trainer.device)
    t0 = time.perf_counter()
    loss = train_step(trainer, shard, seq_len)
    synchronize(trainer.device)
    return time.perf_counter() - t0, loss


def plan_estimate_gib(trainer: Trainer, seq_len: int) -> dict:
    """The memory model's per-rank estimate for this model and length, with the settings
    ``longctx train`` checks before it loads anything (``check_memory``): cp and state shards of the
    mesh, the activation checkpointing the model runs with, bf16 or float32 compute; GiB."""
    memory = rank_memory(
        trainer.model.config.shape,
        seq_len,
        trainer.state.cp_size,
        state_shards=trainer.state.shape.shard_size,
        activation_checkpointing=trainer.checkpointing,
        compute_bytes=2 if trainer.bf16 else 4,
        residual_bytes=(2 if trainer.bf16 else 4) if trainer.state.sharded else 4,
    )
    return {
        "total_gib": memory.total / 2**30,
        "model_states_gib": memory.model_states / 2**30,
        "activations_gib": memory.activations / 2**30,
        **{
            f"{key}_gib": value / 2**30
            for key, value in (
                ("gathered_params", memory.gathered_params),
                ("logits", memory.logits),
                ("ring_buffers", memory.ring_buffers),
                ("optimizer_step", memory.optimizer_step),
            )
        },
    }


def step_flops(trainer: Trainer, seq_len: int, lengths: Sequence[int]) -> float:
    """Model FLOPs of one step (``training_flops``, attention counted with the causal and document masks)."""
    return training_flops(trainer.model.config.shape, seq_len, causal_pair_count(lengths))


# Section 3 -------------------------------------------------------------------------------------------------
def _model_dims(settings, case: TrainCase) -> tuple[dict, int]:
    dims = dict(settings.train_models[case.model])
    return {key: value for key, value in dims.items() if key != "vocab_size"}, dims["vocab_size"]


def estimate_case_s(settings, case: TrainCase, seconds_per_flop: float | None) -> float:
    """Seconds a case is expected to take: building (``settings.build_s_per_billion``), warmup and timed
    steps at the FLOP rate measured so far (with a margin), the profiled step, compiling."""
    dims, vocab = _model_dims(settings, case)
    shape = ModelShape.from_hf({**dims, "vocab_size": vocab}, case.model)
    build = settings.build_s_per_billion * param_count(shape) / 1e9
    if seconds_per_flop is None:
        return build
    pairs = case.tokens * settings.train_mean_document // 2
    step = 1.3 * seconds_per_flop * training_flops(shape, case.tokens, pairs)
    steps = settings.train_warmup + settings.train_steps + (2 if case.profile else 0)
    compile_s = settings.compile_estimate_s if case.kernels.get("compile") else 0.0
    return build + steps * step + compile_s


def run_case(settings, case: TrainCase, deadline: Deadline, emit: Emit, compile_cache: Path) -> dict:
    """Build the case's trainer, run warmup and timed steps (and a profiled one), and summarize."""
    dims, vocab = _model_dims(settings, case)
    seq_len = case.tokens
    t0 = time.perf_counter()
    try:
        trainer = build_trainer(
            dims,
            seq_len,
            vocab,
            activation_checkpointing=case.checkpointing,
            kernels=KernelsConfig(**case.kernels),
            compile_backend=settings.compile_backend,
            compile_cache=compile_cache,
        )
    except ConfigError as err:  # the trainer would refuse it: an answer, recorded
        return {"case": case.name, "status": "does not fit", "reason": str(err)}
    device = trainer.device
    shape = trainer.model.config.shape
    summary: dict = {
        "case": case.name,
        "model": {**settings.train_models[case.model], "parameters": param_count(shape), "shape": case.model},
        "seq_len": seq_len,
        "checkpointing_setting": case.checkpointing,
        "checkpointing": trainer.checkpointing,
        "kernels": trainer.kernels.describe() if trainer.kernels else "plain model",
        "kernel_notes": trainer.kernels.notes if trainer.kernels else [],
        "build_s": time.perf_counter() - t0,
        "trainer": trainer.kind,
    }
    emit(
        {
            "case": case.name,
            "event": "built",
            **{k: summary[k] for k in ("checkpointing", "kernels", "build_s")},
        }
    )
    peak = peak_flops(device, None)
    times, losses, flops, step_lengths = [], [], [], []
    shards = []
    for step in range(settings.train_warmup + settings.train_steps):
        if step > settings.train_warmup and times and not deadline.allows(statistics.median(times) * 1.5):
            emit({"case": case.name, "step": step + 1, "status": "skipped", "reason": "section time cap"})
            break
        row, lengths = many_document_row(seq_len, vocab, settings.train_mean_document, seed=step)
        shard = training_shard(row)
        shards.append((shard, lengths))
        if step == settings.train_warmup:
            free_memory(device)
            reset_peak(device)  # optimizer states exist from the first step on: they are in the peak
        seconds, loss = timed_step(trainer, shard, seq_len)
        record = {
            "case": case.name,
            "step": step + 1,
            "warmup": step < settings.train_warmup,
            "seconds": seconds,
            "loss": loss,
            "documents": len(lengths) - 1,
            "tokens_per_s": seq_len / seconds,
        }
        if step >= settings.train_warmup:
            times.append(seconds)
            losses.append(loss)
            flops.append(step_flops(trainer, seq_len, lengths))
            step_lengths.append(lengths)
            record["mfu"] = flops[-1] / seconds / peak if peak else None
        emit(record)
    memory = peak_gib(device)
    estimate = plan_estimate_gib(trainer, seq_len)
    finite = bool(losses) and all(np.isfinite(losses))
    summary.update(
        steps_timed=len(times),
        losses_finite=finite,
        plan_estimate=estimate,
        peak_memory=memory,
        status="measured" if times else "no step timed",
    )
    if times:
        median = statistics.median(times)
        achieved = statistics.median(f / t for f, t in zip(flops, times, strict=True))
        summary.update(
            step_s_median=median,
            step_s_min=min(times),
            step_s_max=max(times),
            tokens_per_s=seq_len / median,
            model_tflops=achieved / 1e12,
            mfu=achieved / peak if peak else None,
            documents_mean=statistics.mean(len(lengths) - 1 for lengths in step_lengths),
            attention_flop_share=statistics.mean(
                1 - training_flops(shape, seq_len, 0) / step_flops(trainer, seq_len, lengths)
                for lengths in step_lengths
            ),
            seconds_per_flop=statistics.median(t / f for f, t in zip(flops, times, strict=True)),
        )
    if memory is not None:
        ratio = memory["peak_allocated_gib"] / estimate["total_gib"]
        summary["peak_over_plan"] = ratio
        summary["memory_goal_met"] = abs(ratio - 1) <= 0.15
    if case.profile and times and deadline.allows(2 * statistics.median(times) + 10):
        shard, _ = shards[-1]
        summary["profile"] = profile_step(partial(train_step, trainer, shard, seq_len), device, WAIT_CLOCK)
    del trainer
    free_memory(device)
    return summary


def run_training(settings, deadline: Deadline, emit: Emit, shared: dict) -> dict:
    """Section 3: each case of ``settings.train_cases`` (tokens/s, MFU, peak memory against the plan, and
    for one a profiled step's breakdown), skipping the cases that would not finish before the cap."""
    results = []
    seconds_per_flop = None
    with tempfile.TemporaryDirectory(prefix="longctx-compile-") as cache:
        for case in settings.train_cases:
            needed = estimate_case_s(settings, case, seconds_per_flop)
            if not deadline.allows(needed):
                emit(
                    {
                        "case": case.name,
                        "status": "skipped",
                        "reason": f"section time cap (needs ~{needed:.0f} s)",
                    }
                )
                results.append({"case": case.name, "status": "skipped"})
                continue
            result = run_case(settings, case, deadline, emit, Path(cache))
            emit({"case": case.name, "summary": result})
            results.append(result)
            if result.get("seconds_per_flop") is not None:
                seconds_per_flop = seconds_per_flop or result["seconds_per_flop"]
                if case.checkpointing == "full" and case.model == "1.1B":
                    shared["seconds_per_flop"] = result["seconds_per_flop"]  # section 4's estimates
    measured = [r for r in results if r.get("status") == "measured"]
    goal_cases = [r for r in measured if r["case"] in settings.mfu_goal_cases and r.get("mfu") is not None]
    best = max(goal_cases, key=lambda r: r["mfu"], default=None)
    return {
        "cases": [
            {
                key: r.get(key)
                for key in (
                    "case",
                    "status",
                    "seq_len",
                    "checkpointing",
                    "kernels",
                    "tokens_per_s",
                    "mfu",
                    "step_s_median",
                    "peak_over_plan",
                    "documents_mean",
                )
            }
            for r in results
        ],
        "mfu_goal": f"MFU >= {MFU_GOAL:.0%} on {', '.join(settings.mfu_goal_cases)} (model FLOPs, causal and "
        "document masks, recompute not counted)",
        "best_goal_case": best["case"] if best else None,
        "best_mfu": best["mfu"] if best else None,
        "mfu_goal_met": bool(best) and best["mfu"] >= MFU_GOAL,
        "losses_finite": all(r["losses_finite"] for r in measured),
        "passed": bool(measured) and all(r["losses_finite"] for r in measured),
    }


# Section 4 -------------------------------------------------------------------------------------------------
def longest_context(
    lengths: Sequence[int],
    try_length: Callable[[int], dict],
    estimate_s: Callable[[int], float],
    deadline: Deadline,
    emit: Emit,
    free: Callable[[], None],
) -> dict:
    """Try ``lengths`` in increasing order until one runs out of device memory.

    ``try_length(L)`` runs one step and returns its figures; an out-of-memory error there is caught
    (anything else propagates), the memory freed, and longer lengths are not tried. A length whose
    ``estimate_s`` does not fit before the deadline is skipped, as are the longer ones.
    """
    fits: list[int] = []
    stop = None
    for length in sorted(lengths):
        if stop is not None:
            emit({"tokens": length, "status": "not tried", "reason": stop})
            continue
        if not deadline.allows(estimate_s(length)):
            stop = "section time cap (estimated step time)"
            emit({"tokens": length, "status": "skipped", "reason": stop})
            continue
        oom = None
        free()
        try:
            figures = try_length(length)
        except Exception as exc:  # only an out-of-memory error is an answer; anything else is a bug
            if not is_out_of_memory(exc):
                raise
            oom = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        free()
        if oom is not None:
            stop = f"{length} tokens ran out of memory"
            emit({"tokens": length, "status": "OOM", "error": oom})
            continue
        fits.append(length)
        emit({"tokens": length, "status": "fits", **figures})
    return {
        "tried": sorted(lengths),
        "fits": fits,
        "longest_fitting": max(fits) if fits else None,
        "stopped_by": stop,
    }


def run_longest_context(settings, deadline: Deadline, emit: Emit, shared: dict) -> dict:
    """Section 4: one training step at each length (one GPU, activation checkpointing), its memory and the
    plan's estimate, until a length runs out of memory."""
    vocab = settings.train_dims["vocab_size"]
    trainer = shared.get("trainer")
    if trainer is None:
        dims = {key: value for key, value in settings.train_dims.items() if key != "vocab_size"}
        trainer = build_trainer(dims, max(settings.longest_tokens), vocab, refuse=False)
        shared["trainer"] = trainer
    device = trainer.device
    seconds_per_flop = shared.get("seconds_per_flop")

    def window(length: int) -> tuple[PackedRow, list[int]]:
        return synthetic_row(length, vocab, settings.longest_max_document, seed=length)

    def estimate_s(length: int) -> float:
        """Section 3's seconds per model FLOP at this length's FLOPs, with a margin (0 when unknown)."""
        if seconds_per_flop is None:
            return 0.0
        return 1.5 * seconds_per_flop * step_flops(trainer, length, window(length)[1])

    def try_length(length: int) -> dict:
        row, lengths = window(length)
        shard = training_shard(row)
        reset_peak(device)
        seconds, loss = timed_step(trainer, shard, length)
        return {
            "seconds": seconds,
            "loss": loss,
            "documents": len(lengths) - 1,
            "max_document": max(lengths[:-1]),
            "tokens_per_s": length / seconds,
            "peak_memory": peak_gib(device),
            "plan_estimate": plan_estimate_gib(trainer, length),
        }

    def free() -> None:
        trainer.optimizer.zero_grad(set_to_none=True)
        free_memory(device)

    result = longest_context(settings.longest_tokens, try_length, estimate_s, deadline, emit, free)
    result["max_document"] = settings.longest_max_document
    result["device_memory_gib"] = (
        torch.cuda.get_device_properties(device).total_memory / 2**30 if device.type == "cuda" else None
    )
    result["passed"] = bool(result["fits"])
    return result


def run_memory_model(settings, deadline: Deadline, emit: Emit, shared: dict) -> dict:
    """Section 5: the memory model under each checkpointing mode of ``settings.memory_cases``.

    For each ``(mode, length)`` of ``settings.memory_cases``: a fresh trainer, one step (AdamW makes its
    moments), then the measured step's peak against the plan's estimate. The 15% goal is reported.
    """
    shared.pop("trainer", None)  # the ``full`` model of section 4: its memory is needed here
    dims = {key: value for key, value in settings.train_dims.items() if key != "vocab_size"}
    vocab = settings.train_dims["vocab_size"]
    ratios = []
    for mode, length in settings.memory_cases:
        if not deadline.allows(0.0):
            emit({"mode": mode, "tokens": length, "status": "skipped", "reason": "section time cap"})
            continue
        try:
            trainer = build_trainer(dims, length, vocab, activation_checkpointing=mode)
        except ConfigError as err:  # the trainer refuses it before building: an answer, recorded
            emit({"mode": mode, "tokens": length, "status": "refused", "reason": str(err)[:300]})
            continue
        plan = plan_estimate_gib(trainer, length)
        shard = training_shard(synthetic_row(length, vocab, settings.longest_max_document, seed=length)[0])
        try:
            timed_step(trainer, shard, length)
            reset_peak(trainer.device)
            seconds, loss = timed_step(trainer, shard, length)
        except torch.OutOfMemoryError:
            emit({"mode": mode, "tokens": length, "status": "out of memory"})
            continue
        finally:
            del trainer
            free_memory(settings.device)
        peak = peak_gib(settings.device)
        case = {"mode": mode, "tokens": length, "status": "measured", "seconds": seconds, "loss": loss}
        case.update(peak_memory=peak, plan_estimate=plan)
        if peak is not None:
            case["peak_over_plan"] = peak["peak_allocated_gib"] / plan["total_gib"]
            ratios.append(case["peak_over_plan"])
        emit(case)
    return {
        "cases": len(settings.memory_cases),
        "peak_over_plan": ratios,
        "goal": "peak allocated within 15% of longctx plan's estimate",
        "goal_met": bool(ratios) and all(abs(r - 1) <= 0.15 for r in ratios),
        "passed": True,
    }
