"""``longctx demo``: the whole flow on the embedded default corpus, on CPU.

curate -> pack (every ``pack.seq_lens``) -> validate the shards -> train a tiny model on 2 CPU
ranks with ring attention (``train.cp``), in the config's training stages (1024 then 2048 tokens,
each checked by its gate) -> compare the base and the trained model on loss by position, needle
retrieval, effective context length and held-out short windows -> one summary. Every step is
resumable and a second run reuses what is finished. The demo's config ships inside the package
(:func:`packaged_config`).
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
    train_title = f"train ({plural(cfg.train.cp, 'CPU rank')}, ring attention, {_plan(cfg)})"
    with _stage(4, train_title, timings, "train"):
        trained_before = _train(cfg, config_path, layout)
    with _stage(5, f"evaluate ({' vs '.join(cfg.eval.models)})", timings, "eval"):
        evaluation = _evaluate(cfg, reuse=trained_before)
    with _stage(6, "summary"):
        timings["total"] = time.monotonic() - started
        summary = _summary(cfg, layout, curated, manifests, evaluation, timings)
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


def _plan(cfg: RootConfig) -> str:
    """The training's title: its stages' lengths and steps, or its steps."""
    assert cfg.train is not None
    if not cfg.train.stages:
        return plural(cfg.train.steps, "step")
    lengths = " -> ".join(str(s.seq_len) for s in cfg.train.stages)
    steps = " + ".join(str(s.steps) for s in cfg.train.stages)
    return f"stages {lengths} tokens, {steps} steps"


def _train(cfg: RootConfig, config_path: Path, layout: RunLayout) -> bool:
    """Train on ``train.cp`` CPU ranks, unless an earlier run finished; returns whether it had."""
    from longctx import jobs

    assert cfg.train is not None  # run_demo checks the sections
    if jobs.finished_training(cfg) is not None:
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


def _stages(cfg: RootConfig, layout: RunLayout) -> list[dict[str, Any]]:
    """Each training stage: its length, RoPE factor, steps, losses, metrics file and gate result."""
    from longctx.trainer.stage_plan import resolve_stages

    assert cfg.train is not None
    found = []
    for stage in resolve_stages(cfg.train, layout):
        records = [json.loads(line) for line in stage.layout.metrics.read_text().splitlines() if line]
        gate = json.loads(stage.layout.gate.read_text()) if stage.layout.gate.is_file() else None
        found.append(
            {
                "stage": stage.number,
                "seq_len": stage.seq_len,
                "rope_factor": (stage.rope_scaling or {}).get("factor"),
                "steps": stage.steps,
                "losses": [r["loss"] for r in records],
                "max_position": max((r["max_position"] for r in records), default=-1),
                "folder": str(stage.layout.folder),
                "gate": gate,
            }
        )
    return found


def _summary(
    cfg: RootConfig,
    layout: RunLayout,
    curated: dict[str, Any] | None,
    manifests: dict[int, Manifest],
    evaluation: dict[str, Any],
    timings: dict[str, float],
) -> dict[str, Any]:
    """What the demo returns and prints: curation, packing, training (per stage) and evaluation
    figures, and where each output is."""
    from longctx.trainer.stage_plan import final_model

    stages = _stages(cfg, layout)
    if stages:
        records_losses = [loss for s in stages for loss in s["losses"]]
        max_position = max(s["max_position"] for s in stages)
        metrics: str | list[str] = [str(Path(s["folder"]) / "metrics.jsonl") for s in stages]
        checkpoints: str | list[str] = [str(Path(s["folder"]) / "checkpoints") for s in stages]
    else:
        records = [json.loads(line) for line in layout.metrics.read_text().splitlines() if line]
        records_losses = [r["loss"] for r in records]
        max_position = max((r["max_position"] for r in records), default=-1)
        metrics, checkpoints = str(layout.metrics), str(layout.checkpoints)
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
        "losses": records_losses,
        "trained_max_position": max_position,
        "stages": stages,
        "needle_accuracy": evaluation.get("needle_accuracy"),
        "effective_length": evaluation.get("effective_length"),
        "short_context": evaluation.get("short_context"),
        "timings_s": timings,
        "paths": {
            "documents": str(layout.documents),
            "ledger": str(layout.ledger),
            "curation_plot": str(layout.plot),
            "shards": [str(layout.shard_folder(n)) for n in manifests],
            "checkpoints": checkpoints,
            "model": str(final_model(layout, cfg.train)),
            "metrics": metrics,
            "eval": evaluation["files"],
        },
    }


def effective_text(verdict: dict[str, Any]) -> str:
    """One model's effective length in a few words: its length, ``none`` or ``undetermined``."""
    if verdict["status"] == "undetermined":
        return "undetermined"
    return str(verdict["effective_length"] or "none")


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
    for stage in s["stages"]:
        losses = stage["losses"]
        trained = f"loss {losses[0]:.3f} -> {losses[-1]:.3f}" if losses else "not trained"
        factor = f", RoPE factor {stage['rope_factor']:g}" if stage["rope_factor"] else ""
        gate = stage["gate"]
        verdict = "no gate"
        if gate is not None:
            checks = "; ".join(
                f"{c['metric']} {c['value']:.3f} (limit {c['limit']:g})"
                if c["value"] is not None
                else c["metric"]
                for c in gate["checks"]
            )
            verdict = f"gate {'passed' if gate['passed'] else 'FAILED'}: {checks}"
        lines.append(
            f"  stage {stage['stage']}: {stage['seq_len']} tokens{factor}, {stage['steps']} steps, "
            f"{trained}; {verdict}"
        )
    if s["needle_accuracy"] is not None:
        accuracy = ", ".join(f"{label} {a:.0%}" for label, a in s["needle_accuracy"].items())
        lines.append(f"needle retrieval accuracy: {accuracy} (a tiny model after a few steps: expect 0)")
    if s["effective_length"] is not None:
        effective = s["effective_length"]
        found = ", ".join(f"{label} {effective_text(v)}" for label, v in effective["models"].items())
        lines.append(f"effective context length: {found} (details: longctx eval's summary.json)")
    short = s["short_context"]
    if short is not None and "skipped" in short:
        lines.append(f"short-context guard skipped: {short['skipped']}")
    elif short is not None:
        ratios = ", ".join(
            f"{m['label']} {m['ratio']:.3f}" for m in short["models"] if m["ratio"] is not None
        )
        released = ", ".join(
            f"{m['label']} {m['ratio_to_released']:.3f}"
            for m in short["models"]
            if m.get("ratio_to_released") is not None
        )
        lines.append(
            f"short-context loss ratio to {short['baseline']} ({short['windows']} held-out windows of "
            f"{short['length']} tokens, source {short['source']}): {ratios}"
            + (f"; to the base as released (its own RoPE): {released}" if released else "")
        )
    lines.append("\nwhere things are:")
    for key, value in s["paths"].items():
        lines.append(f"  {key}: {', '.join(value) if isinstance(value, list) else value}")
    timings = ", ".join(f"{k} {v:.0f}s" for k, v in s["timings_s"].items())
    lines.append(f"\ntimings: {timings}")
    return "\n".join(lines)
