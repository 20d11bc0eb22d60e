"""The balanced layout (``longctx.trainer.parallel.balance``) against its promises, checked from the
documents' lengths alone: every token on exactly one rank, equal counts, each rank's tokens in window
order, causal work (a token at offset t in its document costs t + 1) within 1% of even where the
documents allow, and no attention traffic for a row whose documents can each stay whole on a rank."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from longctx.trainer.attention.masks import pair_extents
from longctx.trainer.parallel.balance import TOLERANCE, balanced_indices
from longctx.trainer.parallel.layout import rank_indices
from longctx.trainer.parallel.zigzag import segment_ids


def _offsets(lengths: list[int]) -> torch.Tensor:
    return torch.cat([torch.arange(n) for n in lengths])


def _work(held: list[torch.Tensor], lengths: list[int]) -> list[int]:
    cost = _offsets(lengths) + 1
    return [int(cost[h].sum()) for h in held]


def _cu(lengths: list[int]) -> list[int]:
    return [0, *torch.tensor(lengths).cumsum(0).tolist()]


@settings(max_examples=200, deadline=None)
@given(
    st.sampled_from([2, 4, 8]),
    st.lists(st.integers(1, 400), min_size=1, max_size=40),
)
def test_every_token_once_equal_counts_window_order(parts: int, lengths: list[int]) -> None:
    lengths[-1] += -sum(lengths) % parts  # the row splits evenly
    held = balanced_indices(_cu(lengths), parts)
    assert sorted(torch.cat(held).tolist()) == list(range(sum(lengths)))
    assert {len(h) for h in held} == {sum(lengths) // parts}
    assert all(bool((h[1:] > h[:-1]).all()) for h in held)


def test_work_is_even_on_rows_of_many_short_and_a_few_long_documents() -> None:
    generator = torch.Generator().manual_seed(0)
    for trial in range(20):
        parts, length = (4, 32768) if trial % 2 else (8, 131072)
        lengths = []
        while sum(lengths) < length:
            long = torch.rand((), generator=generator) < 0.1
            high = length // 2 if long else 3000
            lengths.append(int(torch.randint(1, high, (), generator=generator)))
        lengths[-1] -= sum(lengths) - length
        work = _work(balanced_indices(_cu(lengths), parts), lengths)
        assert max(work) * parts / sum(work) <= 1 + TOLERANCE, (trial, lengths)


def test_one_document_gets_the_zigzag_layouts_perfect_balance() -> None:
    held = balanced_indices([0, 4096], 8)
    work = _work(held, [4096])
    assert max(work) == min(work)


def test_documents_that_fit_a_rank_whole_stay_whole_and_need_no_other_ranks_keys() -> None:
    lengths = [32] * 4  # shares of 32 for 4 ranks: one whole document each (zigzag chunks are 16)
    cu = torch.tensor(_cu(lengths))
    segments = segment_ids(cu, 128)
    index = torch.stack([rank_indices(cu, 128, cp=4, cp_rank=r, layout="balanced") for r in range(4)])
    overlaps, _ = pair_extents(index, segments[index], index, segments[index])
    assert torch.equal(overlaps, torch.eye(4, dtype=torch.bool))  # the ring sends nothing
    zigzag = torch.stack([rank_indices(cu, 128, cp=4, cp_rank=r, layout="zigzag") for r in range(4)])
    crossing, _ = pair_extents(zigzag, segments[zigzag], zigzag, segments[zigzag])
    assert int(crossing.sum()) > 4  # the zigzag layout cuts documents over ranks


def test_short_documents_are_split_only_to_even_the_counts() -> None:
    generator = torch.Generator().manual_seed(1)
    for _ in range(20):
        lengths = torch.randint(1, 200, (200,), generator=generator).tolist()
        lengths[-1] += -sum(lengths) % 8
        held = balanced_indices(_cu(lengths), 8)
        segments = segment_ids(torch.tensor(_cu(lengths)), sum(lengths))
        ranks_per_document = torch.zeros(len(lengths), dtype=torch.long)
        for h in held:
            ranks_per_document[segments[h].unique()] += 1
        assert int((ranks_per_document > 1).sum()) <= 7  # at most one split per rank boundary
        assert max(_work(held, lengths)) * 8 / sum(_work(held, lengths)) <= 1 + TOLERANCE


def test_all_to_all_members_hold_consecutive_slices_of_their_groups_tokens() -> None:
    cu = torch.tensor(_cu([50, 14, 100, 28, 64]))
    groups = [rank_indices(cu, 256, cp=2, cp_rank=g, layout="balanced") for g in range(2)]
    members = [rank_indices(cu, 256, cp=4, cp_rank=r, layout="balanced", ulysses=2) for r in range(4)]
    assert torch.equal(torch.cat(members[:2]), groups[0]) and torch.equal(torch.cat(members[2:]), groups[1])
