"""Ring attention on CPU with gloo: the ring against one process, and what block skipping and
tiling each contribute.

Forward + backward time, one thread per process, over ``--iters`` repetitions after a warm-up:
wall time (slowest rank) and CPU time (busiest rank), each as median and spread (min-max), and
ratios of medians against a baseline measured in the same run:

1. one document over the window: the P-rank zigzag ring against a single process computing the
   same attention (``group=None``: the same kernel over the whole window);
2. many short documents: the ring's two savings, separated. *Skipping* drops block pairs where no
   query sees a key (no send, no compute; ``skip_empty_blocks``); *tiling* computes a block as the
   non-empty tiles of the rectangle of allowed entries (``tile_blocks``), so the dense-mask CPU
   kernel skips the masked part inside a block. Four plans: both, tiling only, skipping only,
   neither; skipping's gain is (tiling only) / (both), tiling's is (skipping only) / (both). With the
   zigzag layout at P = 2 every block pair holds allowed entries, so nothing is skipped there: run
   ``--world 4`` to see pairs skipped. Also printed: the fractions of block pairs computed, of the
   window's scores inside computed rectangles (``RingStats``) and inside the tiles the kernel runs.

    .venv/bin/python tests/benchmarks/bench_ring.py [--seq-len 4096] [--iters 5] [--world 2]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
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
from longctx.trainer.parallel.zigzag import zigzag_indices


def time_attention(
    args: argparse.Namespace,
    group: dist.ProcessGroup | None,
    segments: torch.Tensor,
    skip: bool,
    tile: bool = True,
):
    """Per-repetition fwd+bwd wall and CPU seconds of this rank, and its plan."""
    world = 1 if group is None else dist.get_world_size(group)
    rank = 0 if group is None else dist.get_rank(group)
    rows = zigzag_indices(args.seq_len, world, rank)
    plan = build_ring_plan(rows, segments[rows], group=group, skip_empty_blocks=skip, tile_blocks=tile)
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
    return wall, cpu, plan


def summary(values: list[float]) -> str:
    """Median and spread of repetitions."""
    return f"{statistics.median(values):.3f} s [{min(values):.3f}-{max(values):.3f}]"


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
        ("one_doc", None, True, True),
        ("both", args.mean_doc, True, True),
        ("tiling_only", args.mean_doc, False, True),
        ("skipping_only", args.mean_doc, True, False),
        ("neither", args.mean_doc, False, False),
    ]
    results = {}
    for name, mean_length, skip, tile in cases:
        wall, cpu, plan = time_attention(
            args, dist.group.WORLD, document_segments(args.seq_len, mean_length), skip, tile
        )
        # per repetition: the slowest rank's wall time and the busiest rank's CPU time
        slowest = torch.tensor([wall, cpu], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        scores = torch.tensor(kernel_scores(plan, args), dtype=torch.float64)
        dist.all_reduce(scores)
        stats = plan.stats
        results[name] = {
            "kernel_fraction": float(scores) / (stats.pairs_total * stats.tokens_q * stats.tokens_kv),
            "seconds": slowest[0].tolist(),
            "cpu_seconds": slowest[1].tolist(),
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
    parser.add_argument("--iters", type=int, default=5, help="timed repetitions (after one warm-up)")
    parser.add_argument("--world", type=int, default=2, help="ring size P")
    args = parser.parse_args()
    world = args.world
    shape = f"heads {args.heads}/{args.kv_heads}, head_dim {args.head_dim}"
    print(
        f"seq_len {args.seq_len}, {shape}, fp32, CPU, gloo, one thread per process, P={world}, "
        f"{args.iters} repetitions: median [min-max]; load {os.getloadavg()[0]:.1f}"
    )

    torch.set_num_threads(1)
    single, single_cpu, _ = time_attention(args, None, document_segments(args.seq_len, None), True)
    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "results.json")
        mp.spawn(ring_worker, args=(world, str(Path(tmp) / "store"), args, out), nprocs=world, join=True)
        ring = json.loads(Path(out).read_text())

    med = statistics.median
    one = ring["one_doc"]
    print(f"\none document, fwd+bwd: single process {summary(single)} wall, {summary(single_cpu)} CPU")
    print(
        f"  ring P={world}: {summary(one['seconds'])} wall, {summary(one['cpu_seconds'])} CPU (busiest rank)"
    )
    print(
        f"  ring / single: wall {med(one['seconds']) / med(single):.2f}, CPU "
        f"{med(one['cpu_seconds']) / med(single_cpu):.2f}"
    )
    print(
        f"  ring pairs computed {one['compute_fraction']:.2f}, scores in computed rectangles"
        f" {one['score_fraction']:.3f}, in kernel tiles {one['kernel_fraction']:.3f}"
    )
    print(f"\nmany documents (mean length {args.mean_doc}), ring P={world}:")
    labels = {
        "both": "skip + tile",
        "tiling_only": "tile only",
        "skipping_only": "skip only",
        "neither": "neither",
    }
    for name, label in labels.items():
        row = ring[name]
        print(
            f"  {label:12s} {summary(row['seconds'])} wall, {summary(row['cpu_seconds'])} CPU,"
            f" pairs {row['compute_fraction']:.2f}, scores in rectangles {row['score_fraction']:.3f},"
            f" in kernel tiles {row['kernel_fraction']:.3f}, kv sends "
            f"{row['kv_sends']}/{row['kv_sends_dense']}"
        )

    def ratio(slow: str, fast: str) -> str:
        wall = med(ring[slow]["seconds"]) / med(ring[fast]["seconds"])
        cpu = med(ring[slow]["cpu_seconds"]) / med(ring[fast]["cpu_seconds"])
        return f"wall {wall:.2f}x, CPU {cpu:.2f}x"

    print(f"  skipping's gain (tile only / skip + tile):  {ratio('tiling_only', 'both')}")
    print(f"  tiling's gain   (skip only / skip + tile):  {ratio('skipping_only', 'both')}")
    print(f"  both together   (neither / skip + tile):    {ratio('neither', 'both')}")


if __name__ == "__main__":
    main()
