"""Child processes die with the process that started them, even when it is killed with SIGKILL.

datatrove's local executor runs a job's tasks in a ``multiprocess`` pool (workers forked by a
forkserver) and keeps a ``multiprocess.Manager`` server process beside it. When the driver (the
``longctx`` command) dies without cleaning up (SIGKILL, the OOM killer, a closed terminal), nothing
stops those processes: a manager server waits forever and a worker finishes its task, for minutes.
So every process started on the driver's behalf asks the kernel to kill it when its parent dies
(Linux ``prctl(PR_SET_PDEATHSIG, SIGKILL)``; elsewhere a thread that watches ``os.getppid()``):

* processes the driver forks while :func:`children_die_with_this_process` is active (the manager
  server, and the pool workers of a job run with ``start_method="fork"``) do it in an
  ``os.register_at_fork`` hook;
* helper processes the driver starts from a fresh interpreter with :data:`DRIVER_ENV` set (the
  job's forkserver, which imports this module first) arm the same as soon as they import this
  module (:func:`die_with_driver`), and make every process they fork (the pool workers) die with
  them, so the chain driver -> forkserver -> worker unwinds at once. (Left to itself, the
  forkserver would exit when the driver's end of its pipe closes, but only after tearing down every
  module it imported: 0.2-4 s, while its workers run on.) Pool workers also arm
  :func:`die_with_parent` when they pick up a task.

multiprocess's resource tracker is the exception: it exits by itself once all of these are gone,
after unlinking the named semaphores they left (:func:`longctx.core.workers.start_resource_tracker`).

Work a killed task leaves half done (a shard's temporary file) is removed when the job runs again.
Forked children start with SIGTERM's default action (they die), whatever handler the driver has;
while a pool worker runs a task, SIGTERM (what the pool sends its workers when a sibling task fails)
raises ``SystemExit``, so that its atomic writers remove their temporary files before it exits.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from types import FrameType

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
_WATCH_INTERVAL = 0.5  # seconds between parent checks where prctl is not available

_active = 0  # nesting depth of children_die_with_this_process()
_forking_pid: int | None = None


def _set_parent_death_signal(sig: int) -> bool:
    """Ask the kernel to send ``sig`` when the parent dies; False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _watch_parent(parent: int) -> None:
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_WATCH_INTERVAL)
        os._exit(1)

    threading.Thread(target=watch, name="longctx-parent-watch", daemon=True).start()


def die_with_parent(parent: int | None = None) -> None:
    """Make this process die as soon as its parent does (idempotent).

    ``parent`` is the pid the parent had when this process was started; when the parent is already
    gone (this process was re-parented before it got here) the process exits at once.
    """
    parent = os.getppid() if parent is None else parent
    if not _set_parent_death_signal(signal.SIGKILL):
        _watch_parent(parent)
    if os.getppid() != parent:  # the parent died before the signal was armed
        os._exit(1)


@contextlib.contextmanager
def sigterm_exits(grace: float = 2.0) -> Iterator[None]:
    """Meanwhile, SIGTERM raises ``SystemExit`` in this process (whose main thread must run this), so
    that ``finally`` blocks and atomic writers remove their temporary files when a pool terminates
    its workers; should the exit get stuck (an exception raised inside a finalizer is ignored), the
    process ends anyway ``grace`` seconds later."""

    def handler(signum: int, frame: FrameType | None) -> None:
        timer = threading.Timer(grace, os._exit, (128 + signum,))
        timer.daemon = True
        timer.start()
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _before_fork() -> None:
    global _forking_pid
    _forking_pid = os.getpid()


def _after_fork_in_child() -> None:
    if _active and _forking_pid is not None:
        die_with_parent(_forking_pid)
        # A SIGTERM handler the driver inherited from its host (``ray.init()`` installs one that only
        # works with Ray's threads, which a fork does not copy) would keep an idle pool worker alive
        # when the pool terminates it, and the driver would wait for it forever.
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


os.register_at_fork(before=_before_fork, after_in_child=_after_fork_in_child)


@contextlib.contextmanager
def children_die_with_this_process() -> Iterator[None]:
    """Meanwhile, every process this one forks dies when this one does."""
    global _active
    _active += 1
    try:
        yield
    finally:
        _active -= 1


DRIVER_ENV = "LONGCTX_DRIVER_PID"
"""Set by a job's driver, while its job runs, to its pid: the helper processes it starts from a fresh
interpreter (datatrove's forkserver) die with it (:func:`die_with_driver`)."""


def die_with_driver() -> None:
    """In a helper process started from a fresh interpreter by the driver named in :data:`DRIVER_ENV`
    (its direct child): die as soon as the driver does, and make every process forked from this one
    die with this one. Exits at once when the driver is already gone; nothing to do in any other
    process (the driver itself, a process started by a worker)."""
    driver = os.environ.get(DRIVER_ENV, "")
    if not driver.isdigit() or int(driver) == os.getpid():
        return
    if os.getppid() != int(driver):
        if not process_exists(int(driver)):  # re-parented: the driver died before we got here
            os._exit(1)
        return
    serve_driver(int(driver))


def serve_driver(driver: int) -> None:
    """In a helper process of the driver ``driver`` (its direct child: the job's forkserver, started
    from a fresh interpreter or forked from the driver): die as soon as the driver does, and make every
    process forked from this one die with this one."""
    global _active
    die_with_parent(driver)
    _active += 1  # for the rest of this process's life: its children die with it


def process_exists(pid: int) -> bool:
    """Whether process ``pid`` still exists."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


die_with_driver()  # first thing a helper process does (the forkserver imports this first)
