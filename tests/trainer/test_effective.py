"""Effective context length on hand-made score tables: the mean over tasks, the largest passing
length (not the first failure), ties, a non-monotone curve, no passing length, missing lengths and
the baseline bar; and the config keys that drive it. Expected values are worked out by hand here."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from longctx.trainer.config import EffectiveLengthConfig, EvalConfig
from longctx.trainer.evaluation.effective import (
    bar_length,
    baseline_threshold,
    effective_length,
    effective_lengths,
    first_failure,
    grid_lengths,
    passes,
    score_by_length,
    task_scores,
    verdict,
)
from longctx.trainer.evaluation.measures import NeedleResult


def result(task: str, n: int, score: float, depth: float = 0.0, sample: int = 0) -> NeedleResult:
    return NeedleResult(n, depth, task, sample, "a", "g", score == 1.0, score)


def table(task: str, scores: dict[int, list[float]]) -> list[NeedleResult]:
    return [result(task, n, s, depth=i / 10) for n, cell in scores.items() for i, s in enumerate(cell)]


def test_length_score_is_the_mean_over_tasks_of_their_means() -> None:
    results = table("single_needle", {256: [1, 0, 1, 1], 512: [0, 0, 1, 0]}) + table(
        "multi_query", {256: [0.5, 0.25], 512: [1.0, 0.75]}
    )
    assert task_scores(results) == {
        "single_needle": {256: 0.75, 512: 0.25},
        "multi_query": {256: 0.375, 512: 0.875},
    }
    # each task weighs the same although single_needle has twice the cells
    assert score_by_length(results) == {256: (0.75 + 0.375) / 2, 512: (0.25 + 0.875) / 2}
    # a result made without a score counts as its correctness
    assert NeedleResult(256, 0.0, "single_needle", 0, "1", "1", True).score == 1.0
    assert NeedleResult(256, 0.0, "single_needle", 0, "1", "2", False).score == 0.0


def test_largest_passing_length_not_the_first_failure() -> None:
    scores = {256: 0.9, 512: 0.8, 1024: 0.5, 2048: 0.85, 4096: 0.2}
    assert effective_length(scores, 0.8) == 2048  # the first-failure rule would say 512
    assert first_failure(scores, 0.8) == 1024
    v = verdict(scores, 0.8)
    assert v.length == 2048 and v.passing == [256, 512, 2048] and v.first_failure == 1024
    assert effective_length({256: 0.9, 512: 0.95, 1024: 0.91}, 0.9) == 1024  # monotone: the last
    assert first_failure({256: 0.9, 512: 0.95}, 0.9) is None


def test_ties_pass_and_zero_never_does() -> None:
    assert effective_length({256: 0.8, 512: 0.8, 1024: 0.7999}, 0.8) == 512
    # the same mean reached by different sums: a rounding tie still passes
    bar = sum([0.1] * 3) / 3
    assert bar > 0.1  # rounding: a strict comparison would fail this tie
    assert passes(0.1, bar) and effective_length({256: 0.1}, bar) == 256
    assert not passes(0.8 - 1e-6, 0.8)
    # a bar of 0 (a random baseline) does not make a length where nothing was retrieved effective
    assert effective_length({256: 0.0, 512: 0.0}, 0.0) is None
    assert effective_length({256: 0.0, 512: 0.1, 1024: 0.0}, 0.0) == 512


def test_no_passing_length_and_missing_lengths() -> None:
    assert effective_length({256: 0.3, 512: 0.1}, 0.5) is None
    assert effective_length({}, 0.5) is None
    # lengths without a score neither pass nor fail
    scores = {256: 0.9, 512: None, 1024: 0.9, 2048: None}
    assert effective_length(scores, 0.5) == 1024 and first_failure(scores, 0.5) is None
    assert verdict(scores, 0.5).scores == {256: 0.9, 1024: 0.9}


def test_baseline_bar_and_its_errors() -> None:
    scores = {"base": {256: 0.5, 512: 0.75}, "trained": {256: 1.0}}
    assert baseline_threshold(scores, "base", 512) == 0.75
    with pytest.raises(ValueError, match=r"no needle score at 1024 tokens \(evaluated: 256, 512\)"):
        baseline_threshold(scores, "base", 1024)
    with pytest.raises(ValueError, match="'other' was not evaluated"):
        baseline_threshold(scores, "other", 512)
    assert bar_length(EffectiveLengthConfig(), 512) == 512
    assert bar_length(EffectiveLengthConfig(baseline_length=1024), 512) == 1024
    assert bar_length(EffectiveLengthConfig(threshold=0.5, baseline_length=1024), 512) is None
    assert grid_lengths([1024, 256, 2048], 512) == [256, 512, 1024, 2048]
    assert grid_lengths([1024, 512], 512) == [512, 1024]
    assert grid_lengths([1024, 512], None) == [512, 1024]


def test_report_for_every_model() -> None:
    """base passes its own bar at the original length (a tie) and fails beyond; trained is
    non-monotone and passes at its longest length."""
    results = {
        "base": table("single_needle", {512: [1, 0], 1024: [0, 0], 2048: [0, 0]})
        + table("common_words", {512: [0.5, 0.5], 1024: [0.2, 0.2], 2048: [0.0, 0.0]}),
        "trained": table("single_needle", {512: [1, 1], 1024: [0, 1], 2048: [1, 0]})
        + table("common_words", {512: [0.9, 0.7], 1024: [0.1, 0.1], 2048: [0.5, 0.5]}),
    }
    report = effective_lengths(results, threshold=None, baseline="base", baseline_length=512)
    # base at 512: (0.5 + 0.5) / 2 = 0.5 is the bar
    assert report["threshold"] == 0.5 and report["bar"] == "baseline"
    assert report["baseline"] == {"model": "base", "length": 512, "score": 0.5}
    base, trained = report["models"]["base"], report["models"]["trained"]
    assert base["effective_length"] == 512 and base["first_failure"] == 1024
    # trained: 512 -> (1 + 0.8) / 2 = 0.9, 1024 -> (0.5 + 0.1) / 2 = 0.3, 2048 -> (0.5 + 0.5) / 2 = 0.5
    assert trained["scores"] == [
        {"context_tokens": 512, "score": pytest.approx(0.9)},
        {"context_tokens": 1024, "score": pytest.approx(0.3)},
        {"context_tokens": 2048, "score": pytest.approx(0.5)},
    ]
    assert trained["effective_length"] == 2048 and trained["passing"] == [512, 2048]
    assert trained["first_failure"] == 1024
    assert list(report["models"]) == ["base", "trained"]
    json.dumps(report)  # written as it is

    fixed = effective_lengths(results, threshold=0.95, baseline="base", baseline_length=512)
    assert fixed["bar"] == "fixed" and fixed["baseline"] is None and fixed["threshold"] == 0.95
    assert fixed["models"]["trained"]["effective_length"] is None  # nothing reaches 0.95
    with pytest.raises(ValueError, match="no needle score at 256"):
        effective_lengths(results, threshold=None, baseline="base", baseline_length=256)


def test_config_keys() -> None:
    default = EvalConfig()
    assert default.baseline == "base" and default.short_context is None
    assert default.effective.threshold is None and default.effective.baseline_length is None
    cfg = EvalConfig.model_validate(
        {
            "baseline": "trained",
            "effective": {"threshold": 0.8, "baseline_length": 4096},
            "short_context": {"source": "anchor", "length": 512, "windows": 4},
            "needle": {"kinds": ["multi_query", "document_qa", "common_words", "frequent_words"]},
        }
    )
    assert cfg.effective.threshold == 0.8 and cfg.short_context.windows == 4
    for bad in (
        {"effective": {"threshold": 1.5}},
        {"effective": {"treshold": 0.5}},
        {"short_context": {"windows": 0}},
        {"needle": {"kinds": ["common_word"]}},
    ):
        with pytest.raises(ValidationError):
            EvalConfig.model_validate(bad)
