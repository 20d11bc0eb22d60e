"""The row checks the loader runs on every row agree with a plain reading of the invariants.

``check_row`` decides with a few whole-row numpy reductions (and a shortcut for positions: steps
adjusted by the previous segment's length at each boundary); the reference here walks every segment
and token in Python. Thousands of random rows, valid and damaged in every way the format forbids
(including damage the shortcut must not miss: a later segment's positions shifted as a whole, a
segment starting at 1 after a segment one token short), are refused exactly when the reference
finds a violation, and a refusal names the field the reference names first."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from longctx.packer.format import ShardError
from longctx.packer.rowcheck import RowTokens, check_row, rows_are_valid

VOCAB = 50


def reference_violation(
    ids: np.ndarray, positions: np.ndarray, mask: np.ndarray, cu: list[int], padded: bool
) -> str | None:
    """The field of the first violated invariant (in check_row's documented order), or None."""
    n = len(ids)
    if len(cu) < 2 or cu[0] != 0 or cu[-1] != n or any(b <= a for a, b in itertools.pairwise(cu)):
        return "cu_seqlens"
    for a, b in itertools.pairwise(cu):
        for t in range(a, b):
            if int(positions[t]) != t - a:
                return "position_ids"
    if any(not 0 <= int(x) < VOCAB for x in ids):
        return "input_ids"
    if any(int(m) not in (0, 1) for m in mask):
        return "loss_mask"
    if any(int(mask[a]) for a in cu[:-1]):
        return "loss_mask"
    if padded and any(int(m) for m in mask[cu[-2] :]):
        return "loss_mask"
    return None


def valid_row(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int], bool]:
    n = int(rng.integers(2, 40))
    cuts = sorted(set(rng.integers(1, n, int(rng.integers(0, 6))).tolist()))
    cu = [0, *cuts, n]
    positions = np.concatenate([np.arange(b - a) for a, b in itertools.pairwise(cu)]).astype(np.int32)
    padded = bool(rng.integers(0, 2))
    mask = (positions > 0).astype(np.uint8)
    if padded:
        mask[cu[-2] :] = 0
    mask[rng.random(n) < 0.1] = 0  # a target may be left out anywhere
    return rng.integers(0, VOCAB, n, dtype=np.int32), positions, mask, cu, padded


def damage(
    rng: np.random.Generator, ids: np.ndarray, positions: np.ndarray, mask: np.ndarray, cu: list[int]
) -> list[int]:
    kind = int(rng.integers(0, 9))
    t = int(rng.integers(0, len(ids)))
    if kind == 0:
        ids[t] = int(rng.choice([VOCAB, VOCAB + 7, -1, -(2**31)]))
    elif kind == 1:
        positions[t] += int(rng.choice([1, -1, 2**30]))
    elif kind == 2 and len(cu) > 2:  # a later segment shifted as a whole (every step inside stays 1)
        k = int(rng.integers(1, len(cu) - 1))
        positions[cu[k] : cu[k + 1]] += int(rng.integers(1, 4))
    elif kind == 3 and len(cu) > 2:  # a boundary moved by one, positions left as they were
        k = int(rng.integers(1, len(cu) - 1))
        cu = [*cu[:k], cu[k] + int(rng.choice([-1, 1])), *cu[k + 1 :]]
    elif kind == 4:
        mask[t] = int(rng.integers(2, 256))
    elif kind == 5:
        mask[cu[int(rng.integers(0, len(cu) - 1))]] = 1
    elif kind == 6:
        mask[cu[-2] :] = 1
    elif kind == 7:
        cu = list(rng.permutation(cu)) if len(cu) > 2 else [0, len(ids) + 1]
    else:
        positions[:] = np.arange(len(ids))  # one segment's positions over several segments
    return cu


@pytest.mark.parametrize("seed", range(4))
def test_check_row_refuses_exactly_what_the_reference_refuses(seed: int) -> None:
    rng = np.random.default_rng(seed)
    refused = 0
    for case in range(1500):
        ids, positions, mask, cu, padded = valid_row(rng)
        if case % 3:
            cu = damage(rng, ids, positions, mask, cu)
        expected = reference_violation(ids, positions, mask, cu, padded)
        row = RowTokens(ids, positions, mask, np.asarray(cu, dtype=np.int32), padded)
        if expected is None:
            check_row(row, VOCAB, "f.arrow", case)
            continue
        refused += 1
        with pytest.raises(ShardError, match=rf"^f\.arrow row {case}: {expected}: "):
            check_row(row, VOCAB, "f.arrow", case)
    assert refused > 500  # the damage mostly breaks an invariant


def random_block(rng: np.random.Generator, damaged: float) -> tuple[list[RowTokens], int]:
    """Rows of one length (a block of a shard), each valid or, with probability ``damaged``, damaged
    in one of the ways of :func:`damage`, or by a block-only damage: positions carried on from the
    previous row instead of restarting at 0."""
    n = int(rng.integers(2, 40))
    rows = []
    for _ in range(int(rng.integers(1, 8))):
        while True:
            ids, positions, mask, cu, padded = valid_row(rng)
            if len(ids) >= n:
                break
        # cut the row to n tokens: its segments up to n, the last one shortened
        cu = [c for c in cu if c < n] + [n]
        ids, mask = ids[:n].copy(), mask[:n].copy()
        positions = np.concatenate([np.arange(b - a) for a, b in itertools.pairwise(cu)]).astype(np.int32)
        mask[cu[:-1]] = 0
        if padded:
            mask[cu[-2] :] = 0
        if rng.random() < damaged:
            kind = rng.random()
            if kind < 0.1 and rows:  # carries on the previous row's positions instead of restarting at 0
                positions[: cu[1]] = rows[-1].position_ids[-1] + 1 + np.arange(cu[1])
            elif kind < 0.2 and rows and len(cu) > 2:  # ... and the row's first segment start dropped
                cu = cu[1:]
                positions[: cu[0]] = rows[-1].position_ids[-1] + 1 + np.arange(cu[0])
            elif (
                kind < 0.3 and padded and cu[-1] - cu[-2] > 1
            ):  # a target inside the padding, not at its start
                mask[int(rng.integers(cu[-2] + 1, cu[-1]))] = 1
            else:
                cu = damage(rng, ids, positions, mask, cu)
        rows.append(RowTokens(ids, positions, mask, np.asarray(cu, dtype=np.int32), padded))
    if rng.random() < damaged / 4:  # every segment of the block starts at the same wrong position
        for row in rows:
            row.position_ids[:] += 1
    return rows, n


@pytest.mark.parametrize("seed", range(3))
def test_block_check_accepts_exactly_the_blocks_whose_rows_all_pass(seed: int) -> None:
    """``rows_are_valid`` (the loader's check of many rows at once, in whole-block passes) against
    ``check_row`` on each row of the block: random blocks of valid and damaged rows."""
    rng = np.random.default_rng(100 + seed)
    outcomes = {True: 0, False: 0}
    for _ in range(1500):
        rows, _n = random_block(rng, damaged=float(rng.choice([0.0, 0.1, 0.5])))
        expected = True
        for k, row in enumerate(rows):
            try:
                check_row(row, VOCAB, "f.arrow", k)
            except ShardError:
                expected = False
        cu_values = np.concatenate([row.cu_seqlens for row in rows])
        cu_offsets = np.concatenate([[0], np.cumsum([len(row.cu_seqlens) for row in rows])]).astype(np.int32)
        got = rows_are_valid(
            np.stack([row.input_ids for row in rows]),
            np.stack([row.position_ids for row in rows]),
            np.stack([row.loss_mask for row in rows]),
            cu_values,
            cu_offsets,
            np.array([row.padded for row in rows]),
            VOCAB,
        )
        assert got == expected
        outcomes[got] += 1
    assert min(outcomes.values()) > 300  # both outcomes are common
