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
from longctx.core.errors import ConfigError, EngineError
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


def _home_with_token(home: Path, token: str) -> Path:
    """A home folder whose ``~/.ray/auth_token`` holds ``token``, where Ray keeps the token it
    generates (a user who ran ``ray.init()`` or ``ray get-auth-token --generate`` has one)."""
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text(token)
    return home


def test_curate_and_pack_on_ray_write_the_local_executors_bytes(
    ray_cluster: RayCluster, cluster_input: Path, cluster_tokenizer: Path, local_reference, tmp_path: Path
) -> None:
    """Given only the address (RAY_ADDRESS; the config names none), on a cluster with token
    authentication whose token is in ``~/.ray/auth_token`` (no RAY_AUTH_* variable set): the same
    bytes as the local executor, no process left, and the token written nowhere."""
    config = run_config(tmp_path / "run", cluster_input, cluster_tokenizer, {"kind": "ray", "tasks": 2})
    env, mark = marked_env()
    token = ray_cluster.token_path.read_text()
    home = _home_with_token(tmp_path / "home", token)
    env = {k: v for k, v in ray_cluster.client_env(**env).items() if k != "RAY_AUTH_TOKEN_PATH"}
    env |= {"RAY_ADDRESS": ray_cluster.address, "HOME": str(home)}
    outputs = []
    for job in ("curate", "pack"):
        done = longctx(job, "--config", str(config), env=env)
        assert done.returncode == 0, done.stderr[-3000:]
        outputs += [done.stdout, done.stderr]
    assert survivors_after(mark, 5) == []
    assert "seq512" in outputs[-2]  # pack's
    assert output_bytes(tmp_path / "run") == local_reference
    assert not any(token in text for text in outputs)
    written = [p for p in (tmp_path / "run").rglob("*") if p.is_file() and token.encode() in p.read_bytes()]
    assert written == []  # run records, logs, configs


def test_a_killed_ray_worker_resumes_to_the_same_output(
    ray_cluster: RayCluster, cluster_input: Path, cluster_tokenizer: Path, local_reference, tmp_path: Path
) -> None:
    """A worker running a `read` task is killed with SIGKILL. With no retries the stage fails with one
    line naming the task; the same command again redoes the unfinished tasks and writes the local
    executor's bytes."""
    executor = {"kind": "ray", "tasks": 2, "ray": {"address": ray_cluster.address, "retries": 0}}
    config = run_config(tmp_path / "run", cluster_input, cluster_tokenizer, executor)
    command = [sys.executable, "-m", "longctx.cli", "curate", "--config", str(config)]
    proc = subprocess.Popen(
        command, env=ray_cluster.client_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
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

    done = longctx("curate", "--config", str(config), env=ray_cluster.client_env())
    assert done.returncode == 0, done.stderr[-3000:]
    # the killed task is redone; the other one counts as done when it finished before the stage failed
    read_line = re.search(
        r"^\[curate 4/8\] read: 2 tasks(, (\d) done in an earlier run)?$", done.stdout, re.M
    )
    assert read_line is not None, done.stdout
    assert read_line.group(2) in (None, "1"), read_line.group(0)
    done = longctx("pack", "--config", str(config), env=ray_cluster.client_env())
    assert done.returncode == 0, done.stderr[-3000:]
    assert output_bytes(tmp_path / "run") == local_reference


_TOKEN_HELP = "(`ray get-auth-token` on the head node prints it)"


def test_a_missing_token_is_one_line_and_writes_nothing(
    ray_cluster: RayCluster, cluster_input: Path, cluster_tokenizer: Path, tmp_path: Path
) -> None:
    """Against the cluster with token authentication, given its address and no token anywhere Ray
    looks: one line naming where to put it, exit status 2, no output folder (it used to be 20 s of
    Ray's retries, then "cannot connect to the Ray cluster")."""
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in ray_cluster.client_env(HOME=str(home)).items() if k != "RAY_AUTH_TOKEN_PATH"}
    config = run_config(tmp_path / "run", cluster_input, cluster_tokenizer, {"kind": "ray"})
    done = longctx("curate", "--config", str(config), env=env | {"RAY_ADDRESS": ray_cluster.address})
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr.strip().splitlines() == [
        f"longctx curate: RAY_ADDRESS {ray_cluster.address}: the Ray cluster requires token authentication "
        "and no token was found: set RAY_AUTH_TOKEN, or RAY_AUTH_TOKEN_PATH to a file holding it, or write "
        f"it to ~/.ray/auth_token {_TOKEN_HELP}"
    ], done.stderr[-3000:]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("case", ["RAY_AUTH_TOKEN", "home", "RAY_AUTH_TOKEN_PATH", "no-file"])
def test_a_wrong_or_unreadable_token_is_refused_naming_where_it_was_read(
    ray_cluster: RayCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    """A wrong token (from each place Ray reads one) or a RAY_AUTH_TOKEN_PATH naming no file: the
    engine check refuses it naming the place, never the token (in this process: the command prints
    the same message as the one line above)."""
    wrong = "0" * 32
    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(_home_with_token(tmp_path / "home", wrong)))
    where = {
        "RAY_AUTH_TOKEN": "RAY_AUTH_TOKEN",
        "home": str(tmp_path / "home" / ".ray" / "auth_token"),
        "RAY_AUTH_TOKEN_PATH": f"{tmp_path / 'wrong'} (RAY_AUTH_TOKEN_PATH)",
    }
    if case == "RAY_AUTH_TOKEN":
        monkeypatch.setenv("RAY_AUTH_TOKEN", wrong)
    elif case == "RAY_AUTH_TOKEN_PATH":
        (tmp_path / "wrong").write_text(wrong)
        monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "wrong"))
    elif case == "no-file":
        monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "absent"))
    cfg = ExecutorConfig(kind="ray", ray={"address": ray_cluster.address})
    with pytest.raises(EngineError) as refused:
        check_engine(cfg, "pack.executor")
    there = f"pack.executor.ray.address {ray_cluster.address}: the Ray cluster"
    if case == "no-file":
        expected = (
            f"{there} requires token authentication and RAY_AUTH_TOKEN_PATH names {tmp_path / 'absent'}, "
            "which cannot be read (No such file or directory)"
        )
    else:
        expected = f"{there} refused the token in {where[case]}: set the cluster's token there {_TOKEN_HELP}"
    assert str(refused.value) == expected
    assert wrong not in str(refused.value)


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
    ray_cluster: RayCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A user error raised in a Ray task reaches the driver as it is; any other error as one line
    naming the task and its log, which holds the traceback. The other task completes either way."""
    import ray
    import ray.cloudpickle

    for name in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN"):  # as they were once the test is over
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(ray_cluster.token_path))

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
