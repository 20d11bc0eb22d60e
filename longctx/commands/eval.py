"""``longctx eval``: loss by position and needle retrieval for a trained or Hugging Face model."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "eval",
        help="loss by position and needle retrieval (tables, JSON and PNG plots)",
        description=(
            "Evaluate whether a model uses its long context: mean loss per position bucket on packed windows "
            "(a healthy extended model's loss keeps falling past the original context) and a needle-retrieval "
            "grid of context lengths x depths scored by greedy decoding. Writes <output>/eval/"
            "{loss_by_position,needle}.{json,png}. The model is <output>/train/final unless --model names a "
            "Hugging Face checkpoint folder (Llama, Mistral, Qwen2)."
        ),
    )
    parser.add_argument("--config", type=Path, required=True, help="YAML config with an eval section")
    parser.add_argument("--output", type=Path, help="output folder (overrides output)")
    parser.add_argument("--model", type=Path, help="Hugging Face checkpoint folder (overrides eval.model)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from longctx import jobs
    from longctx.config import load_config
    from longctx.core.errors import ConfigError

    cfg = load_config(
        args.config,
        {"output": str(args.output) if args.output else None, "eval.model": str(args.model) if args.model else None},
    )
    if cfg.eval is None:
        raise ConfigError(f"{args.config} has no 'eval' section")
    result = jobs.evaluate(cfg)
    print(result["loss_table"])
    if "needle_accuracy" in result:
        print(f"\nneedle retrieval accuracy: {result['needle_accuracy']:.1%}")
    print("\n" + "\n".join(result["files"]))
    return 0
