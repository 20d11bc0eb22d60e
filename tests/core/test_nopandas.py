"""pyarrow without pandas in the curate and pack commands (longctx.core.nopandas): once
:func:`pyarrow_without_pandas` has run, building Arrow data from Python objects and reading and
writing Parquet never import pandas, in the process or in one forked from it; the reference (the same
calls without it) shows that they would."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("pandas") is None, reason="pandas is not installed: pyarrow cannot import it"
)

USES = """
import os, sys
import pyarrow as pa, pyarrow.parquet as pq
table = pa.table({"a": [1, 2], "b": ["x", None]})
pq.write_table(pa.Table.from_pylist([{"a": 1}]), sys.argv[1])
pq.ParquetFile(sys.argv[1]).read().to_pylist()
pa.array([0.5, None], pa.float64())
pid = os.fork()
if pid == 0:
    pa.array(["in a forked process"])
    os._exit(3 if "pandas" in sys.modules else 0)
_, status = os.waitpid(pid, 0)
print("pandas" in sys.modules, os.waitstatus_to_exitcode(status) == 3)
"""


def _run(tmp_path: Path, first: str) -> str:
    script = textwrap.dedent(first) + USES
    result = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "t.parquet")],
        capture_output=True,
        text=True,
        check=True,
    )
    return result.stdout.split("\n")[-2]


def test_pyarrow_never_imports_pandas_after_pyarrow_without_pandas(tmp_path: Path) -> None:
    first = """
    from longctx.core.nopandas import active, pyarrow_without_pandas
    assert not active() and pyarrow_without_pandas() and active()
    """
    assert _run(tmp_path, first) == "False False"  # neither here nor in the forked process


def test_reference_the_same_calls_import_pandas(tmp_path: Path) -> None:
    assert _run(tmp_path, "") == "True True"


def test_with_pandas_imported_already_it_changes_nothing(tmp_path: Path) -> None:
    first = """
    import pandas
    from longctx.core.nopandas import active, pyarrow_without_pandas
    assert pyarrow_without_pandas() is False and not active()
    import pyarrow as pa
    assert pa.table({"a": [1]}).to_pandas()["a"].tolist() == [1]  # pandas still works with pyarrow
    """
    assert _run(tmp_path, first) == "True True"
