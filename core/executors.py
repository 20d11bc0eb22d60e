"""datatrove executors from an ``executor`` config section (local here, Slurm or Ray on a cluster),
and the runner that chains a job's stages on them.

A job is a list of stages, each a datatrove pipeline with its number of tasks. The stages' executors
are chained with datatrove's own ``depends=``: running the last one runs (or, on Slurm, submits) the
others first, in order, and a stage starts only once every task of the one before has completed.
Completed tasks are recorded under ``work/logs/<n>_<stage>/completions`` and skipped when the job runs
again, which is what makes a killed job resumable. No process outlives the job: locally, every process
the executor starts dies with the command, even when it is killed (:mod:`longctx.core.lifetime`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datatrove.executor import LocalPipelineExecutor, RayPipelineExecutor, SlurmPipelineExecutor
from datatrove.executor.base import PipelineExecutor
from datatrove.pipeline.base import PipelineStep
from datatrove.utils._import_utils import check_required_dependencies

from longctx.core.config import ExecutorConfig
from longctx.core.errors import LongctxError
from longctx.core.lifetime import (
    children_die_with_this_process,
    die_with_parent,
    process_exists,
    sigterm_exits,
)
from longctx.core.preflight import disk_fault
from longctx.core.progress import stderr_to_file, tail, task_progress
from longctx.core.workers import job_processes, start_forkserver, start_resource_tracker

Stage = tuple[str, list[PipelineStep], int]
"""A stage of a job: its name, its pipeline and its number of tasks."""


def warm_task_caches() -> None:
    """Fill, once per process, two caches that datatrove's tasks would otherwise fill in every worker
    or on every task. Called when this module is imported: the job's forkserver imports it, so the
    workers it forks start with both.

    - datatrove checks that pyarrow is installed whenever a Parquet step is built or unpickled (every
      worker unpickles its stage's steps), by parsing the metadata of every installed distribution
      (~35 ms per process; its answer is cached per process).
    - datatrove adds three loguru handlers per task (two when the task starts, one when it ends), and
      each ``logger.add`` scans every install scheme of :mod:`sysconfig` for the library folders it
      shortens in tracebacks (~3 ms; about 0.1 s of a curation's driver, which runs the small stages'
      tasks one after another). The folders do not change within a process, but loguru has no
      setting to keep them: its (private) scan is wrapped in a cache here, and loguru is left as it
      is where that scan is not found.
    """
    check_required_dependencies("Parquet steps", ["pyarrow"])
    from loguru import _better_exceptions

    formatter = getattr(_better_exceptions, "ExceptionFormatter", None)
    scan = getattr(formatter, "_get_lib_dirs", None)
    if callable(scan) and not hasattr(scan, "cache_info"):
        formatter._get_lib_dirs = staticmethod(functools.cache(scan))


warm_task_caches()


@dataclass(frozen=True)
class StageReport:
    """What the console shows of one stage run here (locally or on Ray): a line when it starts, one
    per finished task, and on failure the end of the log its tasks wrote."""

    job: str
    name: str
    number: int
    total: int
    tasks: int
    logging_dir: Path
    console_log: Path
    verbose: bool

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        label = f"[{self.job} {self.number}/{self.total}] {self.name}"
        completions = self.logging_dir / "completions"
        done = sum(1 for _ in completions.iterdir()) if completions.is_dir() else 0
        print(
            f"{label}: {self.tasks} task(s)" + (f", {done} done in an earlier run" if done else ""),
            flush=True,
        )
        quiet = contextlib.nullcontext() if self.verbose else stderr_to_file(self.console_log)
        try:
            with quiet, task_progress(label, completions, self.tasks):
                yield
        except LongctxError:
            raise  # a user error with its own message (e.g. a coverage refusal, a full disk)
        except Exception as err:
            # an error that names no file (datatrove's writers) is placed at the stage's folder
            where = None if getattr(err, "filename", None) else self.logging_dir
            fault = disk_fault(err, where) if isinstance(err, OSError) else None
            if fault is not None:  # e.g. the disk filled up under datatrove's own logs
                raise fault from None
            if not self.verbose:
                log = self.console_log
                print(
                    f"{self.job} stage '{self.name}' failed; last lines of {log}:\n{tail(log)}",
                    file=sys.stderr,
                )
            raise


class _Reported:
    """Mixin for executors that run here: the stage it depends on runs first (as datatrove's
    ``depends`` would), then this stage runs inside its :class:`StageReport`."""

    report: StageReport | None = None
    depends: PipelineExecutor | None
    _launched: bool

    def run(self) -> Any:
        if self.depends is not None and not self.depends._launched:
            self.depends.run()  # so that its console lines come before this stage's
        if self.report is None:
            return super().run()  # type: ignore[misc]
        with self.report.running():
            return super().run()  # type: ignore[misc]


class ReportedLocalExecutor(_Reported, LocalPipelineExecutor):
    """datatrove's local executor with a console report, whose processes die with this one.

    The manager server it forks dies with this process (see :mod:`longctx.core.lifetime`), and so do
    pool workers forked from it; a worker of a forkserver arms the same when it picks up a task (its
    parent is the forkserver, which exits when this process does).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.driver_pid = os.getpid()

    def run(self) -> Any:
        with children_die_with_this_process():
            return super().run()

    def _launch_run_for_rank(
        self, rank: int, ranks_q: Any, completed: Any = None, completed_lock: Any = None
    ) -> Any:
        if os.getpid() == self.driver_pid:  # workers: 1 runs the tasks here
            return super()._launch_run_for_rank(rank, ranks_q, completed, completed_lock)
        die_with_parent()
        if not process_exists(self.driver_pid):
            os._exit(1)
        with sigterm_exits():
            return super()._launch_run_for_rank(rank, ranks_q, completed, completed_lock)


class ReportedRayExecutor(_Reported, RayPipelineExecutor):
    """datatrove's Ray executor with a console report."""


def concurrent_tasks(cfg: ExecutorConfig, tasks: int) -> int:
    """How many of a stage's ``tasks`` run at once on one machine: the local executor's workers
    (all tasks with ``workers: -1``); on Ray, its workers (tasks placed on one machine at worst); on
    Slurm one, since each task is its own allocation. Tasks divide the cores by this number."""
    if cfg.kind == "slurm":
        return 1
    return tasks if cfg.workers == -1 else min(cfg.workers, tasks)


def make_executor(
    cfg: ExecutorConfig,
    pipeline: list[PipelineStep],
    *,
    tasks: int,
    logging_dir: Path,
    job_name: str,
    depends: PipelineExecutor | None = None,
    report: StageReport | None = None,
    start_method: str = "forkserver",
) -> PipelineExecutor:
    """One datatrove executor for one stage, run after ``depends``. Completed tasks are recorded in
    ``logging_dir`` and skipped when the stage runs again. ``start_method``: how the local
    executor's pool starts its workers (see :func:`run_stages`)."""
    common: dict[str, Any] = {
        "pipeline": pipeline,
        "tasks": tasks,
        "logging_dir": str(logging_dir),
        "depends": depends,
    }
    if cfg.kind == "slurm":
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
    executor: ReportedLocalExecutor | ReportedRayExecutor
    if cfg.kind == "local":
        executor = ReportedLocalExecutor(
            workers=concurrent_tasks(cfg, tasks), start_method=start_method, **common
        )
    else:
        executor = ReportedRayExecutor(workers=tasks if cfg.workers == -1 else cfg.workers, **common)
    executor.report = report
    return executor


def run_stages(
    cfg: ExecutorConfig,
    stages: list[Stage],
    work: Path,
    job: str,
    verbose: bool = False,
    start_method: str = "forkserver",
    in_driver: Collection[str] = (),
) -> bool:
    """Run a job's stages in order; True when they ran here, False when submitted to Slurm.

    The stages' executors are chained with ``depends=`` and the last one is run. Locally (and on
    Ray) each stage prints a line when it starts and one per finished task, and datatrove's logs go
    to ``work/logs/console.log`` (to the console instead with ``verbose``); a failure names the stage
    and shows the end of that log, except for user errors (:class:`LongctxError`, a full or read-only
    disk among them), which say what is wrong themselves. On Slurm the chain is submitted at once as
    dependent job arrays. Locally, the worker processes keep their temporary files in ``work/tmp``
    and import the job's modules once (:mod:`longctx.core.workers`). ``start_method`` is how pools
    start them: ``"forkserver"`` (datatrove's default: workers forked from a server that preloads
    the job's modules, ~2 s of CPU and of wall time before the first task) or ``"fork"`` (forked from
    this process, which has them imported already: nothing to start). ``"fork"`` is only for a
    driver that has not run a library's thread pool its workers will use, such as the tokenizer's
    (whose workers would find it unusable after the fork, and run single-threaded).

    The stages named in ``in_driver`` run their tasks one after another in this process when run
    locally (as datatrove runs a one-worker stage): stages whose work is smaller than what a pool's
    workers cost to start. Locally, a job with a pooled stage after such stages starts its
    forkserver at once, so that it imports the job's modules while this process runs them.
    """
    console_log = work / "logs" / "console.log"
    last: PipelineExecutor | None = None
    pooled = False
    for number, (name, pipeline, tasks) in enumerate(stages, start=1):
        logging_dir = work / "logs" / f"{number}_{name}"
        report = StageReport(job, name, number, len(stages), tasks, logging_dir, console_log, verbose)
        here = cfg.kind == "local" and name in in_driver
        completions = logging_dir / "completions"
        done = sum(1 for _ in completions.iterdir()) if completions.is_dir() else 0
        pooled = pooled or (not here and concurrent_tasks(cfg, tasks) > 1 and done < tasks)
        last = make_executor(
            cfg.model_copy(update={"workers": 1}) if here else cfg,
            pipeline,
            tasks=tasks,
            logging_dir=logging_dir,
            job_name=f"{job}_{name}",
            depends=last,
            report=report,
            start_method=start_method,
        )
    if last is not None:
        pipelines = [pipeline for _, pipeline, _ in stages]
        if cfg.kind != "local":
            last.run()
            return cfg.kind != "slurm"
        with job_processes(pipelines, work):
            if pooled:  # before any pool: a tracker that dies with this process
                start_resource_tracker()
            if pooled and start_method == "forkserver":
                # it imports the job's modules (~2 s of CPU) on another core while this process runs
                # the stages before the first pool; its workers' stderr is the console log
                with contextlib.nullcontext() if verbose else stderr_to_file(console_log):
                    start_forkserver()
            last.run()
    return cfg.kind != "slurm"
