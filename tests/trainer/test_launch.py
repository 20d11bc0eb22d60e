"""`longctx train --nproc N` as a user drives it: killed in every way, started twice on one output,
fed damaged shards or a config that cannot work. No rank may outlive its launcher, a second run is
refused, a user error is one line with exit status 2, and nothing is left behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from longctx.core.errors import ConfigError
from longctx.core.runlock import RunLockedError, run_lock
from longctx.trainer.launch import PARENT_ENV
from tests.trainer.test_train import SEQ_LEN, train_config

ENV = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}


def write_config(root: Path, output: Path, **train: object) -> Path:
    cfg = train_config(root, output, **train)
    path = output.parent / f"{output.name}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def start(config: Path, *extra: str, nproc: int = 2) -> subprocess.Popen:
    """The launcher in a process group of its own (as a shell starts a job)."""
    cmd = [
        sys.executable,
        "-m",
        "longctx.cli",
        "train",
        "--config",
        str(config),
        "--nproc",
        str(nproc),
        *extra,
    ]
    return subprocess.Popen(
        cmd, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, process_group=0
    )


def ranks_of(launcher: int) -> list[int]:
    """Live processes started for this launcher (they carry its pid in their environment)."""
    found = []
    marker = f"{PARENT_ENV}={launcher}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    found.append(int(entry.name))
        except OSError:
            continue
    return found


def wait_until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.2)


def running_job(shards: Path, tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    """A long run whose two ranks are training (the first metrics line is written)."""
    output = tmp_path / "run"
    proc = start(write_config(shards, output, steps=100_000, checkpoint={"every": 100_000, "keep": 1}))
    metrics = output / "train" / "metrics.jsonl"
    try:
        wait_until(
            lambda: (metrics.exists() and metrics.stat().st_size > 0) or proc.poll() is not None,
            240,
            "training",
        )
    except AssertionError:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    assert proc.poll() is None, proc.communicate()[1][-2000:]
    assert len(ranks_of(proc.pid)) == 2
    return proc, output


@pytest.mark.slow
@pytest.mark.parametrize("how", ["sigkill_group", "sigkill_launcher", "sigterm_launcher"])
def test_killing_the_launcher_leaves_no_rank_training(packed: Path, tmp_path: Path, how: str) -> None:
    proc, output = running_job(packed, tmp_path)
    ranks = ranks_of(proc.pid)
    if how == "sigkill_group":
        os.killpg(proc.pid, signal.SIGKILL)  # the ranks live in sessions of their own: not reached
    elif how == "sigkill_launcher":
        os.kill(proc.pid, signal.SIGKILL)
    else:
        os.kill(proc.pid, signal.SIGTERM)
    proc.communicate(timeout=60)
    wait_until(
        lambda: not any(Path(f"/proc/{r}").exists() and r in ranks_of(proc.pid) for r in ranks),
        10,
        f"ranks {ranks} to stop",
    )
    if how == "sigterm_launcher":
        assert proc.returncode == 128 + signal.SIGTERM
        assert not (output / "train" / ".lock").exists() and not (output / "train" / ".job").exists()
    else:  # a lock left by a killed launcher is taken over by the next run, with a message
        lock = json.loads((output / "train" / ".lock").read_text())
        assert lock["pid"] == proc.pid
        with run_lock(output / "train", "train") as path:
            assert json.loads(path.read_text())["pid"] == os.getpid()


def test_a_second_run_on_the_same_output_is_refused(tmp_path: Path) -> None:
    train_dir = tmp_path / "out" / "train"
    with run_lock(train_dir, "train") as path:
        owner = json.loads(path.read_text())
        assert owner["pid"] == os.getpid() and owner["host"]
        with (
            pytest.raises(
                RunLockedError,
                match=rf"{path}: another longctx train is running on this output \(pid {os.getpid()} on host",
            ),
            run_lock(train_dir, "train"),
        ):
            pass
        other = subprocess.run(  # another process is refused the same way, before it touches anything
            [
                sys.executable,
                "-c",
                "from longctx.core.runlock import run_lock\n"
                f"with run_lock(__import__('pathlib').Path({str(train_dir)!r}), 'train'): pass",
            ],
            capture_output=True,
            text=True,
            env=ENV,
            timeout=60,
        )
        assert other.returncode != 0 and "RunLockedError" in other.stderr
    assert not path.exists() and not train_dir.exists()  # the folder it created, removed when empty


def test_a_stale_lock_is_taken_over_and_a_foreign_one_is_not(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    train_dir = tmp_path / "train"
    train_dir.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (train_dir / ".lock").write_text(json.dumps({"pid": dead.pid, "host": os.uname().nodename, "since": 0}))
    with run_lock(train_dir, "train"):
        pass
    assert f"taking over the stale lock {train_dir / '.lock'} of pid {dead.pid}" in capsys.readouterr().err
    (train_dir / ".lock").write_text(json.dumps({"pid": 1, "host": "another-host", "since": 0}))
    with (
        pytest.raises(RunLockedError, match=r"held by a run on another host .*delete the file"),
        run_lock(train_dir, "train"),
    ):
        pass


@pytest.mark.slow
def test_a_second_launcher_is_refused_while_one_trains(packed: Path, tmp_path: Path) -> None:
    proc, output = running_job(packed, tmp_path)
    try:
        second = subprocess.run(
            [
                sys.executable,
                "-m",
                "longctx.cli",
                "train",
                "--config",
                str(tmp_path / "run.yaml"),
                "--nproc",
                "2",
            ],
            capture_output=True,
            text=True,
            env=ENV,
            timeout=120,
        )
        assert second.returncode == 2
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(
            f"longctx train: {output / 'train' / '.lock'}: another longctx train is running on this output "
            f"(pid {proc.pid} on host {os.uname().nodename}, since "
        ), second.stderr
        assert proc.poll() is None  # the first run is untouched
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.communicate(timeout=60)


def damage_ids(folder: Path, value: int) -> Path:
    """Set token 5 of every row of the first shard to ``value``, keeping the manifest's checksum in step."""
    from tests.packer.test_shard_trust import rewrite

    return folder / rewrite(folder, lambda c: c["input_ids"][:, 5].__setitem__(slice(None), value), shard=0)


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["flipped_bytes", "id_beyond_vocabulary"])
def test_damaged_shards_stop_training_with_one_line(packed: Path, tmp_path: Path, damage: str) -> None:
    import shutil

    folder = tmp_path / "shards"
    shutil.copytree(packed / "shards" / f"seq{SEQ_LEN}", folder)
    manifest = json.loads((folder / "manifest.json").read_text())
    if damage == "flipped_bytes":
        path = folder / manifest["shards"][0]["file"]
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x5A
        path.write_bytes(bytes(data))
        expected = f"{path}: xxh3_128 differs from the manifest's checksum"
    else:
        path = damage_ids(folder, 10**6)
        expected = "input_ids: token 5 has id 1000000, outside the vocabulary"
    output = tmp_path / "run"
    config = write_config(packed, output, shards=str(folder), steps=50)
    done = subprocess.run(
        [sys.executable, "-m", "longctx.cli", "train", "--config", str(config), "--nproc", "2"],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "gloo" not in done.stderr.lower(), done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("longctx train:")]
    assert len(errors) == 1 and expected in errors[0] and str(path) in errors[0], done.stderr[-3000:]
    assert not (output / "train" / ".lock").exists() and not (output / "train" / ".job").exists()


def test_seq_len_not_divisible_by_2cp_is_refused_before_any_rank_starts(packed: Path, tmp_path: Path) -> None:
    config = write_config(packed, tmp_path / "run", cp=3)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "longctx.cli", "train", "--config", str(config), "--nproc", "3"],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=120,
    )
    assert done.returncode == 2
    folder = packed / "shards" / f"seq{SEQ_LEN}"
    assert done.stderr.strip() == (
        f"longctx train: the shards' seq_len ({folder}) = {SEQ_LEN} must be "
        "a positive multiple of 2 x train.cp = 6 (zigzag context parallelism cuts every window into 2 x cp "
        f"equal chunks, two per rank); use windows of a multiple of 6 tokens, or a train.cp that divides "
        f"{SEQ_LEN // 2}"
    )
    assert not (tmp_path / "run").exists()  # a refused run changes nothing
    assert time.monotonic() - started < 60


def test_a_mesh_that_does_not_divide_the_world_is_refused_before_any_rank_starts(
    packed: Path, tmp_path: Path
) -> None:
    """cp 2 x dp_replicate 2 needs a multiple of 4 processes: 2 are refused by the launcher, as each
    rank's mesh would refuse them (``MeshShape.for_world``), before any rank starts."""
    config = write_config(packed, tmp_path / "run", cp=2, dp_replicate=2)
    done = subprocess.run(
        [sys.executable, "-m", "longctx.cli", "train", "--config", str(config), "--nproc", "2"],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=120,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "longctx train: train.cp x train.dp_replicate = 4 must divide the number of processes (longctx train "
        "--nproc, torchrun --nproc-per-node) = 2; use a multiple of 4"
    )
    assert not (tmp_path / "run").exists()  # no rank started, nothing written


def test_preflight_counts_the_replicas_in_the_world_size_rule(tmp_path: Path) -> None:
    """``check_before_start`` refuses what ``init_parallel`` would (cp 2 divides 2 processes, cp 2 x
    dp_replicate 2 does not), without reading any shard."""
    from longctx.core.config import ContextConfig
    from longctx.trainer.config import TrainConfig
    from longctx.trainer.preflight import check_before_start

    train = TrainConfig(cp=2, dp_replicate=2, shards=str(tmp_path / "no-shards-here"))
    with pytest.raises(
        ConfigError, match=r"train\.cp x train\.dp_replicate = 4 must divide the number of processes .* = 2;"
    ):
        check_before_start(train, ContextConfig(original=128, target=SEQ_LEN), tmp_path, world_size=2)


def test_rope_scaling_typos_are_refused_at_config_load(packed: Path, tmp_path: Path) -> None:
    for scaling, message in [
        ({"rope_type": "yarm", "factor": 4.0}, "unknown rope_type 'yarm' (did you mean 'yarn'?)"),
        (
            {"rope_type": "yarn", "factr": 4.0},
            "rope_type 'yarn' takes no key 'factr' (did you mean 'factor'?)",
        ),
        (
            {"rope_type": "llama3", "factor": 8.0},
            "rope_type 'llama3' requires low_freq_factor, high_freq_factor",
        ),
        ({"rope_type": "linear", "factor": "two"}, "factor must be a positive number, got 'two'"),
    ]:
        config = write_config(packed, tmp_path / "run", model={"rope_scaling": scaling})
        done = subprocess.run(
            [sys.executable, "-m", "longctx.cli", "train", "--config", str(config), "--nproc", "2"],
            capture_output=True,
            text=True,
            env=ENV,
            timeout=120,
        )
        assert done.returncode == 2 and "Traceback" not in done.stderr
        assert "train.model.rope_scaling: " + message in done.stderr, done.stderr
        assert not (tmp_path / "run").exists()


_PARTIAL_LINE_RANK = """
import os, sys, time
from longctx.core.errors import ConfigError
from longctx.trainer.launch import rank_errors
with rank_errors("train"):
    if os.environ["RANK"] == "0":
        sys.stderr.write("train:  4%| 2/50")  # a progress bar's line, not ended yet
        sys.stderr.flush()
        time.sleep(120)
    time.sleep(1)
    raise ConfigError("rank 1 found a damaged shard")
"""


def test_the_error_line_starts_its_own_line_after_a_stopped_ranks_partial_line(tmp_path: Path) -> None:
    """Rank 1 records a user error while rank 0's progress bar line is unended; the agent stops rank 0
    with a signal, and the launcher's one error line still starts a line of its own."""
    (tmp_path / "partial_rank.py").write_text(_PARTIAL_LINE_RANK)
    script = (
        "import sys; from pathlib import Path; from longctx.trainer.launch import launch; "
        "sys.exit(launch(2, 'partial_rank', [], Path(sys.argv[1]), env={'PYTHONPATH': sys.argv[2]}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "job"), str(tmp_path)],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr[-2000:]
    assert "train:  4%| 2/50\n" in done.stderr
    assert [line for line in done.stderr.splitlines() if "damaged shard" in line] == [
        "longctx train: rank 1 found a damaged shard"
    ]


def test_multi_machine_flags_that_make_no_job_are_refused_before_any_rank_starts(
    packed: Path, tmp_path: Path
) -> None:
    config = write_config(packed, tmp_path / "run", cp=2)
    for flags, message in [
        (
            ["--nnodes", "2"],
            "longctx train: --nnodes 2 needs --rdzv-endpoint HOST:PORT, where the machines' launchers meet",
        ),
        (["--nnodes", "2", "--rdzv-endpoint", "node0"], "needs --rdzv-endpoint HOST:PORT"),
        (
            ["--rdzv-endpoint", "node0:29500"],
            "longctx train: --rdzv-endpoint and --rdzv-id are for jobs of several machines (--nnodes)",
        ),
    ]:
        done = subprocess.run(
            [sys.executable, "-m", "longctx.cli", "train", "--config", str(config), "--nproc", "2", *flags],
            capture_output=True,
            text=True,
            env=ENV,
            timeout=120,
        )
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert message in done.stderr, done.stderr
        assert not (tmp_path / "run").exists()


def test_a_finished_rank_leaves_with_its_status_without_the_interpreters_shutdown(tmp_path: Path) -> None:
    """A rank that finished still ends by ``_leave`` (exit handlers run, the interpreter's shutdown
    does not, where a process group's worker thread could abort it: pytorch/pytorch#190489); outside a
    launched rank ``leave_rank`` only returns the status."""
    script = (
        "import atexit, os, sys\n"
        "from longctx.trainer.launch import ERROR_FILE_ENV, PARENT_ENV, leave_rank\n"
        "class Finalized:\n"
        "    def __del__(self): print('interpreter shutdown', flush=True)\n"
        "kept = Finalized()\n"
        "atexit.register(lambda: print('exit handlers', flush=True))\n"
        "print('outside:', leave_rank(3), flush=True)\n"
        "os.environ |= {ERROR_FILE_ENV: sys.argv[1], PARENT_ENV: str(os.getppid())}\n"
        "leave_rank(5)\n"
        "print('not reached')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(tmp_path / "errors")], env=ENV, capture_output=True, text=True
    )
    assert done.returncode == 5, done.stderr
    assert done.stdout.splitlines() == ["outside: 3", "exit handlers"]
