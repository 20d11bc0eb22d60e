"""``longctx demo``: the whole flow on the embedded default corpus, on CPU.

curate -> pack (every ``pack.seq_lens``) -> validate the shards -> train a tiny model on 2 CPU
ranks with ring attention (``train.cp``) -> compare the base and the trained model on loss by
position and needle retrieval -> one summary. Every stage is resumable and a second run reuses what
is finished. The demo's config ships inside the package (:func:`packaged_config`).
"""

from __future__ import annotations

import contextlib
import importlib.resources
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from longctx.config import RootConfig
from longctx.core.errors import ConfigError
from longctx.core.layout import RunLayout
from longctx.core.text import plural


@contextlib.contextmanager
def packaged_config() -> Iterator[Path]:
    """The demo config shipped in the package (``longctx/configs/demo.yaml``), as a file path."""
    with importlib.resources.as_file(importlib.resources.files("longctx") / "configs" / "demo.yaml") as path:
        yield path


def _stage(number: int, total: int, name: str) -> float:
    print(f"\n=== [{number}/{total}] {name} ===", flush=True)
    return time.monotonic()


def _train_done(layout: RunLayout, steps: int) -> bool:
    from longctx.trainer.checkpoint import latest_checkpoint

    latest = latest_checkpoint(layout.checkpoints)
    if latest is None or not (layout.final_model / "config.json").is_file():
        return False
    return latest.step >= steps


def _launch_training(config_path: Path, output: Path, nproc: int) -> None:
    """Train under torchrun with ``nproc`` local CPU processes, as ``longctx train --nproc`` does."""
    from longctx.trainer.launch import launch_training

    args = ["train", "--config", str(config_path), "--output", str(output)]
    if launch_training(nproc, args, output) != 0:
        raise RuntimeError(f"training failed (longctx {' '.join(args)} on {plural(nproc, 'rank')})")


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
    from longctx import jobs
    from longctx.packer.validate import validate_folder

    if cfg.pack is None or cfg.train is None or cfg.eval is None:
        raise ConfigError(f"{config_path}: the demo needs pack, train and eval sections")
    layout = RunLayout(cfg.output)
    total, started = 6, time.monotonic()
    timings: dict[str, float] = {}

    t = _stage(1, total, "curate")
    curated = jobs.curate(cfg, verbose=verbose)
    timings["curate"] = time.monotonic() - t

    t = _stage(2, total, f"pack {cfg.pack.resolved_seq_lens(cfg.context.target)}")
    manifests = jobs.pack(cfg, verbose=verbose)
    timings["pack"] = time.monotonic() - t

    t = _stage(3, total, "validate shards")
    for seq_len, manifest in manifests.items():
        folder = layout.shard_folder(seq_len)
        violations = validate_folder(folder, layout.tokenizer)
        if violations:
            raise RuntimeError(f"{folder} failed validation:\n" + "\n".join(str(v) for v in violations[:10]))
        print(f"  {folder}: {plural(manifest.rows, 'window')}, all invariants hold", flush=True)
    timings["validate"] = time.monotonic() - t

    t = _stage(
        4,
        total,
        f"train ({plural(cfg.train.cp, 'CPU rank')}, ring attention, {plural(cfg.train.steps, 'step')})",
    )
    trained_before = _train_done(layout, cfg.train.steps)
    if trained_before:
        print("  finished in an earlier run; reusing its checkpoint", flush=True)
    else:
        _launch_training(config_path, cfg.output, cfg.train.cp)
    timings["train"] = time.monotonic() - t

    t = _stage(5, total, f"evaluate ({' vs '.join(cfg.eval.models)})")
    evaluation = jobs.latest_evaluation(cfg) if trained_before else None
    if evaluation is not None:
        print(f"  finished in an earlier run; reusing {evaluation['folder']}", flush=True)
    else:
        evaluation = jobs.evaluate(cfg)
    print(evaluation["loss_table"], flush=True)
    timings["eval"] = time.monotonic() - t

    _stage(6, total, "summary")
    records = [json.loads(line) for line in layout.metrics.read_text().splitlines() if line]
    summary = {
        "curation": curated,
        "packing": {
            n: {
                "rows": m.rows,
                "tokens": m.tokens,
                "padding": m.padding,
                "efficiency": m.efficiency,
                "max_position": m.max_position,
                "long_fraction": m.long_fraction,
                "tokens_per_source": {s: v.tokens for s, v in m.sources.items()},
            }
            for n, m in manifests.items()
        },
        "losses": [r["loss"] for r in records],
        "trained_max_position": max((r["max_position"] for r in records), default=-1),
        "needle_accuracy": evaluation.get("needle_accuracy"),
        "timings_s": timings | {"total": time.monotonic() - started},
        "paths": {
            "documents": str(layout.documents),
            "ledger": str(layout.ledger),
            "curation_plot": str(layout.plot),
            "shards": [str(layout.shard_folder(n)) for n in manifests],
            "checkpoints": str(layout.checkpoints),
            "model": str(layout.final_model),
            "metrics": str(layout.metrics),
            "eval": evaluation["files"],
        },
    }
    print(format_demo_summary(cfg, summary), flush=True)
    return summary


def format_demo_summary(cfg: RootConfig, s: dict[str, Any]) -> str:
    from longctx.pipeline.stats import format_summary

    lines = ["documents (kept / filtered with reasons / duplicates):", format_summary(s["curation"]), ""]
    for n, p in s["packing"].items():
        per_source = ", ".join(f"{k} {v:,}" for k, v in p["tokens_per_source"].items())
        lines.append(
            f"windows of {n}: {plural(p['rows'], 'row')}, {p['tokens']:,} tokens ({per_source}); padding "
            f"{p['padding']:,} ({1 - p['efficiency']:.2%}); largest position {p['max_position']}; "
            f"{p['long_fraction']:.1%} of tokens at positions >= {cfg.context.original}"
        )
    losses = s["losses"]
    if losses:
        lines.append(
            f"\ntraining loss {losses[0]:.3f} -> {losses[-1]:.3f}  {sparkline(losses)}  "
            f"(largest trained position {s['trained_max_position']})"
        )
    if s["needle_accuracy"] is not None:
        accuracy = ", ".join(f"{label} {a:.0%}" for label, a in s["needle_accuracy"].items())
        lines.append(f"needle retrieval accuracy: {accuracy} (a tiny model after a few steps: expect 0)")
    lines.append("\nwhere things are:")
    for key, value in s["paths"].items():
        lines.append(f"  {key}: {', '.join(value) if isinstance(value, list) else value}")
    timings = ", ".join(f"{k} {v:.0f}s" for k, v in s["timings_s"].items())
    lines.append(f"\ntimings: {timings}")
    return "\n".join(lines)
