"""Per-rank attention work and traffic of each context-parallel mode, zigzag against balanced layouts.

Deterministic, no clocks: for real packed rows it counts, per rank and per training step (one layer),

* attention work at the kernel's block granularity: each rank's query tokens and every key token are
  cut into tiles of ``--tile`` (128, FlashAttention's block) consecutive tokens as the rank holds them,
  and a tile pair counts ``tile x tile`` scores when any of its queries sees any of its keys (the same
  document, the key not later), else nothing: masked tiles are skipped as the kernels skip them;
* bytes each rank sends, forward and backward, in bf16 (fp32 for the ring's dK/dV accumulators), for
  a Llama-3-8B layer (32 query, 8 key/value heads of 128): the ring forwards a block only as far as
  some rank needs it (``longctx.trainer.attention.plan``), the all-gather is skipped for a row in which
  no rank needs another's keys, Ulysses and the hybrid move q, k, v and the output through all-to-alls.

Rows come from two places: windows that ``longctx pack`` wrote from the shared corpus (books and
papers), and windows best-fit packed (``longctx.packer.binpack``) from a length distribution shaped like
long-document data (most documents short, a few very long). For each window length, cp and mode it
prints the busiest rank's work over the mean (max/mean) under the zigzag and the balanced layout, and
writes a JSON report (``--report``) whose ``headline`` is 128K at cp 8.

    python tests/benchmarks/bench_cp_balance.py                       # both sources, 32K and 128K, cp 4 and 8
    python tests/benchmarks/bench_cp_balance.py --no-corpus --rows 8  # the synthetic rows only
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from longctx.packer.binpack import best_fit_decreasing
from longctx.trainer.parallel.layout import rank_indices
from longctx.trainer.parallel.mesh import CP_MODES, MeshShape

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO.parent / "shared" / "corpus"
HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128  # Llama-3-8B
BF16, FP32 = 2, 4


@dataclass(frozen=True)
class Row:
    """One packed window: its document boundaries and where it came from."""

    cu_seqlens: list[int]
    source: str


# Work at tile granularity --------------------------------------------------------------------------------
def _runs(index: np.ndarray, segment: np.ndarray, tile: int) -> tuple[np.ndarray, ...]:
    """Per (tile, document) run of a rank's tokens: tile number, document, first and last index."""
    tiles = np.arange(len(index)) // tile
    change = np.flatnonzero((np.diff(tiles) != 0) | (np.diff(segment) != 0)) + 1
    starts = np.concatenate([[0], change])
    ends = np.concatenate([change, [len(index)]]) - 1
    return tiles[starts], segment[starts], index[starts], index[ends]


def tile_pairs(held: Sequence[np.ndarray], segments: np.ndarray, tile: int) -> np.ndarray:
    """Bool ``[tiles, tiles]`` over every rank's tiles (rank-major): does the query tile see any key of the
    key tile. ``held[r]`` are rank ``r``'s window indices in the order it holds them."""
    per_rank = [math.ceil(len(h) / tile) for h in held]
    offsets = np.concatenate([[0], np.cumsum(per_rank)])
    total = int(offsets[-1])
    parts = [_runs(h, segments[h], tile) for h in held]
    tile_of = np.concatenate([p[0] + offsets[r] for r, p in enumerate(parts)])
    segment = np.concatenate([p[1] for p in parts])
    first = np.concatenate([p[2] for p in parts])
    last = np.concatenate([p[3] for p in parts])
    seen = np.zeros((total, total), dtype=bool)
    order = np.argsort(segment, kind="stable")
    bounds = np.flatnonzero(np.diff(segment[order])) + 1
    for group in np.split(order, bounds):
        # query run q sees key run k iff the query run's last index is not before the key run's first
        sees = last[group][:, None] >= first[group][None, :]
        rows, cols = np.nonzero(sees)
        seen[tile_of[group][rows], tile_of[group][cols]] = True
    return seen


def _owner_tiles(held: Sequence[np.ndarray], tile: int) -> list[slice]:
    offsets = np.concatenate([[0], np.cumsum([math.ceil(len(h) / tile) for h in held])])
    return [slice(int(a), int(b)) for a, b in itertools.pairwise(offsets)]


# Traffic ------------------------------------------------------------------------------------------------
def ring_sends(need: np.ndarray, block_bytes: float) -> np.ndarray:
    """Bytes each ring rank sends in one step (forward + backward) given ``need[r, s]`` (rank ``r``'s queries
    see rank ``s``'s keys): block ``s`` travels to the last position that needs it, forward and again
    backward, and its fp32 dK/dV accumulator rides from the first remote position that needs it to the last,
    then home (``longctx.trainer.attention.plan``)."""
    world = len(need)
    sent = np.zeros(world)
    for s in range(world):
        positions = [p for p in range(1, world) if need[(s + p) % world, s]]
        if not positions:
            continue
        first, last = positions[0], positions[-1]
        for p in range(last):  # the block, forward and backward
            sent[(s + p) % world] += 2 * block_bytes
        for p in range(first, last + 1):  # the accumulator, to the next rank or home
            sent[(s + p) % world] += block_bytes * FP32 / BF16
    return sent


def _need(seen: np.ndarray, owners: Sequence[slice]) -> np.ndarray:
    return np.array([[seen[a, b].any() for b in owners] for a in owners])


@dataclass(frozen=True)
class ModeCount:
    """Per-rank work (scores, all heads) and bytes sent per step, for one mode on one row."""

    work: np.ndarray
    sent: np.ndarray


def count_mode(mode: str, cu_seqlens: Sequence[int], cp: int, layout: str, tile: int) -> ModeCount:
    """Per-rank attention work and bytes of ``mode`` on one row under ``layout``: the hybrid with
    all-to-all groups of 2 ranks, Ulysses over all ``cp`` ranks."""
    length = cu_seqlens[-1]
    degree = {"ulysses": cp, "hybrid": 2}.get(mode, 1)
    cu = torch.tensor(cu_seqlens)
    held = [
        rank_indices(cu, length, cp=cp, cp_rank=r, layout=layout, ulysses=degree).numpy() for r in range(cp)
    ]
    segments = np.repeat(np.arange(len(cu_seqlens) - 1), np.diff(cu_seqlens))
    n = length // cp
    kv_dim = KV_HEADS * HEAD_DIM
    if degree == 1:  # ring, allgather: each rank's queries against every rank's keys, all heads
        seen = tile_pairs(held, segments, tile)
        owners = _owner_tiles(held, tile)
        work = np.array([seen[o].sum() for o in owners], dtype=float) * tile * tile * HEADS
        need = _need(seen, owners)
        block = n * 2 * kv_dim * BF16
        if mode == "ring":
            sent = ring_sends(need, block)
        else:  # one all-gather forward, one reduce-scatter backward; none when no rank needs another's keys
            remote = bool((need & ~np.eye(cp, dtype=bool)).any())
            sent = np.full(cp, 2 * (cp - 1) * block if remote else 0.0)
        return ModeCount(work, sent)
    # ulysses, hybrid: the all-to-all group attends over its tokens for heads / degree heads each
    groups = [np.concatenate(held[g * degree : (g + 1) * degree]) for g in range(cp // degree)]
    seen = tile_pairs(groups, segments, tile)
    owners = _owner_tiles(groups, tile)
    group_work = np.array([seen[o].sum() for o in owners], dtype=float) * tile * tile * HEADS / degree
    work = np.repeat(group_work, degree)
    kv_heads = KV_HEADS * MeshShape.kv_head_copies(KV_HEADS, degree)
    share = (degree - 1) / degree
    a2a = (
        2 * share * n * (2 * HEADS + 2 * kv_heads) * HEAD_DIM * BF16
    )  # q, k, v and out; forward and backward
    sent = np.full(cp, a2a)
    if len(groups) > 1:
        ring_block = degree * n * 2 * (kv_heads // degree) * HEAD_DIM * BF16
        sent += np.repeat(ring_sends(_need(seen, owners), ring_block), degree)
    return ModeCount(work, sent)


def max_over_mean(work: np.ndarray) -> float:
    return float(work.max() / work.mean()) if work.mean() > 0 else 1.0


# Rows -----------------------------------------------------------------------------------------------------
def synthetic_rows(seq_len: int, rows: int, seed: int) -> list[Row]:
    """``rows`` windows drawn at random among those holding more than one document (one document is
    balanced by zigzag already), best-fit packed from document lengths shaped like long-document data:
    90% short (lognormal, median 1K tokens), 10% long (log-uniform from 8K to twice the window)."""
    rng = np.random.default_rng(seed)
    lengths: list[int] = []
    while sum(lengths) < seq_len * rows * 8:
        if rng.random() < 0.9:
            lengths.append(int(max(16, rng.lognormal(math.log(1000), 1.0))))
        else:
            lengths.append(int(math.exp(rng.uniform(math.log(8192), math.log(2 * seq_len)))))
    packing = best_fit_decreasing(np.array(lengths), seq_len)
    mixed = []
    for w in range(packing.num_windows):
        segment_lengths = packing.length[packing.window_ptr[w] : packing.window_ptr[w + 1]]
        if len(segment_lengths) > 1 and int(segment_lengths.sum()) == seq_len:
            mixed.append([0, *np.cumsum(segment_lengths).tolist()])
    picked = sorted(rng.permutation(len(mixed))[:rows].tolist())
    return [Row(mixed[i], "synthetic") for i in picked]


def corpus_rows(seq_len: int, rows: int, work: Path) -> list[Row]:
    """``rows`` windows drawn at random among those that ``longctx curate`` and ``longctx pack`` made
    from the shared corpus (run once into ``work``); a padding tail is a segment, as the trainer sees it."""
    from longctx import jobs
    from longctx.config import parse_config
    from longctx.core.layout import RunLayout
    from longctx.packer.reader import ShardSet

    layout = RunLayout(work)
    folder = layout.shard_folder(seq_len)
    if not (folder / "manifest.json").is_file():
        config = {
            "output": str(work),
            "context": {"original": 8192, "target": seq_len},
            "tokenizer": {"train_vocab_size": 4096, "train_sample_bytes": 4_000_000},
            "curate": {
                "input": str(CORPUS),
                "min_fraction_of_target": 0.01,
                "executor": {"kind": "local", "tasks": 2, "workers": 2},
            },
            "pack": {"seq_lens": [seq_len], "executor": {"kind": "local", "tasks": 1, "workers": 1}},
        }
        cfg = parse_config(config)
        if not (layout.documents / "manifest.json").is_file():
            jobs.curate(cfg)
        jobs.pack(cfg)
    shards = ShardSet(folder)
    picked = sorted(np.random.default_rng(seq_len).permutation(len(shards))[:rows].tolist())
    return [Row([int(c) for c in shards.row(i).cu_seqlens], "corpus") for i in picked]


# Report ---------------------------------------------------------------------------------------------------
def measure(rows: Sequence[Row], cp: int, tile: int) -> dict:
    """Mean over rows of max/mean per mode and layout, and each mode's mean bytes per rank (balanced)."""
    result: dict = {"rows": len(rows), "modes": {}}
    for layout in ("zigzag", "balanced"):
        ratios = [max_over_mean(count_mode("ring", r.cu_seqlens, cp, layout, tile).work) for r in rows]
        result[layout] = {"max_over_mean": float(np.mean(ratios)), "worst": float(np.max(ratios))}
    for mode in CP_MODES:
        counts = [count_mode(mode, r.cu_seqlens, cp, "balanced", tile) for r in rows]
        zigzag = [count_mode(mode, r.cu_seqlens, cp, "zigzag", tile) for r in rows]
        result["modes"][mode] = {
            "max_over_mean": float(np.mean([max_over_mean(c.work) for c in counts])),
            "zigzag_max_over_mean": float(np.mean([max_over_mean(c.work) for c in zigzag])),
            "bytes_per_rank": float(np.mean([c.sent.mean() for c in counts])),
            "zigzag_bytes_per_rank": float(np.mean([c.sent.mean() for c in zigzag])),
            "rows_without_traffic": sum(int(c.sent.max() == 0) for c in counts),
            "max_bytes_per_rank": float(np.max([c.sent.max() for c in counts])),
        }
    return result


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="32768,131072")
    parser.add_argument("--cp", default="4,8")
    parser.add_argument("--rows", type=int, default=16, help="windows per source and length")
    parser.add_argument("--tile", type=int, default=128)
    parser.add_argument("--no-corpus", action="store_true", help="skip the shared corpus' rows")
    parser.add_argument("--work", type=Path, default=REPO / "runs" / "bench_cp_balance")
    parser.add_argument("--report", type=Path, default=None, help="write the JSON report here")
    args = parser.parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",")]
    cps = [int(x) for x in args.cp.split(",")]
    use_corpus = not args.no_corpus and (CORPUS / "MANIFEST.md").is_file()
    if not args.no_corpus and not use_corpus:
        print(f"skipping the corpus rows: no shared corpus at {CORPUS}")
    results: dict = {}
    print(f"{'source':>9} {'window':>7} {'cp':>3} {'zigzag':>7} {'balanced':>8}   " + "  ".join(CP_MODES))
    for length in lengths:
        sources = {"synthetic": synthetic_rows(length, args.rows, seed=length)}
        if use_corpus:
            sources["corpus"] = corpus_rows(length, args.rows, args.work / f"seq{length}")
        for name, rows in sources.items():
            if not rows:
                print(f"{name:>9} {length:>7}: no window")
                continue
            for cp in cps:
                r = measure(rows, cp, args.tile)
                results[f"{name}/{length}/cp{cp}"] = r
                modes = "  ".join(f"{r['modes'][m]['bytes_per_rank'] / 2**20:7.1f}MiB" for m in CP_MODES)
                print(
                    f"{name:>9} {length:>7} {cp:>3} {r['zigzag']['max_over_mean']:7.3f} "
                    f"{r['balanced']['max_over_mean']:8.3f}   {modes}"
                )
    headline = results.get("synthetic/131072/cp8")
    report = {
        "date": datetime.date.today().isoformat(),
        "tile": args.tile,
        "model": {"heads": HEADS, "kv_heads": KV_HEADS, "head_dim": HEAD_DIM},
        "results": results,
    }
    if headline is not None:
        report |= {
            "zigzag": headline["zigzag"],
            "balanced": headline["balanced"],
            "modes": headline["modes"],
            "corpus_128k_cp8": results.get("corpus/131072/cp8"),
        }
        print(
            f"128K, cp 8 (synthetic): zigzag max/mean {headline['zigzag']['max_over_mean']:.3f}, "
            f"balanced {headline['balanced']['max_over_mean']:.3f} (goal <= 1.05)"
        )
    if args.report is not None:
        args.report.write_text(json.dumps(report, indent=2) + "\n")
        print(f"report: {args.report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
