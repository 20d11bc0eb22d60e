"""`longctx train` on several machines, played by launchers on 127.0.0.1: two agents of two ranks
(``--nnodes 2 --nproc 2``, c10d rendezvous on a free port) form world 4 (DP2 x CP2) and train exactly
as one agent of four ranks; killing one agent ends the other with one line and leaves no process;
and configs/slurm/train.sbatch runs two launchers as two Slurm tasks to the same result."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

from tests.cluster.raycluster import free_port
from tests.core.processes import MARKER_KEY, describe, kill_survivors, marked_env, survivors_after
from tests.trainer.test_train import train_config

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
TORCHRUN_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def write_config(shards: Path, output: Path, **train: object) -> Path:
    settings = {"cp": 2, "steps": 3, "checkpoint": {"every": 3, "keep": 1}} | train
    path = output.with_suffix(".yaml")
    path.write_text(yaml.safe_dump(train_config(shards, output, **settings)))
    return path


def launcher(config: Path, *flags: str, env: dict[str, str]) -> subprocess.Popen:
    command = [sys.executable, "-m", "longctx.cli", "train", "--config", str(config), *flags]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def clean_env() -> tuple[dict[str, str], str]:
    env, mark = marked_env()
    for key in TORCHRUN_ENV:
        env.pop(key, None)
    return env, mark


def trained(output: Path) -> tuple[list[float], dict]:
    """The losses of every step and the final weights of a run."""
    losses = [
        json.loads(line)["loss"] for line in (output / "train" / "metrics.jsonl").read_text().splitlines()
    ]
    weights = {}
    for file in sorted((output / "train" / "final").glob("*.safetensors")):
        weights |= load_file(file)
    return losses, weights


def assert_same_training(run: Path, reference: tuple[list[float], dict]) -> None:
    losses, weights = trained(run)
    ref_losses, ref_weights = reference
    assert len(losses) == len(ref_losses) == 3
    for a, b in zip(losses, ref_losses):
        assert abs(a - b) <= 1e-6 * abs(b), (losses, ref_losses)
    assert weights.keys() == ref_weights.keys()
    for name, tensor in weights.items():
        assert (tensor - ref_weights[name]).abs().max().item() <= 1e-6, name


@pytest.fixture(scope="module")
def one_agent(packed: Path, tmp_path_factory) -> tuple[list[float], dict]:
    """Losses and weights of `longctx train --nproc 4` (one agent, world 4: DP2 x CP2)."""
    output = tmp_path_factory.mktemp("one_agent") / "run"
    env, _ = clean_env()
    proc = launcher(write_config(packed, output), "--nproc", "4", env=env)
    _, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    return trained(output)


def test_two_agents_of_two_ranks_train_as_one_agent_of_four(
    packed: Path,
    one_agent,
    tmp_path: Path,
) -> None:
    config = write_config(packed, tmp_path / "run")
    env, mark = clean_env()
    flags = ("--nproc", "2", "--nnodes", "2", "--rdzv-endpoint", f"127.0.0.1:{free_port()}")
    agents = [launcher(config, *flags, env=env) for _ in range(2)]
    results = [agent.communicate(timeout=600) for agent in agents]
    for agent, (_, err) in zip(agents, results):
        assert agent.returncode == 0, err[-3000:]
    assert sum("trained steps 1-3" in out for out, _ in results) == 1  # rank 0's agent reports
    assert_same_training(tmp_path / "run", one_agent)
    assert survivors_after(mark, 5) == []
    assert not [
        p.name for p in (tmp_path / "run" / "train").iterdir() if p.name.startswith((".job", ".lock"))
    ]


def test_killing_one_agent_ends_the_other_with_one_line(packed: Path, tmp_path: Path) -> None:
    """Two agents of one rank each (a 2-rank ring); the first (which hosts the rendezvous: it binds
    the port first) is killed with SIGKILL while both train; its rank dies with it, the other agent
    stops its own and prints one line."""
    config = write_config(packed, tmp_path / "run", steps=100_000, checkpoint={"every": 100_000, "keep": 1})
    env, mark = clean_env()
    flags = ("--nproc", "1", "--nnodes", "2", "--rdzv-endpoint", f"127.0.0.1:{free_port()}")
    first = launcher(config, *flags, env=env)
    time.sleep(1)
    second = launcher(config, *flags, env=env)
    metrics = tmp_path / "run" / "train" / "metrics.jsonl"
    try:
        deadline = time.monotonic() + 300
        while not (metrics.exists() and metrics.stat().st_size > 0):
            assert first.poll() is None and second.poll() is None, second.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the job did not start training"
            time.sleep(0.2)
        os.kill(first.pid, signal.SIGKILL)
        _, err = second.communicate(timeout=120)
        first.communicate(timeout=60)
    finally:
        for proc in (first, second):
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert second.returncode == 2, err[-3000:]
    lines = err.strip().splitlines()
    assert len(lines) == 1, err[-3000:]
    assert re.match(
        r"longctx train: lost (contact with the job's other ranks|the job's rendezvous at 127\.0\.0\.1:\d+) "
        r"\(.+\).*; run again to resume from the newest checkpoint$",
        lines[0],
    ), lines[0]
    left = survivors_after(mark, 15)
    kill_survivors(left)
    assert left == [], describe(left)


@pytest.mark.slurm
def test_the_sbatch_template_trains_two_launchers_as_one_agent_of_four(
    slurm_cluster: dict[str, str],
    packed: Path,
    one_agent,
    tmp_path: Path,
) -> None:
    """configs/slurm/train.sbatch on the one-node cluster as two Slurm tasks (a launcher each, 2 ranks
    each), meeting at the allocation's first node as it reads it from Slurm."""
    config = write_config(packed, tmp_path / "run")
    log = tmp_path / "train.out"
    env, mark = clean_env()
    env |= {k: v for k, v in slurm_cluster.items() if k not in TORCHRUN_ENV and k != MARKER_KEY}
    env |= {
        "CONFIG": str(config),
        "NPROC_PER_NODE": "2",
        "LONGCTX": str(Path(sys.executable).with_name("longctx")),
    }
    submitted = subprocess.run(
        ["sbatch", "--parsable", "--nodes=1", "--ntasks=2", "--ntasks-per-node=2", f"--output={log}"]
        + [str(REPO / "configs" / "slurm" / "train.sbatch")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    job = submitted.stdout.strip().split(";")[0]
    deadline = time.monotonic() + 600
    while True:
        shown = subprocess.run(
            ["scontrol", "show", "job", job], env=env, capture_output=True, text=True, timeout=60
        ).stdout
        state = re.search(r"JobState=(\w+)", shown)
        if state and state.group(1) not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING"):
            break
        assert time.monotonic() < deadline, f"Slurm job {job} still running:\n{log.read_text()[-3000:]}"
        time.sleep(1)
    assert state.group(1) == "COMPLETED", log.read_text()[-3000:]
    assert "trained steps 1-3" in log.read_text()
    assert_same_training(tmp_path / "run", one_agent)
    assert survivors_after(mark, 10) == []  # the launchers and their ranks, started by Slurm
