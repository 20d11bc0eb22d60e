"""Curation's write stage, on Arrow columns, against datatrove's own writers fed the same documents: the
curated files byte for byte (row groups included), and the ledger rows of the kept and the duplicates."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datatrove.data import Document

from longctx.pipeline import docstore, write_stage
from longctx.pipeline.dedup import DECISIONS_SCHEMA
from longctx.pipeline.dependency import SCORES_SCHEMA
from longctx.pipeline.docstore import DocumentWriter, StageDocumentWriter
from longctx.pipeline.ledger import LEDGER_SCHEMA, LedgerWriter
from longctx.pipeline.write_stage import WriteCuratedDocuments

SHA = "cd" * 32


def _documents(count: int, seed: int = 0) -> list[Document]:
    """Documents of two sources, with ids, non-ASCII text and the metadata the readers leave."""
    rng = random.Random(seed)
    docs = []
    for i in range(count):
        source = "books" if rng.random() < 0.6 else "code"
        text = " ".join(
            rng.choice(["naïve", "Größe", "的", "word", "x_1", "\n"]) for _ in range(rng.randint(1, 400))
        )
        meta = {
            "source": source,
            "path": f"{source}/{i}.txt",
            "input_files": 1 + i % 3,
            "token_count": len(text) // 3,
            "token_ids": np.arange(i % 50, dtype=np.uint32) * 7,
        }
        if i % 5 == 0:
            meta["duplicate_files"] = [{"path": "a.py", "duplicate_of": f"repo{i}"}]
        if i % 7 == 0:
            meta["gutenberg_unsafe"] = "footer"
        docs.append(Document(text=text, id=f"doc{i:04d}", metadata=meta))
    return docs


def _copy(doc: Document) -> Document:
    return Document(text=doc.text, id=doc.id, metadata=dict(doc.metadata))


@pytest.mark.parametrize("batch_chars", [1 << 24, 5_000])
def test_write_stage_equals_datatrove_writers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, batch_chars: int
) -> None:
    # small row groups by characters too (the writers' bound of 16M characters, made small)
    monkeypatch.setattr(docstore, "BATCH_CHARS", batch_chars)
    monkeypatch.setattr(write_stage, "BATCH_CHARS", batch_chars)
    docs = _documents(300)
    rank = 3
    with StageDocumentWriter(tmp_path / "stage") as writer:
        for doc in docs:
            writer.write(_copy(doc), rank)
    duplicates = {d.id: (docs[0].id, "exact" if k % 2 else "near") for k, d in enumerate(docs[1::9])}
    decisions = pa.table(
        {
            "id": list(duplicates),
            "duplicate_of": [v[0] for v in duplicates.values()],
            "kind": [v[1] for v in duplicates.values()],
        },
        schema=DECISIONS_SCHEMA,
    )
    pq.write_table(decisions, tmp_path / "decisions.parquet")
    step = WriteCuratedDocuments(
        tmp_path / "stage",
        tmp_path / "decisions.parquet",
        tmp_path / "out" / "documents",
        tmp_path / "out" / "ledger",
        SHA,
    )
    assert list(step.run(rank=rank, world_size=4)) == []

    # the reference: the kept documents through datatrove's writer, the ledger through its own writers
    ref = tmp_path / "ref"
    with (
        DocumentWriter(ref / "documents", "${source}/${rank}.parquet", tokenizer_sha256=SHA) as writer,
        LedgerWriter(ref / "ledger" / "kept", "kept") as kept,
        LedgerWriter(ref / "ledger" / "duplicate", "duplicate") as dropped,
    ):
        for doc in docs:
            if doc.id in duplicates:
                doc = _copy(doc)
                doc.metadata["duplicate_of"], doc.metadata["filter_reason"] = duplicates[doc.id]
                dropped.write(doc, rank)
            else:
                writer.write(_copy(doc), rank)
                kept.write(doc, rank)
    for source in ("books", "code"):
        name = f"{source}/{rank:05d}.parquet"
        ours, theirs = tmp_path / "out" / "documents" / name, ref / "documents" / name
        assert ours.read_bytes() == theirs.read_bytes(), name
        if batch_chars < 1 << 24:
            assert pq.ParquetFile(ours).num_row_groups > pq.ParquetFile(ours).metadata.num_rows // 64 + 1
    for outcome in ("kept", "duplicate"):
        ours = pq.read_table(tmp_path / "out" / "ledger" / outcome / f"{rank:05d}.parquet")
        theirs = pq.read_table(ref / "ledger" / outcome / f"{rank:05d}.parquet")
        assert ours.cast(LEDGER_SCHEMA).equals(theirs.cast(LEDGER_SCHEMA)), outcome
    notes = pq.read_table(tmp_path / "out" / "ledger" / "kept" / f"{rank:05d}.parquet").column("note")
    assert any("removed as duplicates" in n for n in notes.to_pylist())  # the metadata was read
    assert not list((tmp_path / "out").rglob("*.tmp"))


def test_write_stage_of_a_task_without_documents_writes_nothing(tmp_path: Path) -> None:
    pq.write_table(DECISIONS_SCHEMA.empty_table(), tmp_path / "decisions.parquet")
    out = tmp_path / "out"
    step = WriteCuratedDocuments(
        tmp_path / "stage", tmp_path / "decisions.parquet", out / "docs", out / "ledger", SHA
    )
    assert list(step.run(rank=0, world_size=1)) == []
    assert not out.exists()


def test_write_stage_killed_midway_leaves_no_partial_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fault while writing leaves neither a curated file nor a temporary one; the next attempt writes
    them whole."""
    docs = _documents(80, seed=1)
    with StageDocumentWriter(tmp_path / "stage") as writer:
        for doc in docs:
            writer.write(_copy(doc), 0)
    pq.write_table(DECISIONS_SCHEMA.empty_table(), tmp_path / "decisions.parquet")
    out = tmp_path / "out"
    step = WriteCuratedDocuments(
        tmp_path / "stage", tmp_path / "decisions.parquet", out / "docs", out / "ledger", SHA
    )
    flush = write_stage._SourceFile.flush
    calls = []

    def failing(self) -> None:
        calls.append(1)
        if len(calls) == 2:
            raise OSError("disk gone")
        flush(self)

    monkeypatch.setattr(write_stage._SourceFile, "flush", failing)
    with pytest.raises(OSError, match="disk gone"):
        list(step.run(rank=0, world_size=1))
    assert [p for p in out.rglob("*") if p.is_file()] == []
    monkeypatch.setattr(write_stage._SourceFile, "flush", flush)
    list(step.run(rank=0, world_size=1))
    ids = [
        i
        for f in sorted((out / "docs").rglob("*.parquet"))
        for i in pq.read_table(f, columns=["id"]).column(0).to_pylist()
    ]
    assert sorted(ids) == sorted(d.id for d in docs)
    meta = json.loads(pq.read_table(out / "docs" / "books" / "00000.parquet").column("metadata")[0].as_py())
    assert "token_ids" not in meta and meta["input_files"] >= 1


def test_write_stage_with_dependency_scores_equals_datatrove_writers(tmp_path: Path) -> None:
    """Given the dependency stage's scores, the kept documents carry them in their columns, byte for
    byte as datatrove's writer stores them from metadata, and those the scores file gives a reason
    are ledger rows of their own (``filtered``, with the reason and the scores), not curated; a
    duplicate stays a duplicate."""
    docs = _documents(120, seed=2)
    rank = 0
    with StageDocumentWriter(tmp_path / "stage") as writer:
        for doc in docs:
            writer.write(_copy(doc), rank)
    duplicates = {docs[5].id: (docs[0].id, "exact_duplicate")}
    pq.write_table(
        pa.table(
            {"id": list(duplicates), "duplicate_of": [docs[0].id], "kind": ["exact_duplicate"]},
            schema=DECISIONS_SCHEMA,
        ),
        tmp_path / "decisions.parquet",
    )
    rng = random.Random(0)
    scores = {}
    for k, doc in enumerate(docs):
        if k % 4:  # a quarter unscored
            model = rng.random() if k % 3 == 0 else None
            reason = "low_dependency" if k % 10 == 1 else "not_top_dependency" if k % 10 == 5 else ""
            scores[doc.id] = (doc.metadata["source"], rng.uniform(-0.2, 0.9), model, reason)
    table = {
        "id": list(scores),
        "source": [v[0] for v in scores.values()],
        "dependency": [v[1] for v in scores.values()],
        "dependency_model": [v[2] for v in scores.values()],
        "reason": [v[3] for v in scores.values()],
    }
    pq.write_table(pa.table(table, schema=SCORES_SCHEMA), tmp_path / "scores.parquet")
    step = WriteCuratedDocuments(
        tmp_path / "stage",
        tmp_path / "decisions.parquet",
        tmp_path / "out" / "documents",
        tmp_path / "out" / "ledger",
        SHA,
        tmp_path / "scores.parquet",
    )
    assert list(step.run(rank=rank, world_size=1)) == []

    ref = tmp_path / "ref"
    with (
        DocumentWriter(ref / "documents", "${source}/${rank}.parquet", tokenizer_sha256=SHA) as writer,
        LedgerWriter(ref / "ledger" / "kept", "kept") as kept,
        LedgerWriter(ref / "ledger" / "duplicate", "duplicate") as dropped,
        LedgerWriter(ref / "ledger" / "dependency", "filtered") as filtered,
    ):
        for doc in docs:
            doc = _copy(doc)
            _, free, model, reason = scores.get(doc.id, (None, None, None, ""))
            doc.metadata["dependency"], doc.metadata["dependency_model"] = free, model
            if doc.id in duplicates:
                doc.metadata["duplicate_of"], doc.metadata["filter_reason"] = duplicates[doc.id]
                dropped.write(doc, rank)
            elif reason:
                doc.metadata["filter_reason"] = reason
                filtered.write(doc, rank)
            else:
                writer.write(_copy(doc), rank)
                kept.write(doc, rank)
    for source in ("books", "code"):
        name = f"{source}/{rank:05d}.parquet"
        assert (tmp_path / "out" / "documents" / name).read_bytes() == (ref / "documents" / name).read_bytes()
    for folder in ("kept", "duplicate", "dependency"):
        ours = pq.read_table(tmp_path / "out" / "ledger" / folder / f"{rank:05d}.parquet")
        theirs = pq.read_table(ref / "ledger" / folder / f"{rank:05d}.parquet")
        assert ours.cast(LEDGER_SCHEMA).equals(theirs.cast(LEDGER_SCHEMA)), folder
    filtered_rows = pq.read_table(tmp_path / "out" / "ledger" / "dependency").to_pylist()
    assert {r["reason"] for r in filtered_rows} == {"low_dependency", "not_top_dependency"}
    assert all(r["outcome"] == "filtered" and r["dependency"] is not None for r in filtered_rows)
