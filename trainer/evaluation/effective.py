"""Effective context length: the longest length up to which a model keeps its retrieval quality,
rather than the length its configuration claims. The definition follows RULER (Hsieh et al., 2024)
and NoLiMa (Modarressi et al., 2025), with every score held to the lower end of its 95% Wilson
interval (Wilson, 1927; ``longctx.trainer.evaluation.interval``).

**Score per length.** Each needle-grid item has a score in [0, 1] (its task's checker,
``longctx.pipeline.synthetic.checkers``: 0 or 1, or the fraction of a list retrieved). A length's
score pools every item evaluated there, over task kinds and depths: the sum of their scores over
their count (the grid gives every kind the same number of items, so this is also the mean over
kinds of each kind's mean). Each score carries its count and interval.

**The threshold.** ``eval.effective.threshold`` sets an absolute one (RULER holds every model to
Llama-2-7B's score at 4K); by default it is ``eval.effective.fraction`` (0.85) of the model's own
score at its shortest evaluated length (NoLiMa's 85% of the base score), so each model is measured
against what it can do without a long context.

**Undetermined.** When the model's score at its shortest evaluated length is below
``eval.effective.min_short_score`` (0.5), the model cannot do the task even without a long
context: no threshold is meaningful, and the result is *undetermined*, with that reason, never a
length won by one lucky item at a long length.

**Which length.** The effective length is the largest length L such that *every* evaluated length
up to L clears the threshold with the lower end of its interval (a score with few items passes
only when even its pessimistic end does). A dip caps it, and the first failing length is reported
beside it; no passing length gives None (determined: the model is effective at no evaluated
length). The lower end equal to the threshold passes (with a tolerance of 1e-9 for rounding).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from longctx.trainer.config import EffectiveLengthConfig
from longctx.trainer.evaluation.interval import ENOUGH_ITEMS, HALF_WIDTH, Score

TOLERANCE = 1e-9


class ScoredResult(Protocol):
    """What a needle-grid result must provide (``longctx.trainer.evaluation.measures.NeedleResult`` does)."""

    task: str
    context_tokens: int
    score: float | None


def task_scores(results: Sequence[ScoredResult]) -> dict[str, dict[int, Score]]:
    """Each task kind's :class:`Score` per context length (over depths and items), lengths ascending."""
    cells: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in results:
        if r.score is None:
            raise ValueError(f"a {r.task} result at {r.context_tokens} tokens has no score")
        cells[r.task][r.context_tokens].append(float(r.score))
    return {
        task: {n: Score(sum(v), len(v)) for n, v in sorted(by_length.items())}
        for task, by_length in cells.items()
    }


def score_by_length(results: Sequence[ScoredResult]) -> dict[int, Score]:
    """Each context length's :class:`Score`, pooling every item there (all kinds), lengths ascending."""
    pooled: dict[int, list[Score]] = defaultdict(list)
    for by_length in task_scores(results).values():
        for n, score in by_length.items():
            pooled[n].append(score)
    return {n: Score(sum(s.total for s in v), sum(s.count for s in v)) for n, v in sorted(pooled.items())}


def passes(score: Score, threshold: float) -> bool:
    """Whether ``score`` clears ``threshold`` with the lower end of its 95% interval."""
    return score.interval[0] >= threshold - TOLERANCE


@dataclass(frozen=True)
class EffectiveLength:
    """One model's verdict. ``status`` is ``determined`` (``length`` None: no evaluated length
    passes) or ``undetermined`` (``reason`` says why; ``threshold`` then None unless absolute).
    ``threshold_source`` is ``absolute`` (``eval.effective.threshold``) or ``fraction`` (of the
    score at ``reference``, the shortest evaluated length)."""

    length: int | None
    status: str
    reason: str | None
    threshold: float | None
    threshold_source: str
    fraction: float | None
    reference: int | None
    scores: dict[int, Score]
    first_failure: int | None

    def passing(self, n: int) -> bool | None:
        """Whether length ``n`` clears the threshold (None without a threshold)."""
        return None if self.threshold is None else passes(self.scores[n], self.threshold)

    def as_json(self) -> dict[str, Any]:
        """The verdict as ``summary.json`` holds it: every length's score, count, interval, whether
        it passes and whether it has enough items (JSON keys are strings, so lengths go in lists)."""
        ref = self.reference
        return {
            "effective_length": self.length,
            "status": self.status,
            "reason": self.reason,
            "threshold": self.threshold,
            "threshold_source": self.threshold_source,
            "fraction": self.fraction,
            "reference": None if ref is None else {"context_tokens": ref, **self.scores[ref].as_json()},
            "scores": [
                {"context_tokens": n, **s.as_json(), "passes": self.passing(n)}
                for n, s in self.scores.items()
            ],
            "first_failure": self.first_failure,
        }


def verdict(scores: Mapping[int, Score], config: EffectiveLengthConfig) -> EffectiveLength:
    """One model's :class:`EffectiveLength` from its score per length (see the module docstring)."""
    kept = dict(sorted(scores.items()))
    absolute = config.threshold is not None
    source, fraction = ("absolute", None) if absolute else ("fraction", config.fraction)
    if not kept:
        return EffectiveLength(
            None,
            "undetermined",
            "no length was evaluated",
            config.threshold,
            source,
            fraction,
            None,
            kept,
            None,
        )
    reference = next(iter(kept))
    short = kept[reference].mean
    if short < config.min_short_score:
        reason = (
            f"the score at the shortest evaluated length ({reference} tokens) is {short:.3f}, below "
            f"eval.effective.min_short_score ({config.min_short_score:g}): too low to define a threshold"
        )
        return EffectiveLength(
            None, "undetermined", reason, config.threshold, source, fraction, reference, kept, None
        )
    threshold = float(config.threshold) if absolute else config.fraction * short
    length = failure = None
    for n, score in kept.items():
        if not passes(score, threshold):
            failure = n
            break
        length = n
    return EffectiveLength(length, "determined", None, threshold, source, fraction, reference, kept, failure)


def effective_lengths(
    results: Mapping[str, Sequence[ScoredResult]], config: EffectiveLengthConfig
) -> dict[str, Any]:
    """Every model's effective length from its needle results (model label -> results), as written
    to ``summary.json``: ``definition`` (the settings and the interval used) and ``models`` (label
    -> :meth:`EffectiveLength.as_json`, in the order given)."""
    return {
        "definition": {
            "threshold": config.threshold,
            "fraction": config.fraction,
            "min_short_score": config.min_short_score,
            "interval": "Wilson, 95%",
            "enough_items": ENOUGH_ITEMS,
            "half_width": HALF_WIDTH,
        },
        "models": {label: verdict(score_by_length(rs), config).as_json() for label, rs in results.items()},
    }
