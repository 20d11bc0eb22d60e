"""The same stages are handed to datatrove's local, Slurm or Ray executor as the config says."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from datatrove.executor import LocalPipelineExecutor, SlurmPipelineExecutor

from pipeline import curate
from pipeline.config import parse_config
from pipeline.curate import build_stages, resolve_sources
from pipeline.layout import RunLayout
from pipeline.executors import make_executor, run_stages
from pipeline.tokenizer import train_bpe

SLURM = {"kind": "slurm", "tasks": 3, "slurm": {"partition": "cpu", "time": "01:00:00", "cpus_per_task": 4}}


def _config(tmp_path: Path, executor: dict):
    (tmp_path / "in" / "books").mkdir(parents=True)
    (tmp_path / "in" / "books" / "a.txt").write_text("some words " * 50)
    tok = tmp_path / "tok.json"
    train_bpe(["some words"] * 10, 270, tok)
    return parse_config({
        "output": str(tmp_path / "out"), "context": {"original": 8, "target": 16},
        "tokenizer": {"path": str(tok)}, "curate": {"input": str(tmp_path / "in"), "executor": executor},
    })


def test_local_executor_caps_workers_at_tasks(tmp_path: Path) -> None:
    cfg = _config(tmp_path, {"tasks": 2, "workers": 8})
    ex = make_executor(cfg.curate.executor, [], tasks=2, logging_dir=tmp_path / "logs", job_name="x")
    assert isinstance(ex, LocalPipelineExecutor) and ex.workers == 2 and ex.tasks == 2


def test_slurm_stages_are_chained_and_submitted_once(tmp_path: Path, monkeypatch) -> None:
    cfg = _config(tmp_path, SLURM)
    layout = RunLayout(cfg.output, "curate")
    sources = resolve_sources(cfg, layout)
    stages = build_stages(cfg, layout, sources, cfg.tokenizer.path, {})
    submitted: list[SlurmPipelineExecutor] = []
    monkeypatch.setattr(SlurmPipelineExecutor, "run", lambda self: submitted.append(self))
    assert run_stages(cfg.curate.executor, stages, layout.work, "curate") is False
    assert len(submitted) == 1
    chain, ex = [], submitted[0]
    while ex is not None:
        chain.append(ex)
        ex = ex.depends
    chain.reverse()
    assert [e.job_name for e in chain] == [f"curate_{name}" for name, _, _ in stages]
    assert [e.tasks for e in chain] == [3, 14, 1, 3, 1]
    assert all(e.partition == "cpu" and e.cpus_per_task == 4 for e in chain)


def test_run_curation_returns_none_after_slurm_submission(tmp_path: Path, monkeypatch) -> None:
    cfg = _config(tmp_path, SLURM)
    monkeypatch.setattr(SlurmPipelineExecutor, "run", lambda self: None)
    assert curate.run_curation(cfg) is None


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed (pip install longctx[ray])")
def test_ray_run_equals_local_run(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    results = {}
    for kind in ("local", "ray"):
        cfg = _config(tmp_path / kind, {"kind": kind, "tasks": 2})
        summary = curate.run_curation(cfg)
        ledger = pq.read_table(cfg.output / "ledger.parquet").drop_columns(["path"]).to_pylist()
        results[kind] = (summary["totals"], ledger)
    assert results["ray"] == results["local"]
