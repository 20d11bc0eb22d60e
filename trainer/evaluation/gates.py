"""Gates: what a stage of a staged run must reach before the next stage starts.

After a stage's last step, its gate (``train.stages[k].gate``) measures the stage's exported model
(``train/stages/<k>-<N>/final``) with the run's ``eval`` settings, at the stage's length:

- ``needle_score``: the needle grid's score at the stage's length (``eval.needle``'s kinds, depths
  and items; the mean item score, ``longctx.trainer.evaluation.effective``), a point estimate at
  least ``min_needle_score`` (its detail gives its count and 95% interval);
- ``short_loss_ratio``: the loss on held-out short windows (``eval.short_context``, documents no
  training row of the run holds, ``longctx.trainer.evaluation.short_context``) over the reference
  model's, at most ``max_short_loss_ratio``: by default (``short_loss_reference: released``) the
  base model as released, with its own RoPE, since what extension must not cost is what the model
  could do before; or the ``eval.baseline`` model (the base with the run's RoPE);
- ``effective_length``: with ``require_effective_length``, the effective context length
  (``eval.effective``'s definition, over the lengths of ``eval.needle.lengths`` up to the stage's and
  the stage's own) reaches the stage's length; an undetermined one fails, with its reason.

The result (values, limits, verdicts, and the settings it was measured with) is written to the
stage's ``gate.json``. A rerun reuses a recorded result made for the same stage step and settings
instead of measuring again, so a passed gate is never evaluated twice and a failed one fails again
at once until the stage or the gate changes.

Where it runs: on rank 0 of the training job, once every rank has finished the stage and freed its
model, while the other ranks wait (:mod:`longctx.trainer.stages`). This was chosen over a separate
process started by the ``longctx train`` driver because it works the same whoever starts the ranks
(``--nproc``, a plain ``torchrun``, several nodes, or one process from Python); the evaluation is
the single-device code of ``longctx eval``, and the wait is on a group of its own whose timeout is
far longer than ``train.comm_timeout_s``, so a long evaluation is not taken for a dead rank.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from longctx.core.config import ContextConfig
from longctx.core.errors import LongctxError
from longctx.core.layout import RunLayout
from longctx.packer.manifest import load_manifest
from longctx.trainer.config import (
    EffectiveLengthConfig,
    EvalConfig,
    NeedleEvalConfig,
    ShortContextConfig,
    TrainConfig,
)
from longctx.trainer.stage_plan import Stage, training_shards


class GateFailed(LongctxError):
    """A stage's gate failed and ``train.on_gate_fail`` is ``stop``: one line naming the metric, its
    value and limit, and what to change."""


@dataclass(frozen=True)
class GateSettings:
    """What a gate measures with besides the stage: the run's ``eval`` section (None: its defaults)
    and the curated documents (None: ``<output>/documents``)."""

    eval: EvalConfig | None = None
    documents: Path | None = None

    @property
    def section(self) -> EvalConfig:
        return self.eval if self.eval is not None else EvalConfig()

    def recorded(self) -> dict[str, Any]:
        """The settings a recorded result must have been measured with to be reused."""
        return self.section.model_dump(
            mode="json",
            include={"needle", "short_context", "baseline", "effective", "precision", "documents"},
        )


@dataclass(frozen=True)
class Check:
    """One metric of a gate: its ``value`` (None: not measurable), the ``limit`` it is held to,
    whether it ``passed``, and how it was measured (``detail``)."""

    metric: str
    value: float | int | None
    limit: float | int
    passed: bool
    detail: str


@dataclass(frozen=True)
class GateResult:
    """A stage's gate, as written to its ``gate.json``."""

    stage: int
    seq_len: int
    step: int
    gate: dict[str, Any]
    settings: dict[str, Any]
    checks: list[Check]
    seconds: float = 0.0
    measured: dict[str, Any] = field(default_factory=dict)
    """The figures behind the checks (scores per length, losses, the bar)."""

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "passed": self.passed}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GateResult:
        fields = {k: v for k, v in data.items() if k != "passed"}
        return cls(**{**fields, "checks": [Check(**c) for c in data["checks"]]})

    def summary(self) -> str:
        """``short_loss_ratio 0.912 <= 1.0 passed``-style parts, one per check."""
        parts = []
        for c in self.checks:
            relation = "<=" if c.metric == "short_loss_ratio" else ">="
            parts.append(f"{c.metric} {_number(c.value)} {relation} {_number(c.limit)} {_verdict(c)}")
        return "; ".join(parts) or "nothing checked"


def _number(value: float | int | None) -> str:
    if value is None:
        return "none"
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _verdict(check: Check) -> str:
    return "passed" if check.passed else "FAILED"


_ADVICE = {
    "needle_score": "train the stage longer ({key}.steps) or with more retrieval tasks in the mix "
    "(curate.synthetic, pack.mix), or lower {key}.gate.min_needle_score",
    "short_loss_ratio": "train the stage longer ({key}.steps), with a lower lr ({key}.lr) or with more "
    "short documents in pack.mix, or raise {key}.gate.max_short_loss_ratio",
    "effective_length": "train the stage longer ({key}.steps) or with more retrieval tasks in the mix, "
    "{bar}, or drop {key}.gate.require_effective_length",
}


def failure_line(
    result: GateResult,
    stage: Stage,
    layout: RunLayout,
    *,
    on_gate_fail: str,
    effective: EffectiveLengthConfig,
) -> str:
    """The one line a failed gate stops the run with (or, under ``on_gate_fail: continue``, warns
    with): every failed metric with its value and limit, how it was measured, and what to change,
    from the settings as they are (``effective``: ``eval.effective``)."""
    failed = [c for c in result.checks if not c.passed]
    what = "; ".join(
        f"{c.metric} = {_number(c.value)}, "
        + (
            f"above the limit {_number(c.limit)}"
            if c.metric == "short_loss_ratio"
            else f"below {_number(c.limit)}"
        )
        + f" ({c.detail})"
        for c in failed
    )
    bar = (
        f"lower eval.effective.threshold ({effective.threshold:g})"
        if effective.threshold is not None
        else f"lower eval.effective.fraction ({effective.fraction:g}) or eval.effective.min_short_score "
        f"({effective.min_short_score:g})"
    )
    advice = "; or ".join(dict.fromkeys(_ADVICE[c.metric].format(key=stage.key, bar=bar) for c in failed))
    going_on = " (or set train.on_gate_fail: continue)" if on_gate_fail == "stop" else ""
    return (
        f"{stage.describe()} failed its gate: {what}. To pass it: {advice}{going_on}. The finished "
        f"stages are kept in {layout.stages}; the result is in {stage.layout.gate}"
    )


def recorded_gate(stage: Stage, settings: GateSettings) -> GateResult | None:
    """The stage's recorded gate result when it was measured on the stage's final step with the same
    gate and settings; None otherwise (never measured, or something changed)."""
    import json

    path = stage.layout.gate
    if not path.is_file() or stage.gate is None:
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        result = GateResult.from_json(data)
    except (ValueError, TypeError, KeyError):
        return None  # unreadable: measured again (and rewritten)
    same = (
        result.step == stage.steps
        and result.gate == stage.gate.model_dump(mode="json")
        and result.settings == settings.recorded()
    )
    return result if same else None


@dataclass
class GateMemo:
    """What every gate of one run measures alike, kept between its stages' gates in one process so
    it is measured once: the guard's windows (the documents no training row holds, tokenized) and
    the reference models' losses on them (the baseline's, the released base's)."""

    guard: Any = None
    baseline_loss: float | None = None
    released_loss: float | None = None


@dataclass(frozen=True)
class _Where:
    """What a gate's measurements read: the run's settings and folders."""

    train: TrainConfig
    context: ContextConfig
    layout: RunLayout
    tokenizer: Path | None


def evaluate_gate(
    stage: Stage,
    *,
    train: TrainConfig,
    context: ContextConfig,
    layout: RunLayout,
    tokenizer: Path | None,
    settings: GateSettings,
    device: torch.device,
    memo: GateMemo | None = None,
) -> GateResult:
    """Measure the gate of ``stage`` on its exported model (one process, ``device``): see the module
    docstring. ``train`` and ``context`` are the run's (not the stage's): they define the ``base``
    model and the shards whose documents count as trained on. ``memo`` carries what the run's
    earlier gates measured that this one would measure alike."""
    from longctx.trainer.build import use_bf16
    from longctx.trainer.models.interface import load_folder

    assert stage.gate is not None
    gate, section, started = stage.gate, settings.section, time.monotonic()
    memo = memo if memo is not None else GateMemo()
    where = _Where(train, context, layout, layout.tokenizer_file(tokenizer))
    from longctx.trainer.evaluation.job import eval_documents

    documents = eval_documents(section, layout, train) or settings.documents or layout.documents
    bf16 = use_bf16(section.precision, device)
    header = load_manifest(
        layout.training_shards(stage.config.shards, stage.seq_len), train.storage_options
    ).header
    print(f"{stage.describe()}: measuring its gate ({', '.join(gate.checks) or 'nothing'})", flush=True)
    model = load_folder(stage.layout.final_model, implementation=train.model.implementation, device=device)
    needles = None
    if gate.min_needle_score is not None or gate.require_effective_length:
        needles = _needles(section, stage, gate.require_effective_length, where, documents)
        stage_needles = _score(model, needles, device)
    guard = None
    if gate.max_short_loss_ratio is not None:
        if memo.guard is None:
            memo.guard = _guard(section, where, documents, header.tokenizer)
        guard = memo.guard
        stage_loss = _window_loss(model, guard, device, bf16)
    del model
    baseline = None
    reference = gate.short_loss_reference
    if guard is not None and reference == "baseline" and memo.baseline_loss is None:
        baseline = _baseline_model(section, where, header.tokenizer.vocab_size, device)
    checks, measured = [], {}
    if needles is not None:
        from longctx.trainer.evaluation.effective import score_by_length

        by_length = score_by_length(stage_needles)
        measured["score_by_length"] = [{"context_tokens": n, **s.as_json()} for n, s in by_length.items()]
        if gate.min_needle_score is not None:
            kinds = needles.config.kinds
            checks.append(needle_check(stage.seq_len, kinds, by_length[stage.seq_len], gate.min_needle_score))
        if gate.require_effective_length:
            checks.append(effective_check(stage.seq_len, section.effective, by_length, measured))
    if guard is not None:
        if reference == "released":
            if memo.released_loss is None:
                from longctx.trainer.evaluation.job import released_loss

                vocab = header.tokenizer.vocab_size
                found = released_loss(train, context, vocab, device, guard.windows, bf16)
                memo.released_loss = found["mean_loss"]
            base_loss = memo.released_loss
            against = "the base model's as released (its own RoPE; gate.short_loss_reference: released)"
        else:
            if memo.baseline_loss is None:
                memo.baseline_loss = _window_loss(baseline, guard, device, bf16)
            base_loss = memo.baseline_loss
            against = f"{section.baseline}'s (eval.baseline; gate.short_loss_reference: baseline)"
        ratio = (
            stage_loss / base_loss
            if stage_loss is not None and base_loss is not None and base_loss > 0
            else None
        )
        measured["short_context"] = {
            **guard.as_json(),
            "loss": stage_loss,
            "reference_loss": base_loss,
            "reference": reference,
            "baseline": section.baseline,
        }
        checks.append(
            Check(
                "short_loss_ratio",
                ratio,
                gate.max_short_loss_ratio,
                ratio is not None and ratio <= gate.max_short_loss_ratio,
                f"loss on {len(guard.windows)} held-out {guard.length}-token windows of source "
                f"{guard.source!r} over {against}",
            )
        )
    return GateResult(
        stage=stage.number,
        seq_len=stage.seq_len,
        step=stage.steps,
        gate=gate.model_dump(mode="json"),
        settings=settings.recorded(),
        checks=checks,
        seconds=time.monotonic() - started,
        measured=measured,
    )


def gate_lengths(lengths: list[int], seq_len: int, effective: bool) -> list[int]:
    """The needle lengths a gate scores, ascending: the stage's ``seq_len``, and with ``effective``
    (``require_effective_length``) every length of ``lengths`` (``eval.needle.lengths``) below it,
    which the effective length must clear on the way up."""
    below = [n for n in lengths if n < seq_len] if effective else []
    return sorted({*below, seq_len})


def _needles(section: EvalConfig, stage: Stage, effective: bool, where: _Where, documents: Path) -> Any:
    """The needle grid of :func:`gate_lengths`."""
    from longctx.trainer.evaluation.job import build_needles

    needle = section.needle or NeedleEvalConfig()
    grid = needle.model_copy(update={"lengths": gate_lengths(needle.lengths, stage.seq_len, effective)})
    return build_needles(grid, where.tokenizer, documents, {stage.seq_len: f"{stage.key}.seq_len"})


def _score(model: Any, needles: Any, device: torch.device, length: int | None = None) -> list[Any]:
    """``model``'s results on the needles (only those of ``length`` when given)."""
    from longctx.trainer.evaluation.measures import score_needles

    examples = [e for e in needles.examples if length is None or e.example.context_tokens == length]
    return score_needles(
        model, needles.tokenizer, examples, device, needles.config.max_new_tokens, needles.eos
    )


def _guard(section: EvalConfig, where: _Where, documents: Path, info: Any) -> Any:
    """The short-context guard's windows: documents no training row of the run holds. A source with
    none left refuses the gate (:class:`~longctx.trainer.evaluation.short_context.NoHeldOutDocuments`)."""
    from longctx.core.tokenizer import load_tokenizer
    from longctx.trainer.evaluation.short_context import guard_windows, trained_documents

    config = section.short_context or ShortContextConfig()
    trained = trained_documents(
        training_shards(where.train, where.layout, where.context),
        tokenizer=where.tokenizer,
        seed=where.train.seed,
        holdout_rows=where.train.holdout_rows,
        cache=where.train.cache or where.layout.cache,
        storage_options=where.train.storage_options,
    )
    length = config.length or where.context.original
    return guard_windows(config, length, documents, load_tokenizer(where.tokenizer), info, trained)


def _window_loss(model: Any, guard: Any, device: torch.device, bf16: bool) -> float | None:
    from longctx.trainer.evaluation.short_context import window_loss

    return window_loss(model, guard.windows, device, bf16)["mean_loss"]


def _baseline_model(section: EvalConfig, where: _Where, vocab_size: int, device: torch.device) -> Any:
    """The ``eval.baseline`` model (``base``: the model training started from)."""
    from longctx.trainer.evaluation.job import load_model_spec, with_baseline

    (spec,), _ = with_baseline([], section.baseline, where.layout, where.train)
    return load_model_spec(spec, where.train, where.context, vocab_size, device)


def needle_check(seq_len: int, kinds: list[str], score: Any, limit: float) -> Check:
    """Whether the needle ``score`` (an :class:`~longctx.trainer.evaluation.interval.Score`) at the
    stage's length reaches ``limit``: a point estimate, its count and 95% interval in the detail."""
    from longctx.trainer.evaluation.interval import describe

    return Check(
        "needle_score",
        score.mean,
        limit,
        score.mean >= limit,
        f"mean score of {', '.join(kinds)} at {seq_len} tokens: {describe(score.as_json())} "
        "(95% Wilson interval)",
    )


def effective_check(
    seq_len: int, effective: EffectiveLengthConfig, by_length: dict[int, Any], measured: dict[str, Any]
) -> Check:
    """Whether the effective length (``effective``'s definition over ``by_length``, the gate's
    scores per length) reaches ``seq_len``; an undetermined one does not, and the detail says why.
    The verdict is recorded in ``measured``."""
    from longctx.trainer.evaluation.effective import verdict
    from longctx.trainer.evaluation.measures import threshold_text

    found = verdict(by_length, effective).as_json()
    measured["effective_length"] = found
    if found["status"] == "undetermined":
        how = f"undetermined: {found['reason']}"
    else:
        failure = f", first failing length {found['first_failure']}" if found["first_failure"] else ""
        how = f"threshold {threshold_text(found)}, held to the lower end of each 95% interval{failure}"
    length = found["effective_length"]
    return Check("effective_length", length, seq_len, length is not None and length >= seq_len, how)
