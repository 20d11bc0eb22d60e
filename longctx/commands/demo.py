"""``longctx demo``: curate, pack, validate, train (2 CPU ranks, ring attention), evaluate."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "demo",
        help="run the whole flow on the embedded default corpus (CPU, a few minutes)",
        description=(
            "The main job end to end on the embedded default corpus (Python's standard library and its "
            "bundled documentation): curate, pack two window lengths, validate the shards, train a tiny "
            "model for a few steps on 2 CPU ranks with ring attention, compare the base and the trained "
            "model on loss by position and needle retrieval, and print one summary. Finished stages are "
            "reused when run again. The config ships with the package, so it runs from any folder; results "
            "go to runs/demo under the current folder unless --output says otherwise."
        ),
    )
    parser.add_argument("--config", type=Path, help="YAML config (default: the packaged demo config)")
    parser.add_argument("--output", help="local output folder (overrides output)")
    parser.add_argument("--verbose", action="store_true", help="show datatrove's task logs")
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the packaged demo config (to copy and edit) and exit",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import contextlib

    from longctx import jobs
    from longctx.commands import local_path
    from longctx.config import load_config
    from longctx.demo import packaged_config, run_demo

    if args.print_config:
        with packaged_config() as path:
            print(path.read_text(encoding="utf-8"), end="")
        return 0
    with packaged_config() if args.config is None else contextlib.nullcontext(args.config) as config_path:
        output = local_path(args.output, "--output", "the demo writes a local run folder")
        cfg = load_config(config_path, {"output": str(output) if output else None}, {"output": "--output"})
        jobs.check(cfg, *jobs.SECTIONS)  # every stage's sections, before the first stage starts
        run_demo(cfg, config_path, verbose=args.verbose)
    return 0
