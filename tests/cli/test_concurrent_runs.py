"""Two `longctx curate` (or two `longctx pack`) on one output folder: the second is refused in one
line naming the first one's pid and host, and changes nothing; the first one finishes as if alone.
A lock left by a dead process is taken over with a message. The lock is the one `longctx train`
takes (longctx.core.runlock), in ``<output>/work/<job>/.lock``.

Both runs are real processes. The first is stopped (SIGSTOP) as soon as it holds the lock, so that
the second certainly starts while the first is alive, whatever the machine's speed; before the lock
existed, the two deleted each other's forkserver sockets, semaphores or shard temporary files.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from longctx.pipeline.bpe import train_bpe
from tests.core.processes import longctx_command, wait_for
from tests.packer.test_pack_helpers import ORIGINAL, SEQ_LENS, TARGET, make_run
from tests.pipeline.test_curate import prose, wrap

REPO_ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}


def contents(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes (a refused run must leave them all as they were)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def curate_config(tmp_path: Path) -> Path:
    books = tmp_path / "input" / "books"
    books.mkdir(parents=True)
    for i in range(4):
        (books / f"book{i}.txt").write_text(wrap(prose(i, 3000), 70))
    train_bpe([prose(9, 3000)], 300, tmp_path / "tokenizer.json")
    config = {
        "output": str(tmp_path / "out"),
        "context": {"original": 64, "target": 256},
        "tokenizer": {"path": str(tmp_path / "tokenizer.json")},
        "curate": {"input": str(tmp_path / "input"), "executor": {"tasks": 2, "workers": 2}},
    }
    path = tmp_path / "curate.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def pack_config(tmp_path: Path) -> Path:
    root = tmp_path / "out"
    root.mkdir()
    make_run(root)
    config = {
        "output": str(root),
        "context": {"original": ORIGINAL, "target": TARGET},
        "pack": {"seq_lens": SEQ_LENS, "shard_tokens": 4096, "pool_tokens": 8192, "executor": {"tasks": 2}},
    }
    path = tmp_path / "pack.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def lock_owner(lock: Path) -> int | None:
    try:
        return json.loads(lock.read_text()).get("pid")
    except (OSError, ValueError):
        return None


@pytest.mark.parametrize("job", ["curate", "pack"])
def test_a_second_run_on_the_same_output_is_refused_naming_the_first(tmp_path: Path, job: str) -> None:
    config = curate_config(tmp_path) if job == "curate" else pack_config(tmp_path)
    output = tmp_path / "out"
    lock = output / "work" / job / ".lock"
    first = subprocess.Popen(
        longctx_command(job, "--config", str(config)),
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for(lambda: lock_owner(lock) == first.pid, first, 120, f"the first {job} to hold {lock}")
        first.send_signal(signal.SIGSTOP)
        before = contents(output)
        second = subprocess.run(
            longctx_command(job, "--config", str(config)),
            env=ENV,
            capture_output=True,
            text=True,
            timeout=300,
        )
        after = contents(output)
    finally:
        first.send_signal(signal.SIGCONT)
    _, err = first.communicate(timeout=600)
    assert second.returncode == 2, second.stderr[-3000:]
    assert second.stderr.startswith(
        f"longctx {job}: {lock}: another longctx {job} is running on this output "
        f"(pid {first.pid} on host {socket.gethostname()}, since "
    )
    assert len(second.stderr.strip().splitlines()) == 1
    assert after == before  # the refused run wrote nothing
    assert first.returncode == 0, err[-3000:]
    assert not lock.exists()


@pytest.mark.parametrize("job", ["curate", "pack"])
def test_a_lock_left_by_a_dead_process_is_taken_over(tmp_path: Path, job: str) -> None:
    config = curate_config(tmp_path) if job == "curate" else pack_config(tmp_path)
    lock = tmp_path / "out" / "work" / job / ".lock"
    lock.parent.mkdir(parents=True)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock.write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname(), "since": 0}))
    done = subprocess.run(
        longctx_command(job, "--config", str(config)), env=ENV, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"longctx {job}: taking over the stale lock {lock} of pid {dead.pid}" in done.stderr
    assert not lock.exists()
