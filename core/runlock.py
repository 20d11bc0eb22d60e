"""One run of a job per output folder: a lock file holding the owner's pid and host.

``longctx train`` takes ``<output>/train/.lock``, ``longctx curate`` and ``longctx pack``
``<output>/work/<job>/.lock``, before they read or write anything of the run, and remove it when
they end. A second run of the job on the same output while the first one is alive is refused with
one line naming the owner. The file is also held with ``flock``, so the kernel releases it when
its owner dies, however it dies; a lock left by a dead process *on this host* (its pid gone, or
reused by another process) is taken over with a message. A lock owned by another host is never
taken over (its process cannot be checked from here): the message says how to remove it.

Under ``longctx train --nproc N`` the launcher holds the lock for the whole job and tells its ranks
through :data:`HELD_ENV`; otherwise rank 0 holds it (the initialized process group's rank, else
torchrun's ``RANK``: ranks started by other means, e.g. ``torch.multiprocessing``, set no ``RANK``).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from longctx.core.errors import LongctxError
from longctx.core.lifetime import process_exists

LOCK_NAME = ".lock"
HELD_ENV = "LONGCTX_RUN_LOCK"
"""Set by the process holding the lock for its child processes: the lock file's path."""


class RunLockedError(LongctxError):
    """Another live run holds the output folder."""


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux), to tell a reused pid apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _alive(owner: dict) -> bool:
    pid = int(owner.get("pid", -1))
    if pid <= 0:
        return False
    if not process_exists(pid):
        return False
    started = owner.get("start_time")
    return started is None or _start_time(pid) in (None, started)


def _describe(owner: dict) -> str:
    if owner.get("pid") is None:  # the owner holds the flock but has not written its details yet
        return "it is just starting"
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(owner.get("since", 0)))
    return f"pid {owner.get('pid')} on host {owner.get('host')}, since {since}"


def _read(fd: int) -> dict:
    os.lseek(fd, 0, os.SEEK_SET)
    try:
        data = json.loads(os.read(fd, 4096) or b"{}")
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


def _rank() -> int:
    """This process's rank: the initialized process group's (without importing torch), else ``RANK``."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0"))


@contextlib.contextmanager
def run_lock(folder: Path, job: str) -> Iterator[Path | None]:
    """Hold ``folder/.lock`` for the duration of the block (yields its path) for a run of ``job``
    (``train``, ``curate``, ``pack``: named in the messages), or yield None when this process does
    not hold it itself: a rank other than 0, or a rank whose launcher holds it.

    Raises :class:`RunLockedError` when a live run holds it. The folders this call creates (``folder``
    and any missing parent) are removed again at the end when left empty (a refused run changes nothing).
    """
    path = folder / LOCK_NAME
    if os.environ.get(HELD_ENV) == str(path) or _rank() != 0:
        yield None
        return
    created = [p for p in (folder, *folder.parents) if not p.exists()]  # innermost first
    folder.mkdir(parents=True, exist_ok=True)
    fd = _acquire(path, job)
    try:
        yield path
    finally:
        with contextlib.suppress(OSError):
            path.unlink()
        os.close(fd)
        for made in created:
            try:
                made.rmdir()  # only when empty
            except OSError:
                break


def _acquire(path: Path, job: str) -> int:
    host = socket.gethostname()
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _read(fd)
            os.close(fd)
            raise RunLockedError(
                f"{path}: another longctx {job} is running on this output ({_describe(owner)}); "
                "wait for it to finish or stop it"
            ) from None
        try:
            same_file = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same_file = False
        if not same_file:  # the previous owner removed it between our open and our flock: retry
            os.close(fd)
            continue
        owner = _read(fd)
        if owner.get("pid") is not None:
            if owner.get("host") != host:
                os.close(fd)
                raise RunLockedError(
                    f"{path}: held by a run on another host ({_describe(owner)}); if that run is gone, "
                    "delete the file and start again"
                )
            if _alive(owner):
                os.close(fd)
                raise RunLockedError(
                    f"{path}: another longctx {job} is running on this output ({_describe(owner)}); "
                    "wait for it to finish or stop it"
                )
            print(
                f"longctx {job}: taking over the stale lock {path} of {_describe(owner)}, no longer running",
                file=sys.stderr,
                flush=True,
            )
        me = {"pid": os.getpid(), "host": host, "since": time.time(), "start_time": _start_time(os.getpid())}
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, json.dumps(me).encode())
        os.fsync(fd)
        return fd
