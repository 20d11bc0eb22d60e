"""``longctx train``: continue pretraining on packed shards (under torchrun, or ``--nproc N``)."""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported when run, keeping `longctx --help` fast
    from longctx.config import RootConfig
    from longctx.core.layout import RunLayout
    from longctx.trainer.launch import Rendezvous
    from longctx.trainer.stages import StagedResult
    from longctx.trainer.train import TrainResult


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "train",
        help="train a RoPE-scaled decoder on packed shards with ring attention",
        description=(
            "Continue pretraining on the packer's shards. Run it under torchrun for several processes "
            "(torchrun --nproc-per-node N -m longctx.cli train --config CFG) or pass --nproc N to have it "
            "start torchrun on this machine. On M machines, run it on each with --nproc N --nnodes M "
            "--rdzv-endpoint HOST:PORT (HOST one of them, the same on all; docs/clusters.md, and "
            "configs/slurm/train.sbatch under Slurm). train.cp ranks form one ring (context parallelism); "
            "the world size divided by train.cp is the data-parallel size. Refuses shards whose positions "
            "never reach the required position, and models the ring cannot train. Writes "
            "<output>/train/{metrics.jsonl,checkpoints/,final/}; a killed run resumes from its newest intact "
            "checkpoint when started again, at any world size. With train.stages, each stage trains in "
            "<output>/train/stages/<k>-<seq_len>/ from the previous one's weights and is checked by its "
            "gate; a failed gate stops the run (exit 2), and a run started again resumes in the stage it "
            "stopped in."
        ),
    )
    parser.add_argument("--config", type=Path, required=True, help="YAML config with a train section")
    parser.add_argument("--output", help="local run folder (overrides output)")
    parser.add_argument("--steps", type=int, help="optimizer steps (overrides train.steps)")
    parser.add_argument(
        "--shards",
        help="shard folder, or an fsspec URL of one such as s3://bucket/run/shards/seq65536 "
        "(overrides train.shards)",
    )
    parser.add_argument("--nproc", type=int, help="start torchrun with this many local processes")
    parser.add_argument(
        "--nnodes",
        type=int,
        default=1,
        help="with --nproc: machines of the job, each running this command (default 1)",
    )
    parser.add_argument(
        "--rdzv-endpoint",
        metavar="HOST:PORT",
        help="with --nnodes: where the machines' launchers meet (HOST is one of them; the same on all)",
    )
    parser.add_argument(
        "--rdzv-id",
        help="with --nnodes: the job's name at the endpoint, the same on all machines "
        "(default: one derived from the output folder, e.g. $SLURM_JOB_ID under Slurm)",
    )
    parser.add_argument(
        "--restart",
        action="store_true",
        help="train from step 0 when the output holds checkpoints but none is intact (they are kept)",
    )
    parser.add_argument(
        "--export",
        type=int,
        metavar="STEP",
        help="do not train: write checkpoint STEP as a Hugging Face folder under <output>/train/export/ "
        "(one process unless --nproc is given; any number of processes reads a checkpoint of any run)",
    )
    parser.add_argument(
        "--stage",
        type=int,
        metavar="K",
        help="with --export and train.stages: the stage (from 1) whose checkpoint STEP is exported",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from longctx.trainer.launch import follow_launcher, leave_rank, rank_errors

    follow_launcher()  # a rank of `--nproc`: stop when the launcher is gone
    with rank_errors("train"):
        status = _train(args)
    return leave_rank(status)


def _train(args: argparse.Namespace) -> int:
    """The command: checks, then training or an export in this process, or the job's ranks started."""
    from longctx.commands import local_path
    from longctx.config import load_config
    from longctx.core.errors import ConfigError
    from longctx.core.layout import RunLayout
    from longctx.jobs import finished_training
    from longctx.trainer.launch import quiet_agent_cpp_logs

    check_flags(args)
    output = local_path(
        args.output,
        "--output",
        "the run folder is local; train.export.output uploads the trained model to a URL, and "
        "--shards URL reads shards from one",
    )
    cfg = load_config(
        args.config,
        {
            "output": str(output) if output else None,
            "train.steps": args.steps,
            "train.shards": args.shards,
        },
        {"output": "--output", "train.steps": "--steps", "train.shards": "--shards"},
    )
    if cfg.train is None:
        raise ConfigError(f"{args.config} has no 'train' section")
    launcher = bool(args.nproc) and "RANK" not in os.environ
    rendezvous = job_rendezvous(args, cfg.output) if launcher else None
    rank_env = quiet_agent_cpp_logs() if rendezvous is not None else None  # before torch is imported
    layout = RunLayout(cfg.output)
    with compiler_cache(layout.compile_cache):
        finished = finished_training(cfg) if args.export is None else None
        if finished is not None:  # a rerun of a finished run: say where its results are, start nothing
            if int(os.environ.get("RANK", "0")) == 0:
                print(finished)
            return 0
        return _run(args, cfg, launcher, rendezvous, rank_env)


def check_flags(args: argparse.Namespace) -> None:
    """Refuse, in one line naming the flag, a count below 1 and a flag that means nothing without
    another: ``--stage`` without ``--export``, the machines and rendezvous flags without ``--nproc``."""
    from longctx.commands import check_counts
    from longctx.core.errors import ConfigError

    check_counts(
        {"--nproc": args.nproc, "--nnodes": args.nnodes, "--export": args.export, "--stage": args.stage}
    )
    if args.stage is not None and args.export is None:
        raise ConfigError(
            f"--stage {args.stage} needs --export STEP: it names the stage whose checkpoint --export writes"
        )
    with_nproc = {
        "--nnodes": args.nnodes != 1,
        "--rdzv-endpoint": args.rdzv_endpoint is not None,
        "--rdzv-id": args.rdzv_id is not None,
    }
    alone = next((flag for flag, given in with_nproc.items() if given), None)
    if args.nproc is None and alone is not None:
        raise ConfigError(f"{alone} needs --nproc: it describes the job that --nproc starts")


def _run(
    args: argparse.Namespace,
    cfg: RootConfig,
    launcher: bool,
    rendezvous: Rendezvous | None,
    rank_env: dict[str, str] | None,
) -> int:
    """Check the run, then start its ranks (``--nproc``, as one agent of ``rendezvous`` when given), or
    train or export in this process."""
    from longctx import jobs
    from longctx.core.layout import RunLayout
    from longctx.trainer.launch import launch_training
    from longctx.trainer.preflight import check_before_export, check_before_start

    assert cfg.train is not None  # run checks it
    jobs.check(cfg, "train")  # before torchrun starts any rank
    world = args.nproc * args.nnodes if launcher else int(os.environ.get("WORLD_SIZE", "1"))
    if args.export is not None:  # any world size: the checkpoint is resharded onto it
        check_before_export(cfg.train, cfg.output, args.export, args.stage)
    else:
        check_before_start(cfg.train, cfg.context, cfg.output, world)
    if launcher:
        return launch_training(args.nproc, torchrun_args(args), cfg.output, rendezvous, rank_env)
    main_rank = int(os.environ.get("RANK", "0")) == 0
    if args.export is not None:
        folder = jobs.export(cfg, args.export, args.stage)
        if main_rank:
            print(f"exported step {args.export} to {folder}")
        return 0
    result = jobs.train(cfg, restart=args.restart)
    if main_rank:
        print("\n" + summary(result, RunLayout(cfg.output)))
    return 0


@contextlib.contextmanager
def compiler_cache(folder: Path) -> Iterator[None]:
    """``TORCHINDUCTOR_CACHE_DIR`` set to ``folder`` (``RunLayout.compile_cache``) meanwhile (a user's
    own setting wins), for this process and the ranks it starts, before torch is imported: importing
    ``torch._dynamo`` (optimizers and FSDP2 do) creates torch's compiler cache folder, by default
    ``$TMPDIR/torchinductor_<user>``, which outlives the run; ``train.kernels.compile`` compiles into
    the same folder (``kernels.use_compile_cache``)."""
    if "TORCHINDUCTOR_CACHE_DIR" in os.environ:
        yield
        return
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)
    try:
        yield
    finally:
        os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)


def summary(result: TrainResult | StagedResult, layout: RunLayout) -> str:
    """The lines ``longctx train`` ends with: what this run trained and where the results are, per
    stage (with its gate) in a staged run."""
    from longctx.trainer.stages import StagedResult

    if not isinstance(result, StagedResult):
        return f"{_trained(result)}\nmetrics: {layout.metrics}\nmodel: {result.final_model}"
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


def _trained(result: TrainResult) -> str:
    """What one run (or stage) trained in this process."""
    if not result.losses:  # resumed from the last step's checkpoint: only the final export was left
        return f"no step left to train (resumed at step {result.resumed_from}); wrote the final model"
    resumed = f" (resumed from step {result.resumed_from})" if result.resumed_from else ""
    return (
        f"trained steps {result.resumed_from + 1}-{result.steps}{resumed}; loss "
        f"{result.losses[0]:.4f} -> {result.losses[-1]:.4f}; {result.tokens_per_s:,.0f} tokens/s; "
        f"largest trained position {result.coverage['max_position']}"
    )


def job_rendezvous(args: argparse.Namespace, output: Path) -> Rendezvous | None:
    """Where this machine's launcher meets the others' (``--nnodes``, ``--rdzv-endpoint``,
    ``--rdzv-id``); a :class:`~longctx.core.errors.ConfigError` when the flags do not make a job."""
    import hashlib

    from longctx.core.errors import ConfigError
    from longctx.trainer.launch import Rendezvous

    if args.nnodes == 1:  # at least 1: check_flags
        if args.rdzv_endpoint or args.rdzv_id:
            raise ConfigError("--rdzv-endpoint and --rdzv-id are for jobs of several machines (--nnodes)")
        return None
    host, _, port = (args.rdzv_endpoint or "").rpartition(":")
    if not host or not port.isdigit() or port == "0":
        raise ConfigError(
            f"--nnodes {args.nnodes} needs --rdzv-endpoint HOST:PORT, where the machines' launchers meet "
            f"(HOST one of them, PORT free there; the same on every machine), got {args.rdzv_endpoint!r}"
        )
    run_id = args.rdzv_id or "longctx-" + hashlib.sha256(str(output.resolve()).encode()).hexdigest()[:16]
    return Rendezvous(args.nnodes, args.rdzv_endpoint, run_id)


def torchrun_args(args: argparse.Namespace) -> list[str]:
    """The arguments each torchrun rank runs ``longctx.cli`` with: this command without ``--nproc``
    and the rendezvous flags."""
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
