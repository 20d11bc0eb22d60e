"""What the curated documents hold, read from their Parquet columns without the text.

Curated documents live in ``<output>/documents/<source>/*.parquet`` (listed and read with
:mod:`longctx.pipeline.documents`); the folder names the source. Token counts come from curation,
so mixing and the coverage check are planned before any task tokenizes. Counts exclude special tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from longctx.pipeline.documents import document_files, file_tokenizer, read_column, source_of, token_counts


@dataclass(frozen=True)
class SourceCatalog:
    """Documents of one source: ids and token counts (-1 where unknown)."""

    name: str
    ids: list[str]
    token_counts: np.ndarray

    @property
    def counts_known(self) -> bool:
        return bool(len(self.token_counts)) and bool((self.token_counts >= 0).all())


def read_catalog(documents: Path, tokenizer_sha256: str | None = None) -> dict[str, SourceCatalog]:
    """Ids and token counts of every curated document, by source. Counts of a file that records
    another tokenizer than ``tokenizer_sha256`` (the run's tokenizer was replaced after curation) are
    unknown: they count another tokenizer's tokens."""
    ids: dict[str, list[str]] = {}
    counts: dict[str, list[np.ndarray]] = {}
    for file in document_files(documents):
        source = source_of(documents, file)
        ids.setdefault(source, []).extend(read_column(file, "id").to_pylist())
        found = token_counts(file)
        if tokenizer_sha256 is not None and file_tokenizer(file) not in (None, tokenizer_sha256):
            found = np.full(len(found), -1, dtype=np.int64)
        counts.setdefault(source, []).append(found)
    return {name: SourceCatalog(name, ids[name], np.concatenate(counts[name])) for name in sorted(ids)}


def text_size(file: Path) -> int:
    """Uncompressed bytes of a curated file's ``text`` column, from the Parquet footer (no text read)."""
    meta = pq.ParquetFile(file).metadata
    return sum(
        column.total_uncompressed_size
        for g in range(meta.num_row_groups)
        for column in (meta.row_group(g).column(c) for c in range(meta.num_columns))
        if column.path_in_schema == "text"
    )
