"""`longctx demo`, the README's first quickstart command, end to end on the embedded corpus."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_demo_runs_end_to_end_and_reuses_finished_stages(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    cmd = [sys.executable, "-m", "longctx.cli", "demo", "--config", "configs/demo.yaml", "--output", str(tmp_path / "demo")]
    start = time.monotonic()
    first = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, env=env)
    elapsed = time.monotonic() - start
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert elapsed < 300, f"the demo took {elapsed:.0f} s"
    out = first.stdout
    for expected in ("documents (kept / filtered with reasons / duplicates)", "windows of 1024", "windows of 2048",
                     "all invariants hold", "training loss", "needle retrieval accuracy", "where things are"):
        assert expected in out, expected
    root = tmp_path / "demo"
    for path in ("ledger.parquet", "stats.png", "shards/seq1024/manifest.json", "shards/seq2048/manifest.json",
                 "documents/synthetic", "train/final/config.json", "train/metrics.jsonl",
                 "eval/loss_by_position.png", "eval/needle.png"):
        assert (root / path).exists(), path
    scored = json.loads((root / "eval" / "loss_by_position.json").read_text())
    assert scored["held_out_rows"] == 8 == len(scored["rows"])
    losses_line = next(line for line in out.splitlines() if line.startswith("training loss"))
    first_loss, last_loss = (float(x) for x in losses_line.split()[2:5:2])
    assert last_loss < first_loss

    second = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, env=env)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "done in an earlier run" in second.stdout
    assert "reusing its checkpoint" in second.stdout
