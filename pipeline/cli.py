"""The ``longctx`` command.

Each subcommand lives in its own module exposing ``add_parser(subparsers)`` and ``run(args) -> int``.
Modules keep heavy imports (datatrove, torch) inside ``run`` so that ``longctx --help`` is instant.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# subcommand name -> module implementing it
COMMANDS: dict[str, str] = {
    "curate": "pipeline.curate_cli",
    "pack": "packer.cli_pack",
    "inspect": "packer.cli_inspect",
    "train": "trainer.cli_train",
    "plan": "trainer.cli_plan",
    "eval": "trainer.cli_eval",
    "demo": "trainer.cli_demo",
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="longctx",
        description="Long-document continued pretraining: curate, pack, train and evaluate.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name, module_name in COMMANDS.items():
        importlib.import_module(module_name).add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``longctx`` console script."""
    from pipeline.errors import LongctxError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except LongctxError as err:
        print(f"longctx {args.command}: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"longctx {args.command}: interrupted; run the same command again to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
