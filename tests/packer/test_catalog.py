"""The catalog ``pack`` plans from: ids and token counts of curated files, in any of the layouts it
accepts, against the files' own rows read back with pyarrow; and read without importing pandas."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from longctx.packer.catalog import read_catalog


def write_curation(documents: Path) -> dict[str, list[dict]]:
    """Three sources: counts as a column (some null), counts inside a ``metadata`` struct as other
    datatrove writers store them (some null), and no counts at all; one source in two files."""
    rows = {
        "books": [
            {"id": f"b{i}", "text": "x" * i, "token_count": None if i == 2 else 10 * i} for i in range(5)
        ],
        "papers": [
            {"id": f"p{i}", "text": "y", "metadata": {"token_count": None if i == 0 else i, "url": "u"}}
            for i in range(3)
        ],
        "code": [{"id": f"c{i}", "text": "z"} for i in range(4)],
    }
    for source, source_rows in rows.items():
        (documents / source).mkdir(parents=True)
        table = pa.Table.from_pylist(source_rows)
        pq.write_table(table.slice(0, 2), documents / source / "00000.parquet")
        pq.write_table(table.slice(2), documents / source / "00001.parquet")
    return rows


def expected_counts(row: dict) -> int:
    count = row["token_count"] if "token_count" in row else row.get("metadata", {}).get("token_count")
    return -1 if count is None else count


def test_ids_and_counts_of_every_layout(tmp_path: Path) -> None:
    rows = write_curation(tmp_path / "documents")
    catalogs = read_catalog(tmp_path / "documents")
    assert sorted(catalogs) == ["books", "code", "papers"]
    for source, source_rows in rows.items():
        catalog = catalogs[source]
        assert catalog.ids == [r["id"] for r in source_rows]
        assert catalog.token_counts.tolist() == [expected_counts(r) for r in source_rows]
        assert catalog.token_counts.dtype.name == "int64"
        assert not catalog.counts_known  # each source has an unknown count


def test_planning_reads_without_pandas(tmp_path: Path) -> None:
    """pyarrow imports pandas (0.3-0.5 s of CPU) for ``pq.read_table`` and ``to_numpy``; the driver of
    ``longctx pack`` reads the catalog without either."""
    write_curation(tmp_path / "documents")
    code = (
        "import sys; from pathlib import Path; from longctx.packer.catalog import read_catalog; "
        f"c = read_catalog(Path({str(tmp_path / 'documents')!r})); "
        "assert c['books'].token_counts.tolist() == [0, 10, -1, 30, 40], c; "
        "assert 'pandas' not in sys.modules, 'pandas was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
