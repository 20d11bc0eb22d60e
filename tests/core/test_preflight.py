"""Output folders are checked before work starts, and disk faults become one-line errors that name
the path, with no temporary file left behind.

References: the kernel's answers on a real small tmpfs and a real read-only mount (tests/core/disks.py;
skipped where mounting is not allowed), and, everywhere, a writer whose ``write`` fails with
``ENOSPC`` after writing part of its data (what a full disk does).
"""

from __future__ import annotations

import errno
import io
from pathlib import Path

import pytest

from longctx.core import atomic
from longctx.core.config import ExecutorConfig, validate_section
from longctx.core.errors import ConfigError, LongctxError, OutputError
from longctx.core.preflight import check_output_folder, disk_fault
from tests.core.disks import read_only, small_disk, tree


def test_a_file_in_the_way_is_named(tmp_path: Path) -> None:
    (tmp_path / "out").write_text("not a folder")
    with pytest.raises(OutputError, match=r"output: .*/out is a file, not a folder"):
        check_output_folder(tmp_path / "out")
    with pytest.raises(OutputError, match=r"pack\.x: .*/out/shards cannot be created: .*/out is a file"):
        check_output_folder(tmp_path / "out" / "shards", key="pack.x")


def test_a_missing_folder_that_can_be_created_passes_and_is_not_created(tmp_path: Path) -> None:
    check_output_folder(tmp_path / "a" / "b", needed_bytes=1)
    assert not (tmp_path / "a").exists()


def test_read_only_folder_is_refused_and_left_unchanged(tmp_path: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    (folder / "kept.txt").write_text("x")
    before = tree(folder)
    expected = r"cannot write to .*/ro/new .*(read-only file system|permission denied)"
    with read_only(folder), pytest.raises(OutputError, match=expected):
        check_output_folder(folder / "new")
    assert tree(folder) == before


def test_too_small_disk_is_refused_before_work(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", 256) as disk:
        check_output_folder(disk, needed_bytes=100 * 1024)
        with pytest.raises(
            OutputError, match=r"has .* KiB free on its file system, but this run writes about 1\.0 MiB"
        ):
            check_output_folder(disk / "out", needed_bytes=1 << 20)


def test_full_disk_in_an_atomic_write_names_the_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", 64) as disk:
        target = disk / "big.bin"
        with pytest.raises(OutputError, match=r"big\.bin: No space left on device") as raised:
            atomic.write_bytes(target, b"x" * (256 * 1024))
        assert isinstance(raised.value, OSError) and isinstance(raised.value, LongctxError)
        assert list(disk.iterdir()) == []


class _FillingFile(io.FileIO):
    """A file whose disk fills up after ``room`` bytes: writes what fits, then fails with ENOSPC."""

    room = 1000

    def write(self, data) -> int:  # type: ignore[override]
        data = memoryview(data).cast("B")
        if self.tell() + len(data) > self.room:
            super().write(data[: max(0, self.room - self.tell())])
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().write(data)


def test_simulated_full_disk_leaves_no_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same fault without a mount (runs everywhere): the write call fails part-way."""
    monkeypatch.setattr(atomic, "open", lambda path, mode: _FillingFile(path, "w"), raising=False)
    with pytest.raises(OutputError, match=r"shard\.arrow: No space left on device; free some space"):
        atomic.write_bytes(tmp_path / "shard.arrow", b"y" * 5000)
    assert list(tmp_path.iterdir()) == []


def test_code_errors_are_not_disguised_as_disk_faults() -> None:
    assert disk_fault(OSError(errno.EBADF, "Bad file descriptor")) is None
    assert disk_fault(FileNotFoundError(errno.ENOENT, "No such file", "x")) is None
    fault = disk_fault(OSError(errno.EROFS, "Read-only file system", "/data/out/a.json"))
    assert isinstance(fault, OutputError) and str(fault) == "/data/out/a.json: Read-only file system"


@pytest.mark.parametrize("workers", [0, -2])
def test_workers_must_be_positive_or_minus_one(workers: int) -> None:
    with pytest.raises(ConfigError, match=r"workers: must be at least 1, or -1 to run every task at once"):
        validate_section(ExecutorConfig, {"workers": workers}, "run.yaml")
    assert validate_section(ExecutorConfig, {"workers": -1}, "run.yaml").workers == -1
