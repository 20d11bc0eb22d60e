"""The report of ``longctx plan``: the figures of :mod:`longctx.trainer.planning.plan` as an aligned table
for people (:func:`format_report`) and as CSV rows for tools (:func:`csv_rows`, :func:`write_csv`).

Every figure comes from ``longctx.trainer.planning.plan``, ``longctx.trainer.planning.flops`` and
``longctx.trainer.planning.memory``; this module only chooses units and lays them out.
"""

from __future__ import annotations

import csv
from collections.abc import Callable, Sequence
from pathlib import Path

from longctx.trainer.models.shape import ModelShape
from longctx.trainer.planning.cp_modes import ModeCost, choose, mode_costs
from longctx.trainer.planning.fit import MAX_GPUS
from longctx.trainer.planning.flops import layer_flops, matmul_param_count, param_count
from longctx.trainer.planning.memory import HEADROOM_FRACTION, RESERVED_BYTES, usable_bytes
from longctx.trainer.planning.plan import (
    KV_CACHE_FORMATS,
    LengthPlan,
    RunSettings,
    StagePlan,
    checkpointing_at,
    crossover_length,
    kv_cache_bytes_per_token,
    overlap_min_block,
)


def human_bytes(value: float) -> str:
    """Bytes in binary units: ``327680`` -> ``320 KiB``, ``42949672960`` -> ``40 GiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(value) < 1024 or unit == "PiB":
            return f"{value:.0f} {unit}" if unit == "B" or value == int(value) else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def human_flops(value: float) -> str:
    """FLOPs in decimal units: ``3.02e8`` -> ``0.302 GFLOP``."""
    for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if abs(value) >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.3g} FLOP"


def human_seconds(value: float) -> str:
    """A duration: ``4.3e-5`` -> ``42.9 us``, ``0.0123`` -> ``12.3 ms``, ``184000`` -> ``51.1 h (2.13 d)``."""
    if value < 1e-3:
        return f"{value * 1e6:.3g} us"
    if value < 1:
        return f"{value * 1e3:.3g} ms"
    if value < 3600:
        return f"{value:.3g} s"
    return f"{value / 3600:.1f} h ({value / 86400:.3g} d)"


def human_count(value: float) -> str:
    """A token count in decimal units: ``2e10`` -> ``20B``, ``1.5e6`` -> ``1.5M``."""
    for unit, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if value >= scale:
            return f"{value / scale:.4g}{unit}"
    return f"{value:.4g}"


def human_length(length: int) -> str:
    """``131072`` -> ``128K``; lengths not a multiple of 1024 are printed in full."""
    if length % 1024**2 == 0:
        return f"{length // 1024**2}M"
    if length % 1024 == 0:
        return f"{length // 1024}K"
    return str(length)


def _kv_cell(fmt: str) -> Callable[[LengthPlan], str]:
    """The table cell of the KV cache in format ``fmt``."""
    return lambda p: human_bytes(p.kv_cache_bytes[fmt])


def _rows(settings: RunSettings) -> list[tuple[str, Callable[[LengthPlan], str]]]:
    """Label and cell of every line of the printed table."""
    rows: list[tuple[str, Callable[[LengthPlan], str]]] = [
        ("context length (tokens)", lambda p: f"{p.length:,}"),
        ("attention FLOP/token/layer (causal)", lambda p: human_flops(p.layer.attention)),
        ("attention / (projections + MLP)", lambda p: f"{p.layer.attention_ratio:.2f}"),
        ("activations/layer/seq, FlashAttention", lambda p: human_bytes(p.activation_flash_bytes)),
        ("activations/layer/seq, no FlashAttention", lambda p: human_bytes(p.activation_noflash_bytes)),
    ]
    rows += [(f"KV cache/seq, {fmt}", _kv_cell(fmt)) for fmt in KV_CACHE_FORMATS]
    rows += [
        ("tokens per rank (ring block)", lambda p: f"{p.ring.block_tokens:,}"),
        ("ring send/step/layer (K+V, bf16)", lambda p: human_bytes(p.ring.send_bytes)),
        ("ring compute/step/layer (forward)", lambda p: human_flops(p.ring.forward_flops)),
        ("forward step: compute", lambda p: human_seconds(p.ring.forward_compute_s)),
        ("forward step: communication", lambda p: human_seconds(p.ring.forward_comm_s)),
        ("backward step: compute", lambda p: human_seconds(p.ring.backward_compute_s)),
        ("backward step: communication (+fp32 dK/dV)", lambda p: human_seconds(p.ring.backward_comm_s)),
        ("communication hidden", lambda p: "yes" if p.ring.hidden else "NO"),
        (
            f"rank: weights, AdamW, gradients at the peak (/{settings.state_shards})",
            lambda p: human_bytes(p.memory.model_states),
        ),
        ("rank: gathered parameters (FSDP)", lambda p: human_bytes(p.memory.gathered_params)),
        ("activation checkpointing", lambda p: p.activation_checkpointing),
        (
            f"rank: activations (checkpointing {settings.activation_checkpointing})",
            lambda p: human_bytes(p.memory.activations),
        ),
        ("rank: loss logits chunk", lambda p: human_bytes(p.memory.logits)),
        ("rank: ring buffers", lambda p: human_bytes(p.memory.ring_buffers)),
        ("rank: backward peak (the sum above)", lambda p: human_bytes(p.memory.backward)),
        ("rank: optimizer step peak", lambda p: human_bytes(p.memory.optimizer_step)),
        ("rank: total (the larger peak)", lambda p: human_bytes(p.memory.total)),
        ("train FLOP/token", lambda p: human_flops(p.train_flops_per_token)),
    ]
    if settings.gpu_memory_bytes is not None:
        rows.append(
            (f"fits {human_bytes(settings.gpu_memory_bytes)} per GPU", lambda p: "yes" if p.fits else "NO")
        )
    if settings.tokens is not None:
        rows.append(("wall-clock", lambda p: human_seconds(p.train_seconds or 0.0)))
    return rows


def format_report(model: ModelShape, settings: RunSettings, plans: Sequence[LengthPlan]) -> str:
    """The model summary, the run assumptions, and one aligned column per context length."""
    h = model.hidden_size
    dense = layer_flops(model, 0)
    full, causal = crossover_length(model), crossover_length(model, causal=True)
    forward, backward = (
        overlap_min_block(
            model,
            link_bytes_per_s=settings.link_bytes_per_s,
            achieved_flops=settings.achieved_flops,
            backward=b,
        )
        for b in (False, True)
    )
    kv = ", ".join(
        f"{fmt} {human_bytes(kv_cache_bytes_per_token(model, size))}"
        for fmt, size in KV_CACHE_FORMATS.items()
    )
    lines = [
        f"{model.name}: {param_count(model) / 1e9:.2f}B parameters "
        f"({matmul_param_count(model) / 1e9:.2f}B in matmuls), "
        f"{model.num_layers} layers, hidden {h}, {model.num_heads} query / {model.num_kv_heads} KV heads of "
        f"{model.head_dim}, MLP {model.intermediate_size}, vocab {model.vocab_size}",
        f"per layer per token (forward): projections {human_flops(dense.projections)}, "
        f"MLP {human_flops(dense.mlp)}; "
        f"attention matches them at L = {full:,.0f} ({full / h:.2f} x hidden) counting the full L x L, "
        f"L = {causal:,.0f} ({causal / h:.2f} x hidden) causal",
        f"KV cache per token: {kv}",
        f"ring: cp {settings.cp}, {settings.link_bytes_per_s / 1e9:g} GB/s per rank, "
        f"{settings.achieved_flops / 1e12:g} TFLOP/s achieved: communication hides at "
        f">= {max(forward, backward):,.0f} "
        f"tokens per rank (forward {forward:,.0f}, backward {backward:,.0f})",
    ]
    memory = (
        f"memory per rank: model state sharded over {settings.state_shards} ranks, activation checkpointing "
        f"{settings.activation_checkpointing}, bf16 compute"
    )
    if settings.gpu_memory_bytes is not None:
        memory += (
            f"; fits a {human_bytes(settings.gpu_memory_bytes)} GPU when the total stays under "
            f"{human_bytes(usable_bytes(settings.gpu_memory_bytes))} ({1 - HEADROOM_FRACTION:.0%} of it less "
            f"{human_bytes(RESERVED_BYTES)} for the CUDA context and communication buffers)"
        )
    lines.append(memory)
    if settings.tokens is not None:
        lines.append(
            f"wall-clock: {human_count(settings.tokens)} tokens on {settings.gpus} GPUs at "
            f"{settings.peak_flops / 1e12:g} TFLOP/s peak x MFU {settings.mfu:g}"
        )
    rows = _rows(settings)
    table = [[""] + [human_length(p.length) for p in plans]] + [
        [label] + [cell(p) for p in plans] for label, cell in rows
    ]
    widths = [max(len(row[col]) for row in table) for col in range(len(table[0]))]
    lines.append("")
    for row in table:
        cells = [row[0].ljust(widths[0])] + [
            text.rjust(width) for text, width in zip(row[1:], widths[1:], strict=True)
        ]
        lines.append("  ".join(cells).rstrip())
    lines += _changes(settings, plans)
    lines += format_cp_modes(model, settings, [p.length for p in plans])
    return "\n".join(lines)


def format_cp_modes(model: ModelShape, settings: RunSettings, lengths: Sequence[int]) -> list[str]:
    """For each length, a table of the four context-parallel modes (``train.cp_mode``,
    :func:`~longctx.trainer.planning.cp_modes.mode_costs`): what each rank sends per layer and step,
    its time, what of it no compute hides, the attention compute it hides behind, the memory beyond the
    ring's, or why the mode cannot run;
    then the recommended mode and why. One line when ``cp`` is 1 (nothing to choose)."""
    cp = settings.cp
    if cp == 1:
        return [
            "",
            "context-parallel modes (train.cp_mode): cp 1, one rank holds each window: the ring's local call",
        ]
    node, network = settings.node_link_bytes_per_s / 1e9, settings.link_bytes_per_s / 1e9
    lines = [
        "",
        f"context-parallel modes (train.cp_mode) over cp {cp}, per rank and layer, forward + backward; "
        f"groups of up to {settings.gpus_per_node} ranks (one node) at {node:g} GB/s, larger ones at "
        f"{network:g} GB/s:",
    ]
    header = ["all-to-all", "ring", "sent", "communication", "exposed", "hidden", "attention", "extra memory"]
    for length in lengths:
        costs = mode_costs(model, length, cp, settings)
        held = checkpointing_at(model, length, cp, settings)
        title = f"{human_length(length)} (checkpointing {held})"
        table = [[title, *header]]
        refusals = {}
        for c in costs:
            if c.refused is not None:
                refusals[c.mode] = c.refused
                table.append([c.mode] + [""] * len(header))
                continue
            table.append(
                [
                    c.mode,
                    str(c.ulysses),
                    str(c.ring),
                    human_bytes(c.bytes_per_step),
                    human_seconds(c.comm_s),
                    human_seconds(c.exposed_s),
                    "yes" if c.hidden else "NO",
                    human_seconds(c.compute_s),
                    human_bytes(c.extra_memory_bytes),
                ]
            )
        widths = [max(len(row[col]) for row in table) for col in range(len(header) + 1)]
        lines.append("")
        for row in table:
            if row[0] in refusals:
                lines.append(f"{row[0].ljust(widths[0])}  refused: {refusals[row[0]]}")
                continue
            cells = [row[0].ljust(widths[0])] + [
                text.rjust(w) for text, w in zip(row[1:], widths[1:], strict=True)
            ]
            lines.append("  ".join(cells).rstrip())
        best = choose(costs)
        setting = f" (train.ulysses: {best.train_ulysses})" if best.train_ulysses is not None else ""
        lines.append(f"recommended cp_mode: {best.mode}{setting}: {why(best, costs)}")
    return lines


def why(best: ModeCost, costs: Sequence[ModeCost]) -> str:
    """Why ``best`` (:func:`~longctx.trainer.planning.cp_modes.choose` of ``costs``) is recommended."""
    ring = next(c for c in costs if c.mode == "ring")
    others = sorted(
        (c for c in costs if c.refused is None and c.mode != best.mode), key=lambda c: c.exposed_s
    )
    if best.mode == "ring" and best.hidden:
        return "its transfers hide behind attention compute, and it holds no extra memory"
    runner = f"; next {others[0].mode}, {human_seconds(others[0].exposed_s)}" if others else ""
    if best.mode == "ring":
        return f"the least exposed communication, {human_seconds(best.exposed_s)} per layer{runner}"
    how = {
        "allgather": f"one all-gather over {best.ring} ranks",
        "ulysses": f"all-to-alls over all {best.ulysses} ranks",
        "hybrid": f"all-to-alls over {best.ulysses} ranks, a ring over {best.ring}",
    }[best.mode]
    extra = (
        f"; {human_bytes(best.extra_memory_bytes)} more memory per rank" if best.extra_memory_bytes else ""
    )
    return (
        f"{human_seconds(best.exposed_s)} exposed per layer ({how}) against the ring's "
        f"{human_seconds(ring.exposed_s)}{extra}"
    )


def format_stages(stages: Sequence[StagePlan], settings: RunSettings, gpus: int, gpus_given: bool) -> str:
    """A staged run's stages, one row each: length, RoPE, steps, rows and tokens per step, tokens,
    memory per rank (and whether it fits), time per step and per stage, and the totals."""
    where = f"{gpus} GPUs" + ("" if gpus_given else " (cp x dp_replicate; --gpus for your count)")
    header = ["stage", "length", "RoPE", "steps", "rows/step", "tokens/step", "tokens", "memory/rank"]
    if settings.gpu_memory_bytes is not None:
        header.append("fits")
    header += ["time/step", "stage time"]
    table = [header]
    for s in stages:
        row = [
            str(s.number),
            human_length(s.length),
            s.rope,
            f"{s.steps:,}",
            f"{s.rows:,}",
            human_count(s.tokens_per_step),
            human_count(s.tokens),
            human_bytes(s.memory.total),
        ]
        if s.fits is not None:
            row.append("yes" if s.fits else "NO")
        row += [human_seconds(s.step_seconds), human_seconds(s.seconds)]
        table.append(row)
    widths = [max(len(row[col]) for row in table) for col in range(len(header))]
    rate = f"{settings.peak_flops / 1e12:g} TFLOP/s peak x MFU {settings.mfu:g}"
    lines = [f"stages (train.stages) on {where} at {rate}:"]
    lines += ["  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True)) for row in table]
    tokens, seconds = sum(s.tokens for s in stages), sum(s.seconds for s in stages)
    lines.append(f"total: {human_count(tokens)} tokens, {human_seconds(seconds)} of training")
    return "\n".join(lines)


def _changes(settings: RunSettings, plans: Sequence[LengthPlan]) -> list[str]:
    """A line per length that does not fit: the smallest change of each kind that would."""
    if settings.gpu_memory_bytes is None or all(p.fits for p in plans):
        return []
    lines = [""]
    for p in plans:
        if p.fits:
            continue
        where = f"{human_length(p.length)} does not fit {human_bytes(settings.gpu_memory_bytes)} per GPU"
        if not p.changes:
            lines.append(
                f"{where}, and no change of checkpointing, cp or GPUs (up to {MAX_GPUS:,}) makes it fit"
            )
            continue
        options = [f"{c.describe()} ({human_bytes(c.total_bytes)} per rank)" for c in p.changes]
        joined = options[0] if len(options) == 1 else ", ".join(options[:-1]) + " or " + options[-1]
        lines.append(f"{where}; it would with {joined}")
    return lines


def csv_rows(
    model: ModelShape, settings: RunSettings, plans: Sequence[LengthPlan]
) -> list[dict[str, object]]:
    """One machine-readable row per length; units are in the column names (bytes, FLOPs, seconds, hours)."""
    rows = []
    for p in plans:
        row: dict[str, object] = {
            "model": model.name,
            "length_tokens": p.length,
            "cp": settings.cp,
            "proj_flops_per_token_layer": p.layer.projections,
            "mlp_flops_per_token_layer": p.layer.mlp,
            "attn_causal_flops_per_token_layer": p.layer.attention,
            "attn_to_dense_flops_ratio": p.layer.attention_ratio,
            "crossover_full_tokens": crossover_length(model),
            "crossover_causal_tokens": crossover_length(model, causal=True),
            "act_layer_flash_bytes": p.activation_flash_bytes,
            "act_layer_noflash_bytes": p.activation_noflash_bytes,
        }
        row.update({f"kv_cache_{fmt}_bytes": size for fmt, size in p.kv_cache_bytes.items()})
        row.update(
            {
                "ring_block_tokens": p.ring.block_tokens,
                "ring_send_bytes_per_step": p.ring.send_bytes,
                "ring_fwd_flops_per_step": p.ring.forward_flops,
                "ring_fwd_compute_s": p.ring.forward_compute_s,
                "ring_fwd_comm_s": p.ring.forward_comm_s,
                "ring_bwd_compute_s": p.ring.backward_compute_s,
                "ring_bwd_comm_s": p.ring.backward_comm_s,
                "ring_min_block_tokens": p.ring.min_block_tokens,
                "ring_comm_hidden": int(p.ring.hidden),
                "activation_checkpointing": p.activation_checkpointing,
                "rank_model_state_bytes": p.memory.model_states,
                "rank_gathered_param_bytes": p.memory.gathered_params,
                "rank_activation_bytes": p.memory.activations,
                "rank_logits_bytes": p.memory.logits,
                "rank_ring_buffer_bytes": p.memory.ring_buffers,
                "rank_optimizer_step_bytes": p.memory.optimizer_step,
                "rank_total_bytes": p.memory.total,
                "train_flops_per_token": p.train_flops_per_token,
            }
        )
        row.update(_cp_columns(model, settings, p.length))
        if p.fits is not None:
            row.update(
                {
                    "gpu_memory_bytes": settings.gpu_memory_bytes,
                    "fits": int(p.fits),
                    "fits_with": "; ".join(c.describe() for c in p.changes),
                }
            )
        if p.train_seconds is not None:
            row.update(
                {
                    "train_tokens": settings.tokens,
                    "gpus": settings.gpus,
                    "train_hours": p.train_seconds / 3600,
                }
            )
        rows.append(row)
    return rows


def _cp_columns(model: ModelShape, settings: RunSettings, length: int) -> dict[str, object]:
    """The CSV columns of the context-parallel modes at ``length``: per mode its all-to-all degree,
    the reason it is refused (empty when it runs), bytes sent, communication and exposed seconds and
    extra memory per rank, layer and step; then the recommended mode and its ``train.ulysses``."""
    costs = mode_costs(model, length, settings.cp, settings)
    columns: dict[str, object] = {}
    for c in costs:
        columns.update(
            {
                f"cp_{c.mode}_ulysses": c.ulysses,
                f"cp_{c.mode}_refused": c.refused or "",
                f"cp_{c.mode}_bytes_per_step": c.bytes_per_step,
                f"cp_{c.mode}_comm_s": c.comm_s,
                f"cp_{c.mode}_exposed_s": c.exposed_s,
                f"cp_{c.mode}_hidden": int(c.hidden),
                f"cp_{c.mode}_extra_memory_bytes": c.extra_memory_bytes,
            }
        )
    best = choose(costs)
    columns["cp_recommended"] = best.mode
    columns["cp_recommended_ulysses"] = best.train_ulysses or ""
    return columns


def write_csv(path: Path, model: ModelShape, settings: RunSettings, plans: Sequence[LengthPlan]) -> None:
    """Write :func:`csv_rows` to ``path`` atomically (parent folders created)."""
    from longctx.core.atomic import atomic_path

    rows = csv_rows(model, settings, plans)
    with atomic_path(path) as tmp, tmp.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows({key: _csv_number(value) for key, value in row.items()} for row in rows)


def _csv_number(value: object) -> object:
    """Whole floats as integers (``327680`` rather than ``327680.0``); everything else unchanged."""
    return int(value) if isinstance(value, float) and value.is_integer() else value
