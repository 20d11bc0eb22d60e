"""The datatrove steps that write and read documents on disk, between and after stages.

Files hold the columns of :data:`~longctx.pipeline.documents.DOCUMENT_SCHEMA` (``text``, ``id``,
``source``, ``token_count`` and ``metadata`` as JSON). datatrove's own readers (``ParquetReader``)
decode the JSON ``metadata`` column and merge the other columns into ``Document.metadata``, so these
files are ordinary datatrove input. Listing and reading the curated documents without datatrove is
:mod:`longctx.pipeline.documents`; these steps build on it.
"""

from __future__ import annotations

import os
from pathlib import Path

from datatrove.data import Document, DocumentsPipeline
from datatrove.pipeline.base import PipelineStep
from datatrove.pipeline.readers import ParquetReader
from datatrove.pipeline.writers.parquet import ParquetWriter

from longctx.pipeline.documents import (
    DOCUMENT_SCHEMA,
    DOCUMENTS_GLOB,
    document_metadata,
    encode_metadata,
    iter_rows,
)


class DocumentWriter(ParquetWriter):
    """Parquet writer for documents with the fixed :data:`DOCUMENT_SCHEMA`.

    ``output_filename`` may use ``${rank}`` and metadata tags such as ``${source}``.
    """

    name = "📒 Documents"

    def __init__(self, output_folder: str | os.PathLike, output_filename: str = "${rank}.parquet") -> None:
        super().__init__(
            str(output_folder),
            output_filename=output_filename,
            schema=DOCUMENT_SCHEMA,
            max_file_size=-1,
            batch_size=64,
        )

    def _default_adapter(self, document: Document) -> dict:
        return {"text": document.text, "id": document.id, **encode_metadata(document.metadata)}


def document_from_row(row: dict) -> Document:
    """Inverse of :class:`DocumentWriter`'s adapter."""
    return Document(text=row["text"], id=row["id"], metadata=document_metadata(row))


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
        for row in iter_rows(path):
            self.stat_update("documents")
            yield document_from_row(row)


class CuratedDocumentReader(ParquetReader):
    """datatrove's Parquet reader over a curated documents folder (the files of
    :func:`~longctx.pipeline.documents.document_files`, shared among tasks file by file); a document's
    source is its file's folder."""

    name = "📒 Curated documents"

    def __init__(self, documents: str | os.PathLike, batch_size: int = 1000, progress: bool = False) -> None:
        super().__init__(
            str(documents),
            glob_pattern=DOCUMENTS_GLOB,
            batch_size=batch_size,
            file_progress=progress,
            doc_progress=progress,
        )

    def get_document_from_dict(self, data: dict, source_file: str, id_in_file: int) -> Document | None:
        document = super().get_document_from_dict(data, source_file, id_in_file)
        if document is not None:
            document.metadata["source"] = source_file.split("/", 1)[0]
        return document
