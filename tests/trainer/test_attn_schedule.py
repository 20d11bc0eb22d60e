"""The ring schedule of ``RingPlan`` simulated on all ranks at once, for arbitrary overlap patterns.

Every rank's plan is built from the same ``need`` matrix; the simulation posts exactly the transfers
the ring would post and checks that they pair up step by step, that every rank holds each block it
must compute, and that every dk/dv contribution reaches the block's owner exactly once.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from longctx.trainer.attention.plan import RingPlan


@st.composite
def overlap_patterns(draw: st.DrawFn) -> list[list[bool]]:
    world = draw(st.integers(1, 8))
    need = [[draw(st.booleans()) for _ in range(world)] for _ in range(world)]
    if draw(st.booleans()):  # self-attention: every rank sees its own keys
        for r in range(world):
            need[r][r] = True
    return need


def plans_for(need: list[list[bool]]) -> list[RingPlan]:
    world = len(need)
    return [RingPlan(None, rank, need, [None] * world, 4, 4, 0) for rank in range(world)]


@settings(max_examples=300, deadline=None)
@given(overlap_patterns())
def test_key_value_blocks_reach_every_rank_that_needs_them(need: list[list[bool]]) -> None:
    plans = plans_for(need)
    world = len(plans)
    held = {r: r for r in range(world)}  # rank -> source of the block it holds (absent: none)
    for step in range(world):
        for r, plan in enumerate(plans):
            source = plan.source(step)
            if need[r][source]:
                assert held.get(r) == source, (step, r, source)
        sends, recvs = set(), set()
        for r, plan in enumerate(plans):
            source = plan.source(step)
            if r in held and plan.kv_forwarded(source, step):
                sends.add((r, plan.next_rank, source))
            if step + 1 < world and plan.kv_forwarded(plan.source(step + 1), step):
                recvs.add((plan.prev_rank, r, plan.source(step + 1)))
        assert sends == recvs
        held = {to: source for _, to, source in recvs}
    assert sum(plans[0].last) == plans[0].stats.kv_sends


@settings(max_examples=300, deadline=None)
@given(overlap_patterns())
def test_dk_dv_contributions_reach_their_owner_exactly_once(need: list[list[bool]]) -> None:
    plans = plans_for(need)
    world = len(plans)
    own: dict[int, list[int]] = {r: [] for r in range(world)}  # owner -> contributing ranks
    held: dict[int, tuple[int, list[int]]] = {}  # rank -> (source, contributors) finished last step
    for step in range(world + 1):
        sends, recvs = {}, {}
        for r, plan in enumerate(plans):
            if r in held:
                source, contributors = held[r]
                sends[(r, plan.acc_destination(source, step - 1), source)] = contributors
            if step < world and plan.acc_arrives(plan.source(step), step):
                recvs[(plan.prev_rank, r, plan.source(step))] = None
            if plan.acc_return_step == step:
                recvs[(plan.acc_return_sender, r, r)] = None
        assert set(sends) == set(recvs), step
        arriving = {(to, source): sends[(frm, to, source)] for frm, to, source in recvs}
        held = {}
        for r, plan in enumerate(plans):
            if step == world:
                break
            source = plan.source(step)
            mine = [r] if need[r][source] else []
            if step == 0:
                own[r] += mine
            elif plan.acc_exists(source, step):
                held[r] = (source, arriving.get((r, source), []) + mine)
            else:
                assert not mine, "a contribution with no accumulator to go into"
                assert (r, source) not in arriving
        for r in range(world):
            if (r, r) in arriving and plans[r].acc_return_step == step:
                own[r] += arriving[(r, r)]
    for owner in range(world):
        assert sorted(own[owner]) == [r for r in range(world) if need[r][owner]], owner
