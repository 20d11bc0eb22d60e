"""A real Ray cluster on this machine, for the tests and the cluster benchmark.

``ray start --head`` with a fixed number of CPUs, every port chosen free (so that two clusters on
one machine do not collide), its temporary folder and object store under a folder of its own, and
every process it starts marked in its environment. It uses token authentication, as Ray clusters do
once a token exists on their machine (``ray.init()`` writes one to ``~/.ray/auth_token``), with a
token of its own in its folder (``RAY_AUTH_TOKEN_PATH``) and that folder as its processes' home, so
that the machine's ``~/.ray`` is neither read nor written. Stopping it ends exactly those processes, found by
that mark or by the files they hold open in the cluster's folder (by id: SIGTERM, then SIGKILL), and
removes the folder. ``ray stop --force`` is not used: it ends every
Ray process of the machine, other users' clusters included.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

MARKER_KEY = "LONGCTX_TEST_RAY_CLUSTER"
RAY = Path(sys.executable).with_name("ray")


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cluster_processes(mark: str, temp: Path) -> list[int]:
    """Live processes of one test cluster: those whose environment holds ``MARKER_KEY=mark``, and those
    holding a file open under its folder ``temp`` (every Ray process keeps its log files there open).
    The second test is needed: Ray's agents write their process title over their environment, so
    the marker cannot always be read, and an agent that outlived its raylet would be missed."""
    needle = f"{MARKER_KEY}={mark}".encode()
    inside = str(temp) + os.sep
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            if state in ("Z", "X"):
                continue
            if needle in (entry / "environ").read_bytes().split(b"\0") or any(
                os.readlink(fd).startswith(inside) for fd in (entry / "fd").iterdir()
            ):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


AUTH_VARIABLES = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
"""The environment variables through which Ray finds its authentication mode and token."""


@dataclass(frozen=True)
class RayCluster:
    """A running local cluster: its address (``ray.init(address=...)``, ``RAY_ADDRESS``), CPUs,
    temporary folder, the marker its processes carry and the file holding its token."""

    address: str
    num_cpus: int
    temp_dir: Path
    mark: str
    token_path: Path = field(repr=False)

    def client_env(self, **more: str) -> dict[str, str]:
        """This process's environment for a client of the cluster: Ray's authentication variables
        replaced by ``RAY_AUTH_TOKEN_PATH``, the cluster's token file (no address), and ``more``."""
        env = {k: v for k, v in os.environ.items() if k not in AUTH_VARIABLES and k != "RAY_ADDRESS"}
        return env | {"RAY_AUTH_TOKEN_PATH": str(self.token_path)} | more

    def processes(self) -> list[int]:
        return cluster_processes(self.mark, self.temp_dir)

    def task_workers(self, name: str) -> list[int]:
        """The cluster's worker processes running an actor or task whose name starts with ``name``."""
        return [pid for pid in self.processes() if command_line(pid).startswith(f"ray::{name}")]


def stop_processes(pids_of, timeout_s: float = 15.0) -> list[int]:
    """SIGTERM every process ``pids_of()`` lists, SIGKILL those left after a while; returns the
    processes still alive at the end (none unless one could not be killed)."""
    for sig, wait_s in ((signal.SIGTERM, timeout_s / 3), (signal.SIGKILL, timeout_s)):
        for pid in pids_of():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + wait_s
        while pids_of() and time.monotonic() < deadline:
            time.sleep(0.1)
        if not pids_of():
            return []
    return pids_of()


@contextlib.contextmanager
def local_ray_cluster(num_cpus: int = 2) -> Iterator[RayCluster]:
    """Start a one-node Ray cluster with ``num_cpus`` CPUs and token authentication; stop it and
    remove its files at the end, even when the body fails."""
    temp = Path(tempfile.mkdtemp(prefix="lcray-"))
    mark = uuid.uuid4().hex
    token_path = temp / "auth_token"
    token_path.write_text(secrets.token_hex(16))
    (temp / "home").mkdir()
    env = {k: v for k, v in os.environ.items() if k not in AUTH_VARIABLES and k != "RAY_ADDRESS"}
    env |= {MARKER_KEY: mark, "TMPDIR": str(temp), "RAY_USAGE_STATS_ENABLED": "0", "HOME": str(temp / "home")}
    env |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token_path)}
    port = free_port()
    command = [
        str(RAY),
        "start",
        "--head",
        "--node-ip-address",
        "127.0.0.1",
        "--num-cpus",
        str(num_cpus),
        "--port",
        str(port),
        "--disable-usage-stats",
        "--include-dashboard=false",
        "--temp-dir",
        str(temp),
        "--plasma-directory",
        str(temp),
        "--object-store-memory",
        str(100 << 20),
    ]
    for flag in (
        "--ray-client-server-port",
        "--dashboard-port",
        "--dashboard-agent-listen-port",
        "--dashboard-agent-grpc-port",
        "--runtime-env-agent-port",
        "--metrics-export-port",
    ):
        command += [flag, str(free_port())]
    try:
        started = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
        if started.returncode != 0:
            raise RuntimeError(f"ray start failed ({started.returncode}):\n{started.stderr[-3000:]}")
        address = (temp / "ray_current_cluster").read_text().strip()
        yield RayCluster(address, num_cpus, temp, mark, token_path)
    finally:
        left = stop_processes(lambda: cluster_processes(mark, temp))
        shutil.rmtree(temp, ignore_errors=True)
        if left:
            raise RuntimeError(f"Ray processes left after stopping the cluster: {left}")
