"""The curated documents of a run, ``<output>/documents/<source>/*.parquet``, read with pyarrow.

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
import pyarrow.parquet as pq

from longctx.core.errors import ConfigError

DOCUMENTS_GLOB = "*/*.parquet"
"""The curated files of a documents folder: ``<source>/<file>.parquet``."""

DOCUMENT_SCHEMA = pa.schema(
    [
        ("text", pa.large_string()),
        ("id", pa.string()),
        ("source", pa.string()),
        ("token_count", pa.int64()),
        ("metadata", pa.string()),
    ]
)
"""Columns of a curated file; ``metadata`` is a JSON string, since metadata keys differ between sources."""

TOP_LEVEL_COLUMNS = ("source", "token_count")
"""Metadata fields stored as columns of their own, not inside the JSON ``metadata``."""


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
    """One column of a curated file."""
    return pq.read_table(file, columns=[column]).column(0)


def token_counts(file: Path) -> np.ndarray:
    """Token counts of a curated file's documents (``token_count``, top-level or inside a ``metadata``
    struct as other datatrove writers store it), -1 where unknown; the text is not read."""
    schema = pq.read_schema(file)
    metadata = schema.field("metadata").type if "metadata" in schema.names else None
    if "token_count" in schema.names:
        column = pq.read_table(file, columns=["token_count"]).column(0)
    elif (
        metadata is not None and pa.types.is_struct(metadata) and metadata.get_field_index("token_count") >= 0
    ):
        column = pq.read_table(file, columns=["metadata.token_count"]).column(0)
    else:
        return np.full(pq.ParquetFile(file).metadata.num_rows, -1, dtype=np.int64)
    return column.fill_null(-1).to_numpy().astype(np.int64)


def iter_rows(
    file: Path, columns: Sequence[str] | None = None, batch_size: int = 16
) -> Iterator[dict[str, Any]]:
    """The rows of a curated file as dicts, a few at a time (texts can be large)."""
    for batch in pq.ParquetFile(file).iter_batches(batch_size=batch_size, columns=columns):
        yield from batch.to_pylist()


def document_metadata(row: dict[str, Any]) -> dict[str, Any]:
    """A row's metadata: the decoded JSON ``metadata`` plus ``source`` and ``token_count``."""
    metadata = json.loads(row["metadata"]) if row.get("metadata") else {}
    metadata["source"] = row["source"]
    metadata["token_count"] = row["token_count"]
    return metadata


def encode_metadata(metadata: dict[str, Any]) -> dict[str, Any]:
    """The columns of a document's metadata: ``source``, ``token_count`` and the rest as JSON."""
    rest = {k: v for k, v in metadata.items() if k not in TOP_LEVEL_COLUMNS}
    return {
        "source": str(metadata.get("source", "")),
        "token_count": int(metadata.get("token_count", -1)),
        "metadata": json.dumps(rest, ensure_ascii=False, sort_keys=True),
    }
