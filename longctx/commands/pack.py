"""``longctx pack``: tokenize, mix and pack curated documents into shards (run or resume)."""

from __future__ import annotations

import argparse
import gc
import time
from pathlib import Path


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "pack",
        help="tokenize, mix and pack curated documents into fixed-length training windows",
        description=(
            "Tokenize <output>/documents with <output>/tokenizer.json, mix sources by pack.mix, and pack "
            "the documents into windows of every pack.seq_lens length (default: context.target), written as "
            "Arrow shards with a manifest to <output>/shards/seq<N>/ (format: packer/FORMAT.md). Refuses "
            "outputs in which no token reaches position context.original unless "
            "pack.allow_short_positions is set. "
            "Killed runs resume where they stopped when run again, and produce the same bytes. With "
            "pack.output (or --publish) each finished folder is also uploaded to <pack.output>/seq<N>/, its "
            "manifest last, e.g. to s3:// (needs s3fs: pip install 'longctx[s3]'). With pack.input (or "
            "--input) the documents and tokenizer come from a curation published elsewhere (curate.output), "
            "copied into <output>/cache and checked first."
        ),
    )
    parser.add_argument(
        "--config", type=Path, required=True, help="YAML config with a pack section (see configs/)"
    )
    parser.add_argument(
        "--output", help="local run folder holding documents/ and tokenizer.json (overrides output)"
    )
    parser.add_argument(
        "--input",
        metavar="URL",
        help="pack the curation published at URL (curate.output, e.g. s3://bucket/run) instead of "
        "<output>/documents (overrides pack.input)",
    )
    parser.add_argument(
        "--publish",
        metavar="URL",
        help="also upload the finished shards to URL/seq<N>/, e.g. s3://bucket/run/shards "
        "(overrides pack.output)",
    )
    parser.add_argument("--tasks", type=int, help="number of tasks (overrides pack.executor.tasks)")
    parser.add_argument(
        "--workers", type=int, help="tasks run at once locally (overrides pack.executor.workers)"
    )
    parser.add_argument("--verbose", action="store_true", help="show datatrove's task logs on the console")
    parser.add_argument(
        "--status",
        action="store_true",
        help="run nothing: show which tasks of the run are done (and on Slurm, which of its jobs are queued)",
    )
    parser.set_defaults(func=run, fast_allocator=True)  # see longctx.core.allocator


def run(args: argparse.Namespace) -> int:
    from longctx.core.nopandas import pyarrow_without_pandas

    pyarrow_without_pandas()  # this process and its workers never use pandas
    from longctx import jobs
    from longctx.commands import local_path
    from longctx.config import load_config
    from longctx.core.allocator import allocator_note, keep_from_children
    from longctx.core.layout import RunLayout
    from longctx.packer.mix import format_fractions
    from longctx.packer.report import format_manifest

    output = local_path(
        args.output,
        "--output",
        "the run folder is local; add --publish URL (pack.output) to upload the shards there, and "
        "--input URL (pack.input) packs a curation published there",
    )
    cfg = load_config(
        args.config,
        {
            "output": str(output) if output else None,
            "pack.output": args.publish,
            "pack.input": args.input,
            "pack.executor.tasks": args.tasks,
            "pack.executor.workers": args.workers,
        },
        {
            "output": "--output",
            "pack.output": "--publish",
            "pack.input": "--input",
            "pack.executor.tasks": "--tasks",
            "pack.executor.workers": "--workers",
        },
    )
    if cfg.pack is not None and cfg.pack.executor.kind != "local":
        keep_from_children()  # the jobs run on machines that may not have this process's allocator
    if args.status:
        from longctx.commands.curate import show_status
        from longctx.core.jobstate import STAGES_FILE

        work = RunLayout(cfg.output, "pack").work
        passes = sorted(p.parent for p in work.glob(f"*/{STAGES_FILE}"))  # one job per window length
        layout = RunLayout(cfg.output)
        publish = cfg.pack.output if cfg.pack else None
        return show_status(*(passes or [work]), what="packing", results=layout.shards, publish=publish)
    start = time.monotonic()
    manifests = jobs.pack(cfg, verbose=args.verbose)
    layout = RunLayout(cfg.output)
    if manifests is None:
        print(
            f"shards will be in {layout.shards}; once the jobs have finished, run the same command again to "
            f"print the manifests{' and publish' if cfg.pack and cfg.pack.output else ''} (or resubmit what "
            f"failed); `longctx pack --config {args.config} --status` shows which tasks are done"
        )
        return 0
    for seq_len, manifest in manifests.items():
        print()
        print(format_manifest(manifest, title=str(layout.shard_folder(seq_len))))
        targets = {n: s.target_fraction for n, s in manifest.sources.items() if s.target_fraction is not None}
        if targets:
            print(
                format_fractions(targets, {n: s.tokens for n, s in manifest.sources.items()}, "mix reached:")
            )
    print(f"\n({time.monotonic() - start:.1f} s{allocator_note()})")
    # the command ends here: the interpreter's last collections need not scan what is alive now
    # (the job's modules and data; as in `longctx curate`)
    gc.freeze()
    return 0
