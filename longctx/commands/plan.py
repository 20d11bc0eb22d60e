"""``longctx plan``: the capacity table to read before a long-context run.

The formulas are ``longctx.trainer.planning.plan`` and the FLOP model ``longctx.trainer.planning.flops``;
the report is
``longctx.trainer.planning.report``. This module only reads the arguments.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="FLOPs, memory, ring communication and wall-clock of a long-context run, before running it",
        description=(
            "For a model (a preset or a Hugging Face config.json) and a list of context lengths, print "
            "per-layer attention and MLP FLOPs and their crossover length, activation memory with and "
            "without FlashAttention, the KV cache in fp16/fp8/fp4, per-rank memory and per-step "
            "communication of ring attention over --cp ranks with the smallest block that hides it, what "
            "each context-parallel mode (train.cp_mode: ring, allgather, ulysses, hybrid) sends and exposes "
            "with the one to use, and optionally the wall-clock for a token budget. Lengths take K=1024 and "
            "M=1024^2 suffixes (8K = 8192); token budgets take decimal K/M/B/T (20B = 2e10)."
        ),
    )
    parser.add_argument(
        "--config",
        type=Path,
        help="a run config: its train section sets --cp, --dp-replicate, --activation-checkpointing and the "
        "model (train.model.hf_path), and context.target the length (train.stages: every stage's length, "
        "and a table of each stage's steps, tokens, memory and time per step), unless given here",
    )
    parser.add_argument(
        "--model",
        help="preset (llama-2-7b, llama-3-8b, llama-3-70b, llama-3.1-405b, qwen2-7b, mistral-7b-v0.3), "
        "a model folder or a config.json (default: the --config's train.model.hf_path)",
    )
    parser.add_argument("--lengths", help="comma-separated context lengths, e.g. 8K,32K,128K,1M")
    parser.add_argument("--cp", type=int, help="context-parallel (ring) size (default 1)")
    parser.add_argument(
        "--link-gbytes-per-s",
        type=float,
        default=50.0,
        help="per-rank ring bandwidth, one direction, in GB/s = 1e9 bytes/s (default 50: one 400 Gb/s "
        "NIC per GPU; "
        "NVLink 4 within a node is about 450)",
    )
    parser.add_argument(
        "--gpus-per-node",
        type=int,
        default=8,
        help="GPUs of one node: a ring or all-to-all group this large or smaller uses "
        "--node-link-gbytes-per-s in the table of context-parallel modes (default 8)",
    )
    parser.add_argument(
        "--node-link-gbytes-per-s",
        type=float,
        default=450.0,
        help="per-rank bandwidth within a node, one direction, in GB/s (default 450: NVLink 4, H100/H200); "
        "groups larger than a node use --link-gbytes-per-s",
    )
    parser.add_argument(
        "--achieved-tflops",
        type=float,
        default=400.0,
        help="TFLOP/s (1e12) the attention kernel achieves on one ring step's block pair (default 400)",
    )
    parser.add_argument(
        "--dp-replicate", type=int, help="replicas of the sharded state, HSDP (train.dp_replicate, default 1)"
    )
    parser.add_argument(
        "--state-shards",
        type=int,
        help="ranks the weights, gradients and AdamW states are sharded over; default as longctx train "
        "shards them (FSDP2 over dp_shard x cp): --gpus / --dp-replicate, or --cp without --gpus",
    )
    parser.add_argument(
        "--activation-checkpointing",
        nargs="?",
        const="full",
        choices=["auto", "none", "selective", "full"],
        help="activations kept per rank (train.activation_checkpointing): none, selective, full (the flag "
        "alone) or auto, the first of them that fits --gpu-memory (default none)",
    )
    parser.add_argument(
        "--gpu-memory",
        help="memory of one GPU: a bare number is GB (80 = 80GB = 80e9 bytes, as GPUs are sold); 80GiB "
        "(2^30 bytes), 81559MiB (as nvidia-smi says) and 8e10B work too. Says whether each length fits and, "
        "when it does not, the smallest change of each kind that would: activation checkpointing, a larger "
        "--cp, more --gpus, or checkpointing with either",
    )
    parser.add_argument("--tokens", help="token budget for the wall-clock estimate, e.g. 20B (needs --gpus)")
    parser.add_argument("--gpus", type=int, help="GPUs of the run, for the wall-clock estimate")
    parser.add_argument(
        "--peak-tflops",
        type=float,
        default=989.0,
        help="dense bf16 peak TFLOP/s per GPU (default 989, H100 SXM)",
    )
    parser.add_argument(
        "--mfu", type=float, default=0.4, help="model FLOPs utilization for the wall-clock (default 0.4)"
    )
    parser.add_argument("--csv", help="also write the table to this local file, one row per length")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import math

    from longctx.commands import check_counts, local_path
    from longctx.core.errors import ConfigError
    from longctx.trainer.parallel.mesh import MeshShape
    from longctx.trainer.planning.plan import (
        RunSettings,
        load_model_shape,
        parse_bytes,
        parse_count,
        parse_lengths,
        plan_length,
        plan_stage,
    )
    from longctx.trainer.planning.report import format_report, format_stages, write_csv

    check_counts(
        {
            "--cp": args.cp,
            "--dp-replicate": args.dp_replicate,
            "--state-shards": args.state_shards,
            "--gpus": args.gpus,
            "--gpus-per-node": args.gpus_per_node,
        }
    )
    for flag, value in (
        ("--link-gbytes-per-s", args.link_gbytes_per_s),
        ("--node-link-gbytes-per-s", args.node_link_gbytes_per_s),
    ):
        if not 0 < value < math.inf:
            raise ConfigError(f"{flag} {value:g}: must be a positive number of GB/s")
    csv = local_path(args.csv, "--csv", "write the table to a local file")
    defaults = _config_defaults(args.config) if args.config is not None else {}
    model_spec = args.model or defaults.get("model")
    if model_spec is None:
        raise ConfigError(
            "no model: pass --model (a preset or a config.json), or a --config with train.model.hf_path"
        )
    lengths_spec = args.lengths or defaults.get("lengths")
    if lengths_spec is None:
        raise ConfigError("no lengths: pass --lengths, or a --config (its context.target)")
    model = load_model_shape(model_spec)
    lengths = parse_lengths(lengths_spec)
    cp = args.cp if args.cp is not None else defaults.get("cp", 1)
    replicas = args.dp_replicate if args.dp_replicate is not None else defaults.get("dp_replicate", 1)
    shards = args.state_shards
    if shards is None and args.gpus is not None:  # as longctx train shards them: over dp_shard x cp
        keys = {"world_key": "--gpus", "cp_key": "cp", "replicas_key": "dp_replicate"}
        shards = MeshShape.for_world(args.gpus, cp, replicas, **keys).shard_size
    elif shards is None:
        shards = cp
    settings = RunSettings(
        cp=cp,
        link_bytes_per_s=args.link_gbytes_per_s * 1e9,
        achieved_flops=args.achieved_tflops * 1e12,
        state_shards=shards,
        activation_checkpointing=args.activation_checkpointing
        or defaults.get("activation_checkpointing", "none"),
        tokens=parse_count(args.tokens) if args.tokens is not None else None,
        gpus=args.gpus,
        peak_flops=args.peak_tflops * 1e12,
        mfu=args.mfu,
        gpu_memory_bytes=parse_bytes(args.gpu_memory) if args.gpu_memory is not None else None,
        dp_replicate=replicas,
        gpus_per_node=args.gpus_per_node,
        node_link_bytes_per_s=args.node_link_gbytes_per_s * 1e9,
    )
    plans = [plan_length(model, length, settings) for length in lengths]
    print(format_report(model, settings, plans))
    stages = defaults.get("stages")
    if stages:
        gpus = args.gpus or cp * replicas
        keys = {"world_key": "--gpus", "cp_key": "cp", "replicas_key": "dp_replicate"}
        data_parallel = MeshShape.for_world(gpus, cp, replicas, **keys).dp_size
        staged = [  # rows per step default to one per data-parallel rank, as in longctx train
            plan_stage(
                model, **{**stage, "rows": stage["rows"] or data_parallel}, gpus=gpus, settings=settings
            )
            for stage in stages  # type: ignore[attr-defined]
        ]
        print("\n" + format_stages(staged, settings, gpus, args.gpus is not None))
    if csv is not None:
        write_csv(csv, model, settings, plans)
        print(f"\nwrote {csv}")
    return 0


def _config_defaults(path: Path) -> dict[str, object]:
    """What a run config says about the plan: model, length, cp, replicas, activation checkpointing."""
    from longctx.config import check_world, load_config
    from longctx.core.errors import ConfigError
    from longctx.core.layout import RunLayout
    from longctx.trainer.stage_plan import resolve_stages

    cfg = load_config(path)
    if cfg.train is None:
        raise ConfigError(f"{path} has no 'train' section")
    check_world(cfg, ["train.model"])
    defaults: dict[str, object] = {
        "lengths": str(cfg.context.target),
        "cp": cfg.train.cp,
        "dp_replicate": cfg.train.dp_replicate,
        "activation_checkpointing": cfg.train.activation_checkpointing,
    }
    if cfg.train.model.hf_path is not None:
        defaults["model"] = str(cfg.train.model.hf_path)
    if cfg.train.stages:
        stages = resolve_stages(cfg.train, RunLayout(cfg.output))
        defaults["lengths"] = ",".join(str(s.seq_len) for s in stages)
        defaults["stages"] = [
            {
                "number": s.number,
                "length": s.seq_len,
                "rope": _rope(s.rope_scaling, cfg.train.model.rope_theta),
                "steps": s.steps,
                "rows": s.config.global_batch_rows or cfg.train.global_batch_rows,
            }
            for s in stages
        ]
    return defaults


def _rope(scaling: dict[str, object] | None, theta: float | None) -> str:
    """A stage's RoPE scaling in a table cell: ``yarn x4``; without one, the base ``train.model.rope_theta``
    sets (``theta 8e+06``), or ``checkpoint's``."""
    if scaling is None:
        return f"theta {theta:g}" if theta is not None else "checkpoint's"
    kind = scaling.get("rope_type", scaling.get("type"))
    return f"{kind} x{scaling['factor']:g}" if "factor" in scaling else str(kind)
