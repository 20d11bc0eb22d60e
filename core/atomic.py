"""Atomic writes: every file and folder longctx writes appears whole or not at all.

A writer writes under a temporary name beside the target (``<name>.tmp``, so it lies on the same
file system and the rename is atomic) and renames it onto the target when it is complete. Whatever
goes wrong in between, an exception or an interrupt, the temporary file or folder is removed, so a
reader never sees half a file and a failed writer leaves nothing behind. A full or read-only disk
is reported as an :class:`~longctx.core.errors.OutputError` naming the file, not a traceback.

:func:`new_numbered_folder` does the same for results that must never replace earlier ones (one
evaluation after another): each gets the next free number.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from longctx.core.preflight import disk_fault

if TYPE_CHECKING:  # pyarrow is imported by write_table only
    import pyarrow as pa

TEMP_SUFFIX = ".tmp"


def temporary_path(path: Path) -> Path:
    """The temporary name ``path`` is written under before it is renamed into place."""
    return path.with_name(path.name + TEMP_SUFFIX)


def discard(path: Path) -> None:
    """Remove a temporary file or folder, if it exists."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


def commit(tmp: Path, path: Path, *, fsync: bool = False) -> None:
    """Rename the complete ``tmp`` onto ``path``; a folder at ``path`` is replaced (removed first)."""
    if fsync and tmp.is_file():
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
    if tmp.is_dir() and path.is_dir():
        shutil.rmtree(path)
    os.replace(tmp, path)


@contextlib.contextmanager
def atomic_path(path: Path, *, fsync: bool = False) -> Iterator[Path]:
    """The temporary path to write ``path`` under (a file or a folder the caller creates).

    When the block ends normally the temporary is renamed onto ``path`` (an existing folder there is
    replaced); when it raises, the temporary is removed. A leftover of an earlier, killed writer is
    removed first. ``fsync`` flushes a file to disk before the rename. A fault of the disk or folder
    (full, read-only, not a folder) is raised as an :class:`~longctx.core.errors.OutputError` naming
    ``path``.
    """
    path = Path(path)
    tmp = temporary_path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        discard(tmp)
        yield tmp
        commit(tmp, path, fsync=fsync)
    except OSError as err:
        discard(tmp)
        about_target = err.filename is None or str(err.filename) in (str(tmp), str(path))
        fault = disk_fault(err, path if about_target else None)
        if fault is None:
            raise
        raise fault from err
    except BaseException:
        discard(tmp)
        raise


@contextlib.contextmanager
def atomic_file(path: Path, *, fsync: bool = False) -> Iterator[BinaryIO]:
    """A binary file to write ``path`` through, atomically (:func:`atomic_path`): for a writer that
    streams its bytes rather than holding them all."""
    with atomic_path(path, fsync=fsync) as tmp, open(tmp, "wb") as f:
        yield f


def write_bytes(path: Path, data: bytes | memoryview, *, fsync: bool = False) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_file(path, fsync=fsync) as f:
        f.write(data)


def write_text(path: Path, text: str) -> None:
    """Write UTF-8 ``text`` to ``path`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json(path: Path, data: Any, *, indent: int = 2) -> None:
    """Write ``data`` as JSON (sorted keys, a final newline) to ``path`` atomically."""
    write_text(path, json.dumps(data, indent=indent, sort_keys=True) + "\n")


def write_table(path: Path, table: pa.Table) -> None:
    """Write ``table`` as a Parquet file at ``path`` atomically."""
    import pyarrow.parquet as pq

    with atomic_path(path) as tmp:
        pq.write_table(table, tmp)


def _remove_abandoned(parent: Path) -> None:
    """Remove ``<N>.tmp`` folders under ``parent`` that no live writer holds (killed writers')."""
    for tmp in parent.glob("*" + TEMP_SUFFIX):
        if not (tmp.name.removesuffix(TEMP_SUFFIX).isdigit() and tmp.is_dir()):
            continue
        try:
            fd = os.open(tmp, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # a running writer's
        else:
            shutil.rmtree(tmp, ignore_errors=True)
        finally:
            os.close(fd)


@contextlib.contextmanager
def new_numbered_folder(parent: Path, width: int = 3) -> Iterator[tuple[Path, Path]]:
    """A new folder ``parent/<N>`` (``001``, ``002``, ...: one more than the highest number there),
    never replacing an existing one; yields ``(temporary, final)``.

    The caller fills ``temporary`` (``<N>.tmp``); when the block ends it is renamed to ``final``, and
    when it raises it is removed. The number is taken under a lock on ``parent`` and the temporary
    stays locked by its writer until it is done, so concurrent writers get different numbers and a
    later writer removes only the temporaries of killed ones.
    """
    parent = Path(parent)
    parent.mkdir(parents=True, exist_ok=True)
    parent_fd = os.open(parent, os.O_RDONLY)
    try:
        fcntl.flock(parent_fd, fcntl.LOCK_EX)
        _remove_abandoned(parent)
        names = [p.name.removesuffix(TEMP_SUFFIX) for p in parent.iterdir()]
        final = parent / f"{max((int(n) for n in names if n.isdigit()), default=0) + 1:0{width}d}"
        tmp = temporary_path(final)
        tmp.mkdir()
        fd = os.open(tmp, os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_EX)
    finally:
        os.close(parent_fd)
    try:
        yield tmp, final
        os.rename(tmp, final)  # numbers only grow, so nothing is at `final`
    except BaseException:
        discard(tmp)
        raise
    finally:
        os.close(fd)
