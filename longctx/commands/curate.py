"""``longctx curate``: run or resume the curation job."""

from __future__ import annotations

import argparse
import gc
import time
from pathlib import Path


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "curate",
        help="read books, papers and code repositories; filter by token length; "
        "remove exact and near duplicates",
        description=(
            "Curate long documents. Reads the sources of --config (or --input DIR with books/, papers/ and "
            "code/ subfolders), filters by token length, removes exact and near duplicates, and writes "
            "<output>/documents/<source>/*.parquet, <output>/ledger.parquet (one row per input document), "
            "<output>/stats.json and <output>/stats.png. Killed runs resume where they stopped when run "
            "again. With curate.output (or --publish) the finished curation is also uploaded there "
            "(documents/, tokenizer, ledger and stats, then curation.json listing them with checksums), e.g. "
            "to s3://, for `longctx pack` elsewhere to read with pack.input."
        ),
    )
    parser.add_argument("--config", type=Path, required=True, help="YAML config (see configs/)")
    parser.add_argument(
        "--input",
        help="folder (local path or fsspec URL such as s3://bucket/corpus) with books/, papers/, code/ "
        "subfolders (overrides curate.input)",
    )
    parser.add_argument("--output", help="local run folder (overrides output); --publish uploads to a URL")
    parser.add_argument(
        "--publish",
        metavar="URL",
        help="also upload the finished curation to URL, e.g. s3://bucket/run (overrides curate.output)",
    )
    parser.add_argument("--tasks", type=int, help="number of tasks (overrides curate.executor.tasks)")
    parser.add_argument(
        "--workers", type=int, help="tasks run at once locally (overrides curate.executor.workers)"
    )
    parser.add_argument(
        "--update",
        action="store_true",
        help="curate the run again when its input files changed since it started (added, removed or "
        "rewritten files; otherwise refused), marking the changes in the ledger's change column",
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
    from longctx.pipeline.stats import format_summary

    output = local_path(
        args.output,
        "--output",
        "the run folder is local; add --publish URL (curate.output) to upload the finished curation there",
    )
    cfg = load_config(
        args.config,
        {
            "curate.input": args.input,
            "output": str(output) if output else None,
            "curate.output": args.publish,
            "curate.executor.tasks": args.tasks,
            "curate.executor.workers": args.workers,
        },
        {
            "curate.input": "--input",
            "output": "--output",
            "curate.output": "--publish",
            "curate.executor.tasks": "--tasks",
            "curate.executor.workers": "--workers",
        },
    )
    if cfg.curate.executor.kind != "local":
        keep_from_children()  # the jobs run on machines that may not have this process's allocator
    if args.status:
        return show_status(
            RunLayout(cfg.output, "curate").work,
            what="curation",
            results=cfg.output,
            publish=cfg.curate.output,
        )
    start = time.monotonic()
    summary = jobs.curate(cfg, verbose=args.verbose, update=args.update, fresh_process=True)
    if summary is None:
        print(
            f"results will be in {cfg.output}; once the jobs have finished, run the same command again "
            f"to print the summary{' and publish' if cfg.curate.output else ''} (or resubmit what failed); "
            f"`longctx curate --config {args.config} --status` shows which tasks are done"
        )
        return 0
    layout = RunLayout(cfg.output)
    print()
    print(format_summary(summary))
    print(
        f"\ncurated documents: {layout.documents}\nledger: {layout.ledger}\n"
        f"stats: {layout.stats} and {layout.plot}\n"
        f"tokenizer: {layout.tokenizer}\n({time.monotonic() - start:.1f} s{allocator_note()})"
    )
    # the command ends here: the interpreter's last collections need not scan what is alive now
    # (the job's modules and data; ~0.3 s of the ~0.7 s this process took to exit)
    gc.freeze()
    return 0


def show_status(*works: Path, what: str, results: Path, publish: str | None = None) -> int:
    """``--status``: where the job recorded in each of ``works`` stands (see longctx.core.jobstate);
    once every task is done, that the job (``what``) is finished and where its ``results`` are."""
    from longctx.core.jobstate import job_state

    states = [job_state(work) for work in works]
    for state in states:
        print(f"{state.work}:")
        print("\n".join(state.lines()))
    if states and all(state.complete for state in states):
        then = f"prints its summary and publishes it to {publish}" if publish else "prints its summary"
        print(
            f"every task is done: the {what} is finished, its results are in {results}; the command "
            f"without --status {then}"
        )
    return 0
