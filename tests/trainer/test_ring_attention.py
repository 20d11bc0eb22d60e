"""Ring attention on real gloo process groups, against float64 softmax attention over the whole window.

The reference mask is built here from the list of document lengths (block-diagonal, causal), without
any code from ``longctx.trainer.attention``. Groups are started with ``torch.multiprocessing`` from a fork
server that has imported torch and this module once (a spawned process would import torch again, for
seconds per rank); they meet through a ``FileStore`` in the test's temporary directory, and each job
checks many cases in one group.
"""

from __future__ import annotations

import contextlib
import datetime
import multiprocessing
import os
import time
from collections.abc import Callable
from itertools import pairwise
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from longctx.trainer.attention import RingCommError, RingStats, build_ring_plan, ring_attention

SEQ_LEN = 96  # a multiple of 2P for P = 1..4
HEAD_DIM = 16
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
LAYOUTS: dict[str, list[int]] = {
    "one_document": [96],
    "many_short": [5, 7, 3, 9, 1, 1, 20, 11, 2, 6, 4, 27],
    "length_one": [1] * 12 + [30] + [1] * 9 + [45],
    "singletons": [1] * 96,
    "crossing_every_rank": [2, 92, 2],
    "trailing_padding": [30, 25, 41],  # the last segment is padding (id -1)
}
CONFIGS = [(torch.float32, 4, 4), (torch.float32, 8, 2), (torch.bfloat16, 8, 2)]  # dtype, heads, kv heads
DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
    ),
]
TWO_GPUS = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")


# Reference, built from the document lengths only ------------------------------------------------------
def segment_ids(
    lengths: list[int], *, padding: bool = False, relabel: list[int] | None = None
) -> torch.Tensor:
    """Segment id of every token; ``padding`` labels the last document -1, ``relabel`` renames ids."""
    ids = list(range(len(lengths))) if relabel is None else relabel
    if padding:
        ids = [*ids[:-1], -1]
    return torch.repeat_interleave(torch.tensor(ids), torch.tensor(lengths))


def document_mask(lengths: list[int]) -> torch.Tensor:
    total = sum(lengths)
    mask = torch.zeros(total, total, dtype=torch.bool)
    start = 0
    for length in lengths:
        mask[start : start + length, start : start + length] = torch.ones(length, length).tril().bool()
        start += length
    return mask


def zigzag_rows(seq_len: int, world: int, rank: int) -> torch.Tensor:
    chunks = torch.arange(seq_len).chunk(2 * world)
    return torch.cat([chunks[rank], chunks[2 * world - 1 - rank]])


def window_inputs(seed: int, heads: int, kv_heads: int) -> list[torch.Tensor]:
    """q, k, v and the output gradient of the whole window, float64, identical on every rank."""
    generator = torch.Generator().manual_seed(seed)
    shapes = [(SEQ_LEN, heads), (SEQ_LEN, kv_heads), (SEQ_LEN, kv_heads), (SEQ_LEN, heads)]
    return [torch.randn(*shape, HEAD_DIM, generator=generator, dtype=torch.float64) for shape in shapes]


def reference(inputs: list[torch.Tensor], lengths: list[int]) -> list[torch.Tensor]:
    """Output and q/k/v gradients of masked softmax attention in float64."""
    q, k, v, grad = (x.clone().requires_grad_(i < 3) for i, x in enumerate(inputs))
    group = q.shape[1] // k.shape[1]
    scores = torch.einsum("qhd,khd->hqk", q, k.repeat_interleave(group, 1)) / HEAD_DIM**0.5
    probs = scores.masked_fill(~document_mask(lengths), float("-inf")).softmax(-1)
    out = torch.einsum("hqk,khd->qhd", probs, v.repeat_interleave(group, 1))
    (out * grad).sum().backward()
    return [out.detach(), q.grad, k.grad, v.grad]


def relative_errors(actual: list[torch.Tensor], expected: list[torch.Tensor]) -> list[float]:
    """Max error relative to the reference's largest magnitude (absolute when that is below 1, e.g. the
    exactly-zero dq and dk of one-token documents)."""
    pairs = zip(actual, expected, strict=True)
    return [float((a - e).abs().max() / e.abs().max().clamp_min(1.0)) for a, e in pairs]


# Running the ring on one rank --------------------------------------------------------------------------
def run_ring(
    group: dist.ProcessGroup | None,
    segments: torch.Tensor,
    dtype: torch.dtype,
    inputs: list[torch.Tensor],
    *,
    device: str = "cpu",
    skip_empty_blocks: bool = True,
    tile_blocks: bool = True,
) -> tuple[list[torch.Tensor] | None, RingStats]:
    """Ring attention forward+backward on this rank's zigzag tokens; rank 0 gets the window's results."""
    world = 1 if group is None else dist.get_world_size(group)
    rank = 0 if group is None else dist.get_rank(group)
    rows = zigzag_rows(SEQ_LEN, world, rank)
    plan = build_ring_plan(
        rows.to(device),
        segments[rows].to(device),
        group=group,
        skip_empty_blocks=skip_empty_blocks,
        tile_blocks=tile_blocks,
    )
    q, k, v, grad = (x[rows].to(device, dtype) for x in inputs)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    out = ring_attention(q, k, v, plan)
    assert out.dtype == dtype and out.shape == q.shape
    (out * grad).sum().backward()
    local = torch.cat([t.detach().flatten(1) for t in (out, q.grad, k.grad, v.grad)], dim=1).double()
    parts = [local]
    if world > 1:
        parts = [torch.empty_like(local) for _ in range(world)]
        dist.all_gather(parts, local, group=group)
    if rank != 0:
        return None, plan.stats
    window = torch.empty(SEQ_LEN, local.shape[1], dtype=torch.float64)
    for member, part in enumerate(parts):
        window[zigzag_rows(SEQ_LEN, world, member)] = part.cpu()
    widths = [t[0].numel() for t in (q, q, k, v)]
    results = [part.view(SEQ_LEN, -1, HEAD_DIM) for part in window.split(widths, dim=1)]
    return results, plan.stats


def rounded(inputs: list[torch.Tensor], dtype: torch.dtype) -> list[torch.Tensor]:
    """The inputs as the ring sees them (rounded to ``dtype``), back in float64 for the reference."""
    return [x.to(dtype).double() for x in inputs]


def independent_pair_counts(lengths: list[int], world: int) -> tuple[int, int]:
    """(block pairs with any allowed entry, scores inside their bounding rectangles), from the mask."""
    mask = document_mask(lengths)
    pairs = scores = 0
    for r in range(world):
        for s in range(world):
            sub = mask[zigzag_rows(SEQ_LEN, world, r)][:, zigzag_rows(SEQ_LEN, world, s)]
            if sub.any():
                pairs += 1
                rows, cols = sub.any(1).nonzero(), sub.any(0).nonzero()
                scores += int(rows.max() - rows.min() + 1) * int(cols.max() - cols.min() + 1)
    return pairs, scores


# Process-group harness ---------------------------------------------------------------------------------
def _entry(
    rank: int, world: int, store_path: str, timeout_s: float, backend: str, job: Callable, args: tuple
) -> None:
    torch.set_num_threads(1)
    if backend == "nccl":
        torch.cuda.set_device(rank)
    dist.init_process_group(
        backend,
        store=dist.FileStore(store_path, world),
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
    job(rank, world, *args)
    dist.destroy_process_group()


multiprocessing.set_forkserver_preload(["torch", "torch.distributed", __name__])


def launch(
    tmp_path: Path, world: int, job: Callable, *args: object, timeout_s: float = 30, backend: str = "gloo"
) -> None:
    """Run ``job(rank, world, *args)`` on ``world`` new processes; any rank failing fails the test."""
    store = str(tmp_path / f"store-{job.__name__}-{world}")
    mp.start_processes(
        _entry, args=(world, store, timeout_s, backend, job, args), nprocs=world, start_method="forkserver"
    )


# Jobs (module level, so that the started processes can unpickle them) ----------------------------------
def _check_fixed_layouts(rank: int, world: int, device: str) -> None:
    group = dist.group.WORLD
    for name, lengths in LAYOUTS.items():
        segments = segment_ids(lengths, padding=name == "trailing_padding")
        for case, (dtype, heads, kv_heads) in enumerate(CONFIGS):
            inputs = rounded(window_inputs(case, heads, kv_heads), dtype)
            results, stats = run_ring(group, segments, dtype, inputs, device=device)
            if rank == 0:
                errors = relative_errors(results, reference(inputs, lengths))
                assert max(errors) <= TOLERANCE[dtype], (name, dtype, heads, kv_heads, errors)
        pairs, scores = independent_pair_counts(lengths, world)
        assert (stats.pairs_computed, stats.scores_computed) == (pairs, scores), (name, stats)
        assert stats.compute_fraction == pairs / world**2
        if name in ("many_short", "singletons"):
            assert stats.compute_fraction < 1 and stats.kv_sends < stats.kv_sends_dense, (name, stats)
    # The unskipped ring computes every pair, mostly of fully masked rows, and must agree too.
    lengths = LAYOUTS["many_short"]
    inputs = rounded(window_inputs(7, 8, 2), torch.float32)
    # So must the baselines of the benchmark: every pair sent (still tiled), and every pair computed whole.
    for tile_blocks in (True, False):
        results, stats = run_ring(
            group,
            segment_ids(lengths),
            torch.float32,
            inputs,
            device=device,
            skip_empty_blocks=False,
            tile_blocks=tile_blocks,
        )
        assert stats.compute_fraction == 1.0 and stats.kv_sends == stats.kv_sends_dense
        if rank == 0:
            assert max(relative_errors(results, reference(inputs, lengths))) <= TOLERANCE[torch.float32]


def _measure_error_by_ring_size(rank: int, world: int, errors_out: str) -> None:
    subgroups = {size: dist.new_group(list(range(size))) for size in range(1, world + 1)}
    found: dict[str, list[float]] = {}
    for name, dtype in (
        ("crossing_every_rank", torch.float32),
        ("crossing_every_rank", torch.bfloat16),
        ("many_short", torch.bfloat16),
    ):
        lengths = LAYOUTS[name]
        inputs = rounded(window_inputs(11, 8, 2), dtype)
        expected = reference(inputs, lengths)
        for size, subgroup in subgroups.items():
            if rank < size:
                results, _ = run_ring(subgroup, segment_ids(lengths), dtype, inputs)
                if rank == 0:
                    found.setdefault(f"{name}/{dtype}", []).append(max(relative_errors(results, expected)))
    if rank == 0:
        torch.save(found, errors_out)


def _check_random_layouts(rank: int, world: int, max_examples: int) -> None:
    group = dist.group.WORLD

    def run_case(case: tuple[list[int], bool, list[int] | None, int]) -> list[torch.Tensor] | None:
        lengths, padding, relabel, seed = case
        inputs = rounded(window_inputs(seed, 8, 2), torch.float32)
        segments = segment_ids(lengths, padding=padding, relabel=relabel)
        results, stats = run_ring(group, segments, torch.float32, inputs)
        if rank == 0:
            assert (stats.pairs_computed, stats.scores_computed) == independent_pair_counts(lengths, world)
            errors = relative_errors(results, reference(inputs, lengths))
            assert max(errors) <= TOLERANCE[torch.float32], (lengths, errors)
        return results

    if rank != 0:
        while True:
            case = [None]
            dist.broadcast_object_list(case, src=0)
            if case[0] is None:
                return
            run_case(case[0])

    @st.composite
    def cases(draw: st.DrawFn) -> tuple[list[int], bool, list[int] | None, int]:
        cuts = sorted(draw(st.sets(st.integers(1, SEQ_LEN - 1), max_size=40)))
        bounds = [0, *cuts, SEQ_LEN]
        lengths = [b - a for a, b in pairwise(bounds)]
        relabel = draw(st.none() | st.permutations([7 * i + 3 for i in range(len(lengths))]))
        return lengths, draw(st.booleans()), relabel, draw(st.integers(0, 2**16))

    @settings(
        max_examples=max_examples, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(cases())
    def check(case: tuple[list[int], bool, list[int] | None, int]) -> None:
        dist.broadcast_object_list([case], src=0)
        run_case(case)

    try:
        check()
    finally:
        dist.broadcast_object_list([None], src=0)


def _lose_a_rank(rank: int, world: int, mode: str, timeout_s: float) -> None:
    lengths = LAYOUTS["one_document"]
    rows = zigzag_rows(SEQ_LEN, world, rank)
    segments = segment_ids(lengths)[rows]
    plan = build_ring_plan(rows, segments, group=dist.group.WORLD)
    q, k, v, _ = (x[rows].float() for x in window_inputs(0, 4, 4))
    if rank == 1:
        if mode == "dead":
            os._exit(0)  # leaves without sending anything
        time.sleep(timeout_s + 3)
        with contextlib.suppress(RingCommError):  # rank 0 has given up on it by now
            ring_attention(q, k, v, plan)
        os._exit(0)
    started = time.monotonic()
    with pytest.raises(RingCommError, match=r"ring attention forward step \d+ of 2: .*rank 1") as caught:
        ring_attention(q, k, v, plan)
    elapsed = time.monotonic() - started
    assert elapsed < timeout_s + 2, f"took {elapsed:.1f}s to notice: {caught.value}"
    os._exit(0)  # the group is broken; skip the collective teardown


# Tests -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_single_rank_is_a_local_call(device: str) -> None:
    """P = 1 with ``group=None``: same API, no process group at all."""
    for name, lengths in LAYOUTS.items():
        segments = segment_ids(lengths, padding=name == "trailing_padding")
        for case, (dtype, heads, kv_heads) in enumerate(CONFIGS):
            inputs = rounded(window_inputs(case, heads, kv_heads), dtype)
            results, stats = run_ring(None, segments, dtype, inputs, device=device)
            assert max(relative_errors(results, reference(inputs, lengths))) <= TOLERANCE[dtype], name
            assert stats.world_size == 1 and stats.kv_sends == 0


def test_one_whole_window_call_skips_the_merge_bit_for_bit(monkeypatch: pytest.MonkeyPatch) -> None:
    """At P = 1 a window that one kernel call covers is used as the kernel returns it; the merged path
    (fp32 accumulators) gives the same bits, and both match the reference (the test above)."""
    from longctx.trainer.attention import ring

    calls = []
    original = ring._whole_window_call

    def spy(*args, **kwargs):
        calls.append(original(*args, **kwargs))
        return calls[-1]

    for name, lengths in LAYOUTS.items():
        segments = segment_ids(lengths, padding=name == "trailing_padding")
        for case, (dtype, heads, kv_heads) in enumerate(CONFIGS):
            inputs = rounded(window_inputs(case, heads, kv_heads), dtype)
            monkeypatch.setattr(ring, "_whole_window_call", spy)
            fast, _ = run_ring(None, segments, dtype, inputs)
            monkeypatch.setattr(ring, "_whole_window_call", lambda *args, **kwargs: None)
            merged, _ = run_ring(None, segments, dtype, inputs)
            for a, b in zip(fast, merged, strict=True):
                assert torch.equal(a, b), (name, dtype)
    assert calls and all(call is not None for call in calls)  # 96 tokens: one tile of the CPU kernel


@pytest.mark.parametrize(
    ("world", "device"),
    [(2, "cpu"), (3, "cpu"), (4, "cpu"), pytest.param(2, "cuda", marks=TWO_GPUS)],
)
def test_ring_matches_reference_on_fixed_layouts(tmp_path: Path, world: int, device: str) -> None:
    launch(tmp_path, world, _check_fixed_layouts, device, backend="nccl" if device == "cuda" else "gloo")


@pytest.mark.parametrize(("world", "examples"), [(2, 40), (3, 30), (4, 30)])
def test_ring_matches_reference_on_random_layouts(tmp_path: Path, world: int, examples: int) -> None:
    """Hypothesis drives rank 0; the other ranks follow each example it broadcasts."""
    launch(tmp_path, world, _check_random_layouts, examples)


def test_error_does_not_grow_with_ring_size(tmp_path: Path) -> None:
    errors_out = str(tmp_path / "errors.pt")
    launch(tmp_path, 4, _measure_error_by_ring_size, errors_out)
    for case, by_size in torch.load(errors_out, weights_only=True).items():
        assert len(by_size) == 4
        assert max(by_size) <= 2 * by_size[0], (case, by_size)


@pytest.mark.parametrize("mode", ["dead", "slow"])
def test_lost_rank_raises_naming_the_ring_step(tmp_path: Path, mode: str) -> None:
    timeout_s = 2.0
    started = time.monotonic()
    launch(tmp_path, 2, _lose_a_rank, mode, timeout_s, timeout_s=timeout_s)
    assert time.monotonic() - started < 20
