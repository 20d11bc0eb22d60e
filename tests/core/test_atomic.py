"""Atomic writes: the target appears whole or not at all, and a failed writer leaves nothing behind."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from longctx.core.atomic import (
    atomic_path,
    temporary_path,
    write_bytes,
    write_json,
    write_table,
    write_text,
)


def test_writers_create_parents_and_leave_no_temporary(tmp_path: Path) -> None:
    write_bytes(tmp_path / "a" / "b.bin", b"\x00\x01", fsync=True)
    write_text(tmp_path / "a" / "c.txt", "héllo\n")
    write_json(tmp_path / "d.json", {"b": 1, "a": [1, 2]}, indent=1)
    write_table(tmp_path / "e.parquet", pa.table({"x": [1, 2, 3]}))
    assert (tmp_path / "a" / "b.bin").read_bytes() == b"\x00\x01"
    assert (tmp_path / "a" / "c.txt").read_text(encoding="utf-8") == "héllo\n"
    assert (tmp_path / "d.json").read_text() == json.dumps(
        {"a": [1, 2], "b": 1}, indent=1, sort_keys=True
    ) + "\n"
    assert pq.read_table(tmp_path / "e.parquet").column("x").to_pylist() == [1, 2, 3]
    assert sorted(p.name for p in tmp_path.rglob("*") if p.name.endswith(".tmp")) == []


def test_failure_keeps_the_old_file_and_removes_the_temporary(tmp_path: Path) -> None:
    target = tmp_path / "out.json"
    write_json(target, {"v": 1})
    with pytest.raises(RuntimeError, match="disk full"), atomic_path(target) as tmp:
        tmp.write_text("{half")
        raise RuntimeError("disk full")
    assert json.loads(target.read_text()) == {"v": 1}
    assert not temporary_path(target).exists()
    with pytest.raises(KeyboardInterrupt), atomic_path(target) as tmp:  # an interrupt cleans up too
        tmp.write_text("x")
        raise KeyboardInterrupt
    assert not temporary_path(target).exists() and json.loads(target.read_text()) == {"v": 1}


def test_folders_are_replaced_whole_and_stale_temporaries_removed(tmp_path: Path) -> None:
    target = tmp_path / "corpus"
    (target / "old").mkdir(parents=True)
    stale = temporary_path(target)
    (stale / "junk").mkdir(parents=True)  # a killed writer's leftover
    with atomic_path(target) as tmp:
        assert not tmp.exists()
        (tmp / "new").mkdir(parents=True)
    assert sorted(p.name for p in target.iterdir()) == ["new"]
    assert not stale.exists()
    with pytest.raises(ValueError), atomic_path(target) as tmp:
        (tmp / "partial").mkdir(parents=True)
        raise ValueError
    assert sorted(p.name for p in target.iterdir()) == ["new"] and not stale.exists()


def test_numbered_folders_never_replace_earlier_ones(tmp_path: Path) -> None:
    """Each folder gets the next number; a failed writer leaves nothing; a killed writer's
    temporary (unlocked) is removed by the next one, a live writer's is not."""
    import fcntl
    import os

    from longctx.core.atomic import new_numbered_folder

    parent = tmp_path / "eval"
    finals = []
    for i in range(2):
        with new_numbered_folder(parent) as (tmp, final):
            (tmp / "result.txt").write_text(str(i))
            assert not final.exists()
        finals.append(final)
    assert [f.name for f in finals] == ["001", "002"]
    assert [(f / "result.txt").read_text() for f in finals] == ["0", "1"]
    with pytest.raises(RuntimeError), new_numbered_folder(parent) as (tmp, final):
        raise RuntimeError("killed")
    assert sorted(p.name for p in parent.iterdir()) == ["001", "002"]

    (parent / "003.tmp").mkdir()  # a killed writer's: nobody holds its lock
    held = parent / "004.tmp"
    held.mkdir()
    fd = os.open(held, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a running writer's (open file descriptions lock independently)
    try:
        with new_numbered_folder(parent) as (tmp, final):
            pass
        assert final.name == "005" and held.is_dir() and not (parent / "003.tmp").exists()
    finally:
        os.close(fd)
