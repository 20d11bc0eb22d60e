"""The ledger: one row per input unit saying what became of it.

An input *unit* is what a reader turns into one document: a book file, a paper file or folder, a
repository folder, a row of a JSONL/Parquet source, or an entry the reader does not read (a link, a
hidden file or folder, a file of another kind), which is ``skipped`` with a reason. Every file under
a folder source belongs to exactly one unit, and the row's ``files`` column says how many files it
accounts for (1 for a file; every file below a folder; 0 for a row of a tabular source). Inside a
repository, the document's metadata says what became of each file: ``files`` (kept),
``skipped_files`` (with a reason; a skipped folder counts the files below it) and
``duplicate_files`` (removed by file-level deduplication), which add up to the row's ``files``.

Outcomes: ``kept``; ``filtered`` (read, then refused: unreadable, too short, below a dependency
filter...); ``duplicate`` (of ``duplicate_of``); ``skipped`` (never read). ``dependency`` and
``dependency_model`` hold the document's dependency scores (:mod:`longctx.pipeline.dependency`) where
it was scored: kept documents, duplicates and those the dependency filters dropped. ``note`` records
what a reader changed or declined to change (Gutenberg boilerplate that could not be stripped safely,
files removed as duplicates).

Every place that removes a document writes its ledger rows through a :class:`LedgerWriter`
(datatrove's exclusion-writer hook), and the last stage writes a row for every kept document.
:func:`merge_ledger` joins the parts and proves that every input has exactly one row, and
:func:`check_file_counts` that the rows account for every file under each folder source. The
ledger written out also has a ``change`` column: what the run's last ``--update`` changed
(:func:`longctx.pipeline.inputs.mark_changes`).
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
from datatrove.data import Document, DocumentsPipeline
from datatrove.pipeline.base import PipelineStep
from datatrove.pipeline.writers.parquet import ParquetWriter

from longctx.core.atomic import write_table
from longctx.core.text import plural
from longctx.pipeline.documents import SCORE_COLUMNS
from longctx.pipeline.parquet import read_parquet

LEDGER_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("source", pa.string()),
        ("path", pa.string()),
        ("outcome", pa.string()),  # kept | filtered | duplicate | skipped
        ("reason", pa.string()),  # why filtered or skipped, or which kind of duplicate; "" when kept
        ("duplicate_of", pa.string()),  # id of the document this one duplicates; "" otherwise
        ("tokens", pa.int64()),  # -1 when never counted (unreadable inputs)
        ("chars", pa.int64()),
        ("files", pa.int64()),  # input files this row accounts for
        ("note", pa.string()),  # what the reader changed or declined to change; "" when nothing
        ("dependency", pa.float64()),  # model-free long-range dependency score; null when not scored
        ("dependency_model", pa.float64()),  # the language model's; null when not scored
    ]
)
OUTCOMES = ("kept", "filtered", "duplicate", "skipped")
INPUTS_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("source", pa.string()),
        ("path", pa.string()),
        ("chars", pa.int64()),
        ("files", pa.int64()),
    ]
)


class LedgerWriter(ParquetWriter):
    """Writes one ledger row per document it receives, with a fixed outcome.

    Used as a filter's ``exclusion_writer`` (the filter's reason lands in ``reason``) or as a
    pipeline step after the last filter (``outcome="kept"``), where it passes documents on.
    """

    name = "🧾 Ledger"

    def __init__(self, output_folder: str | os.PathLike, outcome: str) -> None:
        if outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, got {outcome!r}")
        super().__init__(
            str(output_folder), output_filename="${rank}.parquet", schema=LEDGER_SCHEMA, max_file_size=-1
        )
        self.outcome = outcome

    def _default_adapter(self, document: Document) -> dict:
        meta = document.metadata
        chars = 0 if meta.get("skip_reason") else len(document.text)
        return ledger_row(document.id, meta, self.outcome, chars)


def ledger_row(doc_id: str, meta: dict, outcome: str, chars: int) -> dict:
    """The ledger row of a document with metadata ``meta`` and ``chars`` characters of text (0 for an
    input that was never read); a dropped document's reason is its ``filter_reason``."""
    return {
        "id": doc_id,
        "source": str(meta.get("source", "")),
        "path": str(meta.get("path", "")),
        "outcome": outcome,
        "reason": "" if outcome == "kept" else str(meta.get("filter_reason", "")),
        "duplicate_of": str(meta.get("duplicate_of", "")),
        "tokens": int(meta.get("token_count", -1)),
        "chars": chars,
        "files": int(meta.get("input_files", 0)),
        "note": ledger_note(meta),
        **{key: None if meta.get(key) is None else float(meta[key]) for key in SCORE_COLUMNS},
    }


def ledger_note(meta: dict) -> str:
    """The ledger's ``note`` for a document: the reader's detail on a skip, Gutenberg markers that
    were not used, files a repository lost to file-level deduplication."""
    notes = []
    if meta.get("skip_detail"):
        notes.append(str(meta["skip_detail"]))
    if meta.get("gutenberg_unsafe"):
        notes.append(f"Gutenberg boilerplate kept: {meta['gutenberg_unsafe']}")
    duplicates = meta.get("duplicate_files") or []
    if duplicates:
        origins = sorted({d["duplicate_of"] for d in duplicates})
        shown = ", ".join(origins[:3]) + (f" and {len(origins) - 3} more" if len(origins) > 3 else "")
        notes.append(f"{plural(len(duplicates), 'file')} removed as duplicates of files of {shown}")
    return "; ".join(notes)


class InputTally(PipelineStep):
    """Records the id, source, path, length and file count of every document the readers produced,
    before any filter, so that the ledger can be checked against the inputs (and the duplicate
    resolver can rank copies by length and path)."""

    type = "🧾 - LEDGER"
    name = "🧮 Input tally"

    def __init__(self, output_folder: str | os.PathLike) -> None:
        super().__init__()
        self.output_folder = Path(output_folder)

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        rows: dict[str, list] = {name: [] for name in INPUTS_SCHEMA.names}
        for doc in data:
            rows["id"].append(doc.id)
            rows["source"].append(str(doc.metadata.get("source", "")))
            rows["path"].append(str(doc.metadata.get("path", "")))
            rows["chars"].append(len(doc.text))
            rows["files"].append(int(doc.metadata.get("input_files", 0)))
            self.stat_update("inputs")
            yield doc
        write_table(self.output_folder / f"{rank:05d}.parquet", pa.table(rows, schema=INPUTS_SCHEMA))


def read_parquet_folder(folder: Path, schema: pa.Schema) -> pa.Table:
    """All ``*.parquet`` files under ``folder`` (recursively) as one table; empty when none."""
    files = sorted(folder.rglob("*.parquet")) if folder.exists() else []
    if not files:
        return schema.empty_table()
    return pa.concat_tables([read_parquet(f, schema) for f in files])


class LedgerMismatch(RuntimeError):
    """The ledger does not account for every input exactly once."""


def merge_ledger(parts_folder: Path, inputs_folder: Path) -> pa.Table:
    """Join the ledger parts and check them against the input tally.

    Raises :class:`LedgerMismatch` when an input has no row, has several rows, or a row names a
    document that was never an input; also when two inputs share an id.
    """
    ledger = read_parquet_folder(parts_folder, LEDGER_SCHEMA).sort_by(
        [("source", "ascending"), ("id", "ascending")]
    )
    inputs = read_parquet_folder(inputs_folder, INPUTS_SCHEMA)
    input_ids = inputs.column("id").to_pylist()
    ledger_ids = ledger.column("id").to_pylist()
    problems: list[str] = []
    if len(set(input_ids)) != len(input_ids):
        seen: set[str] = set()
        repeated = sorted({i for i in input_ids if i in seen or seen.add(i)})
        problems.append(
            f"input ids are not unique: {plural(len(repeated), 'id')} repeated, e.g. {repeated[:3]}"
        )
    if len(set(ledger_ids)) != len(ledger_ids):
        seen = set()
        repeated = sorted({i for i in ledger_ids if i in seen or seen.add(i)})
        problems.append(
            f"{plural(len(repeated), 'document')} with more than one ledger row, e.g. {repeated[:3]}"
        )
    missing = sorted(set(input_ids) - set(ledger_ids))
    if missing:
        problems.append(f"{plural(len(missing), 'input')} without a ledger row, e.g. {missing[:3]}")
    unknown = sorted(set(ledger_ids) - set(input_ids))
    if unknown:
        problems.append(f"{plural(len(unknown), 'ledger row')} naming no input, e.g. {unknown[:3]}")
    if problems:
        raise LedgerMismatch("ledger does not add up: " + "; ".join(problems))
    return ledger


def check_file_counts(ledger: pa.Table, listed: dict[str, int]) -> None:
    """Raise :class:`LedgerMismatch` unless, for every folder source in ``listed`` (source name ->
    files found under its folder), the ledger's rows account for exactly that many files."""
    counted: dict[str, int] = {}
    for source, files in zip(ledger.column("source").to_pylist(), ledger.column("files").to_pylist()):
        counted[source] = counted.get(source, 0) + files
    wrong = [
        f"{s}: {plural(counted.get(s, 0), 'file')} in the ledger, {n} under its folder"
        for s, n in sorted(listed.items())
        if counted.get(s, 0) != n
    ]
    if wrong:
        raise LedgerMismatch("ledger does not account for every input file: " + "; ".join(wrong))
