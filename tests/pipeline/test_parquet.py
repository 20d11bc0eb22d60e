"""The job's small Parquet files read without pyarrow.dataset, against pyarrow's read_table."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from longctx.pipeline.parquet import read_parquet

SCHEMA = pa.schema([("id", pa.string()), ("n", pa.int64()), ("sig", pa.list_(pa.uint32()))])


def test_read_parquet_equals_read_table(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(
        pa.table({"id": ["a", None, "c"], "n": [1, 2, None], "sig": [[1, 2], [], None]}, schema=SCHEMA), path
    )
    assert read_parquet(path, SCHEMA).equals(pq.read_table(path, schema=SCHEMA))
    assert read_parquet(path).equals(pq.read_table(path))
    empty = tmp_path / "e.parquet"
    pq.write_table(SCHEMA.empty_table(), empty)
    assert read_parquet(empty, SCHEMA).equals(pq.read_table(empty, schema=SCHEMA))


def test_a_file_of_another_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"other": [1]}), path)
    with pytest.raises(ValueError):
        read_parquet(path, SCHEMA)


def test_reading_does_not_import_pyarrow_dataset(tmp_path: Path) -> None:
    path = tmp_path / "t.parquet"
    pq.write_table(SCHEMA.empty_table(), path)
    code = (
        "import sys; from longctx.pipeline.parquet import read_parquet; "
        f"read_parquet({str(path)!r}); print('pyarrow.dataset' in sys.modules)"
    )
    assert (
        subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, check=True
        ).stdout.strip()
        == "False"
    )
