"""Running the ``longctx`` command in a subprocess with a fault injected, to see exactly what a user
sees (its stderr, its exit status) when the fault happens in the middle of a run.

The faults are installed in the subprocess before the command runs:

* ``full_disk_after=N``: every ``.tmp`` file an atomic writer opens (:mod:`longctx.core.atomic`)
  takes at most N bytes; the write that goes beyond fails with ``ENOSPC`` after writing what fits,
  as on a disk that fills up. Used where a real small file system cannot be mounted, and for
  precise control of where the fault happens.
* ``no_space_estimate``: the packer's free-space estimate says 0 bytes, so a run starts on a disk
  that is too small and meets the real ``ENOSPC`` while it runs.
"""

from __future__ import annotations

import errno
import io
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]


class FillingFile(io.FileIO):
    """A file on a disk with ``room`` bytes left: writes what fits, then fails with ENOSPC."""

    room = 0

    def write(self, data: Any) -> int:
        data = memoryview(data).cast("B")
        if self.tell() + len(data) > self.room:
            super().write(data[: max(0, self.room - self.tell())])
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().write(data)


def install(full_disk_after: int | None = None, no_space_estimate: bool = False) -> None:
    """Install the faults in this process (called in the subprocess)."""
    if full_disk_after is not None:
        from longctx.core import atomic

        FillingFile.room = full_disk_after
        atomic.open = lambda path, mode="r": FillingFile(path, mode.replace("b", ""))  # type: ignore[attr-defined]
    if no_space_estimate:
        from longctx.packer import run

        run.estimated_output_bytes = lambda layout, plan: 0


def run_longctx(argv: list[str], timeout: float = 300, **faults: Any) -> subprocess.CompletedProcess[str]:
    """``longctx ARGV`` in a subprocess with ``faults`` (keywords of :func:`install`) installed."""
    code = (
        "import sys, json\n"
        "from tests.core.faults import install\n"
        f"install(**json.loads({json.dumps(json.dumps(faults))}))\n"
        "from longctx.cli import main\n"
        f"sys.exit(main({argv!r}))\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO_ROOT,
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
