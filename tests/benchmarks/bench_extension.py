"""Does extension work? The whole chain on this machine's CPU, with longctx's own commands only.

``configs/extension.yaml`` describes it; this script runs it and writes the report:

1. ``longctx curate`` and ``longctx pack``: the embedded default corpus, plus synthetic pass-key
   tasks (``passkey``, after Mohtashami and Jaggi, 2023) of at most ``context.original`` tokens,
   packed into windows of 256, 512 and 1024 tokens.
2. ``longctx train`` with ``train.stages``: a tiny model pretrained from scratch at L0 = 256 with
   plain RoPE (stage 1, gate: pass-key score at 256), then extended with YaRN x2 at 512 and x4 at
   1024 (stages 2 and 3, each gated on the pass-key score at its length and on the short-context
   loss against stage 1's model), for at most 20% of stage 1's steps in all.
3. The same extension with plain position interpolation (``linear``), from stage 1's model, for the
   same steps: the config with only ``rope_type`` changed (``<work>/linear.yaml``).
4. ``longctx eval`` of the three models (``original``: stage 1's, without RoPE scaling; ``yarn``:
   the staged run's; ``linear``) at 256, 512 and 1024 tokens, on the same pass-key items: scores with
   their counts and Wilson intervals, effective lengths (``docs/evaluation.md``), and the
   short-context loss against ``original``.

The report (``--out``, JSON) holds ``original`` (L0), ``base`` (the original model's scores and
effective length, and ``answer_prefix``: per length, the mean fraction of each key's leading digits
generated right, partial credit that shows a model on its way), ``extended`` (the YaRN model's, and
its ``short_context_ratio``), ``linear``,
each stage's steps and gate, every command's wall and CPU seconds, and whether each goal was met.
The plot (the eval's ``score_by_length.png``, the three models with their intervals) is copied beside
it. The configs it ran are kept under ``--work``; only paths differ from ``configs/extension.yaml``.

    .venv/bin/python tests/benchmarks/bench_extension.py \\
        [--out tests/benchmarks/results/<date>-cpu-extension.json] [--work runs/bench_extension] \\
        [--steps-scale 1.0] [--report-only]

``--steps-scale`` multiplies every stage's steps (a quick dry run: 0.02); ``--report-only`` writes the
report of the run already in ``--work`` again. Every process uses
``--threads`` threads (default 1: on 2 cores the tiny model trains as fast on one as on two).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml
from benchtools import REPO, become_subreaper, cpu_seconds

from longctx.core.layout import RunLayout

SCRIPT = "bench_extension.py"
LONGCTX = [sys.executable, "-m", "longctx.cli"]


def derived_configs(base: dict[str, Any], work: Path, scale: float) -> tuple[dict[str, Any], dict[str, Any]]:
    """The staged YaRN run's config and the linear run's, from ``configs/extension.yaml``: paths
    under ``work``, steps scaled by ``scale``; the linear run starts from stage 1's model and trains
    the extension stages (``rope_type: linear``) on the YaRN run's shards."""
    run = RunLayout(work / "run")
    yarn = json.loads(json.dumps(base))
    yarn["output"] = str(run.root)
    stages = yarn["train"]["stages"]
    for stage in stages:
        stage["steps"] = max(1, round(stage["steps"] * scale))
    first = stages[0]
    original = run.stage(1, first["seq_len"]).final_model
    yarn["eval"]["baseline"] = str(original)
    linear = json.loads(json.dumps(yarn))
    linear["output"] = str(work / "linear")
    linear["tokenizer"] = {"path": str(run.tokenizer)}
    linear["train"]["model"]["hf_path"] = str(original)
    linear["train"]["model"].pop("tiny", None)
    linear["eval"]["documents"] = str(run.documents)
    linear_stages = []
    for stage in stages[1:]:
        copy = dict(stage)
        copy["rope_scaling"] = {"rope_type": "linear", "factor": stage["rope_scaling"]["factor"]}
        copy["shards"] = str(run.shard_folder(stage["seq_len"]))
        linear_stages.append(copy)
    linear["train"]["stages"] = linear_stages
    return yarn, linear


def last_stage(config: dict[str, Any]) -> Path:
    """The final model of a staged run's last stage."""
    stages = config["train"]["stages"]
    return RunLayout(Path(config["output"])).stage(len(stages), stages[-1]["seq_len"]).final_model


def run(
    command: list[str], log: Path, env: dict[str, str], allowed: tuple[int, ...] = (0,)
) -> dict[str, Any]:
    """Run one longctx command, its output to ``log``; its wall and CPU seconds and exit status.
    A status outside ``allowed`` stops the benchmark with the log's end."""
    shown = " ".join(["longctx", *command[3:]])
    print("$", shown, flush=True)
    start, start_cpu = time.perf_counter(), cpu_seconds()
    with log.open("w") as out:
        status = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=REPO).returncode
    record = {
        "command": shown,
        "wall_s": round(time.perf_counter() - start, 1),
        "cpu_s": round(cpu_seconds() - start_cpu, 1),
        "exit": status,
    }
    print(f"  {record['wall_s']} s wall, {record['cpu_s']} s CPU, exit {status} (log {log})", flush=True)
    if status not in allowed:
        print(log.read_text()[-3000:], file=sys.stderr)
        sys.exit(f"{SCRIPT}: {record['command']} failed (exit {status}); its log: {log}")
    return record


def stage_records(config: dict[str, Any]) -> list[dict[str, Any]]:
    """Each stage's steps, final loss and gate, from the folders of ``config``'s stages."""
    records = []
    layout = RunLayout(Path(config["output"]))
    for number, spec in enumerate(config["train"]["stages"], start=1):
        stage = layout.stage(number, spec["seq_len"])
        metrics = [json.loads(line) for line in stage.metrics.read_text().splitlines() if line]
        gate = json.loads(stage.gate.read_text()) if stage.gate.exists() else None
        records.append(
            {
                "stage": stage.folder.name,
                "steps": metrics[-1]["step"] if metrics else 0,
                "final_loss": metrics[-1]["loss"] if metrics else None,
                "gate": None
                if gate is None
                else {
                    "passed": gate["passed"],
                    "checks": [
                        {k: c[k] for k in ("metric", "value", "limit", "passed")} for c in gate["checks"]
                    ],
                },
            }
        )
    return records


def model_summary(summary: dict[str, Any], label: str) -> dict[str, Any]:
    """One model's scores (each with count and interval) and effective length from ``summary.json``."""
    effective = summary["effective_length"]["models"][label]
    return {
        "effective_length": effective["effective_length"],
        "status": effective["status"],
        "first_failure": effective["first_failure"],
        "reason": effective.get("reason"),
        "threshold": effective["threshold"],
        "scores": {
            str(s["context_tokens"]): {k: s[k] for k in ("score", "count", "low", "high")}
            for s in effective["scores"]
        },
    }


def prefix_scores(needle: dict[str, Any], label: str) -> dict[str, float]:
    """Partial credit the checker does not give, per length: the mean fraction of each answer's
    leading characters that the greedy generation got right (a model learning to retrieve gets the
    first digits of a pass key before the whole key)."""
    (model,) = [m for m in needle["models"] if m["label"] == label]
    by_length: dict[str, list[float]] = {}
    for item in model["results"]:
        answer, generated = item["answer"], item["generated"].lstrip()
        common = next((i for i, (a, b) in enumerate(zip(answer, generated)) if a != b), None)
        common = min(len(answer), len(generated)) if common is None else common
        by_length.setdefault(str(item["context_tokens"]), []).append(common / len(answer))
    return {length: round(sum(v) / len(v), 3) for length, v in by_length.items()}


def short_context(summary: dict[str, Any], label: str) -> float | None:
    """``label``'s held-out short-window loss over the eval's baseline's (``original``)."""
    return {m["label"]: m["ratio"] for m in summary["short_context"]["models"]}.get(label)


def run_chain(
    yarn: dict[str, Any], linear: dict[str, Any], work: Path, env: dict[str, str]
) -> dict[str, Any]:
    """Curate, pack, train (staged, YaRN), train (linear), then evaluate the three models; each
    command's record. The models are linked as ``<work>/models/{original,yarn,linear}`` so the eval
    labels them so; its config is the YaRN run's with ``eval.baseline: original``."""
    paths = {}
    for name, config in (
        ("extension", yarn),
        ("linear", linear),
        ("eval", dict(yarn, eval={**yarn["eval"], "baseline": "original"})),
    ):
        paths[name] = work / f"{name}.yaml"
        paths[name].write_text(yaml.safe_dump(config, sort_keys=False))
    logs = work / "logs"
    logs.mkdir()
    commands = {}
    for name, argv in [
        ("curate", ["curate", "--config", str(paths["extension"])]),
        ("pack", ["pack", "--config", str(paths["extension"])]),
        ("train", ["train", "--config", str(paths["extension"])]),
        ("train_linear", ["train", "--config", str(paths["linear"])]),
    ]:
        # train exits 2 when a gate fails with train.on_gate_fail: stop (the gates are reported)
        allowed = (0, 2) if name.startswith("train") else (0,)
        commands[name] = run([*LONGCTX, *argv], logs / f"{name}.log", env, allowed)
    models = work / "models"
    models.mkdir()
    (models / "original").symlink_to(yarn["eval"]["baseline"])
    (models / "yarn").symlink_to(last_stage(yarn))
    (models / "linear").symlink_to(last_stage(linear))
    argv = ["eval", "--config", str(paths["eval"])]
    for label in ("original", "yarn", "linear"):
        argv += ["--model", str(models / label)]
    commands["eval"] = run([*LONGCTX, *argv], logs / "eval.log", env)
    return commands


def build_report(
    base: dict[str, Any], work: Path, commands: dict[str, Any], wall: float, header: dict[str, Any]
) -> dict[str, Any]:
    """The report: the three models' scores and effective lengths from the eval's ``summary.json``,
    the stages' steps and gates, the commands' times, and whether each goal of the issue was met."""
    folder = sorted(RunLayout(work / "run").eval.iterdir())[-1]
    summary = json.loads((folder / "summary.json").read_text())
    needle = json.loads((folder / "needle.json").read_text())
    original = base["context"]["original"]
    yarn, linear = derived_configs(base, work, 1.0)
    stages, linear_stages = stage_records(yarn), stage_records(linear)
    steps_one = stages[0]["steps"]
    extension_steps = sum(s["steps"] for s in stages[1:])
    report = {
        **header,
        "original": original,
        "lengths": base["eval"]["needle"]["lengths"],
        "task": base["eval"]["needle"]["kinds"],
        "base": {**model_summary(summary, "original"), "answer_prefix": prefix_scores(needle, "original")},
        "extended": {
            **model_summary(summary, "yarn"),
            "answer_prefix": prefix_scores(needle, "yarn"),
            "short_context_ratio": short_context(summary, "yarn"),
        },
        "linear": {
            **model_summary(summary, "linear"),
            "answer_prefix": prefix_scores(needle, "linear"),
            "short_context_ratio": short_context(summary, "linear"),
        },
        "steps": {
            "stage_1": steps_one,
            "extension": extension_steps,
            "extension_fraction": round(extension_steps / steps_one, 3) if steps_one else None,
            "stages": stages,
            "linear_stages": linear_stages,
        },
        "commands": commands,
        "wall_s": round(wall, 1),
        "cpu_s": round(sum(c["cpu_s"] for c in commands.values()), 1),
        "eval_folder": str(folder),
    }
    base_score = report["base"]["scores"].get(str(original), {}).get("score") or 0
    ratio = report["extended"]["short_context_ratio"]
    report["goals"] = {
        "base_score_at_L0_at_least_0.9": base_score >= 0.9,
        # an undetermined length (the model retrieves too little at L0 to set a bar) meets nothing
        "base_effective_length_at_most_L0": report["base"]["status"] != "undetermined"
        and (report["base"]["effective_length"] or 0) <= original,
        "extended_effective_length_at_least_4L0": (report["extended"]["effective_length"] or 0)
        >= 4 * original,
        "short_context_ratio_at_most_1.05": ratio is not None and ratio <= 1.05,
        "extension_steps_at_most_20_percent": extension_steps <= 0.2 * steps_one,
        "within_25_minutes": wall <= 25 * 60,
    }
    return report


def print_report(report: dict[str, Any]) -> None:
    """The scores with their counts and intervals, the ratios, the steps and each goal."""
    tasks = ", ".join(report["task"])
    print(f"\nL0 = {report['original']}; scores ({tasks}) by length, with count and 95% interval:")
    for label, key in (("original", "base"), ("yarn", "extended"), ("linear", "linear")):
        part = report[key]
        cells = "  ".join(
            f"{n}: {s['score']:.2f} [{s['low']:.2f}, {s['high']:.2f}] n={s['count']}"
            for n, s in part["scores"].items()
        )
        print(f"  {label:9s} {cells}  effective length: {part['effective_length'] or part['status']}")
        prefix = "  ".join(f"{n}: {v:.2f}" for n, v in part["answer_prefix"].items())
        print(f"  {'':9s} answer prefix right (mean fraction of the key's leading digits): {prefix}")
    ratios = {key: report[key]["short_context_ratio"] for key in ("extended", "linear")}
    print(f"short-context loss over original's: yarn {ratios['extended']}, linear {ratios['linear']}")
    steps = report["steps"]
    print(f"steps: stage 1 {steps['stage_1']}, extension {steps['extension']}; wall {report['wall_s']:.0f} s")
    for goal, met in report["goals"].items():
        print(f"  {'met' if met else 'NOT met'}: {goal}")


def main() -> None:
    today = datetime.date.today().isoformat()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "extension.yaml")
    parser.add_argument("--work", type=Path, default=REPO / "runs" / "bench_extension")
    parser.add_argument(
        "--out", type=Path, default=REPO / "tests" / "benchmarks" / "results" / f"{today}-cpu-extension.json"
    )
    parser.add_argument("--steps-scale", type=float, default=1.0, help="multiplies every stage's steps")
    parser.add_argument("--threads", type=int, default=1, help="threads per process (OMP_NUM_THREADS)")
    parser.add_argument(
        "--report-only", action="store_true", help="write the report of the finished run in --work again"
    )
    args = parser.parse_args()
    base = yaml.safe_load(args.config.read_text())
    done = args.work / "commands.json"
    if args.report_only:
        if not done.is_file():
            sys.exit(f"{SCRIPT}: {done} not found: --report-only needs a finished run in --work {args.work}")
        commands = json.loads(done.read_text())
    else:
        become_subreaper(SCRIPT)
        if args.work.exists():
            shutil.rmtree(args.work)
        args.work.mkdir(parents=True)
        yarn, linear = derived_configs(base, args.work, args.steps_scale)
        env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "PYTHONPATH": str(REPO)}
        commands = run_chain(yarn, linear, args.work, env)
        done.write_text(json.dumps(commands, indent=2) + "\n")
    header = {
        "date": today,
        "machine": f"{os.cpu_count()} CPU cores, {args.threads} thread(s) per process",
        "config": str(args.config.resolve().relative_to(REPO))
        if args.config.resolve().is_relative_to(REPO)
        else str(args.config),
        "steps_scale": args.steps_scale,
    }
    wall = sum(c["wall_s"] for c in commands.values())
    report = build_report(base, args.work, commands, wall, header)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    plot = args.out.with_suffix(".png")
    shutil.copyfile(Path(report["eval_folder"]) / "score_by_length.png", plot)
    print_report(report)
    print(f"report: {args.out}\nplot: {plot}")


if __name__ == "__main__":
    main()
