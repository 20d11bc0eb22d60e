"""Starting a training job's ranks on this machine, and the ranks' side of the bargain.

``longctx train --nproc N`` and the demo run the torch elastic agent (what ``torchrun --standalone``
runs) *in this process*: N ranks, each ``python -m <module> <args>``. On several machines
(``--nnodes M --rdzv-endpoint HOST:PORT``), one such agent runs on each; they meet at the endpoint (a
c10d rendezvous, hosted by the agent on that machine) and form one job of M x N ranks, numbered in the
order the agents joined, N consecutive ranks per agent. Running the agent here rather than as a
``torchrun`` child means nothing sits between the launcher and its ranks, so:

- **Killing the launcher stops the ranks.** The agent starts each rank in its own session (so a
  signal to the launcher's process group does not reach them). Each rank therefore asks the kernel
  for ``SIGTERM`` when its parent dies (``PR_SET_PDEATHSIG``) and, should that be missed, a watchdog
  thread ends it within a second of its parent being gone. SIGTERM/SIGINT to the launcher make the
  agent stop the ranks (SIGTERM, then SIGKILL), as torchrun does.
- **A user error is one line.** A rank failing with a :class:`~longctx.core.errors.LongctxError`
  (a damaged shard, a refused config, a full disk) records its message in the job's error file (its
  space set aside before the ranks start, so a full disk does not stop it) and exits with status 2;
  ranks that then fail because that rank is gone (a broken collective) exit quietly; the launcher
  prints the recorded line and returns 2. Other failures keep their traceback.
- **Nothing is left behind.** The agent's per-rank logs and the error file live in a job folder the
  caller names (inside the run folder), removed when the job ends and again before the next one.
- **A lost machine ends the job in one line.** When another agent of a multi-node job dies (its
  machine failed, it was killed), this agent's ranks find their collectives broken: each records one
  line saying so (the first wins) and exits; this agent stops the others and prints it. Losing the
  rendezvous itself (the agent that hosted it died) is one line too.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import re
import shutil
import signal
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from longctx.core.lifetime import process_exists

TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
"""Variables a torchrun job sets for its ranks; a new job must not inherit them from its parent."""
PARENT_ENV = "LONGCTX_LAUNCHER_PID"
ERROR_FILE_ENV = "LONGCTX_ERROR_FILE"
_PR_SET_PDEATHSIG = 1


def torchrun_command(nproc: int, module: str, args: Sequence[str]) -> list[str]:
    """The equivalent ``torchrun`` command line, for users who start the ranks themselves."""
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


@contextlib.contextmanager
def _job_environment(updates: dict[str, str]) -> Iterator[None]:
    """``os.environ`` with torchrun's variables removed and ``updates`` set (the agent builds each
    rank's environment from this process's), restored afterwards."""
    saved = dict(os.environ)
    for key in TORCHRUN_ENV:
        os.environ.pop(key, None)
    os.environ.update(updates)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@dataclass(frozen=True)
class Rendezvous:
    """Where the agents of a job meet: ``nnodes`` agents (one per machine) at ``endpoint``
    (``host:port`` of one of them, which hosts it), under ``run_id``, which every agent of the job
    must share. One agent alone meets itself on a free local port."""

    nnodes: int = 1
    endpoint: str = "localhost:0"
    run_id: str = ""
    join_timeout_s: int = 600

    def __post_init__(self) -> None:
        if self.nnodes < 1:
            raise ValueError(f"nnodes must be at least 1, got {self.nnodes}")
        if self.nnodes > 1 and self.endpoint.rpartition(":")[2] in ("", "0"):
            raise ValueError("a job of several agents needs their meeting point: HOST:PORT")


def launch(
    nproc: int,
    module: str,
    args: Sequence[str],
    job_dir: Path,
    env: dict[str, str] | None = None,
    rendezvous: Rendezvous | None = None,
) -> int:
    """Run ``python -m module *args`` as ``nproc`` local ranks, alone or as one agent of the
    multi-node job ``rendezvous`` names; returns the job's exit status (0, 2 after a user error or a
    lost agent whose line was printed, 1 after another failure, 128 + signal).

    ``job_dir`` holds the agent's logs and the error file while the job runs (created empty,
    removed at the end); ``env`` adds variables for the ranks.
    """
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if nproc < 1:
        raise ValueError(f"nproc must be at least 1, got {nproc}")
    meeting = rendezvous or Rendezvous()
    error_file = job_dir / "error.txt"
    _prepare_job_dir(job_dir, error_file)
    updates = {PARENT_ENV: str(os.getpid()), ERROR_FILE_ENV: str(error_file), **(env or {})}
    if nproc > 1 and "OMP_NUM_THREADS" not in os.environ:
        updates["OMP_NUM_THREADS"] = "1"  # as torchrun does: N ranks share the cores
    config = LaunchConfig(
        min_nodes=meeting.nnodes,
        max_nodes=meeting.nnodes,
        nproc_per_node=nproc,
        run_id=meeting.run_id or uuid.uuid4().hex,
        rdzv_backend="c10d",
        rdzv_endpoint=meeting.endpoint,
        rdzv_configs={"join_timeout": meeting.join_timeout_s},
        max_restarts=0,
        monitor_interval=0.1,
        logs_specs=DefaultLogsSpecs(log_dir=str(job_dir / "logs")),
    )
    elastic_logger = logging.getLogger("torch.distributed.elastic")
    level = elastic_logger.level
    # the agent installs its own handlers (to stop the ranks); the caller's come back afterwards
    handlers = {
        sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
    }
    elastic_logger.setLevel(logging.CRITICAL)  # we report failures ourselves, in one line
    try:
        with _job_environment(updates):
            elastic_launch(config, sys.executable)("-m", module, *args)
        return 0
    except ChildFailedError as err:
        recorded = _recorded(error_file)
        if recorded:
            # ranks stopped by a signal (all but the failed one) may have left their last line unended,
            # such as rank 0's progress bar: then the error line starts a line of its own
            cut = any(failure.exitcode < 0 for failure in err.failures.values())
            print(("\n" if cut else "") + recorded, file=sys.stderr, flush=True)
            return 2
        rank, failure = min(err.failures.items())
        print(f"rank {rank} failed with exit code {failure.exitcode} (its output is above)", file=sys.stderr)
        return 1
    except SignalException as err:
        print(f"stopped by {signal.Signals(err.sigval).name}; the ranks were stopped", file=sys.stderr)
        return 128 + int(err.sigval)
    except (RendezvousError, RuntimeError) as err:  # the rendezvous' store (another agent) is gone
        if meeting.nnodes == 1:
            raise
        print(
            f"longctx train: lost the job's rendezvous at {meeting.endpoint} "
            f"({_first_line(err.__cause__ or err)}): the "
            "agent there stopped or cannot be reached; this agent's ranks were stopped; run again to "
            "resume from the newest checkpoint",
            file=sys.stderr,
            flush=True,
        )
        return 2
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
        elastic_logger.setLevel(level)
        shutil.rmtree(job_dir, ignore_errors=True)


ERROR_FILE_BYTES = 4096
"""Space set aside in the error file before the ranks start, so that a rank can record its error
on a disk that has filled up meanwhile (the very error it may have to report)."""


def _prepare_job_dir(job_dir: Path, error_file: Path) -> None:
    """An empty ``job_dir`` holding the error file, its space set aside (zero bytes: none recorded)."""
    from longctx.core.errors import OutputError
    from longctx.core.preflight import disk_fault

    shutil.rmtree(job_dir, ignore_errors=True)
    try:
        job_dir.mkdir(parents=True)
        with open(error_file, "wb") as out:
            out.write(bytes(ERROR_FILE_BYTES))
    except OSError as err:
        shutil.rmtree(job_dir, ignore_errors=True)
        fault = disk_fault(err, job_dir)
        if fault is None:
            raise
        raise OutputError(f"cannot start the job: {fault}") from None


def _recorded(error_file: Path | str) -> str:
    """The error a rank recorded in ``error_file`` ('' when none, or no file)."""
    try:
        data = Path(error_file).read_bytes()
    except OSError:
        return ""
    return data.rstrip(b"\0").decode("utf-8", errors="replace").strip()


def _record(error_file: str, message: str) -> None:
    """Record ``message`` in the error file unless another rank did first; the file's space was set
    aside by the launcher, so this writes over it in place. Where it cannot, the message goes to
    stderr, which the launcher shows."""
    import fcntl

    try:
        with open(error_file, "r+b") as out:
            fcntl.flock(out, fcntl.LOCK_EX)
            if out.read(1) in (b"", b"\0"):
                out.seek(0)
                out.write(message.encode("utf-8")[: ERROR_FILE_BYTES - 1])
                out.flush()
    except OSError:
        print(message, file=sys.stderr, flush=True)


def _first_line(err: BaseException) -> str:
    """The first line of an error's message, without the source location C++ errors start with."""
    text = re.sub(r"^\[[^\]]*\]\s*", "", str(err).strip())
    return text.splitlines()[0] if text else type(err).__name__


CPP_LOG_ENV = "TORCH_CPP_LOG_LEVEL"


def quiet_agent_cpp_logs() -> dict[str, str]:
    """For the agent of a multi-node job, before torch is imported: torch's C++ log shows warnings only
    from ERROR on (its store client warns, with a C++ stack trace, each time it finds another agent
    gone; the agent says so in one line). Returns the setting the ranks keep (theirs is unchanged)."""
    rank_setting = {CPP_LOG_ENV: os.environ.get(CPP_LOG_ENV, "WARNING")}
    os.environ.setdefault(CPP_LOG_ENV, "ERROR")
    return rank_setting


def launch_training(
    nproc: int,
    argv: Sequence[str],
    output: Path,
    rendezvous: Rendezvous | None = None,
    env: dict[str, str] | None = None,
) -> int:
    """``longctx train`` (``argv``) as ``nproc`` ranks. Alone, this agent holds the run's lock for the
    whole job; as one of several agents (``rendezvous``), the job's rank 0 holds it, and the agent's
    logs go to a job folder of its own (``.job-<host>-<pid>``; those of dead agents of this host are
    removed first). ``env`` adds variables for the ranks."""
    from longctx.core.layout import RunLayout
    from longctx.core.runlock import HELD_ENV, run_lock

    train_dir = RunLayout(output).train
    if rendezvous is None or rendezvous.nnodes == 1:
        with run_lock(train_dir, "train") as lock:
            held = {HELD_ENV: str(lock)} if lock is not None else {}
            return launch(nproc, "longctx.cli", argv, train_dir / ".job", {**(env or {}), **held}, rendezvous)
    host = socket.gethostname()
    for stale in train_dir.glob(f".job-{host}-*"):
        pid = stale.name.rpartition("-")[2]
        if pid.isdigit() and not process_exists(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    return launch(nproc, "longctx.cli", argv, train_dir / f".job-{host}-{os.getpid()}", env, rendezvous)


def _set_parent_death_signal(sig: int) -> None:
    """Ask Linux to send ``sig`` to this process when its parent dies (no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def _watch_parent(parent: int, interval_s: float) -> None:
    while True:
        time.sleep(interval_s)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGKILL)


def follow_launcher(interval_s: float = 1.0) -> None:
    """In a rank started by :func:`launch`: end this process when the launcher is gone."""
    parent = os.environ.get(PARENT_ENV)
    if parent is None:
        return
    _set_parent_death_signal(signal.SIGTERM)
    if os.getppid() != int(parent):  # the launcher died before the death signal was armed
        os.kill(os.getpid(), signal.SIGKILL)
    threading.Thread(
        target=_watch_parent, args=(int(parent), interval_s), daemon=True, name="launcher-watch"
    ).start()


@contextlib.contextmanager
def rank_errors(command: str) -> Iterator[None]:
    """In a rank started by :func:`launch`: a user error is recorded for the launcher (first one
    wins) and ends the rank with status 2; a failure that follows another rank's recorded user error
    (typically a broken collective) ends the rank quietly with status 2. Elsewhere: no-op."""
    error_file = os.environ.get(ERROR_FILE_ENV)
    if error_file is None or PARENT_ENV not in os.environ:
        yield
        return
    from longctx.core.errors import LongctxError

    try:
        yield
    except LongctxError as err:
        _record(error_file, f"longctx {command}: {err}\n")
        _leave(2)
    except Exception as err:
        if _recorded(error_file):
            _leave(2)
        if _peer_lost(err):
            _record(
                error_file,
                f"longctx {command}: lost contact with the job's other ranks ({_first_line(err)}): a "
                "process or machine of the job stopped; run again to resume from the newest checkpoint\n",
            )
            _leave(2)
        raise


def leave_rank(status: int) -> int:
    """In a rank started by :func:`launch`, end it with ``status`` as :func:`_leave` does (a finished
    rank's interpreter shutdown can abort it as a failed one's can, and the launcher would report the
    run as failed); elsewhere return ``status``."""
    if os.environ.get(ERROR_FILE_ENV) is None or PARENT_ENV not in os.environ:
        return status
    _leave(status)


def _leave(status: int) -> NoReturn:
    """End this rank with ``status`` after a failure, its own or elsewhere in the job: the exit
    handlers run (the trackers close), the interpreter's shutdown does not.

    A collective (the one that broke, or the one the ranks agreed on the error through) may still be
    released by its process group's worker thread, which takes the GIL to do so; during the
    interpreter's shutdown that aborts the process ('terminate called without an active exception',
    pytorch/pytorch#190489; ``parallel.settle`` narrows the window but did not close it). Nothing of
    the rank is lost by skipping it: its files are written atomically or not at all, its error is
    recorded, and the launcher stops the job's ranks anyway.
    """
    import atexit

    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _peer_lost(err: BaseException) -> bool:
    """Whether ``err`` says that a collective or the process group's store lost another process."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and isinstance(err, getattr(dist, "DistError", ())):
        return True
    text = str(err)
    return isinstance(err, RuntimeError) and any(
        sign in text for sign in ("Connection closed by peer", "Connection reset by peer", "Broken pipe")
    )
