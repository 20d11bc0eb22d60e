"""The worker processes of a local job (longctx.core.workers): pool workers find the job's modules
already imported by their forkserver, the executor's sockets live in the job's ``work/tmp``, and
the process's own temporary-folder settings are back as they were once the job ends."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import multiprocess
import multiprocess.forkserver
import multiprocess.process
import multiprocess.resource_tracker
import pytest

from longctx.core import workers
from longctx.core.workers import job_processes, preload_modules, temporary_folder
from tests.core.processes import parent_pid


def _pool_sees(module: str) -> bool:
    """Whether a forkserver pool worker has ``module`` imported before running anything of it."""
    with multiprocess.get_context("forkserver").Pool(1) as pool:
        return pool.apply(eval, (f"{module!r} in __import__('sys').modules",))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forkserver and Unix sockets: Linux")
def test_workers_preload_the_jobs_modules_and_keep_sockets_in_the_run(tmp_path: Path) -> None:
    from xml.dom.minidom import Document  # a module multiprocess itself never imports

    work = tmp_path / "work" / "job"
    stale = work / "tmp" / "pymp-left-by-a-killed-run"
    stale.mkdir(parents=True)

    def settings() -> tuple:
        config = multiprocess.process.current_process()._config
        return tempfile.tempdir, os.environ.get("TMPDIR"), config.get("tempdir")

    before = settings()
    with job_processes([[Document()]], work) as folder:
        assert folder == work / "tmp" and not stale.exists()
        assert _pool_sees("xml.dom.minidom")
        manager = multiprocess.Manager()  # forked, as datatrove's executor starts it
        try:
            assert Path(manager.address).parent == folder
        finally:
            manager.shutdown()
        assert any(p.name.startswith("listener-") for p in folder.iterdir())  # the forkserver's
        server = multiprocess.forkserver._forkserver._forkserver_pid
    assert not folder.exists()
    with pytest.raises(ProcessLookupError):  # stopped and reaped: not even a zombie is left
        os.kill(server, 0)
    assert settings() == before
    # the reference: a forkserver started outside a job imports nothing of it
    try:
        assert not _pool_sees("xml.dom.minidom")
    finally:
        multiprocess.forkserver._forkserver._stop()


def _write_ends(pid: int) -> set[str]:
    """The pipes (``pipe:[inode]``) process ``pid`` holds open for writing."""
    found = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            info = Path(f"/proc/{pid}/fdinfo/{fd}").read_text().splitlines()
            flags = next(line for line in info if line.startswith("flags:"))
        except OSError:
            continue
        if link.startswith("pipe:") and int(flags.split()[1], 8) & os.O_ACCMODE == os.O_WRONLY:
            found.add(link)
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forkserver, Unix sockets and /proc: Linux")
def test_a_forkserver_forked_from_the_driver_serves_the_job_as_a_fresh_one_would(tmp_path: Path) -> None:
    """``start_forkserver(fork=True)``: the forkserver is a child of this process with its command
    line, its pool workers are its children and run what they are sent, its socket is in the job's
    folder, it holds neither the write end of the pipe that tells it every client is gone nor the
    resource tracker's (a fresh forkserver holds neither), and it is stopped with the job."""
    from xml.dom.minidom import Document

    work = tmp_path / "work" / "job"
    with job_processes([[Document()]], work) as folder:
        workers.start_resource_tracker(workers.semaphore_prefix(work))
        workers.start_forkserver(fork=True)
        server = multiprocess.forkserver._forkserver
        pid = server._forkserver_pid
        assert parent_pid(pid) == os.getpid()
        assert Path(f"/proc/{pid}/cmdline").read_bytes() == Path("/proc/self/cmdline").read_bytes()
        assert Path(server._forkserver_address).parent == folder
        with multiprocess.get_context("forkserver").Pool(2) as pool:
            parents = pool.map(eval, ["__import__('os').getppid()"] * 4)
            assert pool.apply(eval, ("'xml.dom.minidom' in __import__('sys').modules",))
        assert set(parents) == {pid}
        tracker = multiprocess.resource_tracker._resource_tracker._fd
        ours = {os.readlink(f"/proc/self/fd/{fd}") for fd in (server._forkserver_alive_fd, tracker)}
        assert not ours & _write_ends(pid), (ours, _write_ends(pid))
    with pytest.raises(ProcessLookupError):  # stopped and reaped
        os.kill(pid, 0)


def test_preloaded_modules_are_those_of_the_steps() -> None:
    from xml.dom.minidom import Document

    modules = preload_modules([[Document(), len], [Path("x")]])
    assert modules[:2] == ["longctx.core.lifetime", "__main__"]  # the forkserver arms its death first
    assert {"xml.dom.minidom", "pathlib", "longctx.core.executors"} <= set(modules)
    assert "builtins" not in modules


def test_a_work_folder_too_deep_for_unix_sockets_gets_a_named_system_temporary_folder(tmp_path: Path) -> None:
    deep = tmp_path / ("d" * 120) / "work"
    folder = temporary_folder(deep)
    assert folder.parent == Path(tempfile.gettempdir()) and folder.name.startswith("longctx-")
    assert temporary_folder(deep) == folder  # the same job finds it again, to empty it
    assert temporary_folder(tmp_path / "w") == tmp_path / "w" / "tmp"


def test_with_a_system_temporary_folder_too_deep_as_well_the_job_takes_one_in_slash_tmp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long TMPDIR (pytest-xdist's workers have one) used to end curate in 'AF_UNIX path too long'."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / ("t" * 100)))
    folder = temporary_folder(tmp_path / ("d" * 120) / "work")
    assert folder.parent == Path("/tmp") and folder.name.startswith("longctx-")
    assert len(os.fsencode(folder / "listener-12345678")) <= 107


@pytest.mark.skipif(
    not workers.SEMAPHORE_FOLDER.is_dir(), reason="named semaphores are files in /dev/shm on Linux"
)
def test_a_jobs_semaphores_are_named_after_it_and_a_killed_runs_are_removed(tmp_path: Path) -> None:
    """A pool's named semaphores carry the job's prefix while the job runs; one a killed run of the
    same job left (a file of that prefix no object here owns) is gone once the job starts again, and
    another job's, or one without the prefix, is left alone."""
    work, other = tmp_path / "work" / "job", tmp_path / "work" / "other"
    prefix = workers.semaphore_prefix(work)
    assert prefix != workers.semaphore_prefix(other)
    left = [
        workers.SEMAPHORE_FOLDER / f"sem.{p.lstrip('/')}-{tmp_path.name}"
        for p in (prefix, workers.semaphore_prefix(other), "/mp")
    ]
    try:
        for path in left:
            path.write_bytes(b"\0" * 32)
        before = multiprocess.process.current_process()._config.get("semprefix")
        with job_processes([], work):
            assert not left[0].exists() and left[1].exists() and left[2].exists()
            lock = multiprocess.get_context("forkserver").Lock()
            name = lock._semlock.name
            assert name.startswith(prefix + "-")
            assert (workers.SEMAPHORE_FOLDER / f"sem.{name.lstrip('/')}").exists()
            del lock
        assert multiprocess.process.current_process()._config.get("semprefix") == before
        assert not list(
            workers.SEMAPHORE_FOLDER.glob(f"sem.{prefix.lstrip('/')}-*")
        )  # the pool's own unlinked
    finally:
        for path in left:
            path.unlink(missing_ok=True)
