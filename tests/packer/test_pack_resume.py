"""A pack run killed with SIGKILL in the middle leaves no process behind, resumes when run again,
and its shards are byte-identical to those of a run that was never interrupted.

The kill hits only the ``longctx pack`` process (not its process group), as the OOM killer or
``kill -9 <pid>`` would: its datatrove workers and the executor's manager process must die with it.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
import yaml

from longctx.pipeline.bpe import train_bpe
from tests.core.processes import (
    HAS_PROC,
    describe,
    kill_survivors,
    longctx_command,
    start_marked,
    survivors_after,
    wait_for,
)
from tests.packer.test_pack_helpers import ORIGINAL, SEQ_LENS, TARGET, synthetic_texts, write_curated

TASKS = 8
GRACE_SECONDS = 5.0  # children must be gone this long after the kill (they usually are in < 0.5 s)


def prepare(root: Path, workers: int) -> Path:
    texts = synthetic_texts(seed=3)
    tokenizer = train_bpe([t for docs in texts.values() for t in docs], 320, root / "tokenizer.json")
    write_curated(root, texts, tokenizer, files_per_source=4)
    config = {
        "output": str(root),
        "context": {"original": ORIGINAL, "target": TARGET},
        "pack": {
            "seq_lens": SEQ_LENS,
            "shard_tokens": 2048,
            "pool_tokens": 4096,
            "executor": {"tasks": TASKS, "workers": workers},
        },
    }
    path = root / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def shard_bytes(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted((root / "shards").rglob("*")) if p.is_file()
    }


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """The shards of a run that was never interrupted (the same for any number of workers)."""
    clean = tmp_path_factory.mktemp("clean")
    subprocess.run(
        longctx_command("pack", "--config", str(prepare(clean, 1))), check=True, capture_output=True
    )
    return shard_bytes(clean)


@pytest.mark.skipif(not HAS_PROC, reason="finding a killed command's children needs Linux /proc")
@pytest.mark.parametrize("workers", [1, 2], ids=["tasks-in-the-driver", "pool-of-2-workers"])
def test_killed_run_leaves_no_process_and_resumes_to_identical_bytes(
    tmp_path: Path, clean_run: dict[str, bytes], workers: int
) -> None:
    config = prepare(tmp_path, workers)
    completions = tmp_path / "work" / "pack" / "seq256+seq1024" / "logs" / "1_pack" / "completions"
    process, mark = start_marked(longctx_command("pack", "--config", str(config)))
    wait_for(lambda: completions.is_dir() and any(completions.iterdir()), process, 120, "a task completed")
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    survivors = survivors_after(mark, GRACE_SECONDS)
    report = describe(survivors)
    kill_survivors(survivors)
    assert not survivors, f"processes outlived the killed `longctx pack` by {GRACE_SECONDS} s:\n{report}"

    done = len(list(completions.iterdir()))
    assert 0 < done < TASKS, f"the kill should land mid-run ({done}/{TASKS} tasks complete)"
    assert not (tmp_path / "shards" / f"seq{SEQ_LENS[0]}" / "manifest.json").exists()

    result = subprocess.run(
        longctx_command("pack", "--config", str(config)), check=False, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"{done} done in an earlier run" in result.stdout
    assert shard_bytes(tmp_path) == clean_run
    assert not list(tmp_path.rglob("*.tmp")), "temporary files were left behind"
