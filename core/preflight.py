"""Checks of an output folder before a job starts, and disk faults as one-line errors while it runs.

A job that is going to fail on its output folder (it is a file, it lies on a read-only file system,
the disk is too small) should say so before it does any work, in one line naming the path:
:func:`check_output_folder`. A fault that only shows during the run (the disk fills up meanwhile)
becomes an :class:`~longctx.core.errors.OutputError` naming the file instead of a traceback:
:func:`disk_fault` converts the ``OSError`` (the atomic writers of :mod:`longctx.core.atomic` do it
for every file they write, and remove their temporary file on the way out; :func:`disk_faults` does
it for a file appended in place).
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from longctx.core.errors import OutputError

DISK_FAULTS = frozenset(
    {
        errno.ENOSPC,
        errno.EDQUOT,
        errno.EROFS,
        errno.EACCES,
        errno.EPERM,
        errno.EFBIG,
        errno.EIO,
        errno.ENOTDIR,
    }
)
"""``errno`` values that say something about the output folder or its disk, not about the code."""

FREE_SPACE_MARGIN = 1.1
"""Free space wanted on top of a job's estimate (file system metadata, logs, temporary copies)."""


def _size(n: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:,.0f} {unit}" if unit == "bytes" else f"{n:,.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def _existing_ancestor(path: Path) -> Path:
    """``path`` itself when it exists, else its nearest existing ancestor (what creating it needs)."""
    current = path
    while not current.exists() and current != current.parent:
        current = current.parent
    return current


def _read_only_fs(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        return False


def check_output_folder(path: Path, *, needed_bytes: int = 0, key: str = "output") -> None:
    """Refuse, before any work, an output folder a job could not fill; ``key`` names the setting.

    ``path`` must be a folder or creatable as one (no file in the way), writable (``os.access``, which
    also answers no for a read-only file system, even to root), and its file system must have
    ``needed_bytes`` (an estimate of what the job writes) free, with a margin. Nothing is created or
    touched: a refused run changes nothing.
    """
    path = Path(path).absolute()
    base = _existing_ancestor(path)
    if not base.is_dir():
        what = "is a file" if base == path else f"cannot be created: {base} is a file"
        raise OutputError(f"{key}: {path} {what}, not a folder; choose another {key}")
    if not os.access(base, os.W_OK | os.X_OK, effective_ids=os.access in os.supports_effective_ids):
        reason = "read-only file system" if _read_only_fs(base) else "permission denied"
        where = "" if base == path else f" (it would be created inside {base})"
        raise OutputError(f"{key}: cannot write to {path}{where}: {reason}")
    if needed_bytes > 0:
        free = shutil.disk_usage(base).free
        wanted = int(needed_bytes * FREE_SPACE_MARGIN)
        if free < wanted:
            raise OutputError(
                f"{key}: {path} has {_size(free)} free on its file system, but this run writes about "
                f"{_size(needed_bytes)}; free some space or choose another {key}"
            )


def disk_fault(err: OSError, path: Path | str | None = None) -> OutputError | None:
    """The :class:`OutputError` that says what ``err`` means for ``path`` (or the file the error
    names), when it is a fault of the disk or folder rather than of the code; None otherwise."""
    if isinstance(err, OutputError) or err.errno not in DISK_FAULTS:
        return None
    where = path if path is not None else err.filename
    reason = err.strerror or str(err)
    hint = "; free some space and run again to resume" if err.errno in (errno.ENOSPC, errno.EDQUOT) else ""
    return OutputError(f"{where}: {reason}{hint}" if where else f"{reason}{hint}")


@contextlib.contextmanager
def disk_faults(path: Path | str) -> Iterator[None]:
    """Raise a disk fault met in the block (a full or read-only disk) as :func:`disk_fault`'s
    one-line :class:`OutputError` naming ``path``: for files written in place, such as the lines
    appended to a log, which the atomic writers do not cover."""
    try:
        yield
    except OSError as err:
        fault = disk_fault(err, path)
        if fault is None:
            raise
        raise fault from err


def _free_bytes(path: Path) -> int:
    return shutil.disk_usage(_existing_ancestor(Path(path).absolute())).free


def check_free_space(path: Path, needed_bytes: float, what: str) -> None:
    """Refuse (:class:`OutputError`, one line naming ``path``, the space ``what`` takes and the space
    free) to start writing ``what`` of about ``needed_bytes`` where the file system of ``path`` has
    less than that, with the margin, free."""
    free = _free_bytes(path)
    if free < needed_bytes * FREE_SPACE_MARGIN:
        raise OutputError(
            f"{path}: no room for {what}: it takes about {_size(needed_bytes)} and the file system has "
            f"{_size(free)} free; free some space and run again"
        )


def space_fault(err: OSError, path: Path, needed_bytes: float, what: str) -> OutputError | None:
    """:func:`disk_fault` of an error met while writing ``what`` (about ``needed_bytes``) under ``path``
    (or the :class:`OutputError` an atomic writer made of it); a full disk is said with the space
    ``what`` takes. None when the error is not the disk's."""
    cause = err.__cause__ if isinstance(err, OutputError) and isinstance(err.__cause__, OSError) else err
    if cause.errno not in (errno.ENOSPC, errno.EDQUOT):
        return err if isinstance(err, OutputError) else disk_fault(err, path)
    return OutputError(
        f"{path}: {cause.strerror or 'no space left'} while writing {what}, which takes about "
        f"{_size(needed_bytes)}; it was not kept: free some space and run again"
    )
