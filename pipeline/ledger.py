"""The ledger: one row per input document saying what became of it.

Every place that removes a document writes its ledger rows through a :class:`LedgerWriter`
(datatrove's exclusion-writer hook), and the last stage writes a row for every kept document.
:func:`merge_ledger` joins the parts and proves that every input has exactly one row.
"""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from datatrove.data import Document, DocumentsPipeline
from datatrove.pipeline.base import PipelineStep
from datatrove.pipeline.writers.parquet import ParquetWriter

from longctx.core.atomic import write_table

LEDGER_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("source", pa.string()),
        ("path", pa.string()),
        ("outcome", pa.string()),  # kept | filtered | duplicate
        ("reason", pa.string()),  # why filtered or which kind of duplicate; "" when kept
        ("duplicate_of", pa.string()),  # id of the kept document this one duplicates; "" otherwise
        ("tokens", pa.int64()),  # -1 when never counted (unreadable inputs)
        ("chars", pa.int64()),
    ]
)
OUTCOMES = ("kept", "filtered", "duplicate")
INPUTS_SCHEMA = pa.schema([("id", pa.string()), ("source", pa.string())])


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
        reason = "" if self.outcome == "kept" else str(meta.get("filter_reason", ""))
        return {
            "id": document.id,
            "source": str(meta.get("source", "")),
            "path": str(meta.get("path", "")),
            "outcome": self.outcome,
            "reason": reason,
            "duplicate_of": str(meta.get("duplicate_of", "")),
            "tokens": int(meta.get("token_count", -1)),
            "chars": 0 if meta.get("skip_reason") else len(document.text),
        }


class InputTally(PipelineStep):
    """Records the id and source of every document the readers produced, before any filter,
    so that the ledger can be checked against the inputs."""

    type = "🧾 - LEDGER"
    name = "🧮 Input tally"

    def __init__(self, output_folder: str | os.PathLike) -> None:
        super().__init__()
        self.output_folder = Path(output_folder)

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        ids: list[str] = []
        sources: list[str] = []
        for doc in data:
            ids.append(doc.id)
            sources.append(str(doc.metadata.get("source", "")))
            self.stat_update("inputs")
            yield doc
        write_table(
            self.output_folder / f"{rank:05d}.parquet", pa.table({"id": ids, "source": sources}, schema=INPUTS_SCHEMA)
        )


def read_parquet_folder(folder: Path, schema: pa.Schema) -> pa.Table:
    """All ``*.parquet`` files under ``folder`` (recursively) as one table; empty when none."""
    files = sorted(folder.rglob("*.parquet")) if folder.exists() else []
    if not files:
        return schema.empty_table()
    return pa.concat_tables([pq.read_table(f, schema=schema) for f in files])


class LedgerMismatch(RuntimeError):
    """The ledger does not account for every input exactly once."""


def merge_ledger(parts_folder: Path, inputs_folder: Path) -> pa.Table:
    """Join the ledger parts and check them against the input tally.

    Raises :class:`LedgerMismatch` when an input has no row, has several rows, or a row names a
    document that was never an input; also when two inputs share an id.
    """
    ledger = read_parquet_folder(parts_folder, LEDGER_SCHEMA).sort_by([("source", "ascending"), ("id", "ascending")])
    inputs = read_parquet_folder(inputs_folder, INPUTS_SCHEMA)
    input_ids = inputs.column("id").to_pylist()
    ledger_ids = ledger.column("id").to_pylist()
    problems: list[str] = []
    if len(set(input_ids)) != len(input_ids):
        seen: set[str] = set()
        repeated = sorted({i for i in input_ids if i in seen or seen.add(i)})
        problems.append(f"{len(repeated)} input ids are not unique, e.g. {repeated[:3]}")
    if len(set(ledger_ids)) != len(ledger_ids):
        seen = set()
        repeated = sorted({i for i in ledger_ids if i in seen or seen.add(i)})
        problems.append(f"{len(repeated)} documents have more than one ledger row, e.g. {repeated[:3]}")
    missing = sorted(set(input_ids) - set(ledger_ids))
    if missing:
        problems.append(f"{len(missing)} inputs have no ledger row, e.g. {missing[:3]}")
    unknown = sorted(set(ledger_ids) - set(input_ids))
    if unknown:
        problems.append(f"{len(unknown)} ledger rows name no input, e.g. {unknown[:3]}")
    if problems:
        raise LedgerMismatch("ledger does not add up: " + "; ".join(problems))
    return ledger
