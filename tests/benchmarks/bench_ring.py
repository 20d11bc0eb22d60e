"""Ring attention on CPU with gloo: P = 2 against one process, and block skipping against no skipping.

Two measurements of forward + backward time, one thread per process: wall time (median over
iterations, slowest rank) and CPU time of the busiest rank, which shows the split of the work even
when other jobs compete for the cores:

1. one document over the window: the P = 2 zigzag ring against a single process computing the same
   attention (``group=None``: the same kernel over the whole window);
2. many short documents: the P = 2 ring with block skipping against the same ring with
   ``skip_empty_blocks=False``, with the fractions of block pairs computed, of the window's scores
   inside computed rectangles (``RingStats``) and inside the tiles the CPU kernel actually runs.

    .venv/bin/python tests/benchmarks/bench_ring.py [--seq-len 4096] [--iters 3]
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from layouts import document_segments

from longctx.trainer.attention import RingPlan, build_ring_plan, ring_attention
from longctx.trainer.attention.kernels import kernel_calls
from longctx.trainer.attention.select import select_kernels
from longctx.trainer.attention.zigzag import zigzag_indices


def time_attention(
    args: argparse.Namespace, group: dist.ProcessGroup | None, segments: torch.Tensor, skip: bool
):
    """Median fwd+bwd wall and CPU seconds of this rank, and its plan."""
    world = 1 if group is None else dist.get_world_size(group)
    rank = 0 if group is None else dist.get_rank(group)
    rows = zigzag_indices(args.seq_len, world, rank)
    plan = build_ring_plan(rows, segments[rows], group=group, skip_empty_blocks=skip)
    generator = torch.Generator().manual_seed(rank)
    q = torch.randn(len(rows), args.heads, args.head_dim, generator=generator).requires_grad_()
    k, v = (
        torch.randn(len(rows), args.kv_heads, args.head_dim, generator=generator).requires_grad_()
        for _ in "kv"
    )
    grad = torch.randn_like(q)
    wall, cpu = [], []
    for iteration in range(args.iters + 1):
        if group is not None:
            dist.barrier(group)
        started, started_cpu = time.perf_counter(), time.process_time()
        ring_attention(q, k, v, plan).backward(grad)
        if iteration:  # the first run is a warm-up
            wall.append(time.perf_counter() - started)
            cpu.append(time.process_time() - started_cpu)
    return statistics.median(wall), statistics.median(cpu), plan


def kernel_scores(plan: RingPlan, args: argparse.Namespace) -> int:
    """Query-key scores this rank's kernel calls compute (the CPU kernel works on non-empty tiles)."""
    kernels = select_kernels(torch.device("cpu"), torch.float32, args.head_dim, args.heads, args.kv_heads)
    return sum(
        tile.shape[0] * tile.shape[1]
        for block in plan.blocks
        if block is not None
        for _, tile in kernel_calls(kernels, block)
    )


def ring_worker(rank: int, world: int, store: str, args: argparse.Namespace, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        store=dist.FileStore(store, world),
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(minutes=5),
    )
    cases = [
        ("one_doc", None, True),
        ("many_docs", args.mean_doc, True),
        ("many_docs_no_skip", args.mean_doc, False),
    ]
    results = {}
    for name, mean_length, skip in cases:
        wall, cpu, plan = time_attention(
            args, dist.group.WORLD, document_segments(args.seq_len, mean_length), skip
        )
        slowest = torch.tensor([wall, cpu], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        scores = torch.tensor(kernel_scores(plan, args), dtype=torch.float64)
        dist.all_reduce(scores)
        stats = plan.stats
        results[name] = {
            "kernel_fraction": float(scores) / (stats.pairs_total * stats.tokens_q * stats.tokens_kv),
            "seconds": float(slowest[0]),
            "cpu_seconds": float(slowest[1]),
            "compute_fraction": stats.compute_fraction,
            "score_fraction": stats.score_fraction,
            "kv_sends": stats.kv_sends,
            "kv_sends_dense": stats.kv_sends_dense,
        }
    if rank == 0:
        Path(out).write_text(json.dumps(results))
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument(
        "--mean-doc", type=int, default=128, help="mean document length of the many-document window"
    )
    parser.add_argument("--iters", type=int, default=3)
    args = parser.parse_args()
    world = 2
    shape = f"heads {args.heads}/{args.kv_heads}, head_dim {args.head_dim}"
    print(f"seq_len {args.seq_len}, {shape}, fp32, CPU, gloo, one thread per process")

    torch.set_num_threads(1)
    single, single_cpu, _ = time_attention(args, None, document_segments(args.seq_len, None), True)
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "results.json")
        mp.spawn(ring_worker, args=(world, str(Path(tmp) / "store"), args, out), nprocs=world, join=True)
        ring = json.loads(Path(out).read_text())

    one, skip, dense = ring["one_doc"], ring["many_docs"], ring["many_docs_no_skip"]
    print(f"\none document, fwd+bwd: single process {single:.3f} s wall, {single_cpu:.3f} s CPU")
    print(f"  ring P={world}: {one['seconds']:.3f} s wall, {one['cpu_seconds']:.3f} s CPU (busiest rank)")
    print(f"  ring / single: wall {one['seconds'] / single:.2f}, CPU {one['cpu_seconds'] / single_cpu:.2f}")
    print(
        f"  ring pairs computed {one['compute_fraction']:.2f}, scores in computed rectangles"
        f" {one['score_fraction']:.3f}, in kernel tiles {one['kernel_fraction']:.3f}"
    )
    print(f"\nmany documents (mean length {args.mean_doc}), ring P={world}:")
    for label, row in (("skipping", skip), ("no skipping", dense)):
        print(
            f"  {label:12s} {row['seconds']:.3f} s wall, {row['cpu_seconds']:.3f} s CPU,"
            f" pairs {row['compute_fraction']:.2f}, scores in rectangles {row['score_fraction']:.3f},"
            f" in kernel tiles {row['kernel_fraction']:.3f},"
            f" kv sends {row['kv_sends']}/{row['kv_sends_dense']}"
        )
    wall_ratio, cpu_ratio = skip["seconds"] / dense["seconds"], skip["cpu_seconds"] / dense["cpu_seconds"]
    print(
        f"  skipping / no skipping: wall {wall_ratio:.3f}, CPU {cpu_ratio:.3f} ({1 / wall_ratio:.1f}x faster)"
    )


if __name__ == "__main__":
    main()
