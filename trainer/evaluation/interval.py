"""How sure a score is: the Wilson score interval (Wilson, 1927) of a mean of scores in [0, 1], and
how many items a score needs for its interval to be narrow enough.

The Wilson interval is used rather than the normal approximation (``p +/- z sqrt(p(1-p)/n)``)
because it stays inside [0, 1] and is not degenerate at a score of 0 or 1, which a needle grid often
gives: 6 hits out of 6 is ``[0.61, 1]``, not ``[1, 1]``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

Z95 = 1.959963984540054
"""The standard normal quantile of 0.975: a two-sided 95% interval."""

HALF_WIDTH = 0.1
"""The widest 95% half-width a score may have to count as measured with enough items."""


def wilson_interval(successes: float, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval ``(low, high)`` of ``successes`` out of ``n`` items.

    ``successes`` may be fractional: a recall-scored task kind's item scores the fraction of a list
    it retrieved, and its successes are the sum of its items' scores (the interval then treats the
    mean score as a proportion, which is conservative for scores spread inside [0, 1]: their variance
    is at most that of 0/1 outcomes with the same mean). ``ValueError`` for ``n < 1`` or
    ``successes`` outside ``[0, n]``."""
    if n < 1:
        raise ValueError(f"an interval needs at least one item, got n={n}")
    if not 0 <= successes <= n:
        raise ValueError(f"successes must lie in [0, {n}], got {successes}")
    p = successes / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    # the interval always holds p (at 0 or n items its end is p itself); the bounds keep rounding,
    # which can put the end a hair past p, from saying otherwise
    return max(0.0, min(p, centre - half)), min(1.0, max(p, centre + half))


def items_for_half_width(half_width: float = HALF_WIDTH, z: float = Z95) -> int:
    """The smallest item count whose Wilson interval is at most ``half_width`` wide on each side
    whatever the score (the widest is at a score of 1/2): 93 for 0.1 at 95%."""
    if not 0 < half_width < 0.5:
        raise ValueError(f"half_width must lie in (0, 0.5), got {half_width}")
    n = 1
    while _worst_half_width(n, z) > half_width:
        n += 1
    return n


def _worst_half_width(n: int, z: float) -> float:
    low, high = wilson_interval(n / 2, n, z)
    return (high - low) / 2


ENOUGH_ITEMS = items_for_half_width()
"""Items a score needs for a 95% interval of at most +/-:data:`HALF_WIDTH` (93)."""


@dataclass(frozen=True)
class Score:
    """A mean of ``count`` item scores in [0, 1] (``total`` is their sum), with its 95% Wilson
    interval and whether ``count`` is enough for a half-width of at most :data:`HALF_WIDTH`."""

    total: float
    count: int

    @property
    def mean(self) -> float:
        return self.total / self.count

    @property
    def interval(self) -> tuple[float, float]:
        return wilson_interval(self.total, self.count)

    @property
    def enough(self) -> bool:
        return self.count >= ENOUGH_ITEMS

    def as_json(self) -> dict[str, Any]:
        """``score``, ``count``, ``low``, ``high`` and ``enough``, as written to ``summary.json``."""
        low, high = self.interval
        return {"score": self.mean, "count": self.count, "low": low, "high": high, "enough": self.enough}


def describe(score: dict[str, Any]) -> str:
    """A score as the console shows it (``score`` as :meth:`Score.as_json` writes it):
    ``0.67 [0.30, 0.90] n=6, too few items for +/-0.1``; the warning only when ``enough`` is false."""
    text = f"{score['score']:.2f} [{score['low']:.2f}, {score['high']:.2f}] n={score['count']}"
    return text if score["enough"] else f"{text}, too few items for +/-{HALF_WIDTH:g}"
