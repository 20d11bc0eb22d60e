"""Human-readable views of packed output: statistics recomputed from shards, text summaries,
one window decoded with its segment boundaries, and histogram figures."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from longctx.core.buckets import bucket_bounds, num_buckets
from longctx.core.figures import new_figure, write_figure
from longctx.core.text import plural
from longctx.packer.manifest import Manifest
from longctx.packer.reader import PackedRow, ShardColumns
from longctx.packer.stats import OutputStats


def stats_from_shards(shards: Iterable[ShardColumns], seq_len: int, original_context: int) -> OutputStats:
    """Statistics of the windows in ``shards``, computed from their rows (not from the manifest)."""
    stats = OutputStats(seq_len, original_context)
    seen: dict[str, set[str]] = {}
    for columns in shards:
        table = columns.table
        doc_id = table.column("doc_id").combine_chunks().flatten()
        is_doc = doc_id.is_valid().to_numpy(zero_copy_only=False)
        sources = table.column("doc_source").combine_chunks().flatten().filter(is_doc).to_pylist()
        doc_len = (
            table.column("doc_length").combine_chunks().flatten().filter(is_doc).to_numpy().astype(np.int64)
        )
        stats.add_windows(table.num_rows, sources, columns.segment_lengths()[is_doc], doc_len)
        for name, doc in zip(sources, doc_id.filter(is_doc).to_pylist(), strict=True):
            seen.setdefault(name, set()).add(doc)
    for name, ids in seen.items():
        stats.source(name).documents = len(ids)
    return stats


def _si(value: int) -> str:
    for unit, size in (("M", 1 << 20), ("K", 1 << 10)):
        if value >= size and value % size == 0:
            return f"{value // size}{unit}"
    return str(value)


def bucket_label(k: int, largest: int | None = None) -> str:
    """``"0"``, ``"1"``, ``"[2, 4)"``, ..., ``"[1K, 2K)"``: the values bucket ``k`` holds. With
    ``largest``, the largest value that can occur, a bucket it cuts short says where it really ends:
    segment lengths of 64K windows end with the bucket ``"64K"`` (full windows, not ``[64K, 128K)``),
    those of 3000-token windows with ``"[2K, 3000]"``."""
    lo, hi = bucket_bounds(k)
    if largest is not None and largest < hi - 1:
        return _si(lo) if largest == lo else f"[{_si(lo)}, {_si(largest)}]"
    return str(lo) if hi - lo == 1 else f"[{_si(lo)}, {_si(hi)})"


def _histogram_lines(counts: list[int], largest: int, width: int = 40) -> list[str]:
    top = max(counts) or 1
    last = max((k for k, c in enumerate(counts) if c), default=-1)
    return [
        f"    {bucket_label(k, largest):>11} {c:>14,} {'█' * round(width * c / top)}"
        for k, c in enumerate(counts[: last + 1])
    ]


def format_manifest(manifest: Manifest, title: str) -> str:
    """A text summary: totals, coverage of long positions, sources, and both histograms."""
    h = manifest.header
    total = manifest.rows * h.seq_len
    padding_share = manifest.padding / (total or 1)
    lines = [
        title,
        (
            f"  {plural(manifest.rows, 'row')} x {h.seq_len:,} tokens = {total:,}; {manifest.tokens:,} "
            f"document tokens, padding {manifest.padding:,} ({padding_share:.2%}); "
            f"efficiency {manifest.efficiency:.3%}"
        ),
        (
            f"  strategy {h.strategy}; format v{h.format_version}; tokenizer {h.tokenizer.sha256[:12]}; "
            f"config {h.config_sha256[:12]}; {plural(len(manifest.shards), 'shard file')}"
        ),
        (
            f"  largest position {manifest.max_position:,}; tokens at positions >= {h.original_context:,} "
            f"(context.original): {manifest.long_tokens:,} ({manifest.long_fraction:.2%})"
        ),
        f"  segments holding part of a document that fits one window: {manifest.short_document_pieces:,}",
        (
            f"  {'source':<16} {'tokens':>14} {'fraction':>9} {'docs':>8} {'segments':>9} {'max pos':>9} "
            f"{'>=original':>11}"
        ),
    ]
    for name, s in manifest.sources.items():
        long_share = s.long_tokens / s.tokens if s.tokens else 0.0
        lines.append(
            f"  {name:<16} {s.tokens:>14,} {s.fraction:>9.3f} {s.documents:>8,} {s.segments:>9,} "
            f"{s.max_position:>9,} {long_share:>11.2%}"
        )
    lines.append("  position ids (tokens per power-of-two bucket):")
    lines += _histogram_lines(manifest.position_histogram, h.seq_len - 1)
    lines.append("  segment lengths (document segments per power-of-two bucket):")
    lines += _histogram_lines(manifest.segment_length_histogram, h.seq_len)
    return "\n".join(lines)


def format_row(
    row: PackedRow, index: int, tokenizer: Tokenizer | None, max_chars: int = 2000, where: str = ""
) -> str:
    """Window ``index`` (of the output ``where``) segment by segment: where each lies in the window
    and in its document, then its decoded text (token ids when no tokenizer is given), cut to
    ``max_chars``."""
    cu = row.cu_seqlens.tolist()
    trained = int(row.loss_mask.sum())
    lines = [
        f"row {index}{f' of {where}' if where else ''}: {plural(len(cu) - 1, 'segment')}, "
        f"{trained:,} trained tokens of {len(row.input_ids):,}"
    ]
    for j, (start, end) in enumerate(itertools.pairwise(cu)):
        if row.doc_id[j] is None:
            lines.append(
                f"── segment {j}: window tokens [{start}, {end}) · "
                f"padding ({plural(end - start, 'token')}) ──"
            )
            continue
        offset = row.doc_offset[j]
        lines.append(
            f"── segment {j}: window tokens [{start}, {end}) · document {row.doc_id[j]} "
            f"(source {row.doc_source[j]}) tokens [{offset}, {offset + end - start}) "
            f"of {row.doc_length[j]} ──"
        )
        ids = row.input_ids[start:end].tolist()
        text = tokenizer.decode(ids, skip_special_tokens=False) if tokenizer else " ".join(map(str, ids))
        lines.append(
            text if len(text) <= max_chars else f"{text[: max_chars // 2]} … {text[-max_chars // 2 :]}"
        )
    return "\n".join(lines)


def plot_manifest(manifest: Manifest, path: Path) -> None:
    """Two panels: position ids and segment lengths per power-of-two bucket, stacked by source."""
    fig = new_figure(figsize=(13, 4.5))
    axes = fig.subplots(1, 2)
    seq_len = manifest.header.seq_len
    panels = (
        (
            "position_histogram",
            "tokens",
            f"position ids (context.original = {manifest.header.original_context:,})",
            seq_len - 1,
        ),
        ("segment_length_histogram", "segments", "document segment lengths", seq_len),
    )
    for ax, (key, unit, title, largest) in zip(axes, panels, strict=True):
        shown = num_buckets(largest)  # the buckets values up to `largest` can fall in
        bottom = np.zeros(shown)
        labels = [bucket_label(k, largest) for k in range(shown)]
        for name, source in manifest.sources.items():
            counts = np.array(getattr(source, key)[:shown], dtype=float)
            ax.bar(labels, counts, bottom=bottom, label=name)
            bottom += counts
        if key == "position_histogram":
            original_bucket = manifest.header.original_context.bit_length()
            ax.axvline(
                original_bucket - 0.5, color="black", linestyle="--", linewidth=1, label="context.original"
            )
        ax.set_title(title)
        ax.set_ylabel(unit)
        ax.set_xlabel("power-of-two bucket")
        ax.tick_params(axis="x", labelrotation=60)
        ax.legend(fontsize="small")
    fig.suptitle(
        f"seq_len {manifest.header.seq_len:,}: {plural(manifest.rows, 'row')}, "
        f"efficiency {manifest.efficiency:.3%}"
    )
    fig.tight_layout()
    write_figure(path, fig, dpi=120)
