"""The validator names the row and field of each kind of broken invariant."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pytest

from longctx.packer.format import ShardHeader, open_shard, write_shard
from longctx.packer.validate import validate_file
from tests.packer.test_pack_helpers import PackedRun

pytest_plugins = ["tests.packer.test_pack_helpers"]  # the shared packed_run fixture

Row = dict


def first_row(rows: list[Row], predicate: Callable[[Row], bool]) -> int:
    return next(i for i, row in enumerate(rows) if predicate(row))


def has_padding(row: Row) -> bool:
    return row["doc_id"][-1] is None


def ends_a_document(row: Row) -> bool:
    return row["doc_offset"][0] + row["cu_seqlens"][1] == row["doc_length"][0]


def break_boundaries(row: Row) -> str:
    row["cu_seqlens"][-1] -= 1
    return "cu_seqlens"


def drop_provenance(row: Row) -> str:
    row["doc_id"].pop()
    return "doc_id"


def wrong_padding_token(row: Row) -> str:
    row["input_ids"][-1] += 1
    return "input_ids"


def offset_outside_document(row: Row) -> str:
    row["doc_offset"][0] = row["doc_length"][0]
    return "doc_offset"


def missing_eos(row: Row) -> str:
    row["input_ids"][row["cu_seqlens"][1] - 1] += 1
    return "input_ids"


def id_outside_vocabulary(row: Row) -> str:
    row["input_ids"][1] = 10**6
    return "input_ids"


def source_missing(row: Row) -> str:
    row["doc_source"][0] = None
    return "doc_source"


def padding_not_last(row: Row) -> str:
    for key in ("doc_id", "doc_source", "doc_offset", "doc_length"):
        row[key][0], row[key][-1] = row[key][-1], row[key][0]
    return "doc_id"


CASES: list[tuple[Callable[[Row], str], Callable[[Row], bool], str]] = [
    (break_boundaries, lambda r: True, "must rise strictly from 0 to 256"),
    (drop_provenance, lambda r: True, "entries for"),
    (wrong_padding_token, has_padding, "padding must be pad id"),
    (offset_outside_document, lambda r: True, "do not fit a document"),
    (missing_eos, ends_a_document, "does not end with EOS"),
    (id_outside_vocabulary, lambda r: True, "outside [0, "),
    (source_missing, lambda r: True, "must be null exactly for the padding segment"),
    (padding_not_last, has_padding, "not the last segment"),
]


@pytest.mark.parametrize("damage, applies, message", CASES, ids=[c[0].__name__ for c in CASES])
def test_each_broken_invariant_is_named(
    packed_run: PackedRun,
    tmp_path: Path,
    damage: Callable[[Row], str],
    applies: Callable[[Row], bool],
    message: str,
) -> None:
    for shard in sorted(packed_run.folder(256).glob("*.arrow")):  # the first shard with a row to damage
        meta, table = open_shard(shard)
        rows = table.to_pylist()
        if any(applies(row) for row in rows):
            break
    assert validate_file(shard) == []
    index = first_row(rows, applies)
    field = damage(rows[index])
    path = tmp_path / "damaged.arrow"
    batch = pa.Table.from_pylist(rows, schema=table.schema).to_batches()[0]
    write_shard(path, batch, ShardHeader(**meta.model_dump(exclude={"rows"})))
    violations = validate_file(path)
    assert violations, "the damage went unnoticed"
    first = violations[0]
    assert (first.file, first.row, first.field) == ("damaged.arrow", index, field), str(first)
    assert message in first.message, str(first)
