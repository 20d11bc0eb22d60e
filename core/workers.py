"""The processes datatrove's local executor starts for a job: one forkserver that imports the job's
modules once, and every socket and temporary file of those processes inside the job's work folder.

A stage with more than one worker runs its tasks in a ``multiprocess`` pool whose workers are forked
by a forkserver, beside a ``Manager`` server forked from the driver. Left to its defaults:

* the forkserver outlives a driver killed with SIGKILL by seconds (it tears down what it imported
  first), and so do its workers and the resource tracker (which waits for all of them); here the
  forkserver dies with the driver, the workers with the forkserver
  (:func:`longctx.core.lifetime.die_with_driver`), and the tracker as soon as they are gone;
* the forkserver imports nothing, so every worker of every stage imports datatrove, pyarrow,
  tokenizers and the job's modules itself (about 1.8 s of CPU each on a 2-core machine: ten times in
  a two-task curation, a third of the CPU the second task was meant to add);
* the forkserver and the managers put their sockets in a ``pymp-*`` folder of the system's temporary
  folder, which a killed job (SIGKILL, the OOM killer) leaves behind for good;
* a pool of forkserver workers shares named semaphores (``/dev/shm/sem.mp-*`` on Linux), unlinked by
  the pool when it closes or by ``multiprocess``'s resource tracker once the job's processes are
  gone; a job killed with all its processes (a process group or a Slurm job killed) takes the
  tracker with it and leaves them behind for good. Here the tracker runs in a session of its own
  (:func:`start_resource_tracker`), so that only a kill of the tracker itself leaves them.

:func:`job_processes` preloads the job's modules in a forkserver of its own (started by the first
pool, stopped when the job ends, so that no later job finds it pointing at a removed folder) and
gives these processes ``<work>/tmp`` as their temporary folder (``TMPDIR`` for the processes
started from a fresh interpreter, the driver's own ``multiprocess`` and ``tempfile`` settings for
those forked from it), emptied when the job starts or resumes and removed when it ends. The job's
semaphores are named after its work folder (:func:`semaphore_prefix`), so that those a killed
tracker left are removed when the job starts or resumes.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import os
import shutil
import signal
import socket
import sys
import tempfile
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import multiprocess.connection
import multiprocess.forkserver
import multiprocess.process
import multiprocess.resource_tracker
import multiprocess.spawn
import multiprocess.util

from longctx.core import lifetime, nopandas

# What every task imports on its first Parquet read or write (pyarrow imports pandas, when installed,
# to look for pandas metadata): imported once in the forkserver rather than in each worker.
_TASK_IMPORTS = ("pyarrow.parquet", "pyarrow.dataset", "pandas")

# A Unix socket's path holds at most 107 bytes on Linux; sockets are named "listener-" + 8 characters.
_SOCKET_PATH_MAX = 107 - len("/listener-12345678")


def preload_modules(pipelines: Iterable[Iterable[object]]) -> list[str]:
    """The modules the workers of these pipelines unpickle their steps from, those their Parquet files
    import, and ``__main__`` (which multiprocess preloads by default)."""
    modules = {type(step).__module__ for pipeline in pipelines for step in pipeline} | set(_TASK_IMPORTS)
    modules.add(__name__.rsplit(".", 1)[0] + ".executors")  # the executor itself is pickled too
    # first of all, the forkserver arms its death with the driver (its import does it)
    first = lifetime.__name__
    return [first, "__main__", *sorted(modules - {"__main__", "builtins", first})]


def temporary_folder(work: Path) -> Path:
    """``<work>/tmp``, or where its socket paths would be too long for Unix sockets, a folder named after
    ``work`` (so that the next run of the same job finds and empties it) in the system's temporary
    folder, or in ``/tmp`` when that one's path is too long as well (a long ``TMPDIR``)."""
    folder = Path(os.path.abspath(work)) / "tmp"
    name = f"longctx-{hashlib.sha256(os.fsencode(folder)).hexdigest()[:16]}"
    for candidate in (folder, Path(tempfile.gettempdir()) / name, Path("/tmp") / name):
        if len(os.fsencode(candidate)) <= _SOCKET_PATH_MAX:
            return candidate
    raise OSError(f"no folder for the job's sockets has a path short enough for Unix sockets: {folder}")


SEMAPHORE_FOLDER = Path("/dev/shm")
"""Where Linux keeps named POSIX semaphores, as files ``sem.<name>``."""


def semaphore_prefix(work: Path) -> str:
    """The name prefix of the semaphores a job's pools create (``multiprocess`` names each
    ``<prefix>-<random>``): one per work folder, so that a later run of the job finds those a killed
    run left."""
    digest = hashlib.sha256(os.fsencode(os.path.abspath(work))).hexdigest()[:16]
    return f"/mp-longctx-{digest}"


def remove_semaphores(prefix: str) -> None:
    """Unlink the named semaphores whose names start with ``prefix`` (a job's: :func:`semaphore_prefix`).
    Called before the job's pools start, after a garbage collection, so that finished pools of an
    earlier run of the job in this process have unlinked theirs through their own finalizers: what is
    left was a killed run's whose resource tracker was killed too. Nothing to do where semaphores are
    not files (not Linux)."""
    pattern = f"sem.{prefix.lstrip('/')}-*"
    if not SEMAPHORE_FOLDER.is_dir() or not any(SEMAPHORE_FOLDER.glob(pattern)):
        return
    gc.collect()  # finished pools of this process that are still in reference cycles unlink their own
    for path in SEMAPHORE_FOLDER.glob(pattern):
        path.unlink(missing_ok=True)


def _stop_forkserver() -> None:
    """Stop this process's forkserver, if it started one (multiprocess has no public call for it).

    It is killed rather than asked to exit: between jobs it runs no task and holds nothing to clean
    up (its socket and folder are the driver's to remove), and its own exit would tear down every
    module it preloaded while the driver waits for it (~0.6 s)."""
    server = multiprocess.forkserver._forkserver
    if server._forkserver_pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(server._forkserver_pid, signal.SIGKILL)
    try:
        server._stop()
    except OSError:  # it was reaped elsewhere, or its socket's folder is gone: forget it
        server._forkserver_pid = server._forkserver_alive_fd = server._forkserver_address = None


def _stderr_fd() -> list[int]:
    """This process's stderr file descriptor, for a child to inherit (none when stderr has none)."""
    try:
        return [sys.stderr.fileno()]
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
        return []


JOB_SEMAPHORES = "longctx_job_semaphores"
"""The resource type under which a job's semaphore prefix is registered with the tracker: at its exit
the tracker unlinks every semaphore named with the prefix, also one a kill caught between its creation
and its registration (multiprocess registers a semaphore only after creating it)."""

_TRACKER = (
    "import glob, os, warnings\n"
    "os.setsid()\n"
    "warnings.filterwarnings('ignore', module='multiprocess.resource_tracker')\n"
    "from multiprocess import resource_tracker\n"
    "def unlink_prefix(prefix):\n"
    "    for path in glob.glob({folder!r} + '/sem.' + prefix.lstrip('/') + '-*'):\n"
    "        try:\n"
    "            os.unlink(path)\n"
    "        except OSError:\n"
    "            pass\n"
    "resource_tracker._CLEANUP_FUNCS[{kind!r}] = unlink_prefix\n"
    "resource_tracker.main({fd})\n"
)
"""The resource tracker's program: multiprocess's own, in a session of its own, without its warnings
about what it cleans up (after a kill, that is expected), and knowing :data:`JOB_SEMAPHORES`."""

_tracked: set[str] = set()
"""The semaphore prefixes registered with this process's tracker (:func:`start_resource_tracker`)."""


def start_resource_tracker(prefix: str) -> None:
    """Start this process's ``multiprocess`` resource tracker now, unless one runs, so that it
    unlinks the job's named semaphores (named with ``prefix``: :func:`semaphore_prefix`) whenever
    the job ends, killed or not.

    The tracker is the one process that can: it learns each semaphore's name when a pool creates it,
    and when every process holding its pipe is gone (this one, the manager, the forkserver and its
    workers, which all die at once when this one is killed: :mod:`longctx.core.lifetime`), it
    unlinks those still registered and exits, within milliseconds of the kill. The semaphores cannot
    be unlinked earlier: a forkserver worker opens them by name when it starts, and a pool starts a
    new worker whenever one dies. So the tracker does not die with this process (its death signal
    would leave them behind), and it runs in a session of its own, so that killing the job's process
    group (Ctrl-\\, ``kill -9 -PGID``) misses it too. What a kill of the tracker itself leaves (a
    cgroup killed whole) the job's next run removes (:func:`remove_semaphores`). Otherwise as
    multiprocess starts it (``ResourceTracker.ensure_running``), whose pipe the pools and the
    forkserver then use."""
    tracker = multiprocess.resource_tracker._resource_tracker
    _start_tracker(tracker)
    if prefix not in _tracked:
        tracker.register(prefix, JOB_SEMAPHORES)
        _tracked.add(prefix)


def forget_job_semaphores(prefix: str) -> None:
    """The job whose semaphores are named with ``prefix`` ended, its pools closed: the tracker no longer
    needs to look for them."""
    if prefix in _tracked:
        _tracked.discard(prefix)
        tracker = multiprocess.resource_tracker._resource_tracker
        if tracker._fd is not None:
            tracker.unregister(prefix, JOB_SEMAPHORES)


def _start_tracker(tracker: Any) -> None:
    """Start ``tracker`` (multiprocess's ``ResourceTracker``) with :data:`_TRACKER`, unless it runs."""
    with tracker._lock:
        if tracker._fd is not None and tracker._check_alive():
            return
        _tracked.clear()  # a new tracker knows no prefix
        if tracker._fd is not None:  # it died: multiprocess would start another one too
            os.close(tracker._fd)
            with contextlib.suppress(ChildProcessError, TypeError):
                os.waitpid(tracker._pid, 0)
            tracker._fd = tracker._pid = None
        read, write = os.pipe()
        command = _TRACKER.format(fd=read, folder=str(SEMAPHORE_FOLDER), kind=JOB_SEMAPHORES)
        executable = multiprocess.spawn.get_executable()
        args = [executable, *multiprocess.util._args_from_interpreter_flags(), "-c", command]
        # as multiprocess does (bpo-33613): the signals it ignores are blocked until it has done so
        blocked = getattr(multiprocess.resource_tracker, "_IGNORED_SIGNALS", ())
        try:
            signal.pthread_sigmask(signal.SIG_BLOCK, blocked)
            try:
                pid = multiprocess.util.spawnv_passfds(executable, args, [*_stderr_fd(), read])
            finally:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, blocked)
        except BaseException:
            os.close(write)
            raise
        finally:
            os.close(read)
        tracker._fd, tracker._pid = write, pid


def start_forkserver(*, fork: bool = False) -> None:
    """Start this process's forkserver now (it inherits file descriptor 2 as it is now) rather than
    when a pool first needs it: from a fresh interpreter that imports the preloaded modules (about
    1 s of CPU and of wall time before the first worker starts), or with ``fork`` as a fork of this
    process, which has most of them imported already (:func:`_fork_forkserver`)."""
    if fork:
        _fork_forkserver()
    else:
        multiprocess.forkserver.ensure_running()


def _fork_forkserver() -> None:
    """Start the forkserver as a fork of this process: it serves as multiprocess's own
    (``multiprocess.forkserver.main``, on a listening socket in the job's temporary folder and the
    pipe that tells it when every client is gone), after importing only the preloaded modules this
    process has not (pandas not at all where pyarrow works without it: :mod:`longctx.core.nopandas`).
    What a fresh forkserver would not have is left out or made harmless: it holds neither the write
    end of that pipe nor the resource tracker's (the workers get theirs with each request), never
    collects this process's garbage (whose finalizers could act on this process's files), takes
    SIGTERM's default action, and dies with this process, its workers with it
    (:func:`longctx.core.lifetime.serve_driver`).

    Only for a process that has run no thread pool of a library its workers use (the tokenizer's,
    torch's): a forked child finds such a pool unusable. The threads a process has from its imports
    alone (jemalloc's and OpenBLAS's) are safe to fork: both libraries prepare for it."""
    server = multiprocess.forkserver._forkserver
    unused = {"__main__", *([nopandas.PANDAS] if nopandas.active() else [])}
    preload = [m for m in server._preload_modules if m not in unused and m not in sys.modules]
    tracker_fd = multiprocess.resource_tracker._resource_tracker._fd
    with socket.socket(socket.AF_UNIX) as listener:
        address = multiprocess.connection.arbitrary_address("AF_UNIX")
        listener.bind(address)
        os.chmod(address, 0o600)
        listener.listen()
        alive_r, alive_w = os.pipe()
        driver = os.getpid()
        for stream in (sys.stdout, sys.stderr):  # what is buffered is written once, here
            with contextlib.suppress(AttributeError, OSError, ValueError):
                stream.flush()
        with warnings.catch_warnings():  # Python 3.12+ warns of any thread; those here are safe (above)
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
        if pid == 0:  # the forkserver: never returns
            code = 1
            try:
                gc.freeze()
                os.close(alive_w)
                if tracker_fd is not None:
                    os.close(tracker_fd)
                    multiprocess.resource_tracker._resource_tracker._fd = None
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                lifetime.serve_driver(driver)
                multiprocess.forkserver.main(listener.fileno(), alive_r, preload)
            except SystemExit:  # every client is gone
                code = 0
            except BaseException:
                sys.excepthook(*sys.exc_info())
            finally:
                os._exit(code)
        os.close(alive_r)
    server._forkserver_address = address
    server._forkserver_alive_fd = alive_w
    server._forkserver_pid = pid


@contextlib.contextmanager
def job_processes(pipelines: Iterable[Iterable[object]], work: Path) -> Iterator[Path]:
    """Meanwhile, pools fork their workers from a forkserver that has the modules of ``pipelines``
    imported, and the processes of the job keep their temporary files in :func:`temporary_folder`
    (emptied now, removed at the end), and their semaphores are named after ``work`` (those a killed
    run of the job left are removed now). Yields that folder. Afterwards this
    process's settings (its temporary folder, ``TMPDIR``, the semaphores' prefix, the forkserver's
    preloaded modules) are as they were."""
    folder = temporary_folder(work)
    shutil.rmtree(folder, ignore_errors=True)  # what a killed run of this job left
    folder.mkdir(parents=True)
    config = multiprocess.process.current_process()._config
    saved = (config.get("tempdir"), tempfile.tempdir, os.environ.get("TMPDIR"))
    saved_semprefix, semprefix = config.get("semprefix"), semaphore_prefix(work)
    remove_semaphores(semprefix)  # what a killed run of this job left
    config["semprefix"] = semprefix
    saved_preload = multiprocess.forkserver._forkserver._preload_modules
    _stop_forkserver()  # one an earlier job of this process started, with its modules and folder
    multiprocess.forkserver.set_forkserver_preload(preload_modules(pipelines))
    saved_driver = os.environ.get(lifetime.DRIVER_ENV)
    os.environ[lifetime.DRIVER_ENV] = str(os.getpid())  # the forkserver dies with it
    config["tempdir"] = tempfile.tempdir = os.environ["TMPDIR"] = str(folder)
    try:
        yield folder
    finally:
        _stop_forkserver()
        if saved_driver is None:
            os.environ.pop(lifetime.DRIVER_ENV, None)
        else:
            os.environ[lifetime.DRIVER_ENV] = saved_driver
        for key, value in zip(("tempdir", "TMPDIR"), (saved[0], saved[2])):
            store = config if key == "tempdir" else os.environ
            if value is None:
                store.pop(key, None)
            else:
                store[key] = value
        tempfile.tempdir = saved[1]
        multiprocess.forkserver.set_forkserver_preload(saved_preload)
        shutil.rmtree(folder, ignore_errors=True)
        forget_job_semaphores(semprefix)
        if saved_semprefix is None:
            config.pop("semprefix", None)
        else:
            config["semprefix"] = saved_semprefix
