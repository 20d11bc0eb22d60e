"""Summary of a curation run from its ledger: outcomes per source, token totals, the distribution
of kept document lengths (power-of-two buckets keyed by their lower edge, see
``longctx.core.buckets``) and of the dependency scores (:mod:`longctx.pipeline.dependency`), as JSON
and as a figure."""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from longctx.core.buckets import bucket_bounds, bucket_floor, bucket_of
from longctx.core.figures import new_figure, write_figure
from longctx.core.text import plural
from longctx.pipeline.dependency import REASONS
from longctx.pipeline.documents import SCORE_COLUMNS

COUNTS = ("inputs", "files", "kept", "filtered", "duplicate", "skipped", "kept_tokens")
QUANTILES = {"min": 0.0, "p10": 0.1, "p25": 0.25, "median": 0.5, "p75": 0.75, "p90": 0.9, "max": 1.0}
"""The quantiles of each source's scores in ``stats.json`` (numpy's linear interpolation)."""
SCORE_BIN = 0.05
"""Width of the score histograms' bins; scores are clipped to [-1, 1] for them (a score beyond is
counted in the edge bin, and in the summary's ``outside``)."""


def summarize_ledger(
    ledger: pa.Table, backgrounds: dict[str, dict[str, Any]] | None = None
) -> dict[str, Any]:
    """Per-source counts by outcome and reason, kept tokens, a length histogram and, when the run
    scored documents, their dependency scores (:func:`summarize_scores`; ``backgrounds``, each
    source's chance similarity as :class:`~longctx.pipeline.dependency.DependencySelection` measured
    it, go beside the model-free score's).

    ``totals`` checks itself: inputs == kept + filtered + duplicate + skipped for every source;
    ``files`` counts the input files the rows account for.
    """
    rows = ledger.select(["source", "outcome", "reason", "tokens", "files"]).to_pylist()
    per_source: dict[str, dict[str, Any]] = defaultdict(
        lambda: {
            "inputs": 0,
            "files": 0,
            "kept": 0,
            "filtered": 0,
            "duplicate": 0,
            "skipped": 0,
            "reasons": Counter(),
            "kept_tokens": 0,
            "length_histogram": Counter(),
        }
    )
    for row in rows:
        s = per_source[row["source"]]
        s["inputs"] += 1
        s["files"] += row["files"]
        s[row["outcome"]] += 1
        if row["outcome"] == "kept":
            s["kept_tokens"] += row["tokens"]
            s["length_histogram"][bucket_floor(row["tokens"])] += 1
        else:
            s["reasons"][row["reason"]] += 1
    sources = {}
    for name in sorted(per_source):
        s = per_source[name]
        sources[name] = {
            **{k: s[k] for k in COUNTS},
            "reasons": dict(sorted(s["reasons"].items())),
            "length_histogram": {str(k): v for k, v in sorted(s["length_histogram"].items())},
        }
    for key, per_source in summarize_scores(ledger).items():
        for name, summary in per_source.items():
            sources[name][key] = summary
    for name, background in (backgrounds or {}).items():
        if name in sources and "dependency" in sources[name]:
            sources[name]["dependency"]["background"] = background
    totals = {k: sum(s[k] for s in sources.values()) for k in COUNTS}
    return {"sources": sources, "totals": totals}


def summarize_scores(ledger: pa.Table) -> dict[str, dict[str, dict[str, Any]]]:
    """``{score column: {source: summary}}`` for each of :data:`SCORE_COLUMNS` that some ledger row
    holds. A source's summary covers the documents its scores were for: those kept, and those a
    dependency filter dropped (duplicates and documents refused earlier are left out): how many
    have a score (``scored``) and how many not (``unscored``: too short to score), the
    :data:`QUANTILES` and a histogram (bins of :data:`SCORE_BIN`, keyed by their lower edge)."""
    columns = [
        c for c in SCORE_COLUMNS if c in ledger.column_names and ledger.column(c).null_count < len(ledger)
    ]
    if not columns:
        return {}
    rows = ledger.select(["source", "outcome", "reason", *columns]).to_pylist()
    result: dict[str, dict[str, dict[str, Any]]] = {}
    for column in columns:
        values: dict[str, list[float]] = defaultdict(list)
        unscored: Counter[str] = Counter()
        for row in rows:
            if row["outcome"] == "kept" or (row["outcome"] == "filtered" and row["reason"] in REASONS):
                if row[column] is None:
                    unscored[row["source"]] += 1
                else:
                    values[row["source"]].append(row[column])
        result[column] = {
            name: score_summary(values.get(name, []), unscored[name])
            for name in sorted(set(values) | set(unscored))
        }
    return result


def score_summary(values: list[float], unscored: int) -> dict[str, Any]:
    """Counts, quantiles and histogram of one source's scores (see :func:`summarize_scores`)."""
    summary: dict[str, Any] = {"scored": len(values), "unscored": unscored}
    if values:
        found = np.quantile(np.asarray(values, dtype=np.float64), list(QUANTILES.values()))
        summary["quantiles"] = {name: round(float(v), 4) for name, v in zip(QUANTILES, found)}
        bins = np.floor(np.clip(values, -1.0, 1.0 - SCORE_BIN / 2) / SCORE_BIN).astype(np.int64)
        counts = Counter(bins.tolist())
        summary["histogram"] = {f"{b * SCORE_BIN:.2f}": n for b, n in sorted(counts.items())}
        # far segments sharing more than adjacent ones (above 1) happen; say that the edge bins hold them
        outside = {"below_-1": sum(v < -1.0 for v in values), "from_1": sum(v >= 1.0 for v in values)}
        if any(outside.values()):
            summary["outside"] = outside
    return summary


def plot_summary(summary: dict[str, Any], path: Path) -> None:
    """Outcomes per source (stacked bars) and kept-length histograms (log2 buckets); then, for each
    dependency score the run computed, its histogram per source."""
    sources = list(summary["sources"])
    scores = [c for c in SCORE_COLUMNS if any(c in s for s in summary["sources"].values())]
    fig = new_figure(figsize=(12 + 5 * len(scores), 4.5))
    ax_out, ax_len, *ax_scores = fig.subplots(1, 2 + len(scores))
    bottom = [0] * len(sources)
    for outcome, colour in (
        ("kept", "tab:green"),
        ("filtered", "tab:orange"),
        ("duplicate", "tab:red"),
        ("skipped", "tab:gray"),
    ):
        values = [summary["sources"][s][outcome] for s in sources]
        ax_out.bar(sources, values, bottom=bottom, label=outcome, color=colour)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax_out.set_title("documents by outcome")
    ax_out.set_ylabel("documents")
    ax_out.legend()
    buckets = length_buckets(summary)
    width = 0.8 / max(1, len(sources))
    for i, s in enumerate(sources):
        hist = summary["sources"][s]["length_histogram"]
        ax_len.bar(
            [j + i * width for j in range(len(buckets))],
            [hist.get(str(b), 0) for b in buckets],
            width,
            label=s,
        )
    ax_len.set_xticks([j + 0.4 - width / 2 for j in range(len(buckets))])
    ax_len.set_xticklabels([_short(b) for b in buckets], rotation=45)
    ax_len.set_title("kept documents by length (tokens, power-of-two buckets)")
    ax_len.set_ylabel("documents")
    if sources:
        ax_len.legend()
    for ax, column in zip(ax_scores, scores):
        drawn = False
        for name in sources:
            hist = summary["sources"][name].get(column, {}).get("histogram", {})
            if hist:
                edges = [float(edge) for edge in hist]
                ax.bar(edges, list(hist.values()), SCORE_BIN, align="edge", alpha=0.5, label=name)
                drawn = True
        outside = [summary["sources"][name].get(column, {}).get("outside", {}) for name in sources]
        below, above = sum(o.get("below_-1", 0) for o in outside), sum(o.get("from_1", 0) for o in outside)
        if below or above:
            note = ", ".join(
                text for n, text in ((above, f"{above} at 1 or above"), (below, f"{below} below -1")) if n
            )
            ax.text(0.02, 0.98, f"{note}: in the edge bins", transform=ax.transAxes, va="top", fontsize=8)
        if column == "dependency":
            ax.axvline(0.0, color="black", linewidth=0.8)
            ax.set_title("dependency (model-free): kept and dependency-filtered")
            ax.set_xlabel("score (0: distant segments share no more than chance)")
        else:
            ax.set_title(f"{column}: kept and dependency-filtered")
            ax.set_xlabel("score")
        ax.set_ylabel("documents")
        if drawn:
            ax.legend()
    fig.tight_layout()
    write_figure(path, fig)


def length_buckets(summary: dict[str, Any]) -> list[int]:
    """Lower edges of every power-of-two bucket from the shortest kept document's to the longest's,
    empty ones included, so that the histogram's x axis is a length scale without gaps."""
    found = {int(b) for s in summary["sources"].values() for b in s["length_histogram"]}
    if not found:
        return []
    return [bucket_bounds(k)[0] for k in range(bucket_of(min(found)), bucket_of(max(found)) + 1)]


def _short(n: int) -> str:
    for unit, size in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= size:
            return f"{n // size}{unit}"
    return str(n)


def format_summary(summary: dict[str, Any]) -> str:
    """A table for the console."""
    header = (
        f"{'source':<12} {'inputs':>7} {'files':>7} {'kept':>6} {'filtered':>9} {'dup':>5} {'skipped':>8} "
        f"{'kept tokens':>13}  reasons"
    )
    lines = [header, "-" * len(header)]

    def line(name: str, s: dict[str, Any]) -> str:
        return (
            f"{name:<12} {s['inputs']:>7} {s['files']:>7} {s['kept']:>6} {s['filtered']:>9} "
            f"{s['duplicate']:>5} {s['skipped']:>8} {s['kept_tokens']:>13,}"
        )

    for name, s in summary["sources"].items():
        reasons = ", ".join(f"{r}={n}" for r, n in s["reasons"].items()) or "-"
        lines.append(f"{line(name, s)}  {reasons}")
    lines.append(line("total", summary["totals"]))
    for column in SCORE_COLUMNS:
        medians = [
            f"{name} {s[column]['quantiles']['median']:.2f} ({s[column]['scored']} scored"
            + (f", {s[column]['unscored']} too short)" if s[column]["unscored"] else ")")
            for name, s in summary["sources"].items()
            if "quantiles" in s.get(column, {})
        ]
        if medians:
            lines.append(f"{column} score, median per source: {'; '.join(medians)}")
    update = summary.get("update")
    if update:
        units = update["units"]
        parts = [
            f"{len(units[kind])} {kind.replace('_', ' ')} ({', '.join(units[kind][:3])}"
            f"{f' and {len(units[kind]) - 3} more' if len(units[kind]) > 3 else ''})"
            for kind in ("added", "changed", "removed", "outcome_changed")
            if units[kind]
        ]
        files = ", ".join(f"{len(v)} {k}" for k, v in update["files"].items() if v)
        lines.append(f"update ({files} input files): units {'; '.join(parts) or 'unchanged'}")
    files = summary.get("file_dedup")
    if files:
        lines.append(
            f"file-level dedup: {plural(files['files_removed'], 'code file')} removed as copies of another "
            f"repository's ({files['exact']} exact, {files['near']} near); "
            f"{plural(files['repository_copies'], 'repository', 'repositories')} "
            f"{'was a copy' if files['repository_copies'] == 1 else 'were copies'}"
        )
    return "\n".join(lines)
