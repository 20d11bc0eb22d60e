"""Is the engine an ``executor`` section names usable from here? Asked before a job writes anything.

``kind: ray`` needs the ``ray`` package (the ``ray`` extra) and a Ray cluster that answers at the
configured address (``ray.address``, else ``RAY_ADDRESS``); this process connects to it here, once, and
the job's stages then run there. ``kind: slurm`` needs Slurm's ``sbatch`` on the PATH, and a
controller that would take the job (``sbatch --test-only``). Each missing piece is one
:class:`~longctx.core.errors.EngineError` naming the extra to install, the command that is missing
(or its message) or the address that did not answer.

A cluster with token authentication (Ray's ``RAY_AUTH_MODE=token``, which Ray turns on by itself for
a cluster started where a token exists) is used given its address alone: its head is asked first
whether it takes a request without the token, and when it does not, Ray's client here sends the token
from where Ray keeps it (``RAY_AUTH_TOKEN``, else the file ``RAY_AUTH_TOKEN_PATH`` names, else
``~/.ray/auth_token``). Ray's client sends it only when told to (``RAY_AUTH_MODE=token``), and a
client that lacks it, or holds a wrong one, retries for 20 s before it says that it cannot connect;
here either is one line naming where the token is looked for, at once. The token itself is never
shown, logged nor recorded.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import subprocess
from pathlib import Path

from longctx.core.config import ExecutorConfig, SlurmConfig
from longctx.core.errors import EngineError

CONNECT_TIMEOUT_S = 5.0
"""How long an address may take to accept a connection before the cluster is declared unreachable."""

_connected: str | None = None
"""The address this process is connected to through :func:`connect_ray`."""

_token_mode_here = False
"""Whether :func:`connect_ray` set ``RAY_AUTH_MODE=token`` in this process (not its user)."""

_TOKEN_HELP = "`ray get-auth-token` on the head node prints it"


def check_engine(cfg: ExecutorConfig, key: str, *, verbose: bool = False) -> None:
    """Refuse, with one line, an executor whose engine is not usable from this machine; on Ray, connect
    to the cluster. ``key`` is the section's dotted name (``curate.executor``), for the message."""
    if cfg.kind == "slurm" and shutil.which("sbatch") is None:
        raise EngineError(
            f"{key}.kind is 'slurm' but sbatch is not on the PATH: run on a machine that submits to the "
            "cluster (a login node), with Slurm's client commands installed"
        )
    if cfg.kind == "slurm":
        assert cfg.slurm is not None  # the config validator guarantees it
        _try_sbatch(cfg.slurm, key)
    if cfg.kind == "ray":
        connect_ray(cfg, key, verbose=verbose)


SBATCH_TIMEOUT_S = 120.0
"""How long ``sbatch --test-only`` may take (without a controller, sbatch itself gives up after 18 s)."""


def _try_sbatch(slurm: SlurmConfig, key: str) -> None:
    """Refuse, with sbatch's own message, a job Slurm would not take from here: ``sbatch --test-only``
    (which submits nothing) with the section's settings, for a job that runs ``true``. Without it, the
    first stage's submission fails after the run has written its folder, with a traceback."""
    options = {
        "partition": slurm.partition,
        "time": slurm.time,
        "cpus-per-task": str(slurm.cpus_per_task),
        "mem-per-cpu": f"{slurm.mem_per_cpu_gb}G",
        "qos": slurm.qos,
        **slurm.sbatch_args,
    }
    command = ["sbatch", "--test-only", *(f"--{k}={v}" if v else f"--{k}" for k, v in options.items())]
    try:
        done = subprocess.run(
            [*command, "--wrap=true"], capture_output=True, text=True, timeout=SBATCH_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        raise EngineError(
            f"{key}.kind is 'slurm' but sbatch --test-only got no answer from Slurm in "
            f"{SBATCH_TIMEOUT_S:.0f} s"
        ) from None
    if done.returncode != 0:
        said = [line.strip() for line in done.stderr.splitlines() if line.strip()]
        message = said[-1] if said else f"exit status {done.returncode}"
        raise EngineError(
            f"{key}.kind is 'slurm' but sbatch cannot submit from here (sbatch --test-only: {message})"
        )


def ray_address(cfg: ExecutorConfig, key: str) -> str:
    """The cluster's address: the config's, else ``RAY_ADDRESS``."""
    address = cfg.ray.address or os.environ.get("RAY_ADDRESS")
    if not address:
        raise EngineError(
            f"{key}.kind is 'ray' but no Ray cluster is named: set {key}.ray.address to its head's "
            "host:port (what `ray start --head` prints) or set RAY_ADDRESS"
        )
    return address


def _origin(address: str, key: str) -> str:
    """Where the address comes from, for a message: the config's key, or ``RAY_ADDRESS``."""
    return f"{key}.ray.address" if os.environ.get("RAY_ADDRESS") != address else "RAY_ADDRESS"


def _probe(address: str, key: str) -> None:
    """Refuse a ``host:port`` (or ``ray://host:port``) address nothing accepts connections at."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    origin = _origin(address, key)
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


def _token(there: str) -> tuple[str, str | None]:
    """Where Ray's client takes its token from, in Ray's order, and the token (None: none there):
    ``RAY_AUTH_TOKEN`` when not empty, else the file ``RAY_AUTH_TOKEN_PATH`` names (which must be
    readable and not empty: Ray aborts otherwise, refused here in one line starting with ``there``),
    else ``~/.ray/auth_token``."""
    if os.environ.get("RAY_AUTH_TOKEN"):
        return "RAY_AUTH_TOKEN", os.environ["RAY_AUTH_TOKEN"].strip()
    named = os.environ.get("RAY_AUTH_TOKEN_PATH")
    path = Path(named) if named else Path.home() / ".ray" / "auth_token"
    try:
        token = path.read_text().strip()
    except OSError as err:
        if not named:
            return str(path), None
        problem = f"cannot be read ({err.strerror})"
    else:
        if token or not named:
            return (f"{path} (RAY_AUTH_TOKEN_PATH)" if named else str(path)), token or None
        problem = "is empty"
    raise EngineError(
        f"{there} requires token authentication and RAY_AUTH_TOKEN_PATH names {path}, which {problem}"
    )


def _unauthenticated(address: str, token: str | None) -> bool | None:
    """Whether the head (GCS) at ``host:port`` refuses a request that carries ``token`` (or none) as
    unauthenticated; None when it does not answer as Ray's GCS does (``ray.init`` then says why)."""
    import grpc

    try:
        from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc
    except ImportError:  # a Ray that has no such service: it has no token authentication either
        return None
    metadata = [("authorization", f"Bearer {token}")] if token is not None else []
    with grpc.insecure_channel(address, options=[("grpc.enable_http_proxy", 0)]) as channel:
        try:
            gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel).GetClusterId(
                gcs_service_pb2.GetClusterIdRequest(), timeout=CONNECT_TIMEOUT_S, metadata=metadata
            )
        except grpc.RpcError as err:
            return True if err.code() == grpc.StatusCode.UNAUTHENTICATED else None
    return False


def _send_token(on: bool) -> None:
    """From the next ``ray.init`` on, Ray's client in this process sends its token (or not), as
    ``RAY_AUTH_MODE=token`` in its environment would have it; Ray reads its settings when it is
    imported, so they are read again."""
    from ray._raylet import AuthenticationTokenLoader, Config

    global _token_mode_here
    if on:
        os.environ["RAY_AUTH_MODE"] = "token"
    else:
        os.environ.pop("RAY_AUTH_MODE", None)
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()
    _token_mode_here = on


def _authenticate(address: str, origin: str) -> None:
    """Make Ray's client send the token when the cluster at ``host:port`` requires one; refuse, in
    one line, a token that is missing or that the cluster refuses. A ``RAY_AUTH_MODE`` other than
    ``token`` set by the user is left to Ray."""
    mode = None if _token_mode_here else os.environ.get("RAY_AUTH_MODE")
    if mode is not None and mode.lower() != "token":
        return
    if not _unauthenticated(address, None):  # no token needed, or not a GCS that says so
        if _token_mode_here:
            _send_token(False)  # a token is sent only where one is needed
        return
    there = f"{origin} {address}: the Ray cluster"
    where, token = _token(there)
    if token is None:
        raise EngineError(
            f"{there} requires token authentication and no token was found: set RAY_AUTH_TOKEN, or "
            f"RAY_AUTH_TOKEN_PATH to a file holding it, or write it to ~/.ray/auth_token ({_TOKEN_HELP})"
        )
    if _unauthenticated(address, token):
        raise EngineError(
            f"{there} refused the token in {where}: set the cluster's token there ({_TOKEN_HELP})"
        )
    if mode is None and not _token_mode_here:
        _send_token(True)


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
    if address != "auto" and not address.startswith("ray://"):
        _authenticate(address, _origin(address, key))
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
