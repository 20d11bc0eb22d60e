"""Check every invariant of ``packer/FORMAT.md`` on shards, independently of the code that wrote them.

Row checks are whole-shard numpy operations: segment boundaries first (the other checks are
defined in terms of them), then provenance, positions, loss mask, padding, token range and special
tokens. Folder checks add the manifest: files, checksums, headers, the tokenizer fingerprint, and
every total recomputed from the rows.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from longctx.core.text import plural
from longctx.core.tokenizer import tokenizer_fingerprint
from longctx.packer.format import SHARD_SUFFIX, ShardError, file_checksum, open_shard
from longctx.packer.manifest import build_manifest, load_manifest
from longctx.packer.reader import ShardColumns
from longctx.packer.report import stats_from_shards

PROVENANCE = ("doc_id", "doc_source", "doc_offset", "doc_length")


@dataclass(frozen=True)
class Violation:
    """One broken invariant: where (file and row, when it is about a row), which field, what."""

    file: str
    row: int | None
    field: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file} row {self.row}" if self.row is not None else self.file
        return f"{where}: {self.field}: {self.message}"


@dataclass(frozen=True)
class _Segments:
    """Every segment of a shard, row after row: its row, first token in the flat ``rows * seq_len``
    token array, length, whether it is padding, and its provenance."""

    row: np.ndarray
    start: np.ndarray
    length: np.ndarray
    is_pad: np.ndarray
    provenance: dict[str, pa.Array]

    @property
    def offset(self) -> np.ndarray:
        return self.provenance["doc_offset"].fill_null(0).to_numpy().astype(np.int64)

    @property
    def doc_length(self) -> np.ndarray:
        return self.provenance["doc_length"].fill_null(0).to_numpy().astype(np.int64)


def _flat(columns: ShardColumns, name: str) -> pa.Array:
    return columns.table.column(name).combine_chunks().flatten()


def _rows_of(mask: np.ndarray, rows: np.ndarray, limit: int) -> list[int]:
    return np.unique(rows[mask])[:limit].tolist()


def _check_boundaries(columns: ShardColumns, file: str, limit: int) -> list[Violation]:
    """``0 = cu[0] < cu[1] < ... < cu[-1] = seq_len`` and one provenance entry per segment."""
    seq_len = columns.meta.seq_len
    offsets, cu = columns.cu_offsets.astype(np.int64), columns.cu_values.astype(np.int64)
    segments = np.diff(offsets) - 1
    bad = segments < 1
    ok = ~bad
    bad[ok] = (cu[offsets[:-1][ok]] != 0) | (cu[offsets[1:][ok] - 1] != seq_len)
    steps = np.diff(cu)
    within_row = np.ones(len(steps), bool)
    within_row[offsets[1:-1] - 1] = False
    step_row = np.searchsorted(offsets, np.arange(len(steps)), side="right") - 1
    bad[step_row[within_row & (steps <= 0)]] = True
    found = [
        Violation(
            file,
            r,
            "cu_seqlens",
            f"must rise strictly from 0 to {seq_len}, got {cu[offsets[r] : offsets[r + 1]][:8].tolist()}",
        )
        for r in np.flatnonzero(bad)[:limit].tolist()
    ]
    for name in PROVENANCE:
        entries = pc.list_value_length(columns.table.column(name).combine_chunks()).fill_null(-1).to_numpy()
        found += [
            Violation(
                file,
                r,
                name,
                f"has {plural(entries[r], 'entry', 'entries')} for {plural(segments[r], 'segment')}",
            )
            for r in np.flatnonzero(entries != segments)[:limit].tolist()
        ]
    return found


def _segments(columns: ShardColumns) -> _Segments:
    offsets, cu = columns.cu_offsets.astype(np.int64), columns.cu_values.astype(np.int64)
    row = np.repeat(np.arange(columns.table.num_rows), np.diff(offsets) - 1)
    first = np.ones(len(cu), bool)
    first[offsets[1:] - 1] = False  # every boundary but each row's last starts a segment
    provenance = {name: _flat(columns, name) for name in PROVENANCE}
    return _Segments(
        row=row,
        start=cu[first] + row * columns.meta.seq_len,
        length=columns.segment_lengths(),
        is_pad=provenance["doc_id"].is_null().to_numpy(zero_copy_only=False),
        provenance=provenance,
    )


def _check_provenance(seg: _Segments, file: str, limit: int) -> Iterator[Violation]:
    """Padding: at most one segment, the last of its row, with all provenance null. Documents:
    non-empty id and source, and the segment lies inside the document."""
    last = np.zeros(len(seg.row), bool)
    last[np.flatnonzero(np.diff(np.append(seg.row, -1)))] = True
    for r in _rows_of(seg.is_pad & ~last, seg.row, limit):
        yield Violation(file, r, "doc_id", "a padding segment (null doc_id) that is not the last segment")
    for name in PROVENANCE[1:]:
        for r in _rows_of(
            seg.provenance[name].is_null().to_numpy(zero_copy_only=False) != seg.is_pad, seg.row, limit
        ):
            yield Violation(file, r, name, "must be null exactly for the padding segment")
    empty = ~seg.is_pad & (
        (pc.utf8_length(seg.provenance["doc_id"].fill_null("")).to_numpy() == 0)
        | (pc.utf8_length(seg.provenance["doc_source"].fill_null("")).to_numpy() == 0)
    )
    for r in _rows_of(empty, seg.row, limit):
        yield Violation(file, r, "doc_id", "a document segment with an empty doc_id or doc_source")
    offset, doc_length = seg.offset, seg.doc_length
    outside = ~seg.is_pad & ((offset < 0) | (offset + seg.length > doc_length))
    for s in np.flatnonzero(outside)[:limit].tolist():
        message = f"{seg.length[s]} tokens at offset {offset[s]} do not fit a document of {doc_length[s]}"
        yield Violation(file, int(seg.row[s]), "doc_offset", message)


def _check_tokens(columns: ShardColumns, seg: _Segments, file: str, limit: int) -> Iterator[Violation]:
    """Positions restart at every segment; loss mask 0 exactly at segment starts and on padding;
    padding holds the pad id; every id is inside the vocabulary."""
    seq_len, tok = columns.meta.seq_len, columns.meta.tokenizer
    token_seg = np.repeat(np.arange(len(seg.length)), seg.length)
    expected_position = np.arange(len(token_seg)) - seg.start[token_seg]
    padding = seg.is_pad[token_seg]
    expected_mask = (~padding & (expected_position > 0)).astype(np.uint8)
    ids = columns.input_ids.reshape(-1)
    positions, mask = columns.position_ids.reshape(-1), columns.loss_mask.reshape(-1)
    checks = [
        (
            "position_ids",
            positions != expected_position,
            lambda i: f"expected {expected_position[i]}, got {positions[i]}",
        ),
        ("loss_mask", mask != expected_mask, lambda i: f"expected {expected_mask[i]}, got {mask[i]}"),
        (
            "input_ids",
            padding & (ids != tok.pad_id),
            lambda i: f"padding must be pad id {tok.pad_id}, got {ids[i]}",
        ),
        (
            "input_ids",
            (ids < 0) | (ids >= tok.vocab_size),
            lambda i: f"id {ids[i]} outside [0, {tok.vocab_size})",
        ),
    ]
    for name, wrong, describe in checks:
        flat = np.flatnonzero(wrong)
        rows, first = np.unique(flat // seq_len, return_index=True)
        for r, i in zip(rows[:limit].tolist(), flat[first[:limit]].tolist(), strict=True):
            yield Violation(file, r, name, f"token {i % seq_len}: {describe(i)}")


def _check_special_tokens(
    columns: ShardColumns, seg: _Segments, file: str, limit: int
) -> Iterator[Violation]:
    """A segment that ends its document ends with EOS; one that starts it starts with BOS (if used)."""
    tok = columns.meta.tokenizer
    ids = columns.input_ids.reshape(-1)
    offset, doc_id = seg.offset, seg.provenance["doc_id"]
    ends = ~seg.is_pad & (offset + seg.length == seg.doc_length)
    for s in np.flatnonzero(ends & (ids[seg.start + seg.length - 1] != tok.eos_id))[:limit].tolist():
        yield Violation(
            file,
            int(seg.row[s]),
            "input_ids",
            f"document {doc_id[s].as_py()} does not end with EOS {tok.eos_id}",
        )
    if tok.bos_id is not None:
        starts = ~seg.is_pad & (offset == 0)
        for s in np.flatnonzero(starts & (ids[seg.start] != tok.bos_id))[:limit].tolist():
            message = f"document {doc_id[s].as_py()} does not start with BOS {tok.bos_id}"
            yield Violation(file, int(seg.row[s]), "input_ids", message)


def check_rows(columns: ShardColumns, file: str, limit: int = 10) -> Iterator[Violation]:
    """Row invariants of one shard, each check reporting at most ``limit`` rows."""
    if not columns.table.num_rows:
        return
    broken = _check_boundaries(columns, file, limit)
    if broken:
        yield from broken  # the remaining checks are defined by the segments
        return
    seg = _segments(columns)
    yield from _check_provenance(seg, file, limit)
    yield from _check_tokens(columns, seg, file, limit)
    yield from _check_special_tokens(columns, seg, file, limit)


def validate_file(path: Path, limit: int = 10) -> list[Violation]:
    """Row invariants of a single shard file (no manifest, so no checksum)."""
    try:
        meta, table = open_shard(path)
    except ShardError as err:
        return [Violation(path.name, None, "file", str(err))]
    return list(check_rows(ShardColumns(meta, table), path.name, limit))


def validate_folder(folder: Path, tokenizer: Path | None = None, limit: int = 10) -> list[Violation]:
    """Every invariant of an output folder: manifest, files, checksums, headers, tokenizer
    fingerprint, rows, and the manifest's totals recomputed from the rows."""
    try:
        manifest = load_manifest(folder)
    except ShardError as err:
        return [Violation(folder.name, None, "manifest", str(err))]
    header = manifest.header
    found: list[Violation] = []
    if tokenizer is not None and tokenizer_fingerprint(tokenizer) != header.tokenizer.sha256:
        found.append(
            Violation(
                str(tokenizer), None, "tokenizer", "sha256 differs from the shards' tokenizer fingerprint"
            )
        )
    listed = {s.file for s in manifest.shards}
    for stray in sorted({p.name for p in folder.glob(f"*{SHARD_SUFFIX}")} - listed):
        found.append(Violation(stray, None, "manifest", "shard file not listed in the manifest"))
    opened: list[ShardColumns] = []
    complete = True
    for entry in manifest.shards:
        path = folder / entry.file
        if not path.is_file():
            found.append(Violation(entry.file, None, "file", "listed in the manifest but missing"))
            complete = False
            continue
        if file_checksum(path) != entry.xxh3_128:
            found.append(
                Violation(entry.file, None, "xxh3_128", "checksum differs from the manifest (file modified)")
            )
        try:
            meta, table = open_shard(path)
        except ShardError as err:
            found.append(Violation(entry.file, None, "file", str(err)))
            complete = False
            continue
        if meta.model_dump(exclude={"rows"}) != header.model_dump():
            found.append(Violation(entry.file, None, "metadata", "header differs from the manifest's"))
        if meta.rows != entry.rows:
            found.append(
                Violation(
                    entry.file, None, "rows", f"{plural(meta.rows, 'row')}, the manifest says {entry.rows}"
                )
            )
        columns = ShardColumns(meta, table)
        found += list(check_rows(columns, entry.file, limit))
        opened.append(columns)
        if len(found) >= limit:
            return found[:limit]
    if complete and not found:
        stats = stats_from_shards(opened, header.seq_len, header.original_context)
        recomputed = build_manifest(
            header, manifest.config, manifest.shards, stats, None, manifest.mix
        ).model_dump()
        claimed = manifest.model_dump()
        if manifest.mix is not None:  # the plan's record of the mix must match what the rows hold
            used = {n: s.tokens_used for n, s in manifest.mix.sources.items() if s.tokens_used}
            if used != {n: s["tokens"] for n, s in recomputed["sources"].items()}:
                found.append(
                    Violation("manifest.json", None, "mix", "tokens used per source differ from the shards")
                )
        for source in claimed["sources"].values():
            source["target_fraction"] = None
        for key in sorted(claimed):
            if claimed[key] != recomputed[key]:
                found.append(
                    Violation("manifest.json", None, key, "differs from the value recomputed from the shards")
                )
    return found[:limit]
