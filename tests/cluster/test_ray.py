"""`curate` and `pack` with ``kind: ray`` on a real local Ray cluster (tests/cluster/conftest.py): the
same bytes as the local executor, a killed worker resumed to the same output, no process left."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from datatrove.pipeline.base import PipelineStep

from longctx.core.config import ExecutorConfig
from longctx.core.engines import check_engine
from longctx.core.errors import ConfigError
from longctx.core.executors import StageFailed, run_stages
from tests.cluster.conftest import output_bytes, run_config
from tests.cluster.raycluster import RayCluster
from tests.core.processes import marked_env, survivors_after

pytestmark = pytest.mark.slow


def longctx(
    *args: str, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "longctx.cli", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


def test_curate_and_pack_on_ray_write_the_local_executors_bytes(
    ray_cluster: RayCluster, cluster_input: Path, cluster_tokenizer: Path, local_reference, tmp_path: Path
) -> None:
    """The address comes from RAY_ADDRESS here (the config names none); the commands leave no process."""
    config = run_config(tmp_path / "run", cluster_input, cluster_tokenizer, {"kind": "ray", "tasks": 2})
    env, mark = marked_env()
    env["RAY_ADDRESS"] = ray_cluster.address
    for job in ("curate", "pack"):
        done = longctx(job, "--config", str(config), env=env)
        assert done.returncode == 0, done.stderr[-3000:]
    assert survivors_after(mark, 5) == []
    curate_out = done.stdout  # pack's
    assert "seq512" in curate_out
    assert output_bytes(tmp_path / "run") == local_reference


def test_a_killed_ray_worker_resumes_to_the_same_output(
    ray_cluster: RayCluster, cluster_input: Path, cluster_tokenizer: Path, local_reference, tmp_path: Path
) -> None:
    """A worker running a `read` task is killed with SIGKILL. With no retries the stage fails with one
    line naming the task; the same command again redoes the unfinished tasks and writes the local
    executor's bytes."""
    executor = {"kind": "ray", "tasks": 2, "ray": {"address": ray_cluster.address, "retries": 0}}
    config = run_config(tmp_path / "run", cluster_input, cluster_tokenizer, executor)
    command = [sys.executable, "-m", "longctx.cli", "curate", "--config", str(config)]
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 240
    killed = []
    while not killed and proc.poll() is None and time.monotonic() < deadline:
        for pid in ray_cluster.task_workers("curate_read")[:1]:  # one of the two tasks
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        time.sleep(0.01)
    out, err = proc.communicate(timeout=240)
    assert killed, f"no worker was seen running a read task:\n{out[-2000:]}\n{err[-2000:]}"
    assert proc.returncode == 2, err[-3000:]
    errors = err.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith("longctx curate: curate_read: task "), err[-3000:]
    assert "failed on Ray: WorkerCrashedError" in errors[0] and "run again to resume" in errors[0]
    assert not (tmp_path / "run" / "ledger.parquet").exists()

    done = longctx("curate", "--config", str(config))
    assert done.returncode == 0, done.stderr[-3000:]
    # the killed task is redone; the other one counts as done when it finished before the stage failed
    read_line = re.search(
        r"^\[curate 4/8\] read: 2 tasks(, (\d) done in an earlier run)?$", done.stdout, re.M
    )
    assert read_line is not None, done.stdout
    assert read_line.group(2) in (None, "1"), read_line.group(0)
    done = longctx("pack", "--config", str(config))
    assert done.returncode == 0, done.stderr[-3000:]
    assert output_bytes(tmp_path / "run") == local_reference


class _FailsOnRank1(PipelineStep):
    """Raises ``error`` in task 1; task 0 completes."""

    def __init__(self, error: Exception) -> None:
        super().__init__()
        self.error = error

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        if rank == 1:
            raise self.error
        yield from data or ()


def test_a_failed_ray_task_is_one_line_naming_the_task_and_its_log(
    ray_cluster: RayCluster, tmp_path: Path
) -> None:
    """A user error raised in a Ray task reaches the driver as it is; any other error as one line
    naming the task and its log, which holds the traceback. The other task completes either way."""
    import ray
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import tests/
    cfg = ExecutorConfig(kind="ray", tasks=2, ray={"address": ray_cluster.address})
    check_engine(cfg, "test.executor")
    try:
        with pytest.raises(ConfigError, match=r"^a bad setting$"):
            run_stages(cfg, [("s", [_FailsOnRank1(ConfigError("a bad setting"))], 2)], tmp_path / "a", "job")
        with pytest.raises(StageFailed) as failed:
            run_stages(cfg, [("s", [_FailsOnRank1(ZeroDivisionError("boom"))], 2)], tmp_path / "b", "job")
        log = tmp_path / "b" / "logs" / "1_s" / "logs" / "task_00001.log"
        assert str(failed.value) == (
            f"job_s: task 1 failed on Ray: ZeroDivisionError: boom; its log: {log}; run again to resume"
        )
        assert "Traceback" in log.read_text() and "ZeroDivisionError: boom" in log.read_text()
        for run in ("a", "b"):
            assert [p.name for p in (tmp_path / run / "logs" / "1_s" / "completions").iterdir()] == ["00000"]
    finally:
        ray.shutdown()
