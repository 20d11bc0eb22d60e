"""``longctx train``: continue pretraining on packed shards (under torchrun, or ``--nproc N``)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train",
        help="train a RoPE-scaled Llama-family model on packed shards with ring attention",
        description=(
            "Continue pretraining on the packer's shards. Run it under torchrun for several processes "
            "(torchrun --nproc-per-node N -m longctx.cli train --config CFG) or pass --nproc N to have "
            "it start torchrun on this machine. train.cp ranks form one ring (context parallelism); the "
            "world size divided by train.cp is the data-parallel size. Refuses shards whose positions never "
            "reach the required position. Writes <output>/train/{metrics.jsonl,checkpoints/,final/}; a "
            "killed run resumes from its newest intact checkpoint when started again, at any world size. "
            "With train.stages, each stage trains in <output>/train/stages/<k>-<seq_len>/ from the previous "
            "one's weights and is checked by its gate; a failed gate stops the run (exit 2), and a run "
            "started again resumes in the stage it stopped in."
        ),
    )
    parser.add_argument("--config", type=Path, required=True, help="YAML config with a train section")
    parser.add_argument("--output", type=Path, help="output folder (overrides output)")
    parser.add_argument("--steps", type=int, help="optimizer steps (overrides train.steps)")
    parser.add_argument(
        "--shards",
        help="shard folder, or an fsspec URL of one such as s3://bucket/run/shards/seq65536 "
        "(overrides train.shards)",
    )
    parser.add_argument("--nproc", type=int, help="start torchrun with this many local processes")
    parser.add_argument(
        "--restart",
        action="store_true",
        help="train from step 0 when the output holds checkpoints but none is intact (they are kept)",
    )
    parser.add_argument(
        "--export",
        type=int,
        metavar="STEP",
        help="do not train: write checkpoint STEP as a Hugging Face folder under <output>/train/export/",
    )
    parser.add_argument(
        "--stage",
        type=int,
        metavar="K",
        help="with --export and train.stages: the stage (from 1) whose checkpoint STEP is exported",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from longctx.config import load_config
    from longctx.core.errors import ConfigError
    from longctx.core.layout import RunLayout
    from longctx.trainer.launch import follow_launcher, launch_training, rank_errors
    from longctx.trainer.preflight import check_before_start

    follow_launcher()  # a rank of `--nproc`: stop when the launcher is gone
    with rank_errors("train"):
        cfg = load_config(
            args.config,
            {
                "output": str(args.output) if args.output else None,
                "train.steps": args.steps,
                "train.shards": args.shards,
            },
        )
        if cfg.train is None:
            raise ConfigError(f"{args.config} has no 'train' section")
        launcher = bool(args.nproc) and "RANK" not in os.environ
        world = args.nproc if launcher else int(os.environ.get("WORLD_SIZE", "1"))
        check_before_start(cfg.train, cfg.context, cfg.output, world)
        if launcher:
            return launch_training(args.nproc, torchrun_args(args), cfg.output)
        from longctx import jobs

        if args.export is not None:
            folder = jobs.export(cfg, args.export, args.stage)
            if int(os.environ.get("RANK", "0")) == 0:
                print(f"exported step {args.export} to {folder}")
            return 0
        result = jobs.train(cfg, restart=args.restart)
    if int(os.environ.get("RANK", "0")) == 0:
        print("\n" + _report(result, RunLayout(cfg.output).metrics))
    return 0


def _report(result: Any, metrics: Path) -> str:
    """What a finished run prints: steps, losses and where things are, per stage in a staged run."""
    from longctx.trainer.stages import StagedResult

    if not isinstance(result, StagedResult):
        return _trained(result) + f"\nmetrics: {metrics}\nmodel: {result.final_model}"
    lines = []
    for outcome in result.stages:
        stage = outcome.stage
        done = _trained(outcome.result) if outcome.result is not None else "finished in an earlier run"
        lines.append(f"{stage.describe()}: {done}; metrics: {stage.layout.metrics}")
        if outcome.gate is not None:
            verdict = "passed" if outcome.gate.passed else "FAILED"
            lines.append(f"  gate {verdict}: {outcome.gate.summary()}")
    lines.append(f"model: {result.final_model}")
    return "\n".join(lines)


def _trained(result: Any) -> str:
    first, last = (result.losses[0], result.losses[-1]) if result.losses else (None, None)
    return (
        f"trained {result.steps} steps (resumed at {result.resumed_from}); loss {first} -> {last}; "
        f"{result.tokens_per_s:,.0f} tokens/s; largest trained position {result.coverage['max_position']}"
    )


def torchrun_args(args: argparse.Namespace) -> list[str]:
    """The arguments each torchrun rank runs ``longctx.cli`` with: this command without ``--nproc``."""
    argv = ["train", "--config", str(args.config)]
    for flag, value in (
        ("--output", args.output),
        ("--steps", args.steps),
        ("--shards", args.shards),
        ("--export", args.export),
        ("--stage", args.stage),
    ):
        if value is not None:
            argv += [flag, str(value)]
    if args.restart:
        argv.append("--restart")
    return argv
