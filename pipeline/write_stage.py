"""Curation's ``write`` stage: the documents of one task that are not duplicates, as curated files, and
the ledger rows of all of them.

The ``read`` stage stored each task's documents (text, ids, metadata) in a stage file
(:class:`~longctx.pipeline.docstore.StageDocumentWriter`); the resolver then decided which are
duplicates, by id. This step copies the rest from the stage file's Arrow columns straight into one
curated file per source, never making Python strings, dicts or documents of their text and ids (which
cost more than the Parquet encoding itself); only each document's small metadata is decoded, for its
ledger row. The files are those :class:`~longctx.pipeline.docstore.DocumentWriter` writes: the same
columns, options and row groups (at most 64 documents and about
:data:`~longctx.pipeline.docstore.BATCH_CHARS` characters each), byte for byte.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from datatrove.data import DocumentsPipeline
from datatrove.pipeline.base import PipelineStep
from datatrove.pipeline.writers.parquet import DEFAULT_CDC_OPTIONS

from longctx.core.atomic import atomic_path, write_table
from longctx.pipeline.dedup import read_decisions
from longctx.pipeline.dependency import read_scores
from longctx.pipeline.docstore import (
    BATCH_CHARS,
    ROWS_PER_GROUP,
    document_file_writer,
    stage_token_ids,
    token_ids_array,
)
from longctx.pipeline.documents import DOCUMENT_SCHEMA, SCORE_COLUMNS, TOKENIZER_KEY
from longctx.pipeline.ledger import LEDGER_SCHEMA, ledger_row


class _SourceFile:
    """One curated file being written: rows buffered as slices of the stage file's batches (and
    their dependency scores), written as a row group once they reach :data:`ROWS_PER_GROUP` documents
    or :data:`BATCH_CHARS` characters."""

    def __init__(self, writer: pq.ParquetWriter, schema: pa.Schema) -> None:
        self.writer, self.schema = writer, schema
        self.rows: list[pa.RecordBatch] = []
        self.scores: list[tuple[float | None, ...]] = []
        self.chars = 0

    def add(self, row: pa.RecordBatch, chars: int, scores: tuple[float | None, ...]) -> None:
        """Buffer ``row`` with its ``scores`` (one per :data:`SCORE_COLUMNS`)."""
        self.rows.append(row)
        self.scores.append(scores)
        self.chars += chars
        if len(self.rows) >= ROWS_PER_GROUP or self.chars >= BATCH_CHARS:
            self.flush()

    def flush(self) -> None:
        if not self.rows:
            return
        group = pa.Table.from_batches(self.rows).combine_chunks()
        scores = dict(zip(SCORE_COLUMNS, zip(*self.scores)))
        self.rows, self.scores, self.chars = [], [], 0
        columns = [
            token_ids_array(stage_token_ids(group.column(name).chunk(0)))
            if name == "token_ids"
            else pa.array(scores[name], pa.float64())
            if name in scores
            else group.column(name).chunk(0)
            for name in self.schema.names
        ]
        self.writer.write_batch(pa.record_batch(columns, schema=self.schema))


class WriteCuratedDocuments(PipelineStep):
    """Task ``rank`` of the ``write`` stage: the documents of ``<stage_folder>/<rank>.parquet`` that
    the resolver's ``decisions_file`` does not name, into ``<documents>/<source>/<rank>.parquet``
    (each written under a temporary name, then renamed); a ``kept`` ledger row for each of them and a
    ``duplicate`` row (with the kind of duplicate and ``duplicate_of``) for each of the others, into
    ``<ledger_folder>/kept`` and ``<ledger_folder>/duplicate``.

    With a ``scores_file`` (:class:`~longctx.pipeline.dependency.DependencySelection`'s), every
    document's dependency scores come from it, into the curated file's columns and every ledger row,
    and a document it gives a reason is not written but gets a ``filtered`` row with that reason
    (``<ledger_folder>/dependency``); a duplicate stays a duplicate, whatever its scores."""

    type = "💽 - WRITER"
    name = "📒 Curated documents"

    def __init__(
        self,
        stage_folder: str | os.PathLike,
        decisions_file: str | os.PathLike,
        documents: str | os.PathLike,
        ledger_folder: str | os.PathLike,
        tokenizer_sha256: str,
        scores_file: str | os.PathLike | None = None,
    ) -> None:
        super().__init__()
        self.stage_folder = Path(stage_folder)
        self.decisions_file = Path(decisions_file)
        self.documents = Path(documents)
        self.ledger_folder = Path(ledger_folder)
        self.scores_file = Path(scores_file) if scores_file is not None else None
        self.schema = DOCUMENT_SCHEMA.with_metadata({TOKENIZER_KEY: tokenizer_sha256.encode("ascii")})

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        if data:
            yield from data
        decisions = read_decisions(self.decisions_file)
        scores = read_scores(self.scores_file) if self.scores_file is not None else None
        rows: dict[str, list[dict]] = {"kept": [], "duplicate": [], "dependency": []}
        path = self.stage_folder / f"{rank:05d}.parquet"
        with contextlib.ExitStack() as files:
            outputs: dict[str, _SourceFile] = {}

            def output(source: str) -> _SourceFile:
                if source not in outputs:
                    tmp = files.enter_context(atomic_path(self.documents / source / f"{rank:05d}.parquet"))
                    writer = files.enter_context(
                        document_file_writer(str(tmp), self.schema, "snappy", DEFAULT_CDC_OPTIONS)
                    )
                    outputs[source] = _SourceFile(writer, self.schema)
                return outputs[source]

            batches = pq.ParquetFile(path).iter_batches(batch_size=16) if path.exists() else ()
            for batch in batches:
                chars = pc.utf8_length(batch.column("text")).to_pylist()
                columns = {
                    name: batch.column(name).to_pylist()
                    for name in ("id", "source", "token_count", *SCORE_COLUMNS)
                }
                for i, meta_json in enumerate(batch.column("metadata").to_pylist()):
                    doc_id, source = columns["id"][i], columns["source"][i]
                    meta = json.loads(meta_json) if meta_json else {}
                    meta["source"], meta["token_count"] = source, columns["token_count"][i]
                    if scores is None:
                        doc_scores, reason = tuple(columns[k][i] for k in SCORE_COLUMNS), ""
                    else:
                        *found, reason = scores.get(doc_id, (None, None, ""))
                        doc_scores = tuple(found)
                    meta.update(zip(SCORE_COLUMNS, doc_scores))
                    decision = decisions.get(doc_id)
                    if decision is None and reason:
                        meta["filter_reason"] = reason
                        rows["dependency"].append(ledger_row(doc_id, meta, "filtered", chars[i]))
                        self.stat_update("filtered", f"dropped_{reason}")
                    elif decision is None:
                        output(source).add(batch.slice(i, 1), chars[i], doc_scores)
                        rows["kept"].append(ledger_row(doc_id, meta, "kept", chars[i]))
                        self.stat_update("kept")
                    else:
                        meta["duplicate_of"], meta["filter_reason"] = decision
                        rows["duplicate"].append(ledger_row(doc_id, meta, "duplicate", chars[i]))
                        self.stat_update("duplicate", f"dropped_{decision[1]}")
            for source_file in outputs.values():
                source_file.flush()
        for folder, part in rows.items():
            if part:
                table = pa.Table.from_pylist(part, schema=LEDGER_SCHEMA)
                write_table(self.ledger_folder / folder / f"{rank:05d}.parquet", table)
