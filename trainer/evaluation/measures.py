"""Does the model use its long context? Loss by position and needle retrieval.

- Loss by position: mean next-token loss of tokens whose position falls in each power-of-two bucket
  (plus a bucket edge at the original context). An extended model's loss keeps falling with
  position past the old window; a flat or rising tail means the extension did not take.
- Needle retrieval: for a grid of context lengths x needle depths, greedy decoding (with a key/value
  cache, ``longctx.trainer.evaluation.generate``) answers each synthetic task, scored by its kind's checker
  (``longctx.pipeline.synthetic.checkers``: the exact value, or the fraction of a list retrieved);
  several samples per cell.

Both work on the tiny model and on any Hugging Face checkpoint (``longctx.trainer.models.interface``).
The plots and the table take one result per model, so that models are compared on the same windows
and needles (a line or a panel per model).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from longctx.core.figures import new_figure, write_figure
from longctx.core.text import plural
from longctx.pipeline.synthetic.checkers import answer_settled as answer_settled  # the exact-answer rule
from longctx.pipeline.synthetic.checkers import generation_settled, score_generation
from longctx.pipeline.synthetic.checkers import score_answer as score_answer
from longctx.pipeline.synthetic.kinds import RECALL_KINDS, VALUE_KINDS
from longctx.trainer.coverage import position_edges
from longctx.trainer.evaluation.generate import greedy_generate
from longctx.trainer.metrics import token_losses

if TYPE_CHECKING:
    from longctx.trainer.models.interface import TrainedModel

_ANSWER_SLACK = 8  # tokens beyond a list answer's own, for separators a model may write differently


@torch.no_grad()
def loss_by_position(
    model: TrainedModel,
    samples: Iterable[dict[str, torch.Tensor]],
    original: int,
    seq_len: int,
    device: torch.device,
    bf16: bool = False,
) -> list[dict[str, Any]]:
    """Mean loss per position bucket over packed windows (``longctx.packer.PackedDataset`` items).

    Returns one row per bucket: ``start``, ``end`` (exclusive), ``tokens`` and ``mean_loss`` (None
    for a bucket no token reached). Positions are per document, as the model sees them.
    """
    edges = position_edges(seq_len, original)
    bounds = torch.tensor(edges[1:])
    sums = torch.zeros(len(edges), dtype=torch.float64)
    counts = torch.zeros(len(edges), dtype=torch.int64)
    model.eval()
    for sample in samples:
        n = sample["input_ids"].numel()
        segment = torch.searchsorted(sample["cu_seqlens"][1:].to(torch.int64), torch.arange(n), right=True)
        labels = torch.where(sample["loss_mask"], sample["labels"], -100)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            hidden = model(
                sample["input_ids"].to(device),
                sample["position_ids"].to(device),
                torch.arange(n, device=device),
                segment.to(device),
                rope_seq_len=seq_len,
            )
        losses = token_losses(model, hidden, labels.to(device)).double().cpu()
        mask = sample["loss_mask"]
        bucket = torch.bucketize(sample["position_ids"][mask], bounds, right=True)
        sums.index_add_(0, bucket, losses[mask])
        counts += torch.bincount(bucket, minlength=len(edges))
    ends = edges[1:] + [seq_len]
    return [
        {"start": s, "end": e, "tokens": int(c), "mean_loss": float(t / c) if c else None}
        for s, e, t, c in zip(edges, ends, sums.tolist(), counts.tolist())
    ]


@dataclass(frozen=True)
class NeedleResult:
    """One scored example. ``score`` in [0, 1] is the task's checker's
    (:func:`longctx.pipeline.synthetic.checkers.score_generation`: partial for the recall kinds);
    ``correct`` is ``score == 1``. A result made without a score gets ``float(correct)``."""

    context_tokens: int
    depth: float
    task: str
    sample: int
    answer: str
    generated: str
    correct: bool
    score: float | None = None

    def __post_init__(self) -> None:
        if self.score is None:
            object.__setattr__(self, "score", float(self.correct))


@dataclass(frozen=True)
class NeedleExample:
    """One needle prompt of the grid: its task kind, its sample number and the example itself."""

    task: str
    sample: int
    example: Any  # longctx.pipeline.synthetic.tasks.Example


class NeedleLengthError(ValueError):
    """A needle length at which the task cannot be built (``length``), with the task builder's
    reason phrased for that length."""

    def __init__(self, length: int, reason: str) -> None:
        self.length = length
        super().__init__(reason.replace(f"context_tokens={length}", f"a length of {length} tokens"))


def needle_examples(
    haystack_texts: list[str],
    tokenizer,
    lengths: Sequence[int],
    depths: Sequence[float],
    kinds: Sequence[str],
    seed: int,
    samples: int = 1,
) -> list[NeedleExample]:
    """``samples`` examples per (length, depth, kind), built with
    :func:`longctx.pipeline.synthetic.tasks.make_grid`. Sample ``s`` draws its haystack, keys and
    values from its own seed (derived from ``seed`` and ``s``), so the same ``seed`` gives the same
    needles: build them once and score every model on them. Raises :class:`NeedleLengthError` for a
    length too short to hold a task."""
    from longctx.pipeline.synthetic.tasks import derive_seed, make_grid

    def grid(kind: str, sample: int, length: int) -> list[Any]:
        try:  # one length at a time (make_grid seeds each length alone): the error names it
            return make_grid(
                haystack_texts, tokenizer, [length], list(depths), derive_seed(seed, "sample", sample), kind
            )
        except ValueError as err:
            raise NeedleLengthError(length, str(err)) from None

    return [
        NeedleExample(kind, sample, example)
        for kind in kinds
        for sample in range(samples)
        for length in lengths
        for example in grid(kind, sample, length)
    ]


def generation_budget(example: Any, tokenizer, max_new_tokens: int) -> int:
    """Tokens a model may generate for ``example``: ``max_new_tokens``, raised for the recall kinds
    (whose answers are lists) and the whole-value kinds (whose answers, a UUID for ``json_kv``, may
    be long, and are scored with the character after them) to the expected answer's tokens plus
    ``_ANSWER_SLACK``, so that a correct answer always fits."""
    if example.kind not in RECALL_KINDS | VALUE_KINDS:
        return max_new_tokens
    answer = len(tokenizer.encode(" " + example.answer, add_special_tokens=False).ids)
    return max(max_new_tokens, answer + _ANSWER_SLACK)


def score_needles(
    model: TrainedModel,
    tokenizer,
    examples: Iterable[NeedleExample],
    device: torch.device,
    max_new_tokens: int = 16,
    stop_ids: Sequence[int] = (),
) -> list[NeedleResult]:
    """Greedy decoding on each example, scored by its kind's checker
    (:func:`~longctx.pipeline.synthetic.checkers.score_generation`). Decoding stops at a token of
    ``stop_ids``, after :func:`generation_budget` tokens, or as soon as the score is settled
    (:func:`~longctx.pipeline.synthetic.checkers.generation_settled`)."""
    results = []
    for item in examples:
        example = item.example
        prompt_ids = tokenizer.encode(example.prompt, add_special_tokens=False).ids

        def stop(ids: list[int], example: Any = example) -> bool:
            return ids[-1] in stop_ids or generation_settled(example, tokenizer.decode(ids))

        budget = generation_budget(example, tokenizer, max_new_tokens)
        generated_ids = greedy_generate(model, prompt_ids, budget, device, stop)
        generated = tokenizer.decode([i for i in generated_ids if i not in stop_ids])
        score = score_generation(example, generated)
        result = NeedleResult(
            example.context_tokens,
            example.depth,
            item.task,
            item.sample,
            example.answer,
            generated,
            score == 1.0,
            score,
        )
        results.append(result)
    return results


def needle_grid(
    model: TrainedModel,
    tokenizer,
    haystack_texts: list[str],
    lengths: Sequence[int],
    depths: Sequence[float],
    kinds: Sequence[str],
    seed: int,
    device: torch.device,
    max_new_tokens: int = 16,
    stop_ids: Sequence[int] = (),
    samples: int = 1,
) -> list[NeedleResult]:
    """:func:`needle_examples` scored with :func:`score_needles`, for one model."""
    examples = needle_examples(haystack_texts, tokenizer, lengths, depths, kinds, seed, samples)
    return score_needles(model, tokenizer, examples, device, max_new_tokens, stop_ids)


def needle_accuracy(results: Sequence[NeedleResult]) -> dict[str, Any]:
    """Overall accuracy and accuracy per context length (over depths, kinds and samples)."""
    lengths = sorted({r.context_tokens for r in results})
    by_length = {n: [r.correct for r in results if r.context_tokens == n] for n in lengths}
    return {
        "accuracy": sum(r.correct for r in results) / len(results) if results else None,
        "by_length": [
            {"context_tokens": n, "accuracy": sum(cell) / len(cell)} for n, cell in by_length.items()
        ],
        "examples": len(results),
    }


def plot_loss_by_position(tables: Mapping[str, list[dict[str, Any]]], original: int, path: Path) -> None:
    """Mean loss against position (log2 x axis), one line per model, the original context marked."""
    fig = new_figure(figsize=(7, 4))
    ax = fig.subplots()
    for label, rows in tables.items():
        points = [
            (max(1, (r["start"] + r["end"]) / 2), r["mean_loss"]) for r in rows if r["mean_loss"] is not None
        ]
        ax.plot([p for p, _ in points], [v for _, v in points], marker="o", label=label)
    ax.axvline(original, color="tab:red", linestyle="--", label=f"original context ({original})")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("position in document (bucket midpoint)")
    ax.set_ylabel("mean next-token loss")
    ax.set_title("loss by position (same windows for every model)")
    ax.legend()
    fig.tight_layout()
    write_figure(path, fig)


def _per_cell(counts: set[int]) -> str:
    """How many samples a panel's cells hold: ``2 samples``, ``1-3 samples`` or ``no samples``."""
    if not counts:
        return "no samples"
    low, high = min(counts), max(counts)
    return plural(low, "sample") if low == high else f"{low}-{high} samples"


def plot_needle_heatmap(results: Mapping[str, Sequence[NeedleResult]], path: Path) -> None:
    """Accuracy per (context length, depth): one panel per task kind (rows) and model (columns), each
    cell saying correct/total over its samples and each panel's title how many samples its cells
    hold (the kinds are never pooled into one cell)."""
    labels = list(results)
    every = [r for rs in results.values() for r in rs]
    kinds = list(dict.fromkeys(r.task for r in every))
    lengths = sorted({r.context_tokens for r in every})
    depths = sorted({r.depth for r in every})
    fig = new_figure(
        figsize=(
            len(labels) * (1.2 * len(lengths) + 2) + 1.5,
            max(1, len(kinds)) * (0.5 * len(depths) + 1.7) + 0.8,
        ),
        layout="constrained",
    )
    axes = fig.subplots(max(1, len(kinds)), len(labels), squeeze=False)
    image = None
    for row, kind in enumerate(kinds):
        for ax, label in zip(axes[row], labels):
            grid = [[float("nan")] * len(lengths) for _ in depths]
            counts = [[""] * len(lengths) for _ in depths]
            sizes = set()
            for i, d in enumerate(depths):
                for j, n in enumerate(lengths):
                    cell = [
                        r.correct
                        for r in results[label]
                        if r.task == kind and r.depth == d and r.context_tokens == n
                    ]
                    if cell:
                        grid[i][j], counts[i][j] = sum(cell) / len(cell), f"{sum(cell)}/{len(cell)}"
                        sizes.add(len(cell))
            image = ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
            ax.set_xticks(range(len(lengths)), [str(n) for n in lengths])
            ax.set_yticks(range(len(depths)), [f"{d:.0%}" for d in depths])
            ax.set_xlabel("context tokens")
            ax.set_ylabel("needle depth")
            ax.set_title(f"{label}: {kind} ({_per_cell(sizes)} per cell)", fontsize=10)
            for i in range(len(depths)):
                for j in range(len(lengths)):
                    ax.text(j, i, counts[i][j], ha="center", va="center", fontsize=8)
    fig.suptitle("needle retrieval: greedy decoding reproduces the value (correct/total per cell)")
    if image is not None:
        fig.colorbar(image, ax=axes.ravel().tolist(), label="accuracy")
    write_figure(path, fig)


def format_loss_table(tables: Mapping[str, list[dict[str, Any]]], original: int) -> str:
    """Loss by position as text: a row per bucket, a column of mean losses per model."""
    labels = list(tables)
    widths = [max(10, len(label)) for label in labels]
    first = next(iter(tables.values()))
    header = f"{'positions':>17} {'tokens':>9} " + " ".join(
        f"{label:>{w}}" for label, w in zip(labels, widths)
    )
    lines = [header]
    for k, r in enumerate(first):
        losses = [tables[label][k]["mean_loss"] for label in labels]
        cells = " ".join(
            f"{loss:>{w}.4f}" if loss is not None else f"{'-':>{w}}" for loss, w in zip(losses, widths)
        )
        mark = "  <- original context" if r["start"] == original else ""
        lines.append(
            f"{'[' + str(r['start']) + ', ' + str(r['end']) + ')':>17} {r['tokens']:>9} {cells}{mark}"
        )
    return "\n".join(lines)


_LINE_STYLES = (("o", "-"), ("s", "--"), ("^", ":"), ("D", "-."), ("v", (0, (5, 1, 1, 1))))
"""Marker and line style of each model's line in turn, so that lines that coincide stay told apart."""


def plot_score_by_length(effective: Mapping[str, Any], path: Path) -> None:
    """Each model's needle score against context length (log2 x axis, one line per model, each with
    its own marker and line style and drawn smaller than the ones before it, so that equal scores
    hide none), the bar as a dashed line and each model's effective length marked (``effective``:
    what ``longctx.trainer.evaluation.effective.effective_lengths`` returns)."""
    fig = new_figure(figsize=(7, 4))
    ax = fig.subplots()
    models = list(effective["models"].items())
    for index, (label, verdict) in enumerate(models):
        points = [(s["context_tokens"], s["score"]) for s in verdict["scores"]]
        marker, linestyle = _LINE_STYLES[index % len(_LINE_STYLES)]
        later = len(models) - 1 - index  # lines drawn later are smaller: equal scores leave every one seen
        (line,) = ax.plot(
            [n for n, _ in points],
            [v for _, v in points],
            marker=marker,
            markersize=6 + 4 * later,
            fillstyle="none",
            markeredgewidth=1.5,
            linestyle=linestyle,
            linewidth=1.5 + 1.5 * later,
            label=label,
            zorder=3 + index,
        )
        length = verdict["effective_length"]
        if length is not None:
            score = dict(points)[length]
            ax.plot([length], [score], marker="*", markersize=16, color=line.get_color(), linestyle="none")
            ax.annotate(f"{label}: {length}", (length, score), textcoords="offset points", xytext=(6, 6))
    bar = effective["baseline"]
    where = f"{bar['model']} at {bar['length']}" if bar else "fixed"
    ax.axhline(
        effective["threshold"],
        color="tab:red",
        linestyle="--",
        linewidth=1,
        label=f"bar {effective['threshold']:.3f} ({where})",
        zorder=2,
    )
    ax.set_xscale("log", base=2)
    lengths = sorted({s["context_tokens"] for v in effective["models"].values() for s in v["scores"]})
    ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.set_ylim(-0.05, 1.05)  # lines at 0 and 1 drawn whole
    ax.set_xlabel("context tokens")
    ax.set_ylabel("score (mean over task kinds)")
    ax.set_title("effective context length: the largest length at or above the bar (star)")
    ax.legend()
    fig.tight_layout()
    write_figure(path, fig)


def format_effective(
    effective: Mapping[str, Any], tasks: Mapping[str, Mapping[str, list[dict[str, Any]]]]
) -> str:
    """The effective length of every model, its score per length and per task kind, as text."""
    bar = effective["baseline"]
    where = f"{bar['model']}'s score at {bar['length']} tokens" if bar else "eval.effective.threshold"
    lines = [
        f"effective context length (bar {effective['threshold']:.3f}: {where}; a length passes at a score "
        ">= the bar and > 0)"
    ]
    for label, verdict in effective["models"].items():
        length = verdict["effective_length"]
        failure = verdict["first_failure"]
        found = f"{length} tokens" if length is not None else "none (no evaluated length passes)"
        extra = (
            f", first failing length {failure}"
            if failure is not None and length is not None and failure < length
            else ""
        )
        lines.append(f"  {label}: {found}{extra}")
        scores = ", ".join(f"{s['context_tokens']}: {s['score']:.2f}" for s in verdict["scores"])
        lines.append(f"    score by length  {scores}")
        for task, by_length in tasks.get(label, {}).items():
            cells = ", ".join(f"{c['context_tokens']}: {c['score']:.2f}" for c in by_length)
            lines.append(f"    {task:<16} {cells}")
    return "\n".join(lines)


def format_short_context(short: Mapping[str, Any]) -> str:
    """The short-context guard as a line per model under the loss table: its loss on the held-out
    short windows and the ratio to the baseline's (or why it was skipped)."""
    if "skipped" in short:
        return f"short-context guard skipped: {short['skipped']}"
    held = "held-out " if short["held_out"] else ""
    lines = [
        f"short windows ({short['windows']} {held}windows of {short['length']} tokens from source "
        f"{short['source']!r}; ratio to {short['baseline']}):"
    ]
    for m in short["models"]:
        loss = f"{m['mean_loss']:.4f}" if m["mean_loss"] is not None else "-"
        ratio = f"{m['ratio']:.3f}" if m["ratio"] is not None else "-"
        lines.append(f"  {m['label']}: loss {loss}, ratio {ratio}")
    return "\n".join(lines)
