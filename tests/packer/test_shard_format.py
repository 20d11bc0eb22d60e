"""The shard file: Arrow IPC stream, zero-copy through a memory map, readable by ``datasets``,
self-describing, and a clear error when truncated or corrupt."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from longctx.packer.binpack import pack
from longctx.packer.format import (
    ShardError,
    ShardHeader,
    TokenizerInfo,
    file_checksum,
    open_shard,
    write_shard,
)
from longctx.packer.pool import PoolBuilder
from longctx.packer.reader import ShardColumns, _is_null
from longctx.packer.rows import build_rows

SEQ_LEN = 16
HEADER = ShardHeader(
    seq_len=SEQ_LEN,
    original_context=8,
    target_context=16,
    strategy="bfd",
    tokenizer=TokenizerInfo(sha256="0" * 64, vocab_size=1000, eos_id=0, bos_id=None, pad_id=1),
    config_sha256="c" * 64,
)


def small_batch() -> pa.RecordBatch:
    builder = PoolBuilder()
    for i, n in enumerate([5, 40, 9, 3, 16, 11]):
        builder.add(f"doc{i}", "books" if n > 10 else "anchor", np.arange(2, n + 2, dtype=np.int32), 1)
    pool = builder.build()
    return build_rows(pool, pack(pool.length, pool.copies, SEQ_LEN, "bfd"), SEQ_LEN, pad_id=1)


@pytest.fixture()
def shard(tmp_path: Path) -> Path:
    path = tmp_path / "00000_00000.arrow"
    write_shard(path, small_batch(), HEADER)
    return path


def test_roundtrip_is_zero_copy_and_self_describing(shard: Path) -> None:
    allocated = pa.total_allocated_bytes()
    meta, table = open_shard(shard)
    assert pa.total_allocated_bytes() == allocated  # buffers point into the memory map
    assert meta.rows == table.num_rows == small_batch().num_rows
    assert meta.model_dump(exclude={"rows"}) == HEADER.model_dump()
    assert table.to_pylist() == small_batch().to_pylist()
    assert table.schema.field("input_ids").type == pa.list_(pa.int32(), SEQ_LEN)


def test_datasets_opens_a_shard(shard: Path) -> None:
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_file(str(shard))
    assert ds.num_rows == small_batch().num_rows
    assert ds[0] == small_batch().to_pylist()[0]
    assert ds.with_format("numpy")[:]["input_ids"].shape == (ds.num_rows, SEQ_LEN)


def test_same_rows_give_the_same_bytes(tmp_path: Path) -> None:
    a = write_shard(tmp_path / "a.arrow", small_batch(), HEADER)
    b = write_shard(tmp_path / "b.arrow", small_batch(), HEADER)
    assert (tmp_path / "a.arrow").read_bytes() == (tmp_path / "b.arrow").read_bytes()
    assert a.xxh3_128 == b.xxh3_128 == file_checksum(tmp_path / "a.arrow")
    assert not list(tmp_path.glob("*.tmp"))


def test_rows_indexed_with_int64_are_those_indexed_with_int32(monkeypatch: pytest.MonkeyPatch) -> None:
    """build_rows indexes tokens with int32 unless a pool or window set is too large for it; the
    int64 path (forced) gives the same rows."""
    from longctx.packer import rows

    rng = np.random.default_rng(0)
    builder = PoolBuilder()
    for i, n in enumerate(rng.integers(2, 900, size=150)):  # ~70K tokens, more than int16 holds
        builder.add(f"doc{i}", "books", rng.integers(2, 1000, size=n, dtype=np.int32), 1)
    pool = builder.build()

    def batch() -> pa.RecordBatch:
        return build_rows(pool, pack(pool.length, pool.copies, 256, "bfd"), 256, pad_id=1)

    with_int32 = batch()
    monkeypatch.setattr(rows, "INT32_INDEX_MAX", 0)
    assert batch().equals(with_int32)


@pytest.mark.parametrize("keep", [0.999, 0.5, 0.05, 0.0])
def test_truncated_shard_is_a_clear_error(shard: Path, keep: float) -> None:
    data = shard.read_bytes()
    shard.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(ShardError, match=r"00000_00000\.arrow: .*(truncated|corrupt)"):
        open_shard(shard)


def test_corrupt_or_foreign_files_are_clear_errors(shard: Path, tmp_path: Path) -> None:
    data = bytearray(shard.read_bytes())
    data[:8] = b"\xff" * 8
    shard.write_bytes(bytes(data))
    with pytest.raises(ShardError, match="truncated or corrupt"):
        open_shard(shard)
    foreign = tmp_path / "plain.arrow"
    with (
        pa.OSFile(str(foreign), "wb") as sink,
        pa.ipc.new_stream(sink, pa.schema([("x", pa.int32())])) as writer,
    ):
        writer.write_batch(pa.record_batch([pa.array([1], pa.int32())], names=["x"]))
    with pytest.raises(ShardError, match="not a longctx shard"):
        open_shard(foreign)
    with pytest.raises(ShardError, match="not found"):
        open_shard(tmp_path / "missing.arrow")


def test_rows_disagreeing_with_the_metadata_are_refused(tmp_path: Path) -> None:
    batch = small_batch()
    path = tmp_path / "s.arrow"
    write_shard(path, batch, HEADER)
    _, table = open_shard(path)
    schema = table.schema  # keeps the metadata, which says batch.num_rows
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        writer.write_batch(batch.slice(0, batch.num_rows - 1).replace_schema_metadata(schema.metadata))
    with pytest.raises(ShardError, match="truncated shard"):
        open_shard(path)


@pytest.mark.parametrize(("start", "rows"), [(0, None), (3, 3), (1, 4)])
def test_shard_columns_are_the_tables_values(start: int, rows: int | None) -> None:
    """The numpy views equal pyarrow's own conversion, also of a table that starts inside its
    buffers (a slice: arrays with an offset), and the padding flags follow the null ``doc_id``s."""
    table = pa.Table.from_batches([small_batch()])
    table = table.slice(start, rows)
    meta = HEADER.model_dump()
    columns = ShardColumns(type("Meta", (), {"seq_len": SEQ_LEN, **meta})(), table)
    for name in ("input_ids", "position_ids", "loss_mask"):
        expected = np.array(table.column(name).to_pylist())
        assert columns.__dict__[name].dtype == table.schema.field(name).type.value_type.to_pandas_dtype()
        assert np.array_equal(getattr(columns, name), expected), name
    for i, cu in enumerate(table.column("cu_seqlens").to_pylist()):
        assert columns.cu_values[columns.cu_offsets[i] : columns.cu_offsets[i + 1]].tolist() == cu
    pads = [bool(ids) and ids[-1] is None for ids in table.column("doc_id").to_pylist()]
    assert columns.last_is_pad.tolist() == pads and any(pads) and not all(pads)
    names = pa.array(["a", None, "b", None, "c"] * 3).slice(start, rows)  # the bitmap read at an offset
    assert _is_null(names, np.arange(len(names))).tolist() == [name is None for name in names.to_pylist()]


def test_null_tokens_are_refused() -> None:
    batch = small_batch()
    ids = batch.column(0)
    holed = pa.FixedSizeListArray.from_arrays(
        pa.array(ids.values.to_pylist()[:-1] + [None], pa.int32()), SEQ_LEN
    )
    table = pa.Table.from_batches(
        [pa.RecordBatch.from_arrays([holed, *batch.columns[1:]], schema=batch.schema)]
    )
    with pytest.raises(ShardError, match="input_ids holds null values"):
        ShardColumns(type("Meta", (), {"seq_len": SEQ_LEN})(), table)


def test_reading_rows_imports_neither_pandas_nor_pyarrow_compute(shard: Path) -> None:
    """pyarrow's ``to_numpy`` imports pandas and ``flatten`` pyarrow.compute (together 0.2-0.35 s
    of CPU), in every DataLoader worker forked from a training process that had not: a fresh
    process opening a shard and reading its columns imports neither."""
    code = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from longctx.packer.format import open_shard
        from longctx.packer.reader import ShardColumns, _is_null
        columns = ShardColumns(*open_shard(Path({str(shard)!r})))
        assert columns.input_ids.sum() > 0
        print(sorted(m for m in ("pandas", "pyarrow.compute") if m in sys.modules))
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
