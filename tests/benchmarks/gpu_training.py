"""The GPU suite's training sections: throughput and memory of a ~1B model, and the longest context
that fits (see ``gpu_suite.py``).

The model and optimizer are built the way ``longctx train`` builds them at world size 1
(``longctx.trainer.build.model_config``, ``longctx.trainer.build.build_model`` on the meta device then
``fill_random``, ``make_optimizer``), with activation checkpointing (``full``) and ``precision: auto``:
bf16 autocast on CUDA, float32 on CPU. At world size 1 the trainer does not shard (FSDP2 needs more
than one rank), so neither does the suite. Windows are synthetic packed rows in the packer's format
(random token ids, documents of random lengths and a padding tail), turned into training tensors by the
dataloader's ``row_to_sample`` and split by the trainer's ``zigzag_split``; one step is what the
trainer's ``_forward_backward`` and step do with one row: the model's forward with ``labels`` (the loss
in chunks inside forward), backward of the summed token losses, gradients divided by the row's
loss-masked tokens, gradient clipping and AdamW. FLOPs and MFU use ``longctx.trainer.flops`` with the
rows' real (causal, document-masked) attention pairs; the memory estimate is the one memory model
``longctx plan`` prints and ``longctx train`` checks (``longctx.trainer.memory.rank_memory``) for the
same model, length, state sharding (one rank), activation checkpointing and compute dtype.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from gpu_attention import random_lengths
from gpu_measure import Deadline, free_memory, is_out_of_memory, peak_gib, reset_peak, synchronize

from longctx.core.config import ContextConfig
from longctx.packer.dataset import row_to_sample
from longctx.packer.reader import PackedRow
from longctx.trainer.attention.zigzag import ContextParallelShard, zigzag_split
from longctx.trainer.build import build_model, fill_random, model_config, use_bf16
from longctx.trainer.config import ModelSection, TinyModelConfig, TrainConfig
from longctx.trainer.flops import causal_pair_count, param_count, training_flops
from longctx.trainer.memory import rank_memory
from longctx.trainer.metrics import peak_flops
from longctx.trainer.model import Transformer
from longctx.trainer.parallel import ParallelState, init_parallel
from longctx.trainer.sharding import scale_gradients
from longctx.trainer.train import make_optimizer

Emit = Callable[[dict], None]

ORIGINAL_CONTEXT = 8192
"""The pretraining window the synthetic run extends from (a quarter of the window in the smoke run)."""


def rope_section(original: int) -> dict:
    """A continued-pretraining RoPE setting (Llama-3's base, YaRN x4 from ``original``); it does not
    change the cost, but it is what a real run configures."""
    scaling = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": original}
    return {"rope_theta": 500000.0, "rope_scaling": scaling}


# Data ------------------------------------------------------------------------------------------------------
def synthetic_row(seq_len: int, vocab: int, max_document: int, seed: int) -> tuple[PackedRow, list[int]]:
    """A packed window in the packer's format: documents of ``seq_len / 16`` to ``max_document`` tokens
    (random ids), then a padding segment of ``seq_len / 64`` tokens; returns it and its segment lengths."""
    rng = random.Random(seed)
    padding = max(1, seq_len // 64)
    documents = random_lengths(
        seq_len - padding, max(1, seq_len // 16), max(2, min(seq_len // 2, max_document)), rng
    )
    lengths = [*documents, padding]
    ids = np.random.default_rng(seed).integers(0, vocab, seq_len, dtype=np.int64)
    positions = np.concatenate([np.arange(n) for n in lengths])
    loss_mask = np.ones(seq_len, dtype=np.uint8)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    loss_mask[cu[:-1]] = 0  # the first token of every segment
    loss_mask[cu[-2] :] = 0  # padding
    row = PackedRow(
        input_ids=ids,
        position_ids=positions,
        loss_mask=loss_mask,
        cu_seqlens=cu,
        doc_id=[f"doc{i}" for i in range(len(documents))] + [None],
        doc_source=["synthetic"] * len(documents) + [None],
        doc_offset=[0] * len(documents) + [None],
        doc_length=[*documents, None],
    )
    return row, lengths


def training_shard(row: PackedRow) -> ContextParallelShard:
    """The row as the trainer feeds it at world size 1: dataloader sample, then the (P = 1) zigzag split."""
    return zigzag_split(row_to_sample(row), 1, 0)


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

    @property
    def device(self) -> torch.device:
        return self.state.device


def build_trainer(dims: dict, seq_len: int, vocab: int, activation_checkpointing: str = "full") -> Trainer:
    """The ~1B model (``dims``: a ``train.model.tiny`` section) and AdamW, as ``longctx train`` builds them
    at world size 1 with activation checkpointing (``full`` unless told otherwise) and ``precision: auto``
    (bf16 autocast on CUDA, float32 on CPU)."""
    original = min(ORIGINAL_CONTEXT, seq_len // 4)
    config = TrainConfig(
        model=ModelSection(tiny=TinyModelConfig(**dims), **rope_section(original)),
        activation_checkpointing=activation_checkpointing,
        precision="auto",
    )
    state = init_parallel(config.cp, config.comm_timeout_s, config.dp_replicate)
    bf16 = use_bf16(config.precision, state.device)
    model_cfg = model_config(config, ContextConfig(original=original, target=seq_len), vocab)
    built = build_model(model_cfg, state, activation_checkpointing=config.activation_checkpointing, bf16=bf16)
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
    mesh, the configured activation checkpointing, bf16 or float32 compute; GiB."""
    memory = rank_memory(
        trainer.model.config.shape,
        seq_len,
        trainer.state.cp_size,
        state_shards=trainer.state.shape.shard_size,
        activation_checkpointing=trainer.config.activation_checkpointing,
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
def run_training(settings, deadline: Deadline, emit: Emit, shared: dict) -> dict:
    """Section 3: tokens/s, MFU and peak memory (against the plan) of the ~1B model on packed windows."""
    seq_len, vocab = settings.train_tokens, settings.train_dims["vocab_size"]
    dims = {key: value for key, value in settings.train_dims.items() if key != "vocab_size"}
    t0 = time.perf_counter()
    trainer = build_trainer(dims, seq_len, vocab)
    shared["trainer"] = trainer
    device = trainer.device
    build_s = time.perf_counter() - t0
    shape = trainer.model.config.shape
    emit(
        {
            "event": "built",
            "trainer": trainer.kind,
            "parameters": param_count(shape),
            "build_s": build_s,
            "activation_checkpointing": trainer.config.activation_checkpointing,
            "bf16": trainer.bf16,
        }
    )
    peak = peak_flops(device, None)
    times, losses, flops, step_lengths = [], [], [], []
    total_steps = settings.train_warmup + settings.train_steps
    for step in range(total_steps):
        if (
            step >= settings.train_warmup + 1
            and times
            and not deadline.allows(statistics.median(times) * 1.5)
        ):
            emit({"step": step + 1, "status": "skipped", "reason": "section time cap"})
            break
        row, lengths = synthetic_row(seq_len, vocab, seq_len // 2, seed=step)
        shard = training_shard(row)
        if step == settings.train_warmup:
            free_memory(device)
            reset_peak(device)  # optimizer states exist from the first step on: they are in the peak
        seconds, loss = timed_step(trainer, shard, seq_len)
        record = {
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
    result = {
        "trainer": trainer.kind,
        "model": {**settings.train_dims, "parameters": param_count(shape)},
        "seq_len": seq_len,
        "steps_timed": len(times),
        "losses_finite": finite,
        "plan_estimate": estimate,
        "peak_memory": memory,
        "passed": finite and len(times) > 0,
    }
    if times:
        median = statistics.median(times)
        achieved = statistics.median(f / t for f, t in zip(flops, times, strict=True))
        result.update(
            step_s_median=median,
            step_s_min=min(times),
            step_s_max=max(times),
            tokens_per_s=seq_len / median,
            model_tflops=achieved / 1e12,
            mfu=achieved / peak if peak else None,
            attention_flop_share=statistics.mean(
                1 - training_flops(shape, seq_len, 0) / step_flops(trainer, seq_len, lengths)
                for lengths in step_lengths
            ),
        )
    if memory is not None:
        ratio = memory["peak_allocated_gib"] / estimate["total_gib"]
        result["peak_over_plan"] = ratio
        result["memory_goal"] = "peak allocated within 15% of longctx plan's estimate"
        result["memory_goal_met"] = abs(ratio - 1) <= 0.15
    if times:  # seconds per model FLOP, for section 4's time estimates
        shared["seconds_per_flop"] = statistics.median(t / f for f, t in zip(flops, times, strict=True))
    return result


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
        trainer = build_trainer(dims, max(settings.longest_tokens), vocab)
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
    """Section 5: the memory model under the other checkpointing modes (sections 3 and 4 use ``full``).

    For each ``(mode, length)`` of ``settings.memory_cases``: a fresh trainer, one step (AdamW makes its
    moments), then the measured step's peak against the plan's estimate. The 15% goal is reported.
    """
    shared.pop("trainer", None)  # the ``full`` model of sections 3 and 4: its memory is needed here
    dims = {key: value for key, value in settings.train_dims.items() if key != "vocab_size"}
    vocab = settings.train_dims["vocab_size"]
    ratios = []
    for mode, length in settings.memory_cases:
        if not deadline.allows(0.0):
            emit({"mode": mode, "tokens": length, "status": "skipped", "reason": "section time cap"})
            continue
        trainer = build_trainer(dims, length, vocab, activation_checkpointing=mode)
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
