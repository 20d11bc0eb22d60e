"""Real disk faults for tests: a small file system that fills up, and a read-only folder.

Both are the kernel's own behaviour, not a mock: a ``tmpfs`` of a few hundred KiB really answers
``ENOSPC``, and a read-only bind mount really answers ``EROFS`` (even to root, whom permission bits
do not stop). Mounting needs root (or ``CAP_SYS_ADMIN``); where it is not allowed the tests skip
with the reason, and the simulated faults of ``tests/core/test_preflight.py`` still run. As a normal
user, ``read_only`` removes the write permission instead.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


def _mount(*args: str) -> str | None:
    """Run ``mount``; None when it worked, else why not."""
    if shutil.which("mount") is None:
        return "no mount command"
    result = subprocess.run(["mount", *args], check=False, capture_output=True, text=True)
    return None if result.returncode == 0 else (result.stderr.strip() or f"mount exited {result.returncode}")


def _umount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], check=False, capture_output=True)


@contextlib.contextmanager
def small_disk(path: Path, size_kib: int) -> Iterator[Path]:
    """A ``tmpfs`` of ``size_kib`` KiB mounted at ``path`` (created); skips the test where mounting
    is not allowed."""
    path.mkdir(parents=True, exist_ok=True)
    why = _mount("-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(path))
    if why:
        pytest.skip(f"cannot mount a small tmpfs to fill up ({why}); the simulated ENOSPC tests still run")
    try:
        yield path
    finally:
        _umount(path)


def resize(path: Path, size_kib: int) -> None:
    """Grow (or shrink) the tmpfs mounted at ``path``."""
    why = _mount("-o", f"remount,size={size_kib}k", str(path))
    assert why is None, why


@contextlib.contextmanager
def read_only(path: Path) -> Iterator[Path]:
    """``path`` (a folder) read-only meanwhile: a read-only bind mount as root, the write permission
    bits removed otherwise."""
    if os.geteuid() != 0:
        modes = {p: p.stat().st_mode for p in [path, *path.rglob("*")] if p.is_dir()}
        for p, mode in modes.items():
            p.chmod(mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
        try:
            yield path
        finally:
            for p, mode in modes.items():
                p.chmod(mode)
        return
    why = _mount("--bind", str(path), str(path))
    if why:
        pytest.skip(f"cannot bind-mount {path} read-only ({why})")
    try:
        why = _mount("-o", "remount,ro,bind", str(path))
        if why:
            pytest.skip(f"cannot remount {path} read-only ({why})")
        yield path
    finally:
        _umount(path)


def tree(path: Path, folder_times: bool = True) -> dict[str, tuple[int, int]]:
    """Every file and folder under ``path`` with its size and modification time: equal before and
    after a refused run when it changed nothing. Without ``folder_times``, a folder's modification
    time is left out (a refused run of a job that holds a lock file in it, created and removed, changes
    that time and nothing else)."""
    return {
        str(p.relative_to(path)): (
            (p.stat().st_size, p.stat().st_mtime_ns)
            if p.is_file()
            else (-1, p.stat().st_mtime_ns * folder_times)
        )
        for p in sorted(path.rglob("*"))
    }
