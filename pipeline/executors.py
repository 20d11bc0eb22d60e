"""datatrove executors from the ``executor`` config section: local here, Slurm or Ray on a cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from datatrove.executor.base import PipelineExecutor
from datatrove.pipeline.base import PipelineStep

from pipeline.config import ExecutorConfig


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
