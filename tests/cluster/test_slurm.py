"""`curate` and `pack` with ``kind: slurm`` on a real one-node Slurm cluster (tests/cluster/slurm_up.sh):
the commands submit and say how to follow the jobs, ``--status`` and a second run say where they stand
without submitting again, a failed stage's job takes the later ones out of the queue and the command
run again submits them again, and the finished run holds the local executor's bytes."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.cluster.conftest import output_bytes, run_config
from tests.core.processes import marked_env, survivors_after

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SLURM = {
    "kind": "slurm",
    "tasks": 2,
    "slurm": {"partition": "debug", "time": "00:10:00", "mem_per_cpu_gb": 1},
}


def longctx(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-m", "longctx.cli", *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done


def wait_for_jobs(env: dict[str, str], job_ids: list[str], timeout_s: float = 240) -> None:
    """Until Slurm's queue holds none of ``job_ids`` (job arrays)."""
    deadline = time.monotonic() + timeout_s
    while True:
        listed = subprocess.run(
            ["squeue", "--noheader", "--format=%F"], env=env, capture_output=True, text=True, timeout=60
        ).stdout.split()
        if not set(listed) & set(job_ids):
            return
        assert time.monotonic() < deadline, f"Slurm jobs {job_ids} still queued after {timeout_s} s"
        time.sleep(0.5)


def submitted_jobs(env: dict[str, str], job: str, config: Path) -> list[str]:
    """Run ``longctx <job>``, which submits; check what it says; return the job ids it printed."""
    out = longctx(env, job, "--config", str(config)).stdout
    ids = re.findall(r"^ +\d+/\d+ \S+ +job (\d+) \(\d+ task\(s\)\)$", out, re.MULTILINE)
    assert ids, out
    assert f"follow them with: squeue -j {','.join(ids)}" in out
    assert "slurm_logs/<job>_<task>.out" in out and f"longctx {job} --config {config} --status" in out
    return ids


def submit_and_finish(env: dict[str, str], job: str, config: Path, *, fail_first: bool = False) -> str:
    """Run ``longctx <job>`` (it submits), run it again while its jobs are queued (nothing is submitted
    twice), wait for them, check ``--status``, and run it once more; returns what that last run printed.
    With ``fail_first``, the first stage's job is cancelled at once: the jobs after it leave the queue
    (they can never start), and running the command again submits everything again."""
    ids = submitted_jobs(env, job, config)
    if fail_first:
        subprocess.run(["scancel", ids[0]], env=env, check=True, timeout=60)
        wait_for_jobs(env, ids, timeout_s=60)
        ids = submitted_jobs(env, job, config)
    again = longctx(env, job, "--config", str(config)).stdout
    assert "of this run; nothing submitted" in again and "submitted to Slurm" not in again, again
    wait_for_jobs(env, ids)
    status = longctx(env, job, "--config", str(config), "--status").stdout
    assert "every task is done" in status and "no longer queued" in status, status
    unfinished = [(a, b) for a, b in re.findall(r"(\d+)/(\d+) tasks done", status) if a != b]
    assert not unfinished, status
    return longctx(env, job, "--config", str(config)).stdout


def test_curate_and_pack_on_slurm_write_the_local_executors_bytes(
    slurm_cluster: dict[str, str],
    prose_input: Path,
    cluster_tokenizer: Path,
    prose_reference,
    tmp_path: Path,
) -> None:
    """The jobs' processes carry a marker in their environment (sbatch exports the submitter's):
    none is left once the jobs have finished."""
    config = run_config(tmp_path / "run", prose_input, cluster_tokenizer, SLURM)
    env, mark = marked_env()
    env |= slurm_cluster
    summary = submit_and_finish(env, "curate", config, fail_first=True)
    assert "curated documents:" in summary
    packed = submit_and_finish(env, "pack", config)
    assert "seq512" in packed
    assert output_bytes(tmp_path / "run") == prose_reference
    assert survivors_after(mark, 10) == []
