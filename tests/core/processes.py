"""Finding every process a command started, even after the command itself is gone.

A command is started with a unique marker in its environment; every process it starts (forked or
executed) inherits it, so after the command is killed its descendants can still be found in
``/proc/<pid>/environ``, whatever became of their parent. Linux only (the tests that use it skip
elsewhere).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

MARKER_KEY = "LONGCTX_TEST_PROCESS_MARK"
HAS_PROC = Path("/proc/self/environ").is_file()


def marked_env() -> tuple[dict[str, str], str]:
    """A copy of the environment with a fresh marker, and the marker."""
    mark = uuid.uuid4().hex
    return {**os.environ, MARKER_KEY: mark}, mark


def marked_processes(mark: str) -> list[int]:
    """Live (non-zombie) processes whose environment holds ``mark``."""
    needle = f"{MARKER_KEY}={mark}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if needle not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if state not in ("Z", "X"):
            found.append(int(entry.name))
    return found


def survivors_after(mark: str, seconds: float) -> list[int]:
    """Processes holding ``mark`` that are still alive ``seconds`` from now (returns early when none)."""
    deadline = time.monotonic() + seconds
    while (alive := marked_processes(mark)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive


def parent_pid(pid: int) -> int | None:
    """The parent of process ``pid`` (None when it is gone)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


def describe(pids: list[int]) -> str:
    lines = []
    for pid in pids:
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        lines.append(f"pid {pid} (parent {parent_pid(pid)}): {cmd[:200]}")
    return "\n".join(lines)


def kill_survivors(pids: list[int]) -> None:
    """Clean up after a failed assertion: kill the processes this test started."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def longctx_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "longctx.cli", *args]


def start_marked(command: list[str]) -> tuple[subprocess.Popen, str]:
    """Start ``command`` with a fresh marker (output discarded)."""
    env, mark = marked_env()
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return process, mark


def wait_for(condition, process: subprocess.Popen, timeout: float, what: str) -> None:
    """Poll ``condition()`` until true; fail when ``process`` ended first or time ran out."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, f"the command ended (status {process.returncode}) before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)
