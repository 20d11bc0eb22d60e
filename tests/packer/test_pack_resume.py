"""A pack run killed with SIGKILL in the middle resumes when run again, and its shards are
byte-identical to those of a run that was never interrupted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from longctx.pipeline.bpe import train_bpe
from tests.packer.test_pack_helpers import ORIGINAL, SEQ_LENS, TARGET, synthetic_texts, write_curated


def prepare(root: Path) -> Path:
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
            "executor": {"tasks": 8, "workers": 1},
        },
    }
    path = root / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def pack_command(config: Path) -> list[str]:
    return [sys.executable, "-m", "longctx.cli", "pack", "--config", str(config)]


def shard_bytes(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted((root / "shards").rglob("*")) if p.is_file()
    }


def test_killed_run_resumes_to_identical_bytes(tmp_path: Path) -> None:
    clean, killed = tmp_path / "clean", tmp_path / "killed"
    clean.mkdir()
    killed.mkdir()
    subprocess.run(pack_command(prepare(clean)), check=True, capture_output=True)

    config = prepare(killed)
    completions = killed / "work" / "pack" / "logs" / "1_pack" / "completions"
    process = subprocess.Popen(pack_command(config), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (completions.is_dir() and any(completions.iterdir())) and process.poll() is None:
        assert time.monotonic() < deadline, "the pack run did not complete a task in time"
        time.sleep(0.002)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    done = len(list(completions.iterdir()))
    assert 0 < done < 8, f"the kill should land mid-run ({done}/8 tasks complete)"
    assert not (killed / "shards" / f"seq{SEQ_LENS[0]}" / "manifest.json").exists()

    result = subprocess.run(pack_command(config), check=False, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"{done} done in an earlier run" in result.stdout
    assert shard_bytes(killed) == shard_bytes(clean)
