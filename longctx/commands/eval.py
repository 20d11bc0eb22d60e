"""``longctx eval``: compare models on loss by position and needle retrieval."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "eval",
        help="compare models on loss by position and needle retrieval (tables, JSON and PNG plots)",
        description=(
            "Evaluate whether models use their long context, each on the same windows and needles: mean loss "
            "per position bucket on packed windows (a healthy extended model's loss keeps falling past the "
            "original context) and a needle-retrieval grid of items per task kind and context length, spread "
            "over the depths, scored by greedy decoding. Each run writes a new folder <output>/eval/<NNN>/ "
            "(loss_by_position.{json,png,txt}, needle.{json,png}, needle_prompts.jsonl.gz, "
            "score_by_length.png, summary.json) and never replaces an earlier one. It reports each model's "
            "effective context length (the largest length up to which every length's score clears the "
            "threshold with the lower end of its 95% interval, eval.effective) with its score per task, "
            "each with its count and interval, and, with eval.short_context, its loss on held-out short "
            "windows as a ratio to eval.baseline's and to the base model as released. Models "
            "(eval.models, default: base trained): 'base' is the model training starts from (train.model), "
            "'trained' is <output>/train/final (a staged run's last stage's), anything else a Hugging Face "
            "checkpoint folder (Llama, Mistral and Qwen2 run on longctx's decoder, other RoPE decoders on "
            "their transformers code: train.model.implementation)."
        ),
    )
    parser.add_argument("--config", type=Path, required=True, help="YAML config with an eval section")
    parser.add_argument(
        "--output", help="local run folder (overrides output); results go to <output>/eval/<NNN>"
    )
    parser.add_argument(
        "--model",
        action="append",
        metavar="MODEL",
        help="base, trained or a Hugging Face checkpoint folder; repeat to compare "
        "several (overrides eval.models)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from longctx import jobs
    from longctx.commands import local_path
    from longctx.config import load_config
    from longctx.core.errors import ConfigError

    output = local_path(args.output, "--output", "evaluations are written into the local run folder")
    cfg = load_config(
        args.config,
        {"output": str(output) if output else None, "eval.models": args.model},
        {"output": "--output", "eval.models": "--model"},
    )
    if cfg.eval is None:
        raise ConfigError(f"{args.config} has no 'eval' section")
    result = jobs.evaluate(cfg)
    for label in result["added_as_baseline"]:
        print(f"\n{label} was evaluated too: it is eval.baseline (the short-context ratio)")
    print("\nloss by position (mean next-token loss per bucket)")
    print(result["loss_table"])
    if result["needle_accuracy"] is not None:
        print("\nneedle retrieval accuracy (all items; per context length, with its item count)")
        for label, accuracy in result["needle_accuracy"].items():
            by_length = ", ".join(
                f"{c['context_tokens']}: {c['accuracy']:.0%} of {c['count']}"
                for c in result["needle_by_length"][label]
            )
            print(f"  {label}: {accuracy:.1%}  ({by_length})")
    if result["effective_length"] is not None:
        from longctx.trainer.evaluation.measures import format_effective

        print("\n" + format_effective(result["effective_length"], result["task_scores"]))
    print(f"\nwritten to {result['folder']}:")
    print("\n".join(f"  {path}" for path in result["files"]))
    return 0
