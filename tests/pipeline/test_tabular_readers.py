"""JSONL, Parquet and ``datasets.save_to_disk`` inputs through datatrove's readers: every row
becomes a document (or a recorded skip), tagged with its source and a stable id."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from longctx.pipeline.readers.tabular import make_tabular_reader

ROWS = [
    {"id": "a", "text": "first\r\ndocument"},
    {"id": "b", "text": "   "},
    {"id": "c", "text": None},
    {"id": "d", "text": "fourth document"},
]


def _docs(reader) -> dict[str, dict]:
    return {d.id: {"text": d.text, **d.metadata} for d in reader.run(None, 0, 1)}


def _check(docs: dict[str, dict], source: str) -> None:
    assert set(docs) == {f"{source}/{r['id']}" for r in ROWS}
    assert docs[f"{source}/a"]["text"] == "first\ndocument"
    assert docs[f"{source}/b"]["skip_reason"] == "empty"
    assert docs[f"{source}/c"]["skip_reason"] == "missing_text"
    assert "skip_reason" not in docs[f"{source}/d"]
    assert all(d["source"] == source for d in docs.values())


def test_jsonl_rows_are_documents_or_recorded_skips(tmp_path: Path) -> None:
    (tmp_path / "part.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    _check(_docs(make_tabular_reader("jsonl", tmp_path, "web")), "web")


def test_parquet_rows(tmp_path: Path) -> None:
    pq.write_table(pa.Table.from_pylist(ROWS), tmp_path / "part.parquet")
    _check(_docs(make_tabular_reader("parquet", tmp_path, "pq")), "pq")


def test_hf_dataset_saved_to_disk(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "ds"))
    _check(_docs(make_tabular_reader("hf_dataset", tmp_path / "ds", "hf")), "hf")


def test_rows_without_an_id_get_positional_ids(tmp_path: Path) -> None:
    (tmp_path / "part.jsonl").write_text(
        json.dumps({"text": "x y z"}) + "\n" + json.dumps({"text": "u v"}) + "\n"
    )
    ids = sorted(_docs(make_tabular_reader("jsonl", tmp_path, "s")))
    assert ids == ["s/part.jsonl/0", "s/part.jsonl/1"]


def test_custom_text_key_and_sharding(tmp_path: Path) -> None:
    rows = [{"id": str(i), "body": f"doc {i}"} for i in range(10)]
    for part in range(2):
        (tmp_path / f"p{part}.jsonl").write_text(
            "".join(json.dumps(r) + "\n" for r in rows[part * 5 : part * 5 + 5])
        )
    reader = make_tabular_reader("jsonl", tmp_path, "s", text_key="body")
    shards = [[d.id for d in reader.run(None, rank, 2)] for rank in range(2)]
    assert sorted(shards[0] + shards[1]) == sorted(f"s/{i}" for i in range(10))
    assert not set(shards[0]) & set(shards[1])


def test_not_a_saved_dataset_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"not a datasets\.save_to_disk folder"):
        make_tabular_reader("hf_dataset", tmp_path, "hf")
