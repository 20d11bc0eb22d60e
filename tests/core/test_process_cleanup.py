"""No process outlives a command: `longctx curate` killed with SIGKILL (the command alone, as the
OOM killer or ``kill -9 <pid>`` would, not its process group) takes its datatrove workers and the
executor's manager process with it, leaves nothing in the system's temporary folder (the executor's
sockets live in the run's ``work/curate/tmp``) nor in /dev/shm (its pools' named semaphores), and
the killed run still resumes to the same output.

(`longctx pack` is checked the same way in tests/packer/test_pack_resume.py.) The reference for
"no process" is the kernel's process table: every process the command started carries a marker in
its environment (tests/core/processes.py).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from longctx import jobs
from longctx.config import load_config
from longctx.core.workers import SEMAPHORE_FOLDER, semaphore_prefix, temporary_folder
from longctx.pipeline.bpe import train_bpe
from tests.core.processes import (
    HAS_PROC,
    describe,
    kill_survivors,
    longctx_command,
    marked_env,
    marked_processes,
    parent_pid,
    survivors_after,
    wait_for,
)

GRACE_SECONDS = 5.0
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"]


def _book(seed: int, words: int) -> str:
    rng = random.Random(seed)
    return "\n".join(" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(words // 12))


def _curate_config(tmp_path: Path, output: Path, trained: bool = False) -> Path:
    """A curation of 8 small books; with ``trained``, the run trains its own tokenizer."""
    books = tmp_path / "input" / "books"
    if not books.is_dir():
        books.mkdir(parents=True)
        for i in range(8):
            (books / f"book{i:02d}.txt").write_text(_book(i, 3000))
        train_bpe([_book(99, 3000)], 300, tmp_path / "tokenizer.json")
    config = {
        "output": str(output),
        "context": {"original": 64, "target": 256},
        "tokenizer": {"train_vocab_size": 300} if trained else {"path": str(tmp_path / "tokenizer.json")},
        "curate": {"input": str(tmp_path / "input"), "executor": {"tasks": 4, "workers": 2}},
    }
    path = tmp_path / f"{output.name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def _documents(output: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(output)): p.read_bytes() for p in sorted((output / "documents").rglob("*.parquet"))
    }


def _semaphores(work: Path) -> list[str]:
    """The named semaphores of the job whose work folder is ``work`` in /dev/shm (Linux keeps them there
    as files; the job names them after its work folder: :func:`semaphore_prefix`)."""
    return sorted(p.name for p in SEMAPHORE_FOLDER.glob(f"sem.{semaphore_prefix(work).lstrip('/')}-*"))


@pytest.mark.slow
@pytest.mark.skipif(not HAS_PROC, reason="finding a killed command's children needs Linux /proc")
@pytest.mark.skipif(not SEMAPHORE_FOLDER.is_dir(), reason="named semaphores are files in /dev/shm on Linux")
@pytest.mark.parametrize("stage", ["read", "write"])
def test_killed_curate_leaves_no_process_nor_file_and_resumes(
    tmp_path: Path, stage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed with SIGKILL while the pool of its ``read`` (or ``write``) stage is up: no process is
    left, nothing in the system's temporary folder, none of the pool's named semaphores in /dev/shm
    (they used to stay there until the job ran again, and for good if it never did), and the run
    resumes to the uninterrupted run's output."""
    reference = tmp_path / "reference"
    jobs.curate(load_config(_curate_config(tmp_path, reference)))
    killed = tmp_path / "killed"
    config = _curate_config(tmp_path, killed)
    work = killed / "work" / "curate"
    stage_logs = {"read": work / "logs" / "1_read", "write": work / "logs" / "4_write"}[stage]
    system_tmp = tmp_path / "system_tmp"  # the command's TMPDIR: what it would leave in /tmp
    system_tmp.mkdir()
    env, mark = marked_env()
    process = subprocess.Popen(
        longctx_command("curate", "--config", str(config)),
        env=env | {"TMPDIR": str(system_tmp)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    # the stage has started and its pool is up (it creates the semaphores: between stages there are none)
    wait_for(lambda: stage_logs.is_dir() and _semaphores(work), process, 180, f"the {stage} stage's pool")
    monkeypatch.setattr(tempfile, "tempdir", str(system_tmp))  # as the command sees it
    run_tmp = temporary_folder(work)  # work/tmp, or a short folder where that path is too long for sockets
    sockets = sorted(p.name for p in run_tmp.glob("listener-*"))  # the forkserver's and the manager's
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    survivors = survivors_after(mark, GRACE_SECONDS)
    report = describe(survivors)
    kill_survivors(survivors)
    assert not survivors, f"processes outlived the killed `longctx curate` by {GRACE_SECONDS} s:\n{report}"
    assert _semaphores(work) == []
    assert sockets, f"the executor's sockets are not in {run_tmp}"
    assert sorted(p.name for p in system_tmp.iterdir()) == []

    result = subprocess.run(
        longctx_command("curate", "--config", str(config)), check=False, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert _documents(killed) == _documents(reference)
    assert not run_tmp.exists()  # emptied when the run resumed, removed when it ended


AT_ONCE_SECONDS = 0.3


def _command_lines(pids: list[int]) -> list[str]:
    found = []
    for pid in pids:
        try:
            found.append(Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:300])
        except OSError:
            continue
    return found


def _maps_pandas(pid: int) -> bool:
    """Whether process ``pid`` has pandas' compiled modules mapped (it imported pandas)."""
    try:
        return "/pandas/_libs/" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.slow
@pytest.mark.skipif(not HAS_PROC, reason="finding a killed command's children needs Linux /proc")
@pytest.mark.parametrize(
    ("tokenizer", "caller", "forked"),
    [("given", "command", True), ("trained", "command", False), ("given", "python", False)],
)
def test_curate_killed_in_its_read_stage_takes_every_process_with_it_at_once(
    tmp_path: Path, tokenizer: str, caller: str, forked: bool
) -> None:
    """kill -9 of `longctx curate` while its read stage runs: the forkserver (which has imported the
    job's modules), its pool workers and multiprocess's resource tracker are gone within
    :data:`AT_ONCE_SECONDS` (they used to outlive it by 0.2-4.2 s: the forkserver tore down its
    modules before exiting, and the workers and the tracker waited for it).

    The command, with the tokenizer given, forks the forkserver from itself (it has the command's
    command line). A run that trains its tokenizer has run the tokenizer's thread pool, which forked
    workers would find unusable, and a Python session calling ``jobs.curate`` may have run it before:
    both start the forkserver from a fresh interpreter. The command and every process forked from it
    never import pandas (:mod:`longctx.core.nopandas`); a fresh forkserver does, for its workers."""
    output = tmp_path / "killed"
    config = _curate_config(tmp_path, output, trained=tokenizer == "trained")
    completions = output / "work" / "curate" / "logs" / "1_read" / "completions"
    env, mark = marked_env()
    session = (
        "from longctx import jobs; from longctx.config import load_config; "
        f"jobs.curate(load_config({str(config)!r}))"
    )
    process = subprocess.Popen(
        longctx_command("curate", "--config", str(config))
        if caller == "command"
        else [sys.executable, "-c", session],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    wait_for(
        lambda: completions.is_dir() and any(completions.iterdir()), process, 180, "a read task completed"
    )
    helper_pids = [p for p in marked_processes(mark) if p != process.pid]
    lines = {pid: _command_lines([pid]) for pid in helper_pids}
    with_pandas = [pid for pid in [process.pid, *helper_pids] if _maps_pandas(pid)]
    helpers = [line for found in lines.values() for line in found]
    parents = {pid: parent for pid in helper_pids if (parent := parent_pid(pid)) is not None}
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    deadline = time.monotonic() + AT_ONCE_SECONDS
    while (alive := marked_processes(mark)) and time.monotonic() < deadline:
        time.sleep(0.01)
    names = _command_lines(alive)
    kill_survivors(survivors_after(mark, GRACE_SECONDS))
    # the killed run's sockets, which its next run would remove: a path this deep keeps them in /tmp
    shutil.rmtree(temporary_folder(output / "work" / "curate"), ignore_errors=True)
    # what the kill must take with it: the tracker, the forkserver and its workers (forked from it)
    assert sum("resource_tracker" in h for h in helpers) == 1, helpers
    servers = {parent for parent in parents.values() if parent != process.pid}
    assert len(servers) == 1 and parents[next(iter(servers))] == process.pid, (parents, helpers)
    server = next(iter(servers))
    assert sum(parent == server for parent in parents.values()) >= 2, (parents, helpers)  # its workers
    fresh = any("multiprocess.forkserver" in line for line in lines[server])
    assert fresh != forked, (server, lines)
    if forked:  # the command and the processes forked from it: pyarrow without pandas (core.nopandas)
        assert with_pandas == [], (with_pandas, lines)
    else:  # the reference: a fresh forkserver imports pandas for its workers
        assert server in with_pandas, (with_pandas, lines)
    assert not alive, f"alive {AT_ONCE_SECONDS} s after the kill: {names}"
    assert _semaphores(output / "work" / "curate") == []  # the tracker unlinked them on its way out


@pytest.mark.skipif(not HAS_PROC, reason="needs Linux /proc")
@pytest.mark.parametrize("armed", [True, False], ids=["inside", "outside-reference"])
def test_forked_child_dies_with_its_parent(tmp_path: Path, armed: bool) -> None:
    """The mechanism alone: a process forked inside :func:`children_die_with_this_process` by a
    parent that is then SIGKILLed does not outlive it; one forked outside it does (the reference,
    showing that the check can fail)."""
    script = tmp_path / "parent.py"
    script.write_text(
        "import contextlib, os, sys, time\n"
        "from longctx.core.lifetime import children_die_with_this_process\n"
        "with children_die_with_this_process() if sys.argv[1] == 'armed' else contextlib.nullcontext():\n"
        "    pid = os.fork()\n"
        "if pid == 0:\n"
        "    time.sleep(60)\n"
        "    os._exit(0)\n"
        "print(pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    env, mark = marked_env()
    parent = subprocess.Popen(
        [sys.executable, str(script), "armed" if armed else "plain"],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    child = int(parent.stdout.readline())
    parent.kill()
    parent.wait()
    parent.stdout.close()
    survivors = survivors_after(mark, GRACE_SECONDS) if armed else marked_processes(mark)
    kill_survivors(survivors)
    assert survivors == ([] if armed else [child])
