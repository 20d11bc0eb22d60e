"""The datatrove steps that write and read documents on disk, between and after stages.

Files hold the columns of :data:`~longctx.pipeline.documents.DOCUMENT_SCHEMA` (``text``, ``id``,
``source``, ``token_count``, the dependency scores, ``metadata`` as JSON, and ``token_ids``).
datatrove's own readers (``ParquetReader``) decode the JSON ``metadata`` column and merge the other
columns into ``Document.metadata``, so these files are ordinary datatrove input. Listing and reading
the curated documents without datatrove is :mod:`longctx.pipeline.documents`; these steps build on it.

Inside a pipeline a document's ids travel as ``metadata["token_ids"]``, a uint32 numpy array: the
writer stores them as one Arrow column built from the arrays (never as Python lists), and the readers
here hand them back as numpy views.
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from datatrove.data import Document
from datatrove.io import DataFolder
from datatrove.pipeline.readers import ParquetReader
from datatrove.pipeline.writers.parquet import ParquetWriter

from longctx.pipeline.documents import (
    DOCUMENT_SCHEMA,
    DOCUMENTS_GLOB,
    FILE_TOKENIZER,
    TOKENIZER_KEY,
    encode_metadata,
    token_id_views,
)

BATCH_CHARS = 1 << 24
"""Characters of text a writer buffers before writing a row group (as well as at most
:data:`ROWS_PER_GROUP` documents)."""
ROWS_PER_GROUP = 64
"""Documents a writer buffers before writing a row group."""

STAGE_SCHEMA = pa.schema(
    [pa.field("token_ids", pa.large_binary()) if f.name == "token_ids" else f for f in DOCUMENT_SCHEMA]
)
"""Columns of the files between two stages of one job: :data:`DOCUMENT_SCHEMA` with each document's ids
as the raw bytes of a little-endian uint32 array (one flat buffer: Parquet's nested lists cost about
20 bytes per token to write, a flat buffer almost nothing)."""


def token_ids_array(ids: list[np.ndarray | None], as_bytes: bool = False) -> pa.Array:
    """The ``token_ids`` column of a batch from per-document uint32 arrays (None: null), built from one
    buffer rather than element by element: ``large_list<uint32>``, or ``large_binary`` ``as_bytes``."""
    lengths = np.array([0 if a is None else len(a) for a in ids], dtype=np.int64)
    offsets = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    present = [np.asarray(a, dtype="<u4") for a in ids if a is not None]
    values = present[0] if len(present) == 1 else np.concatenate(present) if present else np.empty(0, "<u4")
    valid = pa.array([a is not None for a in ids], pa.bool_())
    if as_bytes:
        buffers = [valid.buffers()[1], pa.py_buffer(offsets * 4), pa.py_buffer(values)]
        return pa.LargeBinaryArray.from_buffers(
            pa.large_binary(), len(ids), buffers, null_count=len(ids) - len(present)
        )
    return pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values), mask=pc.invert(valid))


def stage_token_ids(column: pa.Array) -> list[np.ndarray | None]:
    """The ids of a :data:`STAGE_SCHEMA` ``token_ids`` column (one record batch) as uint32 numpy views
    of its buffer, None where null."""
    offsets = np.frombuffer(column.buffers()[1], np.int64)[column.offset : column.offset + len(column) + 1]
    data = column.buffers()[2]
    values = np.frombuffer(data, "<u4") if data is not None else np.empty(0, "<u4")
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    return [values[offsets[i] // 4 : offsets[i + 1] // 4] if valid[i] else None for i in range(len(column))]


def document_file_writer(
    sink: Any, schema: pa.Schema, compression: str | None, content_defined_chunking: Any
) -> pq.ParquetWriter:
    """The Parquet writer of one file of documents (:data:`DOCUMENT_SCHEMA` or :data:`STAGE_SCHEMA`),
    with the options every such file is written with."""
    # No dictionary and no statistics for the values that hold a whole document (the text, and ids as
    # bytes): both would copy it (a 50 MB text costs 300 MB more to write with them), and neither
    # helps a reader.
    whole = {"text", "token_ids"} if pa.types.is_large_binary(schema.field("token_ids").type) else {"text"}
    small = [name for name in schema.names if name not in whole]
    # Token ids as a list are dictionary-encoded too (Parquet names them by their leaf path): a
    # vocabulary fits one dictionary page, so each id takes ~log2(vocabulary) bits before compression
    # instead of 32; the column is ~30% smaller, faster to write and 2x faster to read back. Their
    # min/max statistics would tell a reader nothing.
    lists = {name for name in small if pa.types.is_large_list(schema.field(name).type)}
    return pq.ParquetWriter(
        sink,
        schema=schema,
        compression=compression,
        use_dictionary=[f"{name}.list.element" if name in lists else name for name in small],
        write_statistics=[name for name in small if name not in lists],
        use_content_defined_chunking=content_defined_chunking,
    )


class DocumentWriter(ParquetWriter):
    """Parquet writer for documents with the fixed :data:`DOCUMENT_SCHEMA`.

    ``output_filename`` may use ``${rank}`` and metadata tags such as ``${source}``. With
    ``tokenizer_sha256`` (the fingerprint of the tokenizer that made the documents' ``token_ids``),
    every file records it under :data:`TOKENIZER_KEY`. Row groups hold at most 64 documents and about
    :data:`BATCH_CHARS` characters, so the buffer stays bounded however large the documents are.
    """

    name = "📒 Documents"
    base_schema = DOCUMENT_SCHEMA
    ids_as_bytes = False

    def __init__(
        self,
        output_folder: str | os.PathLike,
        output_filename: str = "${rank}.parquet",
        tokenizer_sha256: str | None = None,
    ) -> None:
        schema = self.base_schema
        if tokenizer_sha256 is not None:
            schema = schema.with_metadata({TOKENIZER_KEY: tokenizer_sha256.encode("ascii")})
        super().__init__(
            str(output_folder),
            output_filename=output_filename,
            schema=schema,
            max_file_size=-1,
            batch_size=ROWS_PER_GROUP,
        )
        self._buffered_chars: Counter[str] = Counter()

    def _default_adapter(self, document: Document) -> dict:
        return {"text": document.text, "id": document.id, **encode_metadata(document.metadata)}

    def _write(self, document: dict, file_handler, filename: str) -> None:
        if filename not in self._writers:
            self._writers[filename] = document_file_writer(
                file_handler, self.schema, self.compression, self.use_content_defined_chunking
            )
        self._batches[filename].append(document)
        self._buffered_chars[filename] += len(document["text"])
        if len(self._batches[filename]) >= self.batch_size or self._buffered_chars[filename] >= BATCH_CHARS:
            self._write_batch(filename)

    def _write_batch(self, filename: str) -> None:
        self._buffered_chars.pop(filename, None)
        rows = self._batches.pop(filename, None)
        if not rows:
            return
        columns = [
            token_ids_array([row["token_ids"] for row in rows], self.ids_as_bytes)
            if field.name == "token_ids"
            else pa.array([row[field.name] for row in rows], field.type)
            for field in self.schema
        ]
        del rows
        self._writers[filename].write_batch(pa.record_batch(columns, schema=self.schema))


class StageDocumentWriter(DocumentWriter):
    """Writes documents between two stages of one job (:data:`STAGE_SCHEMA`, read back by
    :class:`~longctx.pipeline.write_stage.WriteCuratedDocuments`): ids as flat bytes, and no
    content-defined chunking (these files are never uploaded)."""

    name = "📒 Stage documents"
    base_schema = STAGE_SCHEMA
    ids_as_bytes = True

    def __init__(self, output_folder: str | os.PathLike, output_filename: str = "${rank}.parquet") -> None:
        super().__init__(output_folder, output_filename)
        self.use_content_defined_chunking = False
        self.compression = None


class GroupTexts:
    """The ``text`` column of one row group of a curated file, read from the file when first asked
    for and then kept (shared by the group's documents, see :class:`StoredTextDocument`)."""

    def __init__(self, folder: DataFolder, path: str, group: int) -> None:
        self.folder, self.path, self.group = folder, path, group
        self._column: pa.Array | None = None

    def column(self) -> pa.Array:
        if self._column is None:
            with self.folder.open(self.path, "rb") as f, pq.ParquetFile(f) as pqf:
                self._column = pqf.read_row_group(self.group, columns=["text"]).column(0).combine_chunks()
        return self._column


class StoredTextDocument(Document):
    """A curated document whose text is read from its file (:class:`GroupTexts`) only when ``text`` is
    first read, and then kept as any document's. Equality, ``dataclasses.replace`` and copies (pickling
    included) see the text, as with a :class:`~datatrove.data.Document`."""

    __slots__ = ("_row", "_text", "_texts")

    @classmethod
    def deferred(cls, document: Document, texts: GroupTexts, row: int) -> StoredTextDocument:
        """``document`` (its text a placeholder) with its text in row ``row`` of ``texts``."""
        stored = cls(text="", id=document.id, media=document.media, metadata=document.metadata)
        stored._text, stored._texts, stored._row = None, texts, row
        return stored

    @property
    def text(self) -> str:
        if self._text is None:
            self._text = self._texts.column()[self._row].as_py()
            self._texts = None
        return self._text

    @text.setter
    def text(self, value: str) -> None:
        self._text, self._texts = value, None

    @property
    def text_read(self) -> bool:
        """Whether the text has been read (or set)."""
        return self._text is not None


class CuratedDocumentReader(ParquetReader):
    """datatrove's Parquet reader over a curated documents folder (the files of
    :func:`~longctx.pipeline.documents.document_files`, shared among tasks file by file); a document's
    source is its file's folder.

    A document with stored ids gets ``metadata["token_ids"]`` (a uint32 numpy view, never a Python
    list), and ``metadata["tokenizer_sha256"]`` (:data:`FILE_TOKENIZER`) names the tokenizer its file records
    for them (absent when the file records none): compare it with your tokenizer's fingerprint before reusing
    the ids.

    ``ids_of`` (a tokenizer's fingerprint) is for a caller that uses the stored ids of that tokenizer
    instead of the text (``longctx pack``): in files that record it, a document with ids is a
    :class:`StoredTextDocument`, its text not read from the file unless asked for (reading and
    decoding the texts costs about as much as the rest of the file). Its ids being its text's tokens,
    a document with ids has a text (datatrove skips those with none); one with no ids, or empty ones,
    is read with its text. Every other document is read as datatrove reads it.
    """

    name = "📒 Curated documents"

    def __init__(
        self,
        documents: str | os.PathLike,
        batch_size: int = 1000,
        progress: bool = False,
        ids_of: str | None = None,
    ) -> None:
        super().__init__(
            str(documents),
            glob_pattern=DOCUMENTS_GLOB,
            batch_size=batch_size,
            file_progress=progress,
            doc_progress=progress,
        )
        self.ids_of = ids_of

    def read_file(self, filepath: str):
        """As datatrove's, with the ``token_ids`` column read as numpy views (and texts left in the
        file where ``ids_of`` says so)."""
        with self.data_folder.open(filepath, "rb") as f, pq.ParquetFile(f) as pqf:
            sha = (pqf.schema_arrow.metadata or {}).get(TOKENIZER_KEY)
            recorded = None if sha is None else sha.decode("ascii")
            li = 0
            if recorded is None or recorded != self.ids_of or "token_ids" not in pqf.schema_arrow.names:
                groups = [(None, pqf.iter_batches(batch_size=self.batch_size))]
            else:
                others = [name for name in pqf.schema_arrow.names if name != "text"]
                groups = [
                    (
                        GroupTexts(self.data_folder, filepath, g),
                        pqf.iter_batches(batch_size=self.batch_size, row_groups=[g], columns=others),
                    )
                    for g in range(pqf.num_row_groups)
                ]
            for texts, batches in groups:
                first = 0  # the batch's first row in its row group
                for batch in batches:
                    documents = []
                    with self.track_time("batch"):
                        ids = [None] * batch.num_rows
                        if "token_ids" in batch.schema.names:
                            ids = token_id_views(batch.column("token_ids"))
                            batch = batch.drop_columns(["token_ids"])
                        for row, (line, row_ids) in enumerate(zip(batch.to_pylist(), ids), first):
                            deferred = texts is not None and row_ids is not None and len(row_ids) > 0
                            if deferred:
                                line["text"] = "-"  # a placeholder that datatrove does not skip
                            elif texts is not None:
                                line["text"] = texts.column()[row].as_py()
                            document = self.get_document_from_dict(line, filepath, li)
                            if not document:
                                continue
                            if deferred:
                                document = StoredTextDocument.deferred(document, texts, row)
                            if row_ids is not None:
                                document.metadata["token_ids"] = row_ids
                            if recorded is not None:
                                document.metadata[FILE_TOKENIZER] = recorded
                            documents.append(document)
                            li += 1
                        first += batch.num_rows
                    yield from documents

    def update_doc_stats(self, document: Document) -> None:
        """As datatrove's, except that a :class:`StoredTextDocument` whose text was not read adds no
        ``doc_len`` (its length in characters, unknown without reading it), only ``doc_len_tokens``."""
        if not isinstance(document, StoredTextDocument) or document.text_read:
            super().update_doc_stats(document)
        elif token_count := document.metadata.get("token_count"):
            self.stat_update("doc_len_tokens", value=token_count, unit="doc")

    def get_document_from_dict(self, data: dict, source_file: str, id_in_file: int) -> Document | None:
        document = super().get_document_from_dict(data, source_file, id_in_file)
        if document is not None:
            document.metadata["source"] = source_file.split("/", 1)[0]
        return document
