"""datatrove executors from an ``executor`` config section (local here, Slurm or Ray on a cluster),
and the runner that chains a job's stages on them.

A job is a list of stages, each a datatrove pipeline with its number of tasks. Locally and on Ray, the
stages run one after another from this process, a stage once every task of the one before has
completed; on Slurm they are submitted at once, chained with datatrove's own ``depends=`` (each job
array waits for the one before). Completed tasks are recorded under
``work/logs/<n>_<stage>/completions`` and skipped when the job runs again, which is what makes a
killed job resumable. No process outlives the job: locally, every process the executor starts dies
with the command, even when it is killed (:mod:`longctx.core.lifetime`).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from datatrove.executor import LocalPipelineExecutor, RayPipelineExecutor, SlurmPipelineExecutor
from datatrove.executor.base import PipelineExecutor
from datatrove.pipeline.base import PipelineStep
from datatrove.utils._import_utils import check_required_dependencies
from datatrove.utils.logging import logger

from longctx.core.config import ExecutorConfig
from longctx.core.errors import LongctxError
from longctx.core.jobstate import (
    SlurmJob,
    completed_tasks,
    job_state,
    record_slurm_jobs,
    record_stages,
    stage_folder,
)
from longctx.core.lifetime import (
    children_die_with_this_process,
    die_with_parent,
    process_exists,
    sigterm_exits,
)
from longctx.core.preflight import disk_fault
from longctx.core.progress import stderr_to_file, tail, task_progress
from longctx.core.text import plural
from longctx.core.workers import job_processes, semaphore_prefix, start_forkserver, start_resource_tracker

Stage = tuple[str, list[PipelineStep], int]
"""A stage of a job: its name, its pipeline and its number of tasks."""


def warm_task_caches() -> None:
    """Fill, once per process, a cache that datatrove's tasks would otherwise fill in every worker.
    Called when this module is imported: the job's forkserver imports it, so the workers it forks
    start with it filled.

    datatrove checks that pyarrow is installed whenever a Parquet step is built or unpickled (every
    worker unpickles its stage's steps), by parsing the metadata of every installed distribution
    (~35 ms per process; its answer is cached per process).
    """
    check_required_dependencies("Parquet steps", ["pyarrow"])


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
        done = completed_tasks(self.logging_dir)
        print(
            f"{label}: {plural(self.tasks, 'task')}" + (f", {done} done in an earlier run" if done else ""),
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
    """Mixin for executors whose stages :func:`run_stages` runs one after another from here: each
    runs inside its :class:`StageReport`."""

    report: StageReport | None = None

    def run(self) -> Any:
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


def run_ray_task(executor: PipelineExecutor, rank: int) -> None:
    """One task of a stage, as a Ray task: datatrove's own task runner (logs, stats, completion mark,
    all in the stage's logging folder), quiet on the worker's console (``local_rank`` 1)."""
    PipelineExecutor._run_for_rank(executor, rank, local_rank=1)


class RayTaskExecutor(RayPipelineExecutor):
    """datatrove's Ray executor, its tasks run as Ray *tasks* rather than one new actor each.

    datatrove starts an actor (a fresh Python process that imports the job's modules: 1-3 s of CPU
    here) inside a placement group for every task, and runs the task in a process pool inside it.
    A Ray task runs in one of the cluster's worker processes, which Ray keeps and reuses for the job's
    next tasks (of this stage and the following ones), as the local executor's pool workers are
    reused. Tasks write their logs straight into the stage's logging folder (datatrove's Ray executor
    writes them to each node's temporary folder first, and leaves them there). A task whose worker or
    node dies is run again by Ray, up to ``retries`` times; a task that fails stops the stage once the
    tasks already running have ended, with one line naming the task and its log (the task's own
    :class:`~longctx.core.errors.LongctxError` as it is).
    """

    def __init__(self, *args: Any, job_name: str, retries: int = 3, **kwargs: Any) -> None:
        with quiet_datatrove("datatrove.executor.ray"):
            super().__init__(*args, **kwargs)
        self.job_name, self.retries = job_name, retries

    def run(self) -> None:
        import ray

        todo = self.get_incomplete_ranks()
        if not todo:
            return
        self.save_executor_as_json()
        options: dict[str, Any] = {
            "name": self.job_name,  # the worker's process title while it runs the task: ray::<name>
            "num_cpus": self.cpus_per_task,
            "max_retries": self.retries,
            "retry_exceptions": False,
        }
        if self.mem_per_cpu_gb:
            options["memory"] = int(self.mem_per_cpu_gb * self.cpus_per_task * (1 << 30))
        task = ray.remote(run_ray_task).options(**options)
        executor = ray.put(self)
        running: dict[Any, int] = {}
        failure: tuple[int, BaseException] | None = None
        while running or (todo and failure is None):
            while todo and failure is None and len(running) < self.workers:
                rank = todo.pop(0)
                running[task.remote(executor, rank)] = rank
            finished, _ = ray.wait(list(running), num_returns=1)
            for ref in finished:
                rank = running.pop(ref)
                try:
                    ray.get(ref)
                except Exception as err:  # the first failure is reported; the others are in their logs
                    failure = failure or (rank, err)
        if failure is not None:
            raise self._task_failure(*failure)

    def _task_failure(self, rank: int, err: BaseException) -> BaseException:
        """What the driver raises for task ``rank``'s failure ``err``."""
        from ray.exceptions import RayTaskError

        cause = err.cause if isinstance(err, RayTaskError) else err
        if isinstance(cause, LongctxError):
            return cause
        if isinstance(err, RayTaskError):
            message = str(cause).strip()
            what = f"{type(cause).__name__}: {message.splitlines()[0] if message else ''}"
        else:  # the worker or its node died (after the retries), or Ray lost the task
            what = f"{type(err).__name__} (its worker process or node died, {self.retries} retries)"
        log = self.logging_dir.resolve_paths(f"logs/task_{rank:05d}.log")
        return StageFailed(
            f"{self.job_name}: task {rank} failed on Ray: {what}; its log: {log}; run again to resume"
        )


class StageFailed(LongctxError):
    """A task of a stage failed on a cluster; the message names the task and its log."""


class ReportedRayExecutor(_Reported, RayTaskExecutor):
    """:class:`RayTaskExecutor` with a console report."""


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
            # a job whose dependency failed is removed from the queue rather than kept waiting for ever
            # (with those after it): running the command again then submits what is unfinished
            sbatch_args={"kill-on-invalid-dep": "yes", **cfg.slurm.sbatch_args},
            env_command=cfg.slurm.env_command or slurm_env_command(),
            **common,
        )
    executor: ReportedLocalExecutor | ReportedRayExecutor
    if cfg.kind == "local":
        executor = ReportedLocalExecutor(
            workers=concurrent_tasks(cfg, tasks), start_method=start_method, **common
        )
    else:
        executor = ReportedRayExecutor(
            workers=tasks if cfg.workers == -1 else cfg.workers,
            cpus_per_task=cfg.ray.cpus_per_task,
            mem_per_cpu_gb=cfg.ray.mem_per_cpu_gb or 0,
            job_name=job_name,
            retries=cfg.ray.retries,
            **common,
        )
    executor.report = report
    return executor


def slurm_env_command() -> str:
    """The shell line a Slurm job runs first: the folder of the Python that submits it on the PATH, so
    that the job runs datatrove's ``launch_pickled_pipeline`` (and longctx) of the same environment."""
    return f"export PATH={shlex.quote(str(Path(sys.executable).parent))}:$PATH"


def run_stages(
    cfg: ExecutorConfig,
    stages: list[Stage],
    work: Path,
    job: str,
    verbose: bool = False,
    start_method: str = "forkserver",
    in_driver: Collection[str] = (),
    fork_server: bool = False,
) -> bool:
    """Run a job's stages in order; True once they have all run, False when they were submitted to
    Slurm (or are still in its queue from an earlier submission: :func:`submit_stages`).

    Locally and on Ray the stages run one after another from this process, each printing a line when
    it starts and one per finished task; locally, datatrove's logs go to ``work/logs/console.log`` (to
    the console instead with ``verbose``), on Ray to each task's log in its stage's folder. A failure
    names the stage and shows the end of that log, except for user errors (:class:`LongctxError`, a
    full or read-only disk among them), which say what is wrong themselves. On Slurm the stages are
    submitted at once as dependent job arrays. The stages and their task counts are recorded in the
    work folder for ``--status`` (:mod:`longctx.core.jobstate`). Locally, the worker processes keep
    their temporary files in ``work/tmp`` and import the job's modules once
    (:mod:`longctx.core.workers`). ``start_method`` is how pools start them: ``"forkserver"``
    (datatrove's default: workers forked from a server that preloads the job's modules, ~2 s of CPU
    and of wall time before the first task) or ``"fork"`` (forked from this process, which has them
    imported already: nothing to start). ``"fork"`` is only for a driver that has not run a library's
    thread pool its workers will use, such as the tokenizer's (whose workers would find it unusable
    after the fork, and run single-threaded). ``fork_server``, for a driver of which the same holds,
    forks the forkserver from this process, which has the job's modules imported already, so that the
    first pool starts in ~0.2 s rather than after ~1 s of imports
    (:func:`~longctx.core.workers.start_forkserver`).

    The stages named in ``in_driver`` run their tasks one after another in this process when run
    locally (as datatrove runs a one-worker stage): stages whose work is smaller than what a pool's
    workers cost to start. Locally, a job with a pooled stage after such stages starts its
    forkserver at once, so that it imports the job's modules while this process runs them.
    """
    record_stages(work, [(name, tasks) for name, _, tasks in stages])
    if cfg.kind == "slurm":
        return submit_stages(cfg, stages, work, job)
    console_log = work / "logs" / "console.log"
    executors: list[PipelineExecutor] = []
    pooled = False
    for number, (name, pipeline, tasks) in enumerate(stages, start=1):
        logging_dir = stage_folder(work, number, name)
        report = StageReport(job, name, number, len(stages), tasks, logging_dir, console_log, verbose)
        here = cfg.kind == "local" and name in in_driver
        done = completed_tasks(logging_dir)
        pooled = pooled or (
            cfg.kind == "local" and not here and concurrent_tasks(cfg, tasks) > 1 and done < tasks
        )
        executors.append(
            make_executor(
                cfg.model_copy(update={"workers": 1}) if here else cfg,
                pipeline,
                tasks=tasks,
                logging_dir=logging_dir,
                job_name=f"{job}_{name}",
                report=report,
                start_method=start_method,
            )
        )
    with job_processes([pipeline for _, pipeline, _ in stages], work):
        if pooled:  # before any pool: a tracker that unlinks the job's semaphores when the job is gone
            start_resource_tracker(semaphore_prefix(work))
        if pooled and start_method == "forkserver":
            # started from a fresh interpreter, it imports the job's modules (~1 s of CPU) on another
            # core while this process runs the stages before the first pool; its workers' stderr is
            # the console log
            with contextlib.nullcontext() if verbose else stderr_to_file(console_log):
                start_forkserver(fork=fork_server)
        for executor in executors:
            executor.run()
    return True


def submit_stages(cfg: ExecutorConfig, stages: list[Stage], work: Path, job: str) -> bool:
    """Submit a job's stages to Slurm, each a job array depending on the one before (datatrove's
    ``depends``), for the tasks not done yet; True when there is nothing left to do. Prints the job ids
    and how to follow them, and records them in the work folder (:mod:`longctx.core.jobstate`). While
    Slurm still holds jobs of an earlier submission, submits nothing and prints where they stand."""
    state = job_state(work)
    if state.complete:
        return True
    if state.queued:
        print(f"{job}: Slurm still holds job(s) {', '.join(state.queued)} of this run; nothing submitted")
        print("\n".join(state.lines()), flush=True)
        return False
    executors: list[SlurmPipelineExecutor] = []
    for number, (name, pipeline, tasks) in enumerate(stages, start=1):
        executor = make_executor(
            cfg,
            pipeline,
            tasks=tasks,
            logging_dir=stage_folder(work, number, name),
            job_name=f"{job}_{name}",
            depends=executors[-1] if executors else None,
        )
        assert isinstance(executor, SlurmPipelineExecutor)
        executors.append(executor)
    with quiet_datatrove("datatrove.executor.slurm"):
        executors[-1].run()
    submitted = [
        SlurmJob(number, name, tasks, str(ex.job_id), str(ex.slurm_logs_folder))
        for number, ((name, _, tasks), ex) in enumerate(zip(stages, executors), start=1)
        if ex.job_id not in (None, -1)
    ]
    record_slurm_jobs(work, submitted)
    if not submitted:
        return job_state(work, ask_slurm=False).complete
    stages_line = plural(len(submitted), "stage")
    print(f"{job}: submitted to Slurm, {stages_line} as job arrays, each after the one before:")
    width = max(len(j.name) for j in submitted)
    for j in submitted:
        print(f"  {j.number}/{len(stages)} {j.name:<{width}}  job {j.job_id} ({plural(j.tasks, 'task')})")
    print(
        f"follow them with: squeue -j {','.join(j.job_id for j in submitted)}\n"
        f"their logs: {work / 'logs'}/<n>_<stage>/slurm_logs/<job>_<task>.out (Slurm's) and "
        f"{work / 'logs'}/<n>_<stage>/logs/task_<task>.log (datatrove's)",
        flush=True,
    )
    return False


@contextlib.contextmanager
def quiet_datatrove(module: str) -> Iterator[None]:
    """datatrove's log lines of ``module`` (an executor's, repeated for every stage: that the logging
    folder must be shared by the nodes, which docs/clusters.md says once) are not shown meanwhile."""
    logger.disable(module)
    try:
        yield
    finally:
        logger.enable(module)
