"""Documents on disk between and after stages: Parquet with ``text``, ``id``, ``source``,
``token_count`` and ``metadata`` (a JSON string, since metadata keys differ between sources).

datatrove's own readers (``ParquetReader``) decode the JSON ``metadata`` column and merge the
other columns into ``Document.metadata``, so these files are ordinary datatrove input.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from datatrove.data import Document, DocumentsPipeline
from datatrove.pipeline.base import PipelineStep
from datatrove.pipeline.writers.parquet import ParquetWriter

DOCUMENT_SCHEMA = pa.schema(
    [
        ("text", pa.large_string()),
        ("id", pa.string()),
        ("source", pa.string()),
        ("token_count", pa.int64()),
        ("metadata", pa.string()),
    ]
)
_COLUMNS = ("source", "token_count")


class DocumentWriter(ParquetWriter):
    """Parquet writer for curated documents with the fixed :data:`DOCUMENT_SCHEMA`.

    ``output_filename`` may use ``${rank}`` and metadata tags such as ``${source}``.
    """

    name = "📒 Documents"

    def __init__(self, output_folder: str | os.PathLike, output_filename: str = "${rank}.parquet") -> None:
        super().__init__(
            str(output_folder), output_filename=output_filename, schema=DOCUMENT_SCHEMA, max_file_size=-1, batch_size=64
        )

    def _default_adapter(self, document: Document) -> dict:
        meta = {k: v for k, v in document.metadata.items() if k not in _COLUMNS}
        return {
            "text": document.text,
            "id": document.id,
            "source": str(document.metadata.get("source", "")),
            "token_count": int(document.metadata.get("token_count", -1)),
            "metadata": json.dumps(meta, ensure_ascii=False, sort_keys=True),
        }


def document_from_row(row: dict) -> Document:
    """Inverse of :class:`DocumentWriter`'s adapter."""
    metadata = json.loads(row["metadata"]) if row.get("metadata") else {}
    metadata["source"] = row["source"]
    metadata["token_count"] = row["token_count"]
    return Document(text=row["text"], id=row["id"], metadata=metadata)


class RankDocumentReader(PipelineStep):
    """Reads back the file that the same rank wrote in an earlier stage (``{rank:05d}.parquet``).

    Reading by rank, not by listing, keeps positions aligned with per-rank side files (MinHash
    signatures, dedup index) even when some ranks wrote no documents at all.
    """

    type = "📖 - READER"
    name = "📒 Rank documents"

    def __init__(self, folder: str | os.PathLike) -> None:
        super().__init__()
        self.folder = Path(folder)

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        if data:
            yield from data
        path = self.folder / f"{rank:05d}.parquet"
        if not path.exists():
            return
        for batch in pq.ParquetFile(path).iter_batches(batch_size=16):
            for row in batch.to_pylist():
                self.stat_update("documents")
                yield document_from_row(row)
