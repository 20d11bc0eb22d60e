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
from typing import TYPE_CHECKING, Any

from longctx.config import RootConfig
from longctx.core.errors import ConfigError
from longctx.core.layout import RunLayout
from longctx.core.text import plural

if TYPE_CHECKING:
    from longctx.packer.manifest import Manifest


@contextlib.contextmanager
def packaged_config() -> Iterator[Path]:
    """The demo config shipped in the package (``longctx/configs/demo.yaml``), as a file path."""
    with importlib.resources.as_file(importlib.resources.files("longctx") / "configs" / "demo.yaml") as path:
        yield path


STAGES = 6
"""Stages of the demo, numbered in their titles."""


@contextlib.contextmanager
def _stage(number: int, name: str, timings: dict[str, float] | None = None, key: str = "") -> Iterator[None]:
    """Print the stage's title; with ``timings``, record its seconds under ``key``."""
    print(f"\n=== [{number}/{STAGES}] {name} ===", flush=True)
    started = time.monotonic()
    yield
    if timings is not None:
        timings[key] = time.monotonic() - started


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

    if cfg.pack is None or cfg.train is None or cfg.eval is None:
        raise ConfigError(f"{config_path}: the demo needs pack, train and eval sections")
    layout = RunLayout(cfg.output)
    started, timings = time.monotonic(), {}
    with _stage(1, "curate", timings, "curate"):
        curated = jobs.curate(cfg, verbose=verbose)
    with _stage(2, f"pack {cfg.pack.resolved_seq_lens(cfg.context.target)}", timings, "pack"):
        manifests = jobs.pack(cfg, verbose=verbose)
    with _stage(3, "validate shards", timings, "validate"):
        _validate_shards(layout, manifests)
    train_title = (
        f"train ({plural(cfg.train.cp, 'CPU rank')}, ring attention, {plural(cfg.train.steps, 'step')})"
    )
    with _stage(4, train_title, timings, "train"):
        trained_before = _train(cfg, config_path, layout)
    with _stage(5, f"evaluate ({' vs '.join(cfg.eval.models)})", timings, "eval"):
        evaluation = _evaluate(cfg, reuse=trained_before)
    with _stage(6, "summary"):
        timings["total"] = time.monotonic() - started
        summary = _summary(layout, curated, manifests, evaluation, timings)
        print(format_demo_summary(cfg, summary), flush=True)
    return summary


def _validate_shards(layout: RunLayout, manifests: dict[int, Manifest]) -> None:
    """Check every invariant of every packed folder (``longctx inspect --validate``)."""
    from longctx.packer.validate import validate_folder

    for seq_len, manifest in manifests.items():
        folder = layout.shard_folder(seq_len)
        violations = validate_folder(folder, layout.tokenizer)
        if violations:
            raise RuntimeError(f"{folder} failed validation:\n" + "\n".join(str(v) for v in violations[:10]))
        print(f"  {folder}: {plural(manifest.rows, 'window')}, all invariants hold", flush=True)


def _train(cfg: RootConfig, config_path: Path, layout: RunLayout) -> bool:
    """Train on ``train.cp`` CPU ranks, unless an earlier run finished; returns whether it had."""
    assert cfg.train is not None  # run_demo checks the sections
    if _train_done(layout, cfg.train.steps):
        print("  finished in an earlier run; reusing its checkpoint", flush=True)
        return True
    _launch_training(config_path, cfg.output, cfg.train.cp)
    return False


def _evaluate(cfg: RootConfig, *, reuse: bool) -> dict[str, Any]:
    """Evaluate base and trained model and print the loss table; with ``reuse`` (training finished in
    an earlier run) an evaluation made since with the same settings is shown instead."""
    from longctx import jobs

    evaluation = jobs.latest_evaluation(cfg) if reuse else None
    if evaluation is not None:
        print(f"  finished in an earlier run; reusing {evaluation['folder']}", flush=True)
    else:
        evaluation = jobs.evaluate(cfg)
    print(evaluation["loss_table"], flush=True)
    return evaluation


def _summary(
    layout: RunLayout,
    curated: dict[str, Any] | None,
    manifests: dict[int, Manifest],
    evaluation: dict[str, Any],
    timings: dict[str, float],
) -> dict[str, Any]:
    """What the demo returns and prints: curation, packing, training and evaluation figures, and
    where each output is."""
    records = [json.loads(line) for line in layout.metrics.read_text().splitlines() if line]
    return {
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
        "timings_s": timings,
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
