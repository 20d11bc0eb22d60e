"""Effective context length on hand-made results: scores pooled over kinds with their counts, the
threshold (a fraction of the model's own shortest-length score, or absolute), every length up to L
clearing it with the lower end of its 95% Wilson interval, a dip capping it, too few items, and an
undetermined result when the short score is too low; and the config keys that drive it. The lower
ends are worked out here from Wilson's closed form, not by the code under test."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from longctx.trainer.config import EffectiveLengthConfig, EvalConfig
from longctx.trainer.evaluation.effective import (
    effective_lengths,
    passes,
    score_by_length,
    task_scores,
    verdict,
)
from longctx.trainer.evaluation.interval import Score
from longctx.trainer.evaluation.job import items_per_kind
from longctx.trainer.evaluation.measures import NeedleResult

Z = 1.959963984540054
DEFAULT = EffectiveLengthConfig()


def lower(k: float, n: int) -> float:
    """Wilson's lower end, (k + z^2/2 - z sqrt(k (n - k) / n + z^2 / 4)) / (n + z^2)."""
    return (k + Z * Z / 2 - Z * math.sqrt(k * (n - k) / n + Z * Z / 4)) / (n + Z * Z)


def result(task: str, n: int, score: float, depth: float = 0.0, item: int = 0) -> NeedleResult:
    return NeedleResult(n, depth, task, item, "a", "g", score == 1.0, score)


def table(task: str, scores: dict[int, list[float]]) -> list[NeedleResult]:
    return [result(task, n, s, depth=i / 10) for n, cell in scores.items() for i, s in enumerate(cell)]


def hits(k: int, n: int) -> Score:
    return Score(k, n)


def test_scores_pool_every_item_with_its_count() -> None:
    results = table("single_needle", {256: [1, 0, 1, 1], 512: [0, 0, 1, 0]}) + table(
        "multi_query", {256: [0.5, 0.25, 1, 0], 512: [1.0, 0.75, 1, 1]}
    )
    kinds = task_scores(results)
    assert kinds["single_needle"] == {256: Score(3, 4), 512: Score(1, 4)}
    assert kinds["multi_query"] == {256: Score(1.75, 4), 512: Score(3.75, 4)}
    # the fractional scores count as successes summed: 3 + 1.75 of 8 items at 256
    assert score_by_length(results) == {256: Score(4.75, 8), 512: Score(4.75, 8)}
    assert score_by_length(results)[256].mean == pytest.approx((0.75 + 0.4375) / 2)  # = the mean of means
    # a result made without a score counts as its correctness
    assert NeedleResult(256, 0.0, "single_needle", 0, "1", "1", True).score == 1.0
    assert NeedleResult(256, 0.0, "single_needle", 0, "1", "2", False).score == 0.0


def test_a_lucky_item_at_a_long_length_wins_nothing() -> None:
    """The issue's first case: nothing retrieved short, one hit of 12 at 2048."""
    scores = {256: hits(0, 12), 512: hits(0, 12), 1024: hits(0, 12), 2048: hits(1, 12)}
    v = verdict(scores, DEFAULT)
    assert v.status == "undetermined" and v.length is None and v.threshold is None
    assert "shortest evaluated length (256 tokens) is 0.000" in v.reason
    assert "eval.effective.min_short_score (0.5)" in v.reason
    # an absolute threshold does not make it determined either
    assert verdict(scores, EffectiveLengthConfig(threshold=0.05)).status == "undetermined"


def test_a_dip_caps_the_length_and_is_reported() -> None:
    """The issue's second case, with 100 items per length."""
    scores = {512: hits(90, 100), 1024: hits(10, 100), 2048: hits(90, 100)}
    threshold = 0.85 * 0.9
    assert lower(90, 100) > threshold > lower(10, 100)  # 0.826 and 0.049 around 0.765
    v = verdict(scores, DEFAULT)
    assert v.status == "determined" and v.threshold == pytest.approx(threshold)
    assert v.length == 512 and v.first_failure == 1024 and v.reference == 512
    assert [v.passing(n) for n in scores] == [True, False, True]  # 2048 passes but is capped


def test_the_lower_end_decides() -> None:
    # 85 of 100 is above 0.85 x 0.95 = 0.8075, but its lower end (0.767) is not
    assert lower(85, 100) < 0.85 * 0.95 < 0.85
    v = verdict({256: hits(95, 100), 512: hits(85, 100), 1024: hits(95, 100)}, DEFAULT)
    assert v.length == 256 and v.first_failure == 512
    # all 6 of 6 right everywhere: the lower end n / (n + z^2) = 0.61 misses 0.85 at the shortest length
    few = verdict({256: hits(6, 6), 512: hits(6, 6)}, DEFAULT)
    assert lower(6, 6) == pytest.approx(6 / (6 + Z * Z)) and lower(6, 6) < 0.85
    assert few.status == "determined" and few.length is None and few.first_failure == 256
    # with enough items the same scores pass
    many = verdict({256: hits(93, 93), 512: hits(93, 93)}, DEFAULT)
    assert lower(93, 93) > 0.85 and many.length == 512 and many.first_failure is None


def test_absolute_threshold_and_ties() -> None:
    config = EffectiveLengthConfig(threshold=0.5)
    scores = {256: hits(80, 93), 512: hits(60, 93), 1024: hits(40, 93)}
    assert lower(60, 93) > 0.5 > lower(40, 93)
    v = verdict(scores, config)
    assert v.threshold == 0.5 and v.threshold_source == "absolute" and v.fraction is None
    assert v.length == 512 and v.first_failure == 1024
    # a lower end equal to the threshold passes (up to rounding), a hair below does not
    edge = lower(50, 100)
    assert passes(hits(50, 100), edge) and not passes(hits(50, 100), edge + 1e-6)
    assert verdict({}, DEFAULT).status == "undetermined"


def test_report_for_every_model() -> None:
    results = {
        "base": table("single_needle", {512: [1] * 10, 1024: [0] * 10}),
        "trained": table("single_needle", {512: [1] * 10, 1024: [1] * 9 + [0]}),
    }
    report = effective_lengths(results, DEFAULT)
    assert report["definition"] == {
        "threshold": None,
        "fraction": 0.85,
        "min_short_score": 0.5,
        "interval": "Wilson, 95%",
        "enough_items": 93,
        "half_width": 0.1,
    }
    base, trained = report["models"]["base"], report["models"]["trained"]
    assert list(report["models"]) == ["base", "trained"]
    # 10 of 10: lower end 10 / (10 + z^2) = 0.72 < 0.85: too few items to pass even a perfect score
    assert base["effective_length"] is None and base["first_failure"] == 512
    assert base["reference"]["context_tokens"] == 512 and base["reference"]["score"] == 1.0
    assert trained["threshold"] == pytest.approx(0.85) and trained["threshold_source"] == "fraction"
    row = trained["scores"][1]
    assert row["context_tokens"] == 1024 and row["count"] == 10 and row["score"] == pytest.approx(0.9)
    assert row["low"] == pytest.approx(lower(9, 10)) and row["enough"] is False and row["passes"] is False
    assert trained["status"] == "determined" and trained["reason"] is None
    json.dumps(report)  # written as it is


def test_the_documented_settings_are_the_defaults() -> None:
    """docs/evaluation.md's effective-length block is a valid eval section and shows the defaults."""
    text = (Path(__file__).parents[2] / "docs" / "evaluation.md").read_text()
    section = text.split("## Effective context length", 1)[1]
    block = yaml.safe_load(section.split("```yaml\n", 1)[1].split("```", 1)[0])
    documented = EvalConfig.model_validate(block["eval"])
    assert documented.effective == EffectiveLengthConfig()
    assert documented.needle.samples is None and items_per_kind(documented.needle) == 31


def test_config_keys() -> None:
    default = EvalConfig()
    assert default.baseline == "base" and default.short_context is None
    assert (default.effective.threshold, default.effective.fraction, default.effective.min_short_score) == (
        None,
        0.85,
        0.5,
    )
    # items per (kind, length) by default: 93 per length, shared among the kinds
    assert default.needle.samples is None and items_per_kind(default.needle) == 93
    three = EvalConfig.model_validate({"needle": {"kinds": ["single_needle", "multi_key", "multi_query"]}})
    assert items_per_kind(three.needle) == 31  # 3 x 31 = 93
    assert items_per_kind(EvalConfig.model_validate({"needle": {"samples": 4}}).needle) == 4
    cfg = EvalConfig.model_validate(
        {
            "baseline": "trained",
            "effective": {"threshold": 0.8, "fraction": 0.9, "min_short_score": 0.3},
            "short_context": {"source": "anchor", "length": 512, "windows": 4},
            "needle": {"kinds": ["multi_query", "document_qa", "common_words", "frequent_words"]},
        }
    )
    assert cfg.effective.threshold == 0.8 and cfg.short_context.windows == 4
    for bad in (
        {"effective": {"threshold": 1.5}},
        {"effective": {"threshold": 0}},
        {"effective": {"fraction": 0}},
        {"effective": {"treshold": 0.5}},
        {"effective": {"baseline_length": 4096}},  # removed: the reference is the shortest length
        {"short_context": {"windows": 0}},
        {"needle": {"kinds": ["common_word"]}},
        {"needle": {"samples": 0}},
    ):
        with pytest.raises(ValidationError):
            EvalConfig.model_validate(bad)
    with pytest.raises(
        ValidationError,
        match=r"baseline_length was removed: .* shortest length of eval\.needle\.lengths \(drop the key",
    ):
        EvalConfig.model_validate({"effective": {"baseline_length": 4096}})
