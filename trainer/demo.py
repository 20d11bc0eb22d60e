"""``longctx demo``: the whole flow on the embedded default corpus, on CPU.

curate -> pack (every ``pack.seq_lens``) -> validate the shards -> train a tiny model on 2 CPU
ranks with ring attention (``train.cp``) -> evaluate loss by position and needle retrieval -> one
summary. Every stage is resumable and a second run reuses what is finished.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pipeline.config import ConfigError, RootConfig


def _stage(number: int, total: int, name: str) -> float:
    print(f"\n=== [{number}/{total}] {name} ===", flush=True)
    return time.monotonic()


def _train_done(cfg: RootConfig) -> bool:
    from trainer.checkpoint import latest_checkpoint

    latest = latest_checkpoint(cfg.output / "train" / "checkpoints")
    if latest is None or not (cfg.output / "train" / "final" / "config.json").is_file():
        return False
    return json.loads((latest / "meta.json").read_text())["step"] >= cfg.train.steps


def _launch_training(config_path: Path, output: Path, nproc: int) -> None:
    """Train under ``torch.distributed.run`` with ``nproc`` local CPU processes."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "pipeline.cli", "train", "--config", str(config_path), "--output", str(output)]
    if subprocess.call(cmd, env=env) != 0:
        raise RuntimeError(f"training failed (command: {' '.join(cmd)})")


def sparkline(values: list[float]) -> str:
    """A one-line plot of a loss curve."""
    if not values:
        return ""
    ticks = "▁▂▃▄▅▆▇█"
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    return "".join(ticks[min(len(ticks) - 1, int((v - low) / span * (len(ticks) - 1) + 0.5))] for v in values)


def run_demo(cfg: RootConfig, config_path: Path, verbose: bool = False) -> dict[str, Any]:
    """Run every stage (reusing finished ones) and return the summary it prints."""
    from packer.run import run_pack
    from packer.validate import validate_folder
    from pipeline.curate import run_curation
    from trainer.eval_job import run_eval

    if cfg.pack is None or cfg.train is None or cfg.eval is None:
        raise ConfigError(f"{config_path}: the demo needs pack, train and eval sections")
    total, started = 6, time.monotonic()
    timings: dict[str, float] = {}

    t = _stage(1, total, "curate")
    curated = run_curation(cfg, verbose=verbose)
    timings["curate"] = time.monotonic() - t

    t = _stage(2, total, f"pack {cfg.pack.seq_lens or [cfg.context.target]}")
    manifests = run_pack(cfg, verbose=verbose)
    timings["pack"] = time.monotonic() - t

    t = _stage(3, total, "validate shards")
    for seq_len, manifest in manifests.items():
        folder = cfg.output / "shards" / f"seq{seq_len}"
        violations = validate_folder(folder, cfg.output / "tokenizer.json")
        if violations:
            raise RuntimeError(f"{folder} failed validation:\n" + "\n".join(str(v) for v in violations[:10]))
        print(f"  {folder}: {manifest.rows} windows, all invariants hold", flush=True)
    timings["validate"] = time.monotonic() - t

    t = _stage(4, total, f"train ({cfg.train.cp} CPU ranks, ring attention, {cfg.train.steps} steps)")
    if _train_done(cfg):
        print("  finished in an earlier run; reusing its checkpoint", flush=True)
    else:
        _launch_training(config_path, cfg.output, cfg.train.cp)
    timings["train"] = time.monotonic() - t

    t = _stage(5, total, "evaluate")
    evaluation = run_eval(cfg)
    print(evaluation["loss_table"], flush=True)
    timings["eval"] = time.monotonic() - t

    _stage(6, total, "summary")
    records = [json.loads(line) for line in (cfg.output / "train" / "metrics.jsonl").read_text().splitlines() if line]
    summary = {
        "curation": curated,
        "packing": {
            n: {"rows": m.rows, "tokens": m.tokens, "padding": m.padding, "efficiency": m.efficiency,
                "max_position": m.max_position, "long_fraction": m.long_fraction,
                "tokens_per_source": {s: v.tokens for s, v in m.sources.items()}}
            for n, m in manifests.items()
        },
        "losses": [r["loss"] for r in records],
        "trained_max_position": max((r["max_position"] for r in records), default=-1),
        "needle_accuracy": evaluation.get("needle_accuracy"),
        "timings_s": timings | {"total": time.monotonic() - started},
        "paths": {
            "documents": str(cfg.output / "documents"),
            "ledger": str(cfg.output / "ledger.parquet"),
            "curation_plot": str(cfg.output / "stats.png"),
            "shards": [str(cfg.output / "shards" / f"seq{n}") for n in manifests],
            "checkpoints": str(cfg.output / "train" / "checkpoints"),
            "model": str(cfg.output / "train" / "final"),
            "metrics": str(cfg.output / "train" / "metrics.jsonl"),
            "eval": evaluation["files"],
        },
    }
    print(format_demo_summary(cfg, summary), flush=True)
    return summary


def format_demo_summary(cfg: RootConfig, s: dict[str, Any]) -> str:
    from pipeline.stats import format_summary

    lines = ["documents (kept / filtered with reasons / duplicates):", format_summary(s["curation"]), ""]
    for n, p in s["packing"].items():
        per_source = ", ".join(f"{k} {v:,}" for k, v in p["tokens_per_source"].items())
        lines.append(
            f"windows of {n}: {p['rows']} rows, {p['tokens']:,} tokens ({per_source}); padding {p['padding']:,} "
            f"({1 - p['efficiency']:.2%}); largest position {p['max_position']}; "
            f"{p['long_fraction']:.1%} of tokens at positions >= {cfg.context.original}"
        )
    losses = s["losses"]
    if losses:
        lines.append(f"\ntraining loss {losses[0]:.3f} -> {losses[-1]:.3f}  {sparkline(losses)}  "
                     f"(largest trained position {s['trained_max_position']})")
    if s["needle_accuracy"] is not None:
        lines.append(f"needle retrieval accuracy: {s['needle_accuracy']:.0%} (a tiny model after a few steps: expect 0)")
    lines.append("\nwhere things are:")
    for key, value in s["paths"].items():
        lines.append(f"  {key}: {', '.join(value) if isinstance(value, list) else value}")
    timings = ", ".join(f"{k} {v:.0f}s" for k, v in s["timings_s"].items())
    lines.append(f"\ntimings: {timings}")
    return "\n".join(lines)
