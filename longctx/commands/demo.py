"""``longctx demo``: curate, pack, validate, train (2 CPU ranks, ring attention), evaluate."""

from __future__ import annotations

import argparse
from pathlib import Path

DEFAULT_CONFIG = Path("configs/demo.yaml")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="run the whole flow on the embedded default corpus (CPU, a few minutes)",
        description=(
            "The main job end to end on the embedded default corpus (Python's standard library and its "
            "bundled documentation): curate, pack two window lengths, validate the shards, train a tiny "
            "model for a few steps on 2 CPU ranks with ring attention, evaluate loss by position and needle "
            "retrieval, and print one summary. Finished stages are reused when run again."
        ),
    )
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help=f"YAML config (default {DEFAULT_CONFIG})")
    parser.add_argument("--output", type=Path, help="output folder (overrides output)")
    parser.add_argument("--verbose", action="store_true", help="show datatrove's task logs")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from longctx.config import load_config
    from longctx.core.errors import ConfigError
    from longctx.demo import run_demo

    if not args.config.is_file():
        raise ConfigError(f"{args.config} not found: run from the repository root or pass --config")
    cfg = load_config(args.config, {"output": str(args.output) if args.output else None})
    run_demo(cfg, args.config, verbose=args.verbose)
    return 0
