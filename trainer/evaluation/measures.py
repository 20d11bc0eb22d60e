"""Does the model use its long context? Loss by position and needle retrieval.

- Loss by position: mean next-token loss of tokens whose position falls in each power-of-two bucket
  (plus a bucket edge at the original context). An extended model's loss keeps falling with
  position past the old window; a flat or rising tail means the extension did not take.
- Needle retrieval: for a grid of context lengths x needle depths, greedy decoding (with a key/value
  cache, ``longctx.trainer.evaluation.generate``) answers each synthetic task, scored by its kind's checker
  (``longctx.pipeline.synthetic.checkers``: the exact value, or the fraction of a list retrieved);
  items per (task kind, length) spread over the depths.

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
    """One scored item. ``score`` in [0, 1] is the task's checker's
    (:func:`longctx.pipeline.synthetic.checkers.score_generation`: partial for the recall kinds);
    ``correct`` is ``score == 1``. A result made without a score gets ``float(correct)``. ``item`` is
    the item's number within its (task kind, length); ``question``, ``needles`` (the inserted texts,
    in order of appearance) and ``seed`` say what was asked, and ``prompt`` is the id of its prompt
    in the evaluation's ``needle_prompts.jsonl.gz`` (:class:`NeedleExample`'s ``id``)."""

    context_tokens: int
    depth: float
    task: str
    item: int
    answer: str
    generated: str
    correct: bool
    score: float | None = None
    question: str = ""
    needles: tuple[str, ...] = ()
    seed: int | None = None
    prompt: int | None = None

    def __post_init__(self) -> None:
        if self.score is None:
            object.__setattr__(self, "score", float(self.correct))


@dataclass(frozen=True)
class NeedleExample:
    """One needle prompt of the grid: its ``id`` (its place in the grid), its task kind, its item
    number within its (kind, length) and the example itself."""

    id: int
    task: str
    item: int
    example: Any  # longctx.pipeline.synthetic.tasks.Example


class NeedleLengthError(ValueError):
    """A needle length at which the task cannot be built (``length``), with the task builder's
    reason phrased for that length."""

    def __init__(self, length: int, reason: str) -> None:
        self.length = length
        super().__init__(reason.replace(f"context_tokens={length}", f"a length of {length} tokens"))


def item_seed(seed: int, kind: str, length: int, item: int) -> int:
    """The seed of item ``item`` of (``kind``, ``length``): every item draws its own haystack, keys
    and values."""
    from longctx.pipeline.synthetic.tasks import derive_seed

    return derive_seed(seed, kind, length, "item", item)


def needle_examples(
    haystack_texts: list[str],
    tokenizer,
    lengths: Sequence[int],
    depths: Sequence[float],
    kinds: Sequence[str],
    seed: int,
    samples: int = 1,
) -> list[NeedleExample]:
    """``samples`` items per (kind, length), spread evenly over ``depths``: item ``i`` sits at depth
    ``depths[i % len(depths)]`` and is built by
    :func:`longctx.pipeline.synthetic.tasks.build_example` from :func:`item_seed`, so the same
    ``seed`` gives the same needles: build them once and score every model on them. Raises
    :class:`NeedleLengthError` for a length too short to hold a task."""
    from longctx.pipeline.synthetic.tasks import build_example

    def build(kind: str, length: int, item: int) -> Any:
        depth = depths[item % len(depths)]
        try:
            return build_example(
                haystack_texts, tokenizer, length, depth, item_seed(seed, kind, length, item), kind
            )
        except ValueError as err:
            raise NeedleLengthError(length, str(err)) from None

    cells = [(kind, length, item) for kind in kinds for length in lengths for item in range(samples)]
    return [
        NeedleExample(k, kind, item, build(kind, length, item))
        for k, (kind, length, item) in enumerate(cells)
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
            item.item,
            example.answer,
            generated,
            score == 1.0,
            score,
            example.question,
            tuple(n.text for n in example.needles),
            example.seed,
            item.id,
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
    """Overall accuracy and accuracy per context length (over depths, kinds and items), each length
    with its item ``count``."""
    lengths = sorted({r.context_tokens for r in results})
    by_length = {n: [r.correct for r in results if r.context_tokens == n] for n in lengths}
    return {
        "accuracy": sum(r.correct for r in results) / len(results) if results else None,
        "by_length": [
            {"context_tokens": n, "accuracy": sum(cell) / len(cell), "count": len(cell)}
            for n, cell in by_length.items()
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

_OFFSET = 0.06
"""Horizontal offset between models' points, in octaves (log2 units): equal scores hide no model."""


def threshold_text(verdict: Mapping[str, Any]) -> str:
    """How a model's threshold was set: ``0.765 = 0.85 x 0.90 at 256 tokens`` or ``0.8 (absolute)``."""
    if verdict["threshold_source"] == "absolute":
        return f"{verdict['threshold']:.3g} (absolute, eval.effective.threshold)"
    ref = verdict["reference"]
    at = f"{ref['score']:.2f} at {ref['context_tokens']} tokens"
    return f"{verdict['threshold']:.3f} = {verdict['fraction']:g} x {at}"


def counts_text(rows: Sequence[Mapping[str, Any]]) -> str:
    """The item counts of a model's scores by length, for its legend entry: ``; n=93``,
    ``; n=6-12, too few items for +/-0.1`` (when a score lacks enough items), '' without scores."""
    from longctx.trainer.evaluation.interval import HALF_WIDTH

    if not rows:
        return ""
    low, high = min(r["count"] for r in rows), max(r["count"] for r in rows)
    few = "" if all(r["enough"] for r in rows) else f", too few items for +/-{HALF_WIDTH:g}"
    return f"; n={low}{'' if low == high else f'-{high}'}{few}"


def plot_score_by_length(effective: Mapping[str, Any], path: Path) -> None:
    """Each model's needle score against context length (log2 x axis, one line per model, each with
    its own marker and line style and shifted a little sideways so that equal scores hide none), its
    95% interval as error bars, its threshold as a dashed line of its colour and its effective
    length as a star (``effective``: what
    ``longctx.trainer.evaluation.effective.effective_lengths`` returns)."""
    fig = new_figure(figsize=(12, 4.5))
    ax = fig.subplots()
    models = list(effective["models"].items())
    for index, (label, verdict) in enumerate(models):
        shift = 2 ** ((index - (len(models) - 1) / 2) * _OFFSET)
        rows = verdict["scores"]
        xs = [r["context_tokens"] * shift for r in rows]
        ys = [r["score"] for r in rows]
        errors = [[r["score"] - r["low"] for r in rows], [r["high"] - r["score"] for r in rows]]
        marker, linestyle = _LINE_STYLES[index % len(_LINE_STYLES)]
        length = verdict["effective_length"]
        found = "undetermined" if verdict["status"] == "undetermined" else f"effective {length or 'none'}"
        found += counts_text(rows)
        line = ax.errorbar(
            xs,
            ys,
            yerr=errors,
            marker=marker,
            fillstyle="none",
            linestyle=linestyle,
            capsize=3,
            label=f"{label} ({found})",
            zorder=3 + index,
        )
        color = line.lines[0].get_color()
        if verdict["threshold"] is not None:
            ax.axhline(
                verdict["threshold"],
                color=color,
                linestyle="--",
                linewidth=1,
                zorder=2,
                label=f"{label} threshold {threshold_text(verdict)}",
            )
        if length is not None:
            score = next(r["score"] for r in rows if r["context_tokens"] == length)
            ax.plot([length * shift], [score], marker="*", markersize=16, color=color, linestyle="none")
            ax.annotate(  # below the point, a line per model: the labels never overlap
                f"{label}: {length}",
                (length * shift, score),
                textcoords="offset points",
                xytext=(6, -14 - 12 * index),
            )
    ax.set_xscale("log", base=2)
    lengths = sorted({s["context_tokens"] for v in effective["models"].values() for s in v["scores"]})
    ax.set_xticks(lengths, [str(n) for n in lengths])
    ax.set_ylim(-0.05, 1.05)  # lines at 0 and 1 drawn whole
    ax.set_xlabel("context tokens")
    ax.set_ylabel("score (95% Wilson interval)")
    ax.set_title("effective context length: every length up to it clears the threshold (lower end)")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))  # beside the axes: hides no point
    fig.tight_layout()
    write_figure(path, fig)


def format_effective(
    effective: Mapping[str, Any], tasks: Mapping[str, Mapping[str, list[dict[str, Any]]]]
) -> str:
    """The effective length of every model, how its threshold was set, its score per length and
    per task kind with their counts and 95% intervals, as text."""
    from longctx.trainer.evaluation.interval import describe

    lines = [
        "effective context length (the largest length up to which every evaluated length clears the "
        "threshold with the lower end of its 95% Wilson interval)"
    ]
    for label, verdict in effective["models"].items():
        length, failure = verdict["effective_length"], verdict["first_failure"]
        if verdict["status"] == "undetermined":
            lines.append(f"  {label}: undetermined: {verdict['reason']}")
        else:
            found = f"{length} tokens" if length is not None else "none (its shortest length fails)"
            after = f", first failing length {failure}" if failure is not None else ""
            lines.append(f"  {label}: {found} (threshold {threshold_text(verdict)}){after}")
        lines.append("    score by length:")
        for row in verdict["scores"]:
            verdict_text = {True: "  passes", False: "  fails", None: ""}[row["passes"]]
            lines.append(f"      {row['context_tokens']:>7}: {describe(row)}{verdict_text}")
        for task, by_length in tasks.get(label, {}).items():
            lines.append(f"    {task}:")
            lines.extend(f"      {c['context_tokens']:>7}: {describe(c)}" for c in by_length)
    return "\n".join(lines)


def format_short_context(short: Mapping[str, Any]) -> str:
    """The short-context guard as a line per model under the loss table: its loss on the held-out
    short windows, the ratio to the baseline's and, when measured, to the base model as released
    (its own RoPE); or why it was skipped."""
    if "skipped" in short:
        return f"short-context guard skipped: {short['skipped']}"
    held = "held-out " if short["held_out"] else ""
    released = short.get("released_base")
    against = f"; the base as released (its own RoPE): loss {released:.4f}" if released is not None else ""
    lines = [
        f"short windows ({short['windows']} {held}windows of {short['length']} tokens from source "
        f"{short['source']!r}; ratio to {short['baseline']}{against}):"
    ]
    for m in short["models"]:
        loss = f"{m['mean_loss']:.4f}" if m["mean_loss"] is not None else "-"
        ratio = f"{m['ratio']:.3f}" if m["ratio"] is not None else "-"
        line = f"  {m['label']}: loss {loss}, ratio {ratio}"
        if m.get("ratio_to_released") is not None:
            line += f", ratio to the released base {m['ratio_to_released']:.3f}"
        lines.append(line)
    return "\n".join(lines)
