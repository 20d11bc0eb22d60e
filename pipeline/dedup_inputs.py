"""What the single-task duplicate resolvers read: the index every task of the signature stage wrote
(``<rank>.parquet``, one row per document or file) and the candidate pairs of datatrove's MinHash
stage 2 (``*.dups`` files). Document dedup (:class:`~longctx.pipeline.dedup.DuplicateResolver`) and
file dedup (:class:`~longctx.pipeline.filededup.FileDuplicateResolver`) read both the same way."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from datatrove.io import get_datafolder
from datatrove.utils.binaryio import read_tuples_from_file

from longctx.pipeline.parquet import read_parquet

MinhashPair = tuple[int, int, int, int]
"""``(rank1, idx1, rank2, idx2)``: document ``idx1`` of task ``rank1`` is a candidate duplicate of
document ``idx2`` of task ``rank2``."""


def read_rank_index(folder: Path, schema: pa.Schema) -> pa.Table:
    """Every task's index file under ``folder`` (``<rank>.parquet``, each checked against ``schema``)
    in one table, in rank order, with a ``rank`` column added; an empty table when there is none."""
    tables = []
    for path in sorted(folder.glob("*.parquet")):
        table = read_parquet(path, schema)
        tables.append(table.append_column("rank", pa.array([int(path.stem)] * len(table), pa.int64())))
    return pa.concat_tables(tables) if tables else schema.append(pa.field("rank", pa.int64())).empty_table()


def read_minhash_pairs(folder: Path | None) -> list[MinhashPair]:
    """The candidate pairs MinHash stage 2 wrote under ``folder``, read as datatrove's own cluster
    stage reads them; none when there is no such folder (near-duplicate search off, or no pairs)."""
    pairs: list[MinhashPair] = []
    if folder is None or not folder.is_dir():
        return pairs
    dups = get_datafolder(str(folder))
    for name in dups.list_files(glob_pattern="*.dups"):
        with dups.open(name, "rb") as f:
            pairs.extend(read_tuples_from_file(f, "4I", lines_to_buffer=-1))
    return pairs
