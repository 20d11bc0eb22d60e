"""Effective context length, after RULER (Hsieh et al., 2024): the longest length at which a model
still clears a quality bar, rather than the length its configuration claims.

**Score per length.** Each needle-grid result has a score in [0, 1] (its task's checker,
``longctx.pipeline.synthetic.checkers``). A task's score at a length is the mean over its depths
and samples; the length's score is the mean over the tasks evaluated there, so every task weighs
the same whatever its number of cells.

**The bar.** A fixed ``eval.effective.threshold``, or by default the baseline model's score
(``eval.baseline``, normally ``base``, the model training starts from) at
``eval.effective.baseline_length`` (default ``context.original``, the length it was pretrained on):
RULER's short-context baseline, made per model family, and the same bar for every model evaluated.

**Which length.** The effective length is the *largest* evaluated length whose score passes, not
the length before the first failure; this is RULER's choice, and ours because the grid has few
samples per length: one noisy dip at a middle length would otherwise cap a model that passes at
longer lengths, and the result would depend on which lengths happen to be in the grid. The
smallest failing length is reported beside it (``first_failure``), so a non-monotone curve is
visible rather than hidden.

**Ties.** A score equal to the bar passes (compared with a tolerance of 1e-9 for the rounding of
means of the same fractions): with the default bar the baseline model at its own baseline length
must pass its own bar, which a strict comparison would fail by construction. A score of 0 never
passes, even when the bar is 0 (a random baseline): a length where a model retrieves nothing is
not effective.

**Missing lengths.** Lengths without results (not in the grid, or scored None) are skipped: they
neither pass nor fail. No passing length gives ``None``: the model is effective at no evaluated
length (distinct from a length of 0, which is never reported).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from longctx.trainer.config import EffectiveLengthConfig

TOLERANCE = 1e-9


class ScoredResult(Protocol):
    """What a needle-grid result must provide (``longctx.trainer.evaluation.measures.NeedleResult`` does)."""

    task: str
    context_tokens: int
    score: float | None


def task_scores(results: Sequence[ScoredResult]) -> dict[str, dict[int, float]]:
    """Mean score per task kind and context length (over depths and samples), lengths ascending."""
    cells: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in results:
        if r.score is None:
            raise ValueError(f"a {r.task} result at {r.context_tokens} tokens has no score")
        cells[r.task][r.context_tokens].append(float(r.score))
    return {
        task: {n: sum(v) / len(v) for n, v in sorted(by_length.items())} for task, by_length in cells.items()
    }


def score_by_length(results: Sequence[ScoredResult]) -> dict[int, float]:
    """Each context length's score: the mean over task kinds of :func:`task_scores`, lengths ascending."""
    per_length: dict[int, list[float]] = defaultdict(list)
    for by_length in task_scores(results).values():
        for n, score in by_length.items():
            per_length[n].append(score)
    return {n: sum(v) / len(v) for n, v in sorted(per_length.items())}


def passes(score: float | None, threshold: float) -> bool:
    """Whether a length's score clears the bar: positive and at least ``threshold`` (ties pass; see
    the module docstring)."""
    return score is not None and score > 0 and score >= threshold - TOLERANCE


def effective_length(scores: Mapping[int, float | None], threshold: float) -> int | None:
    """The largest length whose score :func:`passes` ``threshold``; None when none does."""
    passing = [n for n, score in scores.items() if passes(score, threshold)]
    return max(passing) if passing else None


def first_failure(scores: Mapping[int, float | None], threshold: float) -> int | None:
    """The smallest evaluated length whose score does not pass; None when all pass."""
    failing = [n for n, score in scores.items() if score is not None and not passes(score, threshold)]
    return min(failing) if failing else None


def baseline_threshold(scores: Mapping[str, Mapping[int, float | None]], model: str, length: int) -> float:
    """``model``'s score at ``length``: the default bar. ``ValueError`` naming what is missing when
    that model or length was not evaluated."""
    if model not in scores:
        raise ValueError(
            f"the baseline model {model!r} was not evaluated (models: {', '.join(scores) or 'none'}); "
            "evaluate it too, or set eval.effective.threshold"
        )
    score = scores[model].get(length)
    if score is None:
        evaluated = ", ".join(str(n) for n, s in scores[model].items() if s is not None) or "none"
        raise ValueError(
            f"the baseline model {model!r} has no needle score at {length} tokens (evaluated: {evaluated}); "
            "add that length to eval.needle.lengths, or set eval.effective.threshold"
        )
    return float(score)


def bar_length(effective: EffectiveLengthConfig, original: int) -> int | None:
    """Where the bar is measured: ``effective.baseline_length``, default ``original``
    (``context.original``); None when ``effective.threshold`` fixes the bar."""
    if effective.threshold is not None:
        return None
    return effective.baseline_length or original


def bar_source(effective: EffectiveLengthConfig) -> str:
    """The setting the bar's length comes from, as a refusal of that length names it."""
    if effective.baseline_length is not None:
        return "eval.effective.baseline_length"
    return (
        "context.original, where eval.effective measures the bar (set eval.effective.baseline_length to "
        "a longer length, or eval.effective.threshold)"
    )


def grid_lengths(lengths: Sequence[int], baseline_length: int | None) -> list[int]:
    """The needle grid's lengths, ascending, with ``baseline_length`` added when the bar is measured
    (``baseline_length`` None: a fixed threshold, nothing to add)."""
    return sorted(set(lengths) | ({baseline_length} if baseline_length is not None else set()))


@dataclass(frozen=True)
class EffectiveLength:
    """One model's verdict: ``length`` (None: no evaluated length passes), the ``threshold`` it was
    held to, its ``scores`` per length, the lengths that pass and the first that fails."""

    length: int | None
    threshold: float
    scores: dict[int, float]
    passing: list[int]
    first_failure: int | None

    def as_json(self) -> dict[str, Any]:
        """The verdict with ``scores`` as ``[{"context_tokens", "score"}]`` (JSON keys are strings)."""
        return {
            "effective_length": self.length,
            "threshold": self.threshold,
            "scores": [{"context_tokens": n, "score": s} for n, s in self.scores.items()],
            "passing": self.passing,
            "first_failure": self.first_failure,
        }


def verdict(scores: Mapping[int, float | None], threshold: float) -> EffectiveLength:
    """One model's :class:`EffectiveLength` from its score per length."""
    kept = {n: float(s) for n, s in sorted(scores.items()) if s is not None}
    return EffectiveLength(
        effective_length(kept, threshold),
        threshold,
        kept,
        [n for n, s in kept.items() if passes(s, threshold)],
        first_failure(kept, threshold),
    )


def effective_lengths(
    results: Mapping[str, Sequence[ScoredResult]],
    *,
    threshold: float | None,
    baseline: str,
    baseline_length: int,
) -> dict[str, Any]:
    """Every model's effective length from its needle results (model label -> results), as written
    to an evaluation's JSON: ``threshold`` (the bar used), ``bar`` (``fixed`` or ``baseline``),
    ``baseline`` (``{"model", "length", "score"}`` when the bar is measured, else None) and
    ``models`` (label -> :meth:`EffectiveLength.as_json`, in the order given). ``ValueError``
    when the bar is measured and the baseline model or length is missing."""
    scores = {label: score_by_length(rs) for label, rs in results.items()}
    measured = threshold is None
    bar = baseline_threshold(scores, baseline, baseline_length) if measured else float(threshold)
    models = {label: verdict(by_length, bar).as_json() for label, by_length in scores.items()}
    return {
        "threshold": bar,
        "bar": "baseline" if measured else "fixed",
        "baseline": {"model": baseline, "length": baseline_length, "score": bar} if measured else None,
        "models": models,
    }
