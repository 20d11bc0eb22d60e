"""datatrove executors from the ``executor`` config section: local here, Slurm or Ray on a cluster,
and the runner that chains a job's stages on them."""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any

from datatrove.executor.base import PipelineExecutor
from datatrove.pipeline.base import PipelineStep

from pipeline.config import ConfigError, ExecutorConfig
from pipeline.progress import stderr_to_file, tail, task_progress

Stage = tuple[str, list[PipelineStep], int]
"""A stage of a job: its name, its pipeline and its number of tasks."""


def make_executor(
    cfg: ExecutorConfig,
    pipeline: list[PipelineStep],
    *,
    tasks: int,
    logging_dir: Path,
    job_name: str,
    depends: PipelineExecutor | None = None,
) -> PipelineExecutor:
    """One datatrove executor for one stage. Completed tasks are recorded in ``logging_dir`` and
    skipped when the stage runs again, which is what makes a killed run resumable."""
    common: dict[str, Any] = dict(pipeline=pipeline, tasks=tasks, logging_dir=str(logging_dir), depends=depends)
    if cfg.kind == "local":
        from datatrove.executor import LocalPipelineExecutor

        workers = tasks if cfg.workers == -1 else min(cfg.workers, tasks)
        return LocalPipelineExecutor(workers=workers, **common)
    if cfg.kind == "slurm":
        from datatrove.executor import SlurmPipelineExecutor

        assert cfg.slurm is not None  # the config validator guarantees it
        return SlurmPipelineExecutor(
            job_name=job_name,
            time=cfg.slurm.time,
            partition=cfg.slurm.partition,
            cpus_per_task=cfg.slurm.cpus_per_task,
            mem_per_cpu_gb=cfg.slurm.mem_per_cpu_gb,
            qos=cfg.slurm.qos,
            sbatch_args=cfg.slurm.sbatch_args or None,
            **common,
        )
    from datatrove.executor import RayPipelineExecutor

    return RayPipelineExecutor(workers=tasks if cfg.workers == -1 else cfg.workers, **common)


def run_stages(cfg: ExecutorConfig, stages: list[Stage], work: Path, job: str, verbose: bool = False) -> bool:
    """Run a job's stages in order; True when they ran here, False when submitted to Slurm.

    Locally (and on Ray) stages run one after the other, with a line per stage and per finished
    task on the console and datatrove's logs in ``work/logs/console.log`` (on the console instead
    with ``verbose``); a failure names the stage and shows the end of that log. On Slurm the stages are
    submitted at once as a chain of dependent job arrays. Completions are recorded under
    ``work/logs/<n>_<stage>``, so running the job again skips finished tasks.
    """
    console_log = work / "logs" / "console.log"
    previous = None
    for number, (name, pipeline, tasks) in enumerate(stages, start=1):
        logging_dir = work / "logs" / f"{number}_{name}"
        executor = make_executor(
            cfg,
            pipeline,
            tasks=tasks,
            logging_dir=logging_dir,
            job_name=f"{job}_{name}",
            depends=previous if cfg.kind == "slurm" else None,
        )
        if cfg.kind == "slurm":
            previous = executor
            continue
        label = f"[{job} {number}/{len(stages)}] {name}"
        completions = logging_dir / "completions"
        done = sum(1 for _ in completions.iterdir()) if completions.is_dir() else 0
        print(f"{label}: {tasks} task(s)" + (f", {done} done in an earlier run" if done else ""), flush=True)
        quiet = contextlib.nullcontext() if verbose else stderr_to_file(console_log)
        try:
            with quiet, task_progress(label, completions, tasks):
                executor.run()
        except ConfigError:
            raise  # a user error with its own message (e.g. a coverage refusal)
        except Exception:
            if not verbose:
                print(f"{job} stage '{name}' failed; last lines of {console_log}:\n{tail(console_log)}", file=sys.stderr)
            raise
    if previous is not None:
        previous.run()
        return False
    return True
