"""`longctx demo`, the README's first quickstart command, end to end on the embedded corpus, run
from a folder outside the repository with the config that ships in the package."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from longctx.config import load_config
from longctx.demo import packaged_config

REPO = Path(__file__).resolve().parents[2]


HANG_S = 1800
"""A guard against a hung demo, not a speed limit (the demo takes about a minute on a quiet machine,
several under heavy load)."""


def test_the_demo_config_ships_in_the_package_and_the_repository_links_to_it(tmp_path: Path) -> None:
    """One copy: ``configs/demo.yaml`` is the packaged file, ``--print-config`` prints it, and it
    loads from any folder."""
    with packaged_config() as path:
        assert path.is_file() and path.parent.parent.name == "longctx"
        assert (REPO / "configs" / "demo.yaml").resolve() == path.resolve()
        text = path.read_text(encoding="utf-8")
        cfg = load_config(path)
    assert cfg.train is not None and cfg.eval is not None and str(cfg.output) == "runs/demo"
    done = subprocess.run(
        [sys.executable, "-m", "longctx.cli", "demo", "--print-config"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout == text


TEST_EXTRA_ONLY = ("moto", "wandb", "boto3", "s3fs", "aiobotocore", "tensorboard", "transformers", "datasets")
TEST_EXTRA_ONLY += ("accelerate", "trl", "hypothesis")
"""Packages of the test extra and no base dependency: `make demo` installs the package alone, so the
demo (and its training ranks) must run without them."""

_BLOCK = f"""
import sys

# as if not installed: `import x` raises ModuleNotFoundError, importlib.util.find_spec(x) is None
sys.modules.update(dict.fromkeys({TEST_EXTRA_ONLY!r}))
"""


def test_make_demo_installs_the_package_alone(tmp_path: Path) -> None:
    # run from `make test` (CI), the outer make's variables would make this one print "Entering directory"
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    done = subprocess.run(
        ["make", "-n", "--no-print-directory", "demo", f"VENV={tmp_path / 'venv'}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    installs = [line for line in done.stdout.splitlines() if " install " in line]
    assert any(line.endswith("pip install -q -e .") for line in installs), installs
    assert not any("[test]" in line for line in installs), installs
    assert done.stdout.strip().splitlines()[-1].endswith("longctx demo")


@pytest.mark.slow
def test_demo_runs_end_to_end_from_any_folder_and_reuses_finished_stages(tmp_path: Path) -> None:
    """... without the test extra's packages, in every process it starts (see :data:`TEST_EXTRA_ONLY`)."""
    blocker = tmp_path / "block"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(_BLOCK)
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(blocker), env.get("PYTHONPATH")) if p)
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    cmd = [sys.executable, "-m", "longctx.cli", "demo"]  # the packaged config; output runs/demo under cwd
    first = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=HANG_S, env=env)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    out = first.stdout
    for expected in (
        "documents (kept / filtered with reasons / duplicates)",
        "windows of 1024",
        "windows of 2048",
        "all invariants hold",
        "training loss",
        "stage 1 (1024 tokens): gate passed (short_loss_ratio",
        "stage 2 (2048 tokens) starts from the weights of runs/demo/train/stages/1-1024/checkpoints/",
        "  stage 1: 1024 tokens, RoPE factor 2, 6 steps, loss ",
        "  stage 2: 2048 tokens, RoPE factor 4, 6 steps, loss ",
        "evaluate (base vs trained)",
        "needle retrieval accuracy: base",
        "effective context length: base ",
        "short-context loss ratio to base (8 held-out windows of 512 tokens, source code): base 1.000, ",
        "; to the base as released (its own RoPE): base ",
        "where things are",
    ):
        assert expected in out, expected
    root = cwd / "runs" / "demo"
    for path in (
        "ledger.parquet",
        "stats.png",
        "shards/seq1024/manifest.json",
        "shards/seq2048/manifest.json",
        "documents/synthetic",
        "train/stages/1-1024/final/config.json",
        "train/stages/1-1024/gate.json",
        "train/stages/2-2048/final/config.json",
        "train/stages/2-2048/metrics.jsonl",
        "train/stages/2-2048/gate.json",
        "eval/001/loss_by_position.png",
        "eval/001/needle.png",
        "eval/001/score_by_length.png",
        "eval/001/summary.json",
    ):
        assert (root / path).exists(), path
    for stage in ("1-1024", "2-2048"):  # the gates the demo's tiny model passes, as the summary says
        gate = json.loads((root / "train" / "stages" / stage / "gate.json").read_text())
        (check,) = gate["checks"]
        assert gate["passed"] and check["metric"] == "short_loss_ratio" and check["value"] <= 1.0
        assert f"short_loss_ratio {check['value']:.3f} (limit 1)" in out
    scored = json.loads((root / "eval" / "001" / "loss_by_position.json").read_text())
    assert scored["held_out_rows"] == 8 == len(scored["rows"])
    assert [m["label"] for m in scored["models"]] == ["base", "trained"]
    losses_line = next(line for line in out.splitlines() if line.startswith("training loss"))
    first_loss, last_loss = (float(x) for x in losses_line.split()[2:5:2])
    assert last_loss < first_loss
    summary = json.loads((root / "eval" / "001" / "summary.json").read_text())
    for label, verdict in summary["effective_length"]["models"].items():
        # the tiny model retrieves nothing: its short score defines no threshold, and the summary says so
        assert verdict["status"] == "undetermined" and verdict["effective_length"] is None
        assert f"{label} undetermined" in out
        assert [s["count"] for s in verdict["scores"]] == [6, 6, 6, 6]  # eval.needle.samples

    second = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=HANG_S, env=env)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "done in an earlier run" in second.stdout
    assert "reusing its checkpoint" in second.stdout
    assert "reusing runs/demo/eval/001" in second.stdout
    assert sorted(p.name for p in (root / "eval").iterdir()) == ["001"]
