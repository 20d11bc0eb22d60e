"""What the curated documents hold, read from their Parquet columns without the text.

Curated documents live in ``<output>/documents/<source>/*.parquet``; the folder names the source.
Token counts come from curation (``token_count``, top-level or inside a ``metadata`` struct), so
mixing and the coverage check are planned before any task tokenizes. Counts exclude special tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.config import ConfigError


@dataclass(frozen=True)
class SourceCatalog:
    """Documents of one source: ids and token counts (-1 where unknown)."""

    name: str
    ids: list[str]
    token_counts: np.ndarray

    @property
    def counts_known(self) -> bool:
        return bool(len(self.token_counts)) and bool((self.token_counts >= 0).all())


def document_files(documents: Path) -> list[Path]:
    """Every curated Parquet file, sorted; a :class:`ConfigError` for files outside a source folder."""
    if not documents.is_dir():
        raise ConfigError(f"no curated documents at {documents}; run `longctx curate` first")
    files = sorted(documents.rglob("*.parquet"))
    if not files:
        raise ConfigError(f"{documents} holds no .parquet files; run `longctx curate` first")
    stray = [f for f in files if f.parent == documents]
    if stray:
        raise ConfigError(
            f"{stray[0]} is not inside a source folder (expected {documents}/<source>/*.parquet)"
        )
    return files


def source_of(documents: Path, file: Path) -> str:
    """The source a curated file belongs to: its top folder under ``documents``."""
    return file.relative_to(documents).parts[0]


def _token_counts(file: Path) -> np.ndarray:
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


def read_catalog(documents: Path) -> dict[str, SourceCatalog]:
    """Ids and token counts of every curated document, by source."""
    ids: dict[str, list[str]] = {}
    counts: dict[str, list[np.ndarray]] = {}
    for file in document_files(documents):
        source = source_of(documents, file)
        ids.setdefault(source, []).extend(pq.read_table(file, columns=["id"]).column(0).to_pylist())
        counts.setdefault(source, []).append(_token_counts(file))
    return {name: SourceCatalog(name, ids[name], np.concatenate(counts[name])) for name in sorted(ids)}
