"""The resolvers' inputs: every task's index file and MinHash stage 2's pairs, read back as written."""

from __future__ import annotations

import struct
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from longctx.pipeline.dedup import INDEX_SCHEMA
from longctx.pipeline.dedup_inputs import read_minhash_pairs, read_rank_index
from longctx.pipeline.filededup import FILE_INDEX_SCHEMA


def test_index_files_are_joined_in_rank_order_with_their_rank(tmp_path: Path) -> None:
    rows = {3: [(0, "c", "h3")], 0: [(0, "a", "h1"), (1, "b", "h2")], 12: []}
    for rank, entries in rows.items():  # written out of rank order
        table = pa.table({name: [e[i] for e in entries] for i, name in enumerate(INDEX_SCHEMA.names)})
        pq.write_table(table.cast(INDEX_SCHEMA), tmp_path / f"{rank:05d}.parquet")
    index = read_rank_index(tmp_path, INDEX_SCHEMA)
    assert index.column_names == [*INDEX_SCHEMA.names, "rank"]
    expected = [
        {"idx": i, "id": d, "text_hash": h, "rank": rank} for rank in sorted(rows) for i, d, h in rows[rank]
    ]
    assert index.to_pylist() == expected


def test_no_index_files_is_an_empty_table_of_the_schema(tmp_path: Path) -> None:
    index = read_rank_index(tmp_path, FILE_INDEX_SCHEMA)
    assert index.num_rows == 0
    assert index.schema == FILE_INDEX_SCHEMA.append(pa.field("rank", pa.int64()))


def test_pairs_of_every_dups_file(tmp_path: Path) -> None:
    written = {"00000_00.dups": [(0, 1, 2, 3), (4, 5, 6, 7)], "00001_00.dups": [(8, 9, 10, 11)]}
    for name, pairs in written.items():  # the little-endian uint32 quadruples datatrove's stage 2 writes
        (tmp_path / name).write_bytes(b"".join(struct.pack("<4I", *pair) for pair in pairs))
    (tmp_path / "other.bin").write_bytes(struct.pack("<4I", 9, 9, 9, 9))
    assert sorted(read_minhash_pairs(tmp_path)) == sorted(p for pairs in written.values() for p in pairs)


def test_no_pairs_without_a_folder(tmp_path: Path) -> None:
    assert read_minhash_pairs(None) == []
    assert read_minhash_pairs(tmp_path / "absent") == []
    assert read_minhash_pairs(tmp_path) == []
