"""Every context-parallel mode (ring, allgather, ulysses, hybrid) and both row layouts (zigzag,
balanced) on real gloo groups of 2 and 4 ranks, forward and backward, against float64 softmax
attention over the whole window with an explicit document mask (built in
``tests/trainer/test_ring_attention.py`` from the document lengths alone)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from longctx.trainer.attention.modes import cp_attention
from longctx.trainer.parallel.layout import rank_indices
from longctx.trainer.parallel.mesh import MeshShape
from tests.trainer.test_ring_attention import (
    LAYOUTS,
    SEQ_LEN,
    launch,
    reference,
    relative_errors,
    segment_ids,
    window_inputs,
)

HEADS = [(4, 4), (8, 2), (4, 1)]  # query heads, key/value heads: MHA, GQA, and fewer KV heads than ranks
MODES = {"ring": 1, "allgather": 1, "ulysses": None, "hybrid": 2}  # mode: all-to-all degree (None: cp)


def _groups(world: int, degree: int) -> tuple[dist.ProcessGroup | None, dist.ProcessGroup | None]:
    """This rank's (ring group, all-to-all group) with all-to-all groups of consecutive ranks, as the
    trainer's mesh builds them; every rank creates every group, in the same order."""
    rank = dist.get_rank()
    ring = ulysses = None
    for start in range(0, world, degree):
        group = dist.new_group(list(range(start, start + degree)))
        if start <= rank < start + degree:
            ulysses = group
    for member in range(degree):
        group = dist.new_group(list(range(member, world, degree)))
        if rank % degree == member:
            ring = group
    return (ring if world // degree > 1 else None), (ulysses if degree > 1 else None)


def _check_modes(rank: int, world: int) -> None:
    for mode, degree in MODES.items():
        degree = world if degree is None else degree
        if mode == "hybrid" and world // degree < 2:
            continue
        ring_group, ulysses_group = _groups(world, degree)
        attention = cp_attention(
            mode,
            cp_group=dist.group.WORLD,
            ring_group=ring_group,
            ulysses_group=ulysses_group,
            backend="math",
        )
        for layout in ("zigzag", "balanced"):
            for name, lengths in LAYOUTS.items():
                cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()])
                segments = segment_ids(lengths, padding=name == "trailing_padding")
                rows = rank_indices(cu, SEQ_LEN, cp=world, cp_rank=rank, layout=layout, ulysses=degree)
                for case, (heads, kv_heads) in enumerate(HEADS):
                    attention = cp_attention(
                        mode,
                        cp_group=dist.group.WORLD,
                        ring_group=ring_group,
                        ulysses_group=ulysses_group,
                        kv_copies=MeshShape.kv_head_copies(kv_heads, degree),
                        backend="math",
                    )
                    inputs = window_inputs(case, heads, kv_heads)
                    q, k, v, grad = (x[rows].clone() for x in inputs)
                    q, k, v = (x.requires_grad_() for x in (q, k, v))
                    out = attention.bind(rows, segments[rows])(q, k, v)
                    (out * grad).sum().backward()
                    local = torch.cat([t.detach().flatten(1) for t in (out, q.grad, k.grad, v.grad)], dim=1)
                    parts = [torch.empty_like(local) for _ in range(world)]
                    dist.all_gather(parts, local)
                    held = [torch.empty_like(rows) for _ in range(world)]
                    dist.all_gather(held, rows)
                    window = torch.empty(SEQ_LEN, local.shape[1], dtype=torch.float64)
                    for member_rows, part in zip(held, parts, strict=True):
                        window[member_rows] = part
                    widths = [t[0].numel() for t in (q, q, k, v)]
                    actual = [p.reshape(SEQ_LEN, -1, q.shape[2]) for p in window.split(widths, dim=1)]
                    errors = relative_errors(actual, reference(inputs, lengths))
                    where = f"{mode} {layout} {name} heads {heads}/{kv_heads} world {world}"
                    assert max(errors) < 1e-12, f"{where}: errors {errors}"
                    assert sorted(torch.cat(held).tolist()) == list(range(SEQ_LEN)), where


@pytest.mark.parametrize("world", [2, 4])
def test_every_mode_and_layout_is_exact_in_float64_forward_and_backward(tmp_path: Path, world: int) -> None:
    launch(tmp_path, world, _check_modes, timeout_s=120)


def test_ulysses_refuses_heads_that_do_not_split_in_one_line(tmp_path: Path) -> None:
    launch(tmp_path, 4, _check_refusal, timeout_s=60)


def _check_refusal(rank: int, world: int) -> None:
    attention = cp_attention("ulysses", cp_group=dist.group.WORLD, ulysses_group=dist.group.WORLD)
    rows = rank_indices(torch.tensor([0, SEQ_LEN]), SEQ_LEN, cp=world, cp_rank=rank, layout="zigzag")
    q, k, v = torch.zeros(len(rows), 6, 8), torch.zeros(len(rows), 3, 8), torch.zeros(len(rows), 3, 8)
    with pytest.raises(ValueError, match="6 query heads and 3 key/value heads"):
        attention.bind(rows, torch.zeros_like(rows))(q, k, v)


def test_a_mode_chosen_by_hand_that_the_plan_prices_slower_than_the_ring_is_said_in_one_line() -> None:
    """Llama-3-8B at 128K over cp 8: the ring hides behind compute, the all-gather does not."""
    from longctx.trainer.build import cp_mode_warning
    from longctx.trainer.config import TrainConfig
    from longctx.trainer.models.shape import ModelShape
    from longctx.trainer.parallel.mesh import CpChoice

    class Llama8B:
        shape = ModelShape("8B", 4096, 14336, 32, 32, 8, 128, 128256, False)

    warning = cp_mode_warning(
        TrainConfig(cp=8, cp_mode="allgather"), Llama8B(), 131072, CpChoice("allgather")
    )
    assert warning is not None and warning.startswith("warning (train.cp_mode allgather): ")
    assert "cp_mode auto would choose ring" in warning and "\n" not in warning
    assert cp_mode_warning(TrainConfig(cp=8, cp_mode="ring"), Llama8B(), 131072, CpChoice("ring")) is None
