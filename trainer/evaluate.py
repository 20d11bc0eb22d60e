"""Does the model use its long context? Loss by position and needle retrieval.

- Loss by position: mean next-token loss of tokens whose position falls in each power-of-two bucket
  (plus a bucket edge at the original context). An extended model's loss keeps falling with
  position past the old window; a flat or rising tail means the extension did not take.
- Needle retrieval: for a grid of context lengths x needle depths, greedy decoding must reproduce
  the needle's value.

Both work on the bundled model and on any Hugging Face checkpoint loaded by ``longctx.trainer.hf_io``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from longctx.core.atomic import write_figure
from longctx.trainer.coverage import position_edges
from longctx.trainer.metrics import token_losses
from longctx.trainer.model import Transformer


@torch.no_grad()
def loss_by_position(
    model: Transformer,
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
                sample["input_ids"].to(device), sample["position_ids"].to(device), torch.arange(n, device=device),
                segment.to(device), rope_seq_len=seq_len,
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


@torch.no_grad()
def greedy_generate(
    model: Transformer,
    prompt: Sequence[int],
    max_new_tokens: int,
    device: torch.device,
    stop: Callable[[list[int]], bool] = lambda generated: False,
) -> list[int]:
    """Greedy continuation of one prompt, until ``max_new_tokens`` or ``stop(generated)`` is true.

    The prefix is recomputed at every step: answers are a few tokens and scoring stops as soon as
    the answer is settled, so a KV cache would not pay for its complexity here.
    """
    model.eval()
    ids = list(prompt)
    out: list[int] = []
    for _ in range(max_new_tokens):
        n = len(ids)
        tokens = torch.tensor(ids, device=device)
        positions = torch.arange(n, device=device)
        hidden = model(tokens, positions, positions, torch.zeros(n, dtype=torch.long, device=device), rope_seq_len=n)
        out.append(int(model.logits(hidden[-1:]).argmax(-1)))
        ids.append(out[-1])
        if stop(out):
            break
    return out


@dataclass(frozen=True)
class NeedleResult:
    context_tokens: int
    depth: float
    task: str
    answer: str
    generated: str
    correct: bool


def score_answer(generated: str, answer: str) -> bool:
    """Correct when the generation, without leading white space, starts with the expected answer."""
    return generated.lstrip().startswith(answer.strip())


def answer_settled(generated: str, answer: str) -> bool:
    """True once more tokens cannot change the score: the answer is complete, or the generation
    has left it."""
    text, expected = generated.lstrip(), answer.strip()
    return text.startswith(expected) or (bool(text) and not expected.startswith(text))


def needle_grid(
    model: Transformer,
    tokenizer,
    haystack_texts: list[str],
    lengths: Sequence[int],
    depths: Sequence[float],
    kinds: Sequence[str],
    seed: int,
    device: torch.device,
    max_new_tokens: int = 16,
    stop_ids: Sequence[int] = (),
) -> list[NeedleResult]:
    """Build one example per (length, depth, kind) with :func:`longctx.pipeline.synthetic.tasks.make_grid` and
    score greedy decoding against its answer. Decoding stops at a token of ``stop_ids`` or as soon
    as the score is settled (:func:`answer_settled`)."""
    from longctx.pipeline.synthetic.tasks import make_grid

    results = []
    for kind in kinds:
        for example in make_grid(haystack_texts, tokenizer, list(lengths), list(depths), seed, kind):
            prompt_ids = tokenizer.encode(example.prompt, add_special_tokens=False).ids

            def stop(ids: list[int], answer: str = example.answer) -> bool:
                return ids[-1] in stop_ids or answer_settled(tokenizer.decode(ids), answer)

            generated_ids = greedy_generate(model, prompt_ids, max_new_tokens, device, stop)
            generated = tokenizer.decode([i for i in generated_ids if i not in stop_ids])
            results.append(NeedleResult(example.context_tokens, example.depth, kind, example.answer, generated,
                                        score_answer(generated, example.answer)))
    return results


def plot_loss_by_position(rows: list[dict[str, Any]], original: int, path: Path, title: str = "") -> None:
    """Mean loss against position (log2 x axis), with the original context marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [(max(1, (r["start"] + r["end"]) / 2), r["mean_loss"]) for r in rows if r["mean_loss"] is not None]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot([p for p, _ in points], [v for _, v in points], marker="o")
    ax.axvline(original, color="tab:red", linestyle="--", label=f"original context ({original})")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("position in document (bucket midpoint)")
    ax.set_ylabel("mean next-token loss")
    ax.set_title(title or "loss by position")
    ax.legend()
    fig.tight_layout()
    write_figure(path, fig)


def plot_needle_heatmap(results: list[NeedleResult], path: Path) -> None:
    """Accuracy per (context length, depth), averaged over task kinds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = sorted({r.context_tokens for r in results})
    depths = sorted({r.depth for r in results})
    grid = [[0.0] * len(lengths) for _ in depths]
    for i, d in enumerate(depths):
        for j, n in enumerate(lengths):
            cell = [r.correct for r in results if r.depth == d and r.context_tokens == n]
            grid[i][j] = sum(cell) / len(cell) if cell else float("nan")
    fig, ax = plt.subplots(figsize=(1.2 * len(lengths) + 3, 0.5 * len(depths) + 2.5))
    image = ax.imshow(grid, vmin=0, vmax=1, cmap="RdYlGn", aspect="auto")
    ax.set_xticks(range(len(lengths)), [str(n) for n in lengths])
    ax.set_yticks(range(len(depths)), [f"{d:.0%}" for d in depths])
    ax.set_xlabel("context tokens")
    ax.set_ylabel("needle depth")
    ax.set_title("needle retrieval (greedy decoding reproduces the value)")
    for i in range(len(depths)):
        for j in range(len(lengths)):
            ax.text(j, i, f"{grid[i][j]:.0%}", ha="center", va="center", fontsize=8)
    fig.colorbar(image, ax=ax, label="accuracy")
    fig.tight_layout()
    write_figure(path, fig)


def format_loss_table(rows: list[dict[str, Any]], original: int) -> str:
    lines = [f"{'positions':>17} {'tokens':>9} {'mean loss':>10}"]
    for r in rows:
        loss = f"{r['mean_loss']:.4f}" if r["mean_loss"] is not None else "-"
        mark = "  <- original context" if r["start"] == original else ""
        lines.append(f"{'[' + str(r['start']) + ', ' + str(r['end']) + ')':>17} {r['tokens']:>9} {loss:>10}{mark}")
    return "\n".join(lines)
