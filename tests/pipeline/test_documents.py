"""The one reader of curated documents: its listing is datatrove's, and it refuses misplaced files."""

from __future__ import annotations

from pathlib import Path

import pytest
from datatrove.data import Document
from datatrove.io import get_datafolder

from longctx.core.errors import ConfigError
from longctx.pipeline.docstore import CuratedDocumentReader, DocumentWriter
from longctx.pipeline.documents import DOCUMENTS_GLOB, document_files, iter_rows, source_of, token_counts


def _write(folder: Path, source: str, rank: int, texts: list[str]) -> None:
    with DocumentWriter(folder / source) as writer:
        for i, text in enumerate(texts):
            doc = Document(
                text=text, id=f"{source}/{rank}/{i}", metadata={"source": source, "token_count": i, "k": [i]}
            )
            writer.write(doc, rank)


def test_listing_and_rows_agree_with_datatrove(tmp_path: Path) -> None:
    docs = tmp_path / "documents"
    for source in ("books", "a-b", "a"):  # "a-b" sorts before "a/" as a string, after "a" as a path
        for rank in range(3):
            _write(docs, source, rank, [f"{source} text {rank} {i}" for i in range(rank + 1)])
    files = document_files(docs)
    assert [f.relative_to(docs).as_posix() for f in files] == get_datafolder(str(docs)).list_files(
        glob_pattern=DOCUMENTS_GLOB
    )
    assert {source_of(docs, f) for f in files} == {"books", "a-b", "a"}
    for world_size in (1, 2, 4):  # a task's share of the reader step is its share of the listing
        for rank in range(world_size):
            read = list(CuratedDocumentReader(docs).run(rank=rank, world_size=world_size))
            expected = [
                (row["id"], row["text"], source_of(docs, f))
                for f in files[rank::world_size]
                for row in iter_rows(f, ["id", "text"])
            ]
            assert [(d.id, d.text, d.metadata["source"]) for d in read] == expected
    first = next(iter(CuratedDocumentReader(docs).run()))
    assert first.metadata["k"] == [0] and first.metadata["token_count"] == 0
    assert token_counts(files[0]).tolist() == list(range(len(list(iter_rows(files[0])))))


def test_missing_empty_and_misplaced_files_are_refused(tmp_path: Path) -> None:
    docs = tmp_path / "documents"
    with pytest.raises(ConfigError, match="no curated documents"):
        document_files(docs)
    docs.mkdir()
    with pytest.raises(ConfigError, match="holds no .parquet files"):
        document_files(docs)
    _write(docs, "books", 0, ["x"])
    (docs / "books" / "nested").mkdir()
    (docs / "books" / "nested" / "00000.parquet").write_bytes((docs / "books" / "00000.parquet").read_bytes())
    with pytest.raises(ConfigError, match="is not directly inside a source folder"):
        document_files(docs)
