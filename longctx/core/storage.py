"""Output folders and the storage faults met while writing them, as one-line user errors.

Every job checks its output folder before it starts (:func:`check_output_folder`: not a file, on a
writable file system), without writing anything, so that a refused run changes nothing. A fault met
while writing (a full disk, a quota, a file system remounted read-only) ends the job with one line
naming the path (:func:`storage_error`) instead of a traceback; the job resumes when run again.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from longctx.core.errors import LongctxError

_MEANINGS = {
    errno.ENOSPC: "no space left on the device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "the file system is read-only",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
}


class StorageError(LongctxError):
    """Writing an output failed for a reason of the storage (full, read-only, not permitted)."""


def check_output_folder(path: str | os.PathLike, key: str = "output") -> None:
    """Refuse, with a :class:`StorageError` naming ``key`` and the path, an output folder that is a
    file, lies below a file, or cannot be written (read-only file system, no permission). Local
    paths only; nothing is created."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise StorageError(f"{key}: {path} is a file, not a folder")
    existing = path
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir():
        raise StorageError(f"{key}: {path} cannot be created, {existing} is a file")
    if not os.access(existing, os.W_OK | os.X_OK):
        problem = "the file system is read-only" if _read_only(existing) else "permission denied"
        raise StorageError(f"{key}: {existing} is not writable ({problem})")


def _read_only(path: Path) -> bool:
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except (OSError, AttributeError):
        return False


def storage_error(err: BaseException, where: str | os.PathLike) -> StorageError | None:
    """The one-line error for a storage fault ``err`` met while writing under ``where``, or None
    when ``err`` is not one (a bug, which keeps its traceback)."""
    if not isinstance(err, OSError):
        return None
    code = err.errno
    if code is None:  # pyarrow and some fsspec writers keep the errno only in the message
        text = str(err)
        code = next((c for c, m in ((errno.ENOSPC, "No space left"), (errno.EDQUOT, "quota")) if m in text), None)
    if code not in _MEANINGS:
        return None
    target = err.filename or where
    return StorageError(f"{target}: {_MEANINGS[code]}; free space or fix the output folder, then run again to resume")
