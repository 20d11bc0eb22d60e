"""Reading the job's own small Parquet files (indexes, decisions, ledger parts).

``pyarrow.parquet.read_table`` reads through ``pyarrow.dataset``, whose import pulls in pandas:
about a second of CPU in every process that reads a table that way, and more when it exits. These
files are single, local and written by this job with a known schema, so :class:`pyarrow.parquet.ParquetFile`
reads them without either.
"""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq


def read_parquet(
    path: str | os.PathLike, schema: pa.Schema | None = None, columns: list[str] | None = None
) -> pa.Table:
    """The table in the Parquet file at ``path`` (only ``columns`` when given), cast to ``schema``
    when given (an error when its columns are not the schema's, by name and order)."""
    with pq.ParquetFile(path) as file:
        table = file.read(columns=columns)
    return table if schema is None else table.cast(schema)
