"""What the benchmark scripts share: where the corpus is, and timing that counts every process.

Benchmarks here run as plain scripts (``python tests/benchmarks/bench_X.py``), so this module is
imported as a sibling. Timings keep every repetition (reported as median and min-max), wall time and
CPU time both; CPU time includes the work of child processes and of their orphaned descendants (the
workers of datatrove's local executor are children of its forkserver, which nobody waits for) once
this process has become their subreaper.
"""

from __future__ import annotations

import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

REPO = Path(__file__).resolve().parents[2]
CORPUS = Path(os.environ.get("LONGCTX_SHARED_CORPUS", REPO.parent / "shared" / "corpus"))
"""The shared corpus, found like the tests find it."""

T = TypeVar("T")


def commit() -> str | None:
    """For reports: the checkout's commit (None outside a git checkout), with ``+changes`` when
    tracked files differ from it."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True
        ).stdout

    try:
        head, dirty = (
            git("rev-parse", "--short", "HEAD").strip(),
            git("status", "--porcelain", "-uno").strip(),
        )
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+changes" if dirty else "")


def require_corpus(corpus: Path, script: str) -> None:
    """Exit with one line (status 2) when ``corpus`` lacks the books/ and papers/ folders."""
    if not (corpus / "books").is_dir() or not (corpus / "papers").is_dir():
        print(
            f"{script}: shared corpus not found at {corpus} (books/ and papers/); "
            "set LONGCTX_SHARED_CORPUS or pass --corpus",
            file=sys.stderr,
        )
        sys.exit(2)


def become_subreaper(script: str) -> None:
    """Adopt orphaned descendants, so that reaping them counts their CPU time in ``RUSAGE_CHILDREN``."""
    import ctypes

    PR_SET_CHILD_SUBREAPER = 36
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        sys.exit(
            f"{script}: cannot become a child subreaper (Linux only); CPU times would miss worker processes"
        )


def reap_descendants() -> None:
    """Wait for every finished child, adopted orphans included (their CPU time then counts)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def cpu_seconds() -> float:
    """CPU seconds of this process and of every child reaped so far."""
    reap_descendants()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def fmt(values: list[float]) -> str:
    """Median and [min-max] of repeated measurements."""
    return f"{statistics.median(values):7.2f} [{min(values):.2f}-{max(values):.2f}]"


@dataclass
class Samples:
    """Wall and CPU seconds of every repetition of one contender."""

    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)

    def run(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` once, record its times, return its result."""
        start, start_cpu = time.perf_counter(), cpu_seconds()
        result = fn()
        self.wall.append(time.perf_counter() - start)
        self.cpu.append(cpu_seconds() - start_cpu)
        return result

    @property
    def median_wall(self) -> float:
        return statistics.median(self.wall)

    @property
    def median_cpu(self) -> float:
        return statistics.median(self.cpu)

    def __str__(self) -> str:
        return f"wall {fmt(self.wall)} s, CPU {fmt(self.cpu)} s"
