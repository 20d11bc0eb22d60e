"""The one reader of curated documents: its listing is datatrove's, and it refuses misplaced files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datatrove.data import Document
from datatrove.io import get_datafolder

from longctx.core.errors import ConfigError
from longctx.pipeline.docstore import CuratedDocumentReader, DocumentWriter
from longctx.pipeline.documents import (
    DOCUMENTS_GLOB,
    FILE_TOKENIZER,
    document_files,
    file_tokenizer,
    iter_rows,
    iter_token_ids,
    source_of,
    token_counts,
)


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
    with pytest.raises(ConfigError, match=r"holds no \.parquet files"):
        document_files(docs)
    _write(docs, "books", 0, ["x"])
    (docs / "books" / "nested").mkdir()
    (docs / "books" / "nested" / "00000.parquet").write_bytes((docs / "books" / "00000.parquet").read_bytes())
    with pytest.raises(ConfigError, match="is not directly inside a source folder"):
        document_files(docs)


def test_token_ids_round_trip_as_numpy_views(tmp_path: Path) -> None:
    """Ids written from numpy arrays come back equal through every reader, as uint32 numpy arrays
    (not lists), null where a document had none; the file names the tokenizer only when told."""
    rng = np.random.default_rng(0)
    ids = [rng.integers(0, 2**32, size=n, dtype=np.uint32) for n in (0, 5, 70_000)] + [None]
    docs = tmp_path / "documents"
    for sha, folder in (("ab" * 32, "with"), (None, "without")):
        with DocumentWriter(docs / folder, tokenizer_sha256=sha) as writer:
            for i, a in enumerate(ids):
                meta = {"source": folder, "token_count": -1 if a is None else len(a)}
                if a is not None:
                    meta["token_ids"] = a
                writer.write(Document(text=f"t{i}", id=f"{folder}/{i}", metadata=meta), 0)
    with_file, without_file = docs / "with" / "00000.parquet", docs / "without" / "00000.parquet"
    assert file_tokenizer(with_file) == "ab" * 32 and file_tokenizer(without_file) is None

    def same(got: list) -> None:
        assert len(got) == len(ids)
        for g, a in zip(got, ids):
            assert (g is None) == (a is None)
            if a is not None:
                assert isinstance(g, np.ndarray) and g.dtype == np.uint32 and np.array_equal(g, a)

    same(list(iter_token_ids(with_file, batch_size=2)))
    same([row["token_ids"] for row in iter_rows(with_file, batch_size=3)])
    read = [d for d in CuratedDocumentReader(docs, batch_size=2).run() if d.metadata["source"] == "with"]
    same([d.metadata.get("token_ids") for d in read])
    assert all(d.metadata[FILE_TOKENIZER] == "ab" * 32 for d in read)
    assert all(
        FILE_TOKENIZER not in d.metadata
        for d in CuratedDocumentReader(docs).run()
        if d.metadata["source"] == "without"
    )
    # written again, the reader's file-level key does not leak into the row's JSON metadata
    with DocumentWriter(tmp_path / "again" / "with") as writer:
        for d in read:
            writer.write(d, 0)
    again = tmp_path / "again" / "with" / "00000.parquet"
    assert all("tokenizer_sha256" not in row["metadata"] for row in iter_rows(again))
    same(list(iter_token_ids(again)))


def test_token_ids_are_dictionary_encoded_without_statistics(tmp_path: Path) -> None:
    """The ids column is dictionary-encoded (a vocabulary is one dictionary page: each id in a few
    bits before compression) and, like the text, carries no min/max statistics; the small columns
    keep both. Read through the leaf column of the Parquet footer."""
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 128_256, size=300_000, dtype=np.uint32)  # a Llama 3 sized vocabulary
    with DocumentWriter(tmp_path / "books") as writer:
        writer.write(
            Document(
                text="t " * 1000,
                id="b/0",
                metadata={"source": "books", "token_count": len(ids), "token_ids": ids},
            ),
            0,
        )
    meta = pq.ParquetFile(tmp_path / "books" / "00000.parquet").metadata.row_group(0)
    columns = {meta.column(i).path_in_schema: meta.column(i) for i in range(meta.num_columns)}
    leaf = columns["token_ids.list.element"]
    assert "RLE_DICTIONARY" in leaf.encodings and leaf.has_dictionary_page and not leaf.is_stats_set
    assert not columns["text"].has_dictionary_page and not columns["text"].is_stats_set
    assert columns["id"].has_dictionary_page and columns["id"].is_stats_set
    assert np.array_equal(next(iter_token_ids(tmp_path / "books" / "00000.parquet")), ids)


def test_files_without_the_ids_column_read_as_none(tmp_path: Path) -> None:
    """Files written before ids were stored (no ``token_ids`` column) still read."""
    old = tmp_path / "documents" / "books" / "00000.parquet"
    old.parent.mkdir(parents=True)
    pq.write_table(
        pa.table(
            {
                "text": ["a", "b"],
                "id": ["1", "2"],
                "source": ["books"] * 2,
                "token_count": [1, 1],
                "metadata": ["{}"] * 2,
            }
        ),
        old,
    )
    assert list(iter_token_ids(old)) == [None, None] and file_tokenizer(old) is None
    assert [d.metadata.get("token_ids") for d in CuratedDocumentReader(tmp_path / "documents").run()] == [
        None,
        None,
    ]


def test_texts_stay_in_the_file_for_documents_with_ids_of_the_callers_tokenizer(tmp_path: Path) -> None:
    """With ``ids_of``, a document with (non-empty) ids of that tokenizer is read without its text:
    a StoredTextDocument whose text is read from the file when asked for. Documents, texts, ids and
    metadata are those datatrove's way of reading gives (reference: the reader without ``ids_of``),
    across row groups and batches that do not line up with them; documents with no ids or empty
    ids are read with their text (an empty text is skipped, as datatrove does)."""
    import copy
    import dataclasses

    from longctx.pipeline.docstore import StoredTextDocument

    sha, docs = "ab" * 32, tmp_path / "documents"
    kinds = ["ids"] * 120 + ["none", "empty", "empty text", "ids", "none"] + ["ids"] * 20
    with DocumentWriter(docs / "books", tokenizer_sha256=sha) as writer:  # 64 documents a row group
        for i, kind in enumerate(kinds):
            text = "" if kind == "empty text" else f"text {i} é " * (i % 7 + 1)
            meta = {"source": "books", "token_count": i, "k": [i]}
            if kind != "none":
                meta["token_ids"] = np.arange(0 if "empty" in kind else i % 5 + 1, dtype=np.uint32)
            writer.write(Document(text=text, id=f"d{i}", metadata=meta), 0)
    assert pq.ParquetFile(docs / "books" / "00000.parquet").num_row_groups == 3

    def view(d: Document) -> tuple:
        ids = d.metadata.get("token_ids")
        meta = {k: v for k, v in d.metadata.items() if k != "token_ids"}
        return d.id, d.text, meta, None if ids is None else ids.tolist()

    reference = list(CuratedDocumentReader(docs, batch_size=5).run())
    reader = CuratedDocumentReader(docs, batch_size=5, ids_of=sha)
    read = list(reader.run())
    assert len(read) == len(kinds) - 1  # the empty text is skipped
    deferred = [isinstance(d, StoredTextDocument) for d in read]
    assert deferred == [k == "ids" for k in kinds if k != "empty text"]
    assert not any(d.text_read for d in read if isinstance(d, StoredTextDocument))
    assert reader.stats["doc_len"].n == deferred.count(False)  # no length of a text not read
    assert [view(d) for d in read] == [view(d) for d in reference]
    assert all(d.text_read for d in read if isinstance(d, StoredTextDocument))

    other = list(CuratedDocumentReader(docs, batch_size=5, ids_of="cd" * 64).run())
    assert not any(isinstance(d, StoredTextDocument) for d in other)
    fresh = next(iter(CuratedDocumentReader(docs, ids_of=sha).run()))
    assert isinstance(fresh, StoredTextDocument)
    assert copy.deepcopy(fresh).text == dataclasses.replace(fresh, id="x").text == reference[0].text
