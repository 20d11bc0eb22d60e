"""The Wilson score interval against values worked out independently: its closed form written out
here with ``math``, a textbook value (8 of 10: about (0.490, 0.943)), and the item count for a 95%
half-width of 0.1 from the closed form of the worst-case half-width, ``z / (2 sqrt(n + z^2))``."""

from __future__ import annotations

import math

import pytest

from longctx.trainer.evaluation.interval import (
    ENOUGH_ITEMS,
    Score,
    describe,
    items_for_half_width,
    wilson_interval,
)

Z = 1.959963984540054  # the 0.975 quantile of the standard normal


def closed_form(k: float, n: int) -> tuple[float, float]:
    """Wilson (1927): (k + z^2/2 -+ z sqrt(k (n - k) / n + z^2 / 4)) / (n + z^2)."""
    root = Z * math.sqrt(k * (n - k) / n + Z * Z / 4)
    return (k + Z * Z / 2 - root) / (n + Z * Z), (k + Z * Z / 2 + root) / (n + Z * Z)


def test_textbook_value() -> None:
    low, high = wilson_interval(8, 10)
    assert low == pytest.approx(0.490, abs=5e-4) and high == pytest.approx(0.943, abs=5e-4)


@pytest.mark.parametrize(("k", "n"), [(0, 1), (1, 1), (0, 6), (6, 6), (4, 6), (1, 12), (50, 100), (2.5, 7)])
def test_matches_the_closed_form(k: float, n: int) -> None:
    low, high = wilson_interval(k, n)
    expected_low, expected_high = closed_form(k, n)
    assert low == pytest.approx(max(0.0, expected_low), abs=1e-12)
    assert high == pytest.approx(min(1.0, expected_high), abs=1e-12)


def test_all_hits_is_not_a_certainty() -> None:
    low, high = wilson_interval(6, 6)
    assert high == pytest.approx(1.0) and low == pytest.approx(36 / (36 + 6 * Z * Z))  # n / (n + z^2)


def test_items_for_a_half_width() -> None:
    # worst case (p = 1/2): half-width z / (2 sqrt(n + z^2)) <= h  <=>  n >= z^2 / (4 h^2) - z^2
    for h in (0.1, 0.05, 0.2):
        assert items_for_half_width(h) == math.ceil(Z * Z / (4 * h * h) - Z * Z)
    assert ENOUGH_ITEMS == items_for_half_width(0.1) == 93
    with pytest.raises(ValueError, match="half_width"):
        items_for_half_width(0.0)


def test_bad_counts_are_refused() -> None:
    with pytest.raises(ValueError, match="at least one item"):
        wilson_interval(0, 0)
    with pytest.raises(ValueError, match=r"\[0, 3\]"):
        wilson_interval(4, 3)


def test_score_says_when_it_has_too_few_items() -> None:
    few = Score(4, 6).as_json()
    low, high = closed_form(4, 6)
    assert few == {
        "score": pytest.approx(4 / 6),
        "count": 6,
        "low": pytest.approx(low),
        "high": pytest.approx(high),
        "enough": False,
    }
    assert describe(few) == f"0.67 [{low:.2f}, {high:.2f}] n=6, too few items for +/-0.1"
    many = Score(80, 93).as_json()
    assert many["enough"] and describe(many).endswith("n=93")


def test_the_interval_always_holds_the_score() -> None:
    """At 0 or n successes the interval's end is the score itself, which rounding used to push past
    it (low = 1e-17 above a score of 0: negative error bars, which matplotlib refuses to draw)."""
    for n in range(1, 300):
        for k in range(n + 1):
            low, high = wilson_interval(k, n)
            assert 0.0 <= low <= k / n <= high <= 1.0, (k, n, low, high)
        assert wilson_interval(0, n)[0] == 0.0 and wilson_interval(n, n)[1] == 1.0
