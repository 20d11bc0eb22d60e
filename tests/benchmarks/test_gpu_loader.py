"""gpu_loader.py kept working without a GPU: its CPU smoke run (workers, passes, resume) and its
comparison, which must catch a batch that differs from the reference."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gpu_loader


def test_cpu_smoke_checks_every_worker_setting(tmp_path: Path) -> None:
    out = tmp_path / "report.json"
    assert gpu_loader.main(["--cpu-smoke", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    checks = [c for entry in report["lengths"] for c in entry["checks"]]
    assert report["passed"] and [c["workers"] for c in checks] == [0, 2]
    assert all(c["equal"] and c["resume_equal"] and c["batches"] > 2 * c["resumed_at_batch"] for c in checks)
    timing = report["lengths"][0]["timing"]
    assert all(t["tokens"] == report["lengths"][0]["rows"] * 2048 for t in timing.values())


def test_comparison_catches_a_changed_batch(tmp_path: Path) -> None:
    folder = tmp_path / "seq2048"
    folder.mkdir()
    gpu_loader.write_folder(folder, 2048, 8, rows_per_shard=4, seed=0)
    want = gpu_loader.reference(folder, 1)
    got = [{k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in b.items()} for b in want]
    assert gpu_loader.first_difference(got, want) is None
    got[2]["labels"][0, 5] += 1
    assert gpu_loader.first_difference(got, want).startswith("batch 2, labels")
    got[2]["labels"][0, 5] -= 1
    got[1]["max_seqlen"] += 1
    assert gpu_loader.first_difference(got, want).startswith("batch 1, max_seqlen")
    assert gpu_loader.first_difference(got[:-1], want) == f"{len(want) - 1} batches, expected {len(want)}"
