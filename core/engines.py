"""Is the engine an ``executor`` section names usable from here? Asked before a job writes anything.

``kind: ray`` needs the ``ray`` package (the ``ray`` extra) and a Ray cluster that answers at the
configured address (``ray.address``, else ``RAY_ADDRESS``); this process connects to it here, once, and
the job's stages then run there. ``kind: slurm`` needs Slurm's ``sbatch`` on the PATH. Each missing
piece is one :class:`~longctx.core.errors.EngineError` naming the extra to install, the command that is
missing or the address that did not answer.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket

from longctx.core.config import ExecutorConfig
from longctx.core.errors import EngineError

CONNECT_TIMEOUT_S = 5.0
"""How long an address may take to accept a connection before the cluster is declared unreachable."""

_connected: str | None = None
"""The address this process is connected to through :func:`connect_ray`."""


def check_engine(cfg: ExecutorConfig, key: str, *, verbose: bool = False) -> None:
    """Refuse, with one line, an executor whose engine is not usable from this machine; on Ray, connect
    to the cluster. ``key`` is the section's dotted name (``curate.executor``), for the message."""
    if cfg.kind == "slurm" and shutil.which("sbatch") is None:
        raise EngineError(
            f"{key}.kind is 'slurm' but sbatch is not on the PATH: run on a machine that submits to the "
            "cluster (a login node), with Slurm's client commands installed"
        )
    if cfg.kind == "ray":
        connect_ray(cfg, key, verbose=verbose)


def ray_address(cfg: ExecutorConfig, key: str) -> str:
    """The cluster's address: the config's, else ``RAY_ADDRESS``."""
    address = cfg.ray.address or os.environ.get("RAY_ADDRESS")
    if not address:
        raise EngineError(
            f"{key}.kind is 'ray' but no Ray cluster is named: set {key}.ray.address to its head's "
            "host:port (what `ray start --head` prints) or set RAY_ADDRESS"
        )
    return address


def _probe(address: str, key: str) -> None:
    """Refuse a ``host:port`` (or ``ray://host:port``) address nothing accepts connections at."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    origin = f"{key}.ray.address" if os.environ.get("RAY_ADDRESS") != address else "RAY_ADDRESS"
    if not host or not port.isdigit():
        raise EngineError(f"{origin} {address!r} is not host:port, 'auto' or ray://host:port")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as err:
        reason = err.strerror or type(err).__name__
        raise EngineError(
            f"{origin} {address}: no Ray cluster answers there ({reason}); start one with "
            "`ray start --head` or correct the address"
        ) from None


def connect_ray(cfg: ExecutorConfig, key: str, *, verbose: bool = False) -> None:
    """Connect this process to the configured Ray cluster (kept connected for the job's stages; a
    connection to another cluster is closed first)."""
    try:
        import ray
    except ImportError:
        raise EngineError(
            f"{key}.kind is 'ray' but ray is not installed here: pip install 'longctx[ray]'"
        ) from None
    address = ray_address(cfg, key)
    if address != "auto":
        _probe(address, key)
    global _connected
    if ray.is_initialized():
        if _connected == address:
            return
        ray.shutdown()
    try:
        ray.init(
            address=address,
            logging_level=logging.INFO if verbose else logging.WARNING,
            log_to_driver=verbose,
        )
    except (ConnectionError, TimeoutError, RuntimeError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise EngineError(f"{key}: cannot connect to the Ray cluster at {address}: {first}") from None
    _connected = address
