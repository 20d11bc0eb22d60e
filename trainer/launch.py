"""Starting a training job on this machine under torchrun (``torch.distributed.run``).

``longctx train --nproc N`` and the demo both start their ranks here, with the same command: the
current interpreter, ``--standalone`` rendezvous, ``N`` processes, each running a Python module
(``python -m <module> <args>``). The caller names the module, so this launcher knows nothing of the
command line it starts.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence

TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
"""Variables a torchrun job sets for its ranks; a new job must not inherit them from its parent."""


def torchrun_command(nproc: int, module: str, args: Sequence[str]) -> list[str]:
    """The command that runs ``python -m module *args`` as ``nproc`` local ranks."""
    if nproc < 1:
        raise ValueError(f"nproc must be at least 1, got {nproc}")
    return [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={nproc}",
        "-m",
        module,
        *args,
    ]


def launch(nproc: int, module: str, args: Sequence[str]) -> int:
    """Run ``python -m module *args`` as ``nproc`` local ranks under torchrun; returns its exit status."""
    env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_ENV}
    return subprocess.call(torchrun_command(nproc, module, args), env=env)
