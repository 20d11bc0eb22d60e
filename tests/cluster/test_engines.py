"""A missing engine is one line before anything is written: no ray (the extra), no sbatch on the PATH
or an sbatch that cannot submit, no Ray cluster named, or none answering at the address given. Each
for `curate` and for `pack`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.cluster.raycluster import free_port

# the command with the ray package made unimportable, as where the extra is not installed
WITHOUT_RAY = (
    "import sys; sys.modules['ray'] = None; from longctx.cli import main; sys.exit(main(sys.argv[1:]))"
)


def config(tmp_path: Path, executor: dict) -> Path:
    (tmp_path / "in" / "books").mkdir(parents=True, exist_ok=True)
    (tmp_path / "in" / "books" / "a.txt").write_text("some words " * 500)
    path = tmp_path / "run.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "output": str(tmp_path / "out"),
                "context": {"original": 8, "target": 16},
                "curate": {"input": str(tmp_path / "in"), "executor": executor},
                "pack": {"executor": executor},
            }
        )
    )
    return path


def refused(command: list[str], env: dict[str, str], tmp_path: Path) -> str:
    """The one line a refused command printed (exit status 2); the output folder was never made."""
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr[-3000:]
    assert not (tmp_path / "out").exists()  # no tokenizer.json, no work/
    return lines[0]


def environment(**changes: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


@pytest.mark.parametrize("job", ["curate", "pack"])
def test_slurm_without_sbatch_on_the_path(tmp_path: Path, job: str) -> None:
    path = config(tmp_path, {"kind": "slurm", "slurm": {"partition": "cpu"}})
    empty = tmp_path / "bin"
    empty.mkdir()
    line = refused(
        [sys.executable, "-m", "longctx.cli", job, "--config", str(path)],
        environment(PATH=str(empty)),
        tmp_path,
    )
    assert line.startswith(f"longctx {job}: {job}.executor.kind is 'slurm' but sbatch is not on the PATH")


SBATCH_WITHOUT_CONTROLLER = """#!/bin/sh
# Slurm's sbatch on a machine whose slurm.conf names a controller that is not running: what the real
# one prints (after 9 s of its own retries; 18 s with --test-only), and its exit status
case " $* " in
    *" --test-only "*) echo "allocation failure: Unable to contact slurm controller (connect failure)" >&2 ;;
    *) echo "sbatch: error: Batch job submission failed: Unable to contact slurm controller" \
        "(connect failure)" >&2 ;;
esac
exit 1
"""


@pytest.mark.parametrize("job", ["curate", "pack"])
def test_slurm_whose_sbatch_reaches_no_controller(tmp_path: Path, job: str) -> None:
    """sbatch is on the PATH but cannot submit (a stand-in for Slurm's own, failing as it does without
    a controller): one line with sbatch's message, exit 2, nothing written (it was a
    CalledProcessError traceback, exit 1, and a partial output folder)."""
    path = config(tmp_path, {"kind": "slurm", "slurm": {"partition": "cpu"}})
    bin_folder = tmp_path / "bin"
    bin_folder.mkdir()
    (bin_folder / "sbatch").write_text(SBATCH_WITHOUT_CONTROLLER)
    (bin_folder / "sbatch").chmod(0o755)
    line = refused(
        [sys.executable, "-m", "longctx.cli", job, "--config", str(path)],
        environment(PATH=f"{bin_folder}{os.pathsep}{os.environ['PATH']}"),
        tmp_path,
    )
    assert line == (
        f"longctx {job}: {job}.executor.kind is 'slurm' but sbatch cannot submit from here "
        "(sbatch --test-only: allocation failure: Unable to contact slurm controller (connect failure))"
    )


@pytest.mark.parametrize("job", ["curate", "pack"])
def test_ray_without_the_ray_extra(tmp_path: Path, job: str) -> None:
    path = config(tmp_path, {"kind": "ray", "ray": {"address": "127.0.0.1:6379"}})
    line = refused([sys.executable, "-c", WITHOUT_RAY, job, "--config", str(path)], environment(), tmp_path)
    assert line == (
        f"longctx {job}: {job}.executor.kind is 'ray' but ray is not installed here: "
        "pip install 'longctx[ray]'"
    )


@pytest.mark.parametrize("job", ["curate", "pack"])
def test_ray_at_an_address_nothing_answers(tmp_path: Path, job: str) -> None:
    pytest.importorskip("ray")
    port = free_port()
    path = config(tmp_path, {"kind": "ray", "ray": {"address": f"127.0.0.1:{port}"}})
    line = refused([sys.executable, "-m", "longctx.cli", job, "--config", str(path)], environment(), tmp_path)
    assert line == (
        f"longctx {job}: {job}.executor.ray.address 127.0.0.1:{port}: no Ray cluster answers there "
        "(Connection refused); start one with `ray start --head` or correct the address"
    )


def test_ray_address_from_the_environment_and_no_address_at_all(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    path = config(tmp_path, {"kind": "ray"})
    command = [sys.executable, "-m", "longctx.cli", "curate", "--config", str(path)]
    port = free_port()
    line = refused(command, environment(RAY_ADDRESS=f"127.0.0.1:{port}"), tmp_path)
    assert line.startswith(f"longctx curate: RAY_ADDRESS 127.0.0.1:{port}: no Ray cluster answers there")
    line = refused(command, environment(), tmp_path)
    assert line == (
        "longctx curate: curate.executor.kind is 'ray' but no Ray cluster is named: set curate.executor."
        "ray.address to its head's host:port (what `ray start --head` prints) or set RAY_ADDRESS"
    )
