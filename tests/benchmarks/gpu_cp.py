"""The GPU suite's ``cp_modes`` section: each context-parallel mode's per-rank attention work on one device.

One GPU cannot host a process group of several ranks (NCCL refuses two ranks on one device), so each
rank of a virtual ``P``-rank group runs here in turn, on the tensors it would hold, through the
trainer's own entry points (``build_ring_plan`` and ``ring_attention``, forward and backward), and only
the transfers are left out (``bench_cp_balance.py`` counts their bytes, ``longctx plan`` prices them):

* ``ring``: the rank's queries against each rank's key/value block it needs, one call per block;
* ``allgather``: the rank's queries against the whole window's keys and values, one call;
* ``ulysses``: every token of the window, for ``heads / P`` query heads (key/value heads copied up to
  ``P`` where fewer), one call;
* ``hybrid``: all-to-all groups of 2 ranks, a ring across the ``P / 2`` groups, ``heads / 2`` heads.

For each mode and row layout (zigzag, balanced) on a window packed like long-document data
(``bench_cp_balance.synthetic_rows``), the section reports every rank's milliseconds, the slowest over
the mean (a step waits for its slowest rank), and the attention rate of the whole group: useful causal
FLOPs of the window over ``P x`` the slowest rank's time, against the ring with the zigzag layout.
MFU under several GPUs needs several GPUs; this measures what one can.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable

import torch
from bench_cp_balance import synthetic_rows
from gpu_measure import Deadline, time_ms
from layouts import document_lengths

from longctx.trainer.attention import build_ring_plan, ring_attention
from longctx.trainer.attention.masks import pair_extents
from longctx.trainer.parallel.layout import rank_indices
from longctx.trainer.parallel.mesh import CP_MODES, MeshShape
from longctx.trainer.parallel.zigzag import segment_ids
from longctx.trainer.planning.flops import TRAIN_FACTOR, attention_flops, causal_pair_count

Emit = Callable[[dict], None]
HYBRID_DEGREE = 2


def _calls(mode: str, held: list[torch.Tensor], segments: torch.Tensor, heads: int, kv_heads: int):
    """Per rank: the (query rows, key rows, query heads, kv heads) of each attention call it makes."""
    world = len(held)
    degree = {"ulysses": world, "hybrid": HYBRID_DEGREE}.get(mode, 1)
    if degree > 1:
        groups = [torch.cat(held[g * degree : (g + 1) * degree]) for g in range(world // degree)]
        kv_share = kv_heads * MeshShape.kv_head_copies(kv_heads, degree) // degree
        per_group = _calls("ring", groups, segments, heads // degree, kv_share) if len(groups) > 1 else None
        if per_group is None:
            everything = [(groups[0], groups[0], heads // degree, kv_share)]
            return [everything for _ in range(world)]
        return [per_group[r // degree] for r in range(world)]
    index = torch.stack(held)
    needed, _ = pair_extents(index, segments[index], index, segments[index])
    if mode == "allgather":
        keys = torch.cat(held)
        return [[(rows, keys, heads, kv_heads)] for rows in held]
    return [
        [(rows, held[s], heads, kv_heads) for s in range(world) if needed[r, s]]
        for r, rows in enumerate(held)
    ]


def _rank_ms(calls, segments, settings, warmup: int, reps: int) -> float:
    """Median milliseconds of one rank's calls, forward and backward, on fresh random tensors."""
    device, dtype, head_dim = settings.device, settings.speed_dtype, settings.head_dim
    prepared = []
    for rows, keys, heads, kv_heads in calls:
        rows_d, keys_d = rows.to(device), keys.to(device)
        plan = build_ring_plan(
            rows_d, segments[rows].to(device), kv_index=keys_d, kv_segment=segments[keys].to(device)
        )
        options = {"device": device, "dtype": dtype, "requires_grad": True}
        q = torch.randn(len(rows), heads, head_dim, **options)
        k, v = (torch.randn(len(keys), kv_heads, head_dim, **options) for _ in range(2))
        prepared.append((plan, q, k, v))

    def step() -> None:
        for plan, q, k, v in prepared:
            out = ring_attention(q, k, v, plan)
            torch.autograd.grad(out, (q, k, v), torch.ones_like(out))

    return statistics.median(time_ms(step, device, warmup=warmup, reps=reps))


def run_cp_modes(settings, deadline: Deadline, emit: Emit) -> dict:
    """Every mode and layout at each of ``settings.cp_tokens`` over ``settings.cp_world`` virtual ranks."""
    heads, kv_heads, world = settings.heads, settings.kv_heads, settings.cp_world
    summary: dict = {"world": world, "rows": {}}
    for tokens in settings.cp_tokens:
        rows = synthetic_rows(tokens, 1, seed=tokens)
        lengths = (
            rows[0].cu_seqlens if rows else [0, *itertools.accumulate(document_lengths(tokens, tokens // 8))]
        )
        cu = torch.tensor(lengths)
        segments = segment_ids(cu, tokens)
        useful = TRAIN_FACTOR * attention_flops(
            heads * settings.head_dim, causal_pair_count(cu.diff().tolist())
        )
        warmup, reps = settings.speed_reps(tokens)
        rates: dict[str, float] = {}
        for mode in CP_MODES:
            for layout in ("zigzag", "balanced"):
                if deadline.left() <= 0:
                    emit({"tokens": tokens, "mode": mode, "layout": layout, "status": "skipped (time cap)"})
                    continue
                degree = {"ulysses": world, "hybrid": HYBRID_DEGREE}.get(mode, 1)
                problem = MeshShape.heads_problem(heads, kv_heads, degree)
                if problem is not None:
                    emit({"tokens": tokens, "mode": mode, "layout": layout, "status": f"refused: {problem}"})
                    continue
                held = [
                    rank_indices(cu, tokens, cp=world, cp_rank=r, layout=layout, ulysses=degree)
                    for r in range(world)
                ]
                per_rank = [
                    _rank_ms(calls, segments, settings, warmup, reps)
                    for calls in _calls(mode, held, segments, heads, kv_heads)
                ]
                slowest = max(per_rank)
                rate = useful / (world * slowest * 1e-3) / 1e12
                rates[f"{mode}/{layout}"] = rate
                emit({
                    "tokens": tokens, "mode": mode, "layout": layout, "documents": len(cu) - 1,
                    "rank_ms": per_rank, "max_over_mean": slowest / statistics.mean(per_rank),
                    "tflops": rate, "status": "ok",
                })  # fmt: skip
        baseline = rates.get("ring/zigzag")
        summary["rows"][str(tokens)] = {
            name: {"tflops": rate, "vs_ring_zigzag": rate / baseline if baseline else None}
            for name, rate in rates.items()
        }
    summary["passed"] = bool(summary["rows"]) and all(summary["rows"].values())
    return summary
