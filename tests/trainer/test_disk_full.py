"""A disk that fills up while 2 ranks save a checkpoint or export the model: one line naming the folder
and the space needed, every rank stopping together (no traceback, no gloo 'Connection closed'),
nothing partial left, and the same command working once there is room (issue 27). Metrics, which
rank 0 alone appends, fail there alone: one line naming the file, the other rank stopped by the
launcher.

The disk is a real ``tmpfs`` of a chosen size (``tests/core/disks.py``; the tests skip where it cannot
be mounted). Sizes are measured, not assumed: a first run on a roomy disk gives the pages a checkpoint
and an export really take, and the model's tensors give the bytes the state holds.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from safetensors.torch import load_file

from tests.core.disks import resize, small_disk
from tests.trainer.test_train import train_config

PAGE = 4096


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return subprocess.run(
        [sys.executable, "-m", "longctx.cli", *args], capture_output=True, text=True, timeout=600, env=env
    )


def used(path: Path) -> int:
    """Bytes in use on the file system of ``path`` (tmpfs counts whole pages)."""
    stats = os.statvfs(path)
    return (stats.f_blocks - stats.f_bfree) * stats.f_frsize


def one_line(done: subprocess.CompletedProcess) -> str:
    """The command's error line: exit status 2, one line on stderr past the progress bar."""
    lines = [line for line in done.stderr.replace("\r", "\n").splitlines() if line.strip()]
    lines = [line for line in lines if not line.startswith("train:")]
    assert done.returncode == 2 and len(lines) == 1, done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "Connection closed" not in done.stderr
    return lines[0]


@pytest.fixture(scope="module")
def roomy(packed: Path, tmp_path_factory) -> tuple[dict, Path]:
    """(config, run folder) of a 2-step, 2-rank cp=2 run on an ordinary disk: the sizes to aim at."""
    root = tmp_path_factory.mktemp("roomy")
    cfg = train_config(
        packed,
        root / "run",
        cp=2,
        steps=2,
        checkpoint={"every": 2, "keep": 1},
        export={"max_shard_size": "20KB"},
    )
    path = root / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    done = run_cli("train", "--config", str(path), "--nproc", "2")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return cfg, root / "run"


def state_bytes(run: Path) -> int:
    """The model's parameters and AdamW's two moments in float32, and one step count per tensor:
    what a checkpoint holds, from the exported weights."""
    tensors = {}
    for shard in sorted((run / "train" / "final").glob("model-*.safetensors")):
        tensors.update(load_file(shard))
    assert tensors
    return sum(3 * t.numel() * 4 + 4 for t in tensors.values())


def empty(folder: Path) -> bool:
    """Nothing (of a checkpoint or an export) under ``folder``."""
    return not folder.exists() or not any(folder.iterdir())


def pages(folder: Path) -> int:
    return sum(-(-p.stat().st_size // PAGE) * PAGE for p in folder.rglob("*") if p.is_file())


@pytest.mark.slow
def test_a_checkpoint_on_a_full_disk(roomy: tuple[dict, Path], tmp_path: Path) -> None:
    cfg, reference = roomy
    checkpoint = pages(reference / "train" / "checkpoints" / "step_0000002")
    needed = state_bytes(reference)
    # DCP adds a header per tensor: the checkpoint takes well over the state's bytes, so a disk can
    # have the room the state needs (with the 10% margin) and still fill up while the ranks write
    assert 1.1 * needed + 8 * PAGE < checkpoint - 8 * PAGE, (needed, checkpoint)
    with small_disk(tmp_path / "disk", 64) as disk:
        path = tmp_path / "run.yaml"
        path.write_text(yaml.safe_dump({**cfg, "output": str(disk)}))
        checkpoints = disk / "train" / "checkpoints"

        # too little free: refused before anything of the checkpoint is written
        line = one_line(run_cli("train", "--config", str(path), "--nproc", "2"))
        assert line.startswith(
            f"longctx train: {checkpoints}: no room for checkpoint step 2: it takes about "
        )
        assert empty(checkpoints)

        # room for the state but not for DCP's files: the write fails on the ranks, all stop together
        resize(disk, (used(disk) + int(1.1 * needed) + checkpoint) // 2 // 1024 + 8)
        line = one_line(run_cli("train", "--config", str(path), "--nproc", "2"))
        assert line.startswith(
            f"longctx train: {checkpoints}: No space left on device while writing checkpoint "
        )
        assert line.endswith("; it was not kept: free some space and run again")
        assert empty(checkpoints)

        # with room, the same command trains and exports
        resize(disk, 16 * 1024)
        done = run_cli("train", "--config", str(path), "--nproc", "2")
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert sorted(p.name for p in checkpoints.iterdir()) == ["step_0000002"]
        assert (disk / "train" / "final" / "config.json").is_file()


@pytest.mark.slow
def test_an_export_on_a_full_disk(roomy: tuple[dict, Path], tmp_path: Path) -> None:
    """`longctx train --export 2 --nproc 2` (20 KB safetensors shards, each file rounded up to whole
    pages) onto a disk with the room the weights and tokenizer need but a page or two short of what
    the export really takes (measured beside it), then with room: the export equals the run's own.
    (A disk without that room is refused before writing, as the checkpoint's test shows.)"""
    cfg, reference = roomy
    export = pages(reference / "train" / "final")
    tokenizer = Path(cfg["tokenizer"]["path"]).stat().st_size
    needed = state_bytes(reference) // 3 + tokenizer  # the weights in float32, and the tokenizer
    assert 1.1 * needed + 2 * PAGE < export - 2 * PAGE, (needed, export)
    with small_disk(tmp_path / "disk", 64) as disk:
        resize(disk, 16 * 1024)
        shutil.copytree(reference / "train" / "checkpoints", disk / "train" / "checkpoints")
        path = tmp_path / "run.yaml"
        path.write_text(yaml.safe_dump({**cfg, "output": str(disk)}))
        target = disk / "train" / "export"
        argv = ("train", "--config", str(path), "--export", "2", "--nproc", "2")
        before = used(disk)

        # the launcher's error file takes a page while the ranks run
        resize(disk, (before + export) // 1024 - 8)
        line = one_line(run_cli(*argv))
        written = target / "step_0000002"
        assert line.startswith(
            f"longctx train: {written}: No space left on device while writing the exported "
        )
        assert empty(target)

        resize(disk, 16 * 1024)
        done = run_cli(*argv)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        for file in (reference / "train" / "final").iterdir():
            assert (written / file.name).read_bytes() == file.read_bytes(), file.name


def fill(disk: Path, leave: int) -> Path:
    """A file taking all but ``leave`` bytes of ``disk``'s free space."""
    stats = os.statvfs(disk)
    filler = disk / "filler"
    filler.write_bytes(bytes(stats.f_bavail * stats.f_frsize - leave))
    return filler


def test_a_metrics_line_on_a_full_disk(tmp_path: Path) -> None:
    """Rank 0 alone appends metrics: a full disk there is one line naming the file, not a traceback."""
    from longctx.core.errors import OutputError
    from longctx.trainer.tracking import JsonlSink

    with small_disk(tmp_path / "disk", 64) as disk:
        sink = JsonlSink(disk / "train" / "metrics.jsonl")
        sink.write({"step": 1, "loss": 5.0})
        fill(disk, 0)
        expected = f"{disk / 'train' / 'metrics.jsonl'}: No space left on device"
        with pytest.raises(OutputError, match="^" + re.escape(expected)):
            sink.write({"step": 2, "loss": 4.0, "text": "x" * 2 * PAGE})


@pytest.mark.slow
def test_setting_metrics_aside_on_a_full_disk(packed: Path, tmp_path: Path) -> None:
    """A rerun sets aside the metrics lines of steps it will train again; on a full disk rank 0 fails
    doing so while rank 1 waits in a collective: one line naming the file, the other rank stopped by
    the launcher, and with room the same command gets as far as before."""
    cfg = train_config(packed, tmp_path / "run", cp=2, steps=2, checkpoint={"every": 2, "keep": 1})
    with small_disk(tmp_path / "disk", 64) as disk:
        path = tmp_path / "run.yaml"
        path.write_text(yaml.safe_dump({**cfg, "output": str(disk)}))
        argv = ("train", "--config", str(path), "--nproc", "2")
        refused = "longctx train: {}: no room for checkpoint step 2"
        checkpoints = disk / "train" / "checkpoints"
        assert one_line(run_cli(*argv)).startswith(refused.format(checkpoints))
        metrics = (disk / "train" / "metrics.jsonl").read_text()
        assert metrics.count("\n") == 2

        filler = fill(disk, 2 * PAGE)  # the launcher's job folder takes two pages
        line = one_line(run_cli(*argv))
        assert line == (
            f"longctx train: {disk / 'train' / 'metrics.superseded.jsonl'}: No space left on device; "
            "free some space and run again to resume"
        )
        assert (disk / "train" / "metrics.jsonl").read_text() == metrics

        filler.unlink()
        assert one_line(run_cli(*argv)).startswith(refused.format(checkpoints))
        assert (disk / "train" / "metrics.superseded.jsonl").read_text().endswith(metrics)
