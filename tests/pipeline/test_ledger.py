"""The ledger must account for every input exactly once."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from longctx.core.atomic import write_table
from longctx.core.buckets import bucket_floor as pow2_bucket
from longctx.pipeline.ledger import (
    INPUTS_SCHEMA,
    LEDGER_SCHEMA,
    LedgerMismatch,
    check_file_counts,
    merge_ledger,
)
from longctx.pipeline.stats import summarize_ledger


def _row(doc_id: str, outcome: str = "kept", reason: str = "", tokens: int = 10, files: int = 1) -> dict:
    return {
        "id": doc_id,
        "source": "s",
        "path": "",
        "outcome": outcome,
        "reason": reason,
        "duplicate_of": "",
        "tokens": tokens,
        "chars": 0,
        "files": files,
        "note": "",
    }


def _setup(tmp_path: Path, inputs: list[str], parts: dict[str, list[dict]]) -> tuple[Path, Path]:
    n = len(inputs)
    tally = {"id": inputs, "source": ["s"] * n, "path": [""] * n, "chars": [0] * n, "files": [1] * n}
    write_table(tmp_path / "inputs" / "00000.parquet", pa.table(tally, schema=INPUTS_SCHEMA))
    for name, rows in parts.items():
        write_table(
            tmp_path / "ledger" / name / "00000.parquet", pa.Table.from_pylist(rows, schema=LEDGER_SCHEMA)
        )
    return tmp_path / "ledger", tmp_path / "inputs"


def test_complete_ledger_merges(tmp_path: Path) -> None:
    ledger = merge_ledger(
        *_setup(
            tmp_path,
            ["a", "b", "c"],
            {"kept": [_row("a"), _row("c")], "length": [_row("b", "filtered", "too_short")]},
        )
    )
    assert ledger.column("id").to_pylist() == ["a", "b", "c"]


@pytest.mark.parametrize(
    "inputs, parts, message",
    [
        (["a", "b"], {"kept": [_row("a")]}, "1 input without a ledger row"),
        (
            ["a"],
            {"kept": [_row("a")], "length": [_row("a", "filtered", "too_short")]},
            "more than one ledger row",
        ),
        (["a"], {"kept": [_row("a"), _row("z")]}, "1 ledger row naming no input"),
        (["a", "a"], {"kept": [_row("a")]}, "input ids are not unique"),
    ],
)
def test_mismatches_are_errors(tmp_path: Path, inputs, parts, message) -> None:
    with pytest.raises(LedgerMismatch, match=message):
        merge_ledger(*_setup(tmp_path, inputs, parts))


def test_file_counts_must_match_the_folders() -> None:
    ledger = pa.Table.from_pylist(
        [_row("a", files=3), _row("b", "skipped", "hidden", files=2)], schema=LEDGER_SCHEMA
    )
    check_file_counts(ledger, {"s": 5})
    with pytest.raises(LedgerMismatch, match="s: 5 files in the ledger, 6 under its folder"):
        check_file_counts(ledger, {"s": 6})


def test_summary_adds_up() -> None:
    rows = [
        _row("a", tokens=1000),
        _row("b", "filtered", "too_short", 3),
        _row("c", "duplicate", "near_duplicate", 990),
        _row("d", "skipped", "symlink", -1, files=1),
    ]
    summary = summarize_ledger(pa.Table.from_pylist(rows, schema=LEDGER_SCHEMA))
    s = summary["sources"]["s"]
    assert s["inputs"] == 4 == s["kept"] + s["filtered"] + s["duplicate"] + s["skipped"]
    assert s["files"] == 4
    assert s["kept_tokens"] == 1000
    assert s["length_histogram"] == {"512": 1}
    assert s["reasons"] == {"too_short": 1, "near_duplicate": 1, "symlink": 1}


@pytest.mark.parametrize(
    "n, bucket", [(0, 0), (1, 1), (2, 2), (3, 2), (1023, 512), (1024, 1024), (70000, 65536)]
)
def test_pow2_bucket(n: int, bucket: int) -> None:
    assert pow2_bucket(n) == bucket
