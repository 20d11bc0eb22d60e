"""Console progress for multi-stage jobs whose executors log verbosely.

datatrove's tasks log every step at INFO level to stderr. Locally, longctx sends that stream to a
log file and prints one line per stage and per finished task instead (``--verbose`` keeps the
datatrove logs on the console).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def stderr_to_file(path: Path) -> Iterator[None]:
    """Point file descriptor 2 (and so every child process's stderr) at ``path`` meanwhile."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "ab") as log:
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


# Held while the progress thread prints, and by os.fork() (a pool starting its workers meanwhile):
# a child forked in the middle of a print would find sys.stdout's lock taken, for good.
_print_lock = threading.Lock()
os.register_at_fork(
    before=_print_lock.acquire, after_in_parent=_print_lock.release, after_in_child=_print_lock.release
)


@contextlib.contextmanager
def task_progress(label: str, completions: Path, total: int, interval: float = 1.0) -> Iterator[None]:
    """Print ``label: k/total tasks done`` whenever the number of completion markers changes."""
    stop = threading.Event()
    start = time.monotonic()

    def count() -> int:
        return sum(1 for _ in completions.iterdir()) if completions.is_dir() else 0

    def watch() -> None:
        last = count()
        while not stop.wait(interval):
            now = count()
            if now != last:
                with _print_lock:
                    print(
                        f"  {label}: {now}/{total} tasks done ({time.monotonic() - start:.0f} s)", flush=True
                    )
                last = now

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def tail(path: Path, lines: int = 30) -> str:
    """The last ``lines`` lines of a text file (for error messages)."""
    if not path.exists():
        return ""
    return "\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:])
