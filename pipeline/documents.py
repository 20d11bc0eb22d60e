"""The curated documents of a run, ``<output>/documents/<source>/*.parquet``, read with pyarrow.

Besides the text, a curated document stores its token ids (``token_ids``, uint32, the cleaned text
encoded without special tokens by the run's tokenizer; null when absent) and every curated file
names that tokenizer in its key-value metadata (:data:`TOKENIZER_KEY`, the sha256 of its
``tokenizer.json``), so that ``pack`` can reuse the ids instead of tokenizing again
(:func:`file_tokenizer`, :func:`iter_token_ids`). Its long-range dependency scores are columns too
(``dependency``, ``dependency_model``: :mod:`longctx.pipeline.dependency`), null where it has none.

Curation writes one folder per source; the folder names the source. Every reader of curated
documents lists them here, with one glob, and reads their columns here: the packer's catalog and
reader step, the synthetic-task stage and the trainer's evaluation. This module imports no datatrove
(the trainer reads haystack text with it); the datatrove steps that write and read documents inside
a pipeline (``longctx.pipeline.docstore``) build on it.

Files are listed in the order of their path relative to the documents folder (as strings), the order
datatrove's readers list and shard them in.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from longctx.core.errors import ConfigError
from longctx.pipeline.parquet import read_parquet

DOCUMENTS_GLOB = "*/*.parquet"
"""The curated files of a documents folder: ``<source>/<file>.parquet``."""

DOCUMENT_SCHEMA = pa.schema(
    [
        ("text", pa.large_string()),
        ("id", pa.string()),
        ("source", pa.string()),
        ("token_count", pa.int64()),
        ("dependency", pa.float64()),
        ("dependency_model", pa.float64()),
        ("metadata", pa.string()),
        ("token_ids", pa.large_list(pa.uint32())),
    ]
)
"""Columns of a curated file; ``metadata`` is a JSON string, since metadata keys differ between sources.
``dependency`` and ``dependency_model`` are the document's long-range dependency scores, model-free and
from a language model (:mod:`longctx.pipeline.dependency`; null where not scored)."""

SCORE_COLUMNS = ("dependency", "dependency_model")
"""Metadata fields of the dependency scores, stored as columns (floats, null when absent)."""
TOP_LEVEL_COLUMNS = ("source", "token_count", *SCORE_COLUMNS, "token_ids")
"""Metadata fields stored as columns of their own, not inside the JSON ``metadata``."""

TOKENIZER_KEY = b"longctx.tokenizer_sha256"
"""File-level metadata key: sha256 of the ``tokenizer.json`` that made the file's ``token_ids``."""

FILE_TOKENIZER = "tokenizer_sha256"
"""Document metadata that readers add from the file's :data:`TOKENIZER_KEY`; never stored per row."""


def document_files(documents: Path) -> list[Path]:
    """Every curated Parquet file, in datatrove's order; a :class:`ConfigError` when there are none or
    when one lies anywhere but directly inside a source folder (it would be left out unnoticed)."""
    if not documents.is_dir():
        raise ConfigError(f"no curated documents at {documents}; run `longctx curate` first")
    stray = sorted(f for f in documents.rglob("*.parquet") if len(f.relative_to(documents).parts) != 2)
    if stray:
        where = "inside" if stray[0].parent == documents else "directly inside"
        raise ConfigError(
            f"{stray[0]} is not {where} a source folder (expected {documents}/<source>/*.parquet)"
        )
    files = sorted(documents.glob(DOCUMENTS_GLOB), key=lambda f: f.relative_to(documents).as_posix())
    if not files:
        raise ConfigError(f"{documents} holds no .parquet files; run `longctx curate` first")
    return files


def source_of(documents: Path, file: Path) -> str:
    """The source a curated file belongs to: its folder under ``documents``."""
    return file.relative_to(documents).parts[0]


def read_column(file: Path, column: str) -> pa.ChunkedArray:
    """One column of a curated file (:func:`~longctx.pipeline.parquet.read_parquet`: no pandas import)."""
    return read_parquet(file, columns=[column]).column(0)


def token_counts(file: Path) -> np.ndarray:
    """Token counts of a curated file's documents (``token_count``, top-level or inside a ``metadata``
    struct as other datatrove writers store it), -1 where unknown; the text is not read."""
    schema = pq.read_schema(file)
    metadata = schema.field("metadata").type if "metadata" in schema.names else None
    if "token_count" in schema.names:
        column = read_column(file, "token_count")
    elif (
        metadata is not None and pa.types.is_struct(metadata) and metadata.get_field_index("token_count") >= 0
    ):
        column = pc.struct_field(read_column(file, "metadata.token_count"), "token_count")
    else:
        return np.full(pq.ParquetFile(file).metadata.num_rows, -1, dtype=np.int64)
    # np.from_dlpack rather than fill_null/to_numpy, for which pyarrow imports pandas (0.3-0.5 s)
    column = column.combine_chunks()
    counts = np.full(len(column), -1, dtype=np.int64)
    counts[np.from_dlpack(pc.indices_nonzero(column.is_valid()))] = np.from_dlpack(column.drop_null())
    return counts


def file_tokenizer(file: Path) -> str | None:
    """The sha256 of the tokenizer that made a curated file's ``token_ids`` (None when the file
    records none: written before ids were stored, by another tool, or without ids)."""
    metadata = pq.read_schema(file).metadata or {}
    value = metadata.get(TOKENIZER_KEY)
    return value.decode("ascii") if value is not None else None


def token_id_views(column: pa.Array) -> list[np.ndarray | None]:
    """Each row's ids of a ``token_ids`` column (one record batch) as uint32 numpy views of its
    buffer (no Python lists), None where null."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    # np.from_dlpack (read-only views) rather than to_numpy, for which pyarrow imports pandas
    offsets = np.from_dlpack(column.offsets)
    values = np.from_dlpack(column.values)
    valid = np.ones(len(column), dtype=bool)
    if column.null_count:
        valid[:] = False
        valid[np.from_dlpack(pc.indices_nonzero(column.is_valid()))] = True
    return [values[offsets[i] : offsets[i + 1]] if valid[i] else None for i in range(len(column))]


def iter_token_ids(file: Path, batch_size: int = 16) -> Iterator[np.ndarray | None]:
    """A curated file's ``token_ids``, row by row, as numpy views (None where null or when the file
    has no such column); pair them with :func:`file_tokenizer` before trusting them."""
    if "token_ids" not in pq.read_schema(file).names:
        yield from (None for _ in range(pq.ParquetFile(file).metadata.num_rows))
        return
    for batch in pq.ParquetFile(file).iter_batches(batch_size=batch_size, columns=["token_ids"]):
        yield from token_id_views(batch.column(0))


def iter_rows(
    file: Path, columns: Sequence[str] | None = None, batch_size: int = 16
) -> Iterator[dict[str, Any]]:
    """The rows of a curated file as dicts, a few at a time (texts can be large); ``token_ids``
    come as numpy views (see :func:`token_id_views`), not as lists."""
    for batch in pq.ParquetFile(file).iter_batches(batch_size=batch_size, columns=columns):
        if "token_ids" not in batch.schema.names:
            yield from batch.to_pylist()
            continue
        ids = token_id_views(batch.column("token_ids"))
        rows = batch.drop_columns(["token_ids"]).to_pylist()
        for row, row_ids in zip(rows, ids):
            row["token_ids"] = row_ids
            yield row


def document_metadata(row: dict[str, Any]) -> dict[str, Any]:
    """A row's metadata: the decoded JSON ``metadata`` plus ``source``, ``token_count`` and, when
    the row has them, the dependency scores and ``token_ids``."""
    metadata = json.loads(row["metadata"]) if row.get("metadata") else {}
    metadata["source"] = row["source"]
    metadata["token_count"] = row["token_count"]
    for key in (*SCORE_COLUMNS, "token_ids"):
        if row.get(key) is not None:
            metadata[key] = row[key]
    return metadata


def encode_metadata(metadata: dict[str, Any]) -> dict[str, Any]:
    """The columns of a document's metadata: ``source``, ``token_count``, the dependency scores and
    ``token_ids`` (None when absent) and the rest as JSON."""
    rest = {k: v for k, v in metadata.items() if k not in TOP_LEVEL_COLUMNS and k != FILE_TOKENIZER}
    scores = {key: None if metadata.get(key) is None else float(metadata[key]) for key in SCORE_COLUMNS}
    return {
        "source": str(metadata.get("source", "")),
        "token_count": int(metadata.get("token_count", -1)),
        **scores,
        "metadata": json.dumps(rest, ensure_ascii=False, sort_keys=True),
        "token_ids": metadata.get("token_ids"),
    }
