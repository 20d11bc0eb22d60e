"""``bench_cp_balance.py``'s counts against brute force over explicit masks, and its headline on rows
shaped like long-document data (the balanced layout within 5% of even at 128K and cp 8)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))
import bench_cp_balance as bench

from longctx.trainer.parallel.layout import rank_indices


def _dense_tile_work(cu: list[int], cp: int, layout: str, tile: int) -> list[int]:
    """Per rank: non-empty (tile x tile) pairs of its queries against every rank's keys, from the mask."""
    lengths = np.diff(cu)
    segment = np.repeat(np.arange(len(lengths)), lengths)
    held = [
        rank_indices(torch.tensor(cu), cu[-1], cp=cp, cp_rank=r, layout=layout).numpy() for r in range(cp)
    ]
    keys = np.concatenate(held)
    counts = []
    for h in held:
        allowed = (segment[h][:, None] == segment[keys][None, :]) & (keys[None, :] <= h[:, None])
        count = 0
        for i in range(0, len(h), tile):
            offset = 0
            for other in held:
                for j in range(0, len(other), tile):
                    count += bool(allowed[i : i + tile, offset + j : offset + j + tile].any())
                offset += len(other)
        counts.append(count)
    return counts


def test_tile_work_equals_brute_force_over_the_mask() -> None:
    rng = np.random.default_rng(0)
    for cp, layout in [(2, "zigzag"), (4, "balanced"), (4, "zigzag")]:
        lengths = rng.integers(1, 90, 12).tolist()
        lengths[-1] += -sum(lengths) % (2 * cp * 8)
        cu = [0, *np.cumsum(lengths).tolist()]
        counted = bench.count_mode("ring", cu, cp, layout, tile=8).work / (8 * 8 * bench.HEADS)
        assert counted.tolist() == _dense_tile_work(cu, cp, layout, 8)


def test_ring_bytes_follow_the_blocks_needs() -> None:
    need = np.eye(4, dtype=bool)
    assert bench.ring_sends(need, 1.0).tolist() == [0, 0, 0, 0]  # nobody needs another's keys
    need[1, 0] = (
        True  # rank 1 needs rank 0's block: rank 0 sends it forward and backward, rank 1 the dK/dV home
    )
    assert bench.ring_sends(need, 1.0).tolist() == [2.0, 2.0, 0, 0]


def test_ulysses_work_is_even_and_balanced_beats_zigzag_at_128k_cp8() -> None:
    rows = bench.synthetic_rows(131072, 4, seed=3)
    result = bench.measure(rows, 8, 128)
    assert result["modes"]["ulysses"]["max_over_mean"] == 1.0
    assert result["balanced"]["max_over_mean"] <= 1.05 < result["zigzag"]["max_over_mean"]
