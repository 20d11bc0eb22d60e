"""Summary of a curation run from its ledger: outcomes per source, token totals, and the
distribution of kept document lengths (power-of-two buckets keyed by their lower edge, see
``longctx.core.buckets``), as JSON and as a figure."""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa

from longctx.core.buckets import bucket_bounds, bucket_floor, bucket_of
from longctx.core.figures import new_figure, write_figure
from longctx.core.text import plural

COUNTS = ("inputs", "files", "kept", "filtered", "duplicate", "skipped", "kept_tokens")


def summarize_ledger(ledger: pa.Table) -> dict[str, Any]:
    """Per-source counts by outcome and reason, kept tokens and a length histogram.

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
    totals = {k: sum(s[k] for s in sources.values()) for k in COUNTS}
    return {"sources": sources, "totals": totals}


def plot_summary(summary: dict[str, Any], path: Path) -> None:
    """Two panels: outcomes per source (stacked bars) and kept-length histograms (log2 buckets)."""
    sources = list(summary["sources"])
    fig = new_figure(figsize=(12, 4.5))
    ax_out, ax_len = fig.subplots(1, 2)
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
