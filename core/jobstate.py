"""Where a job's stages stand: which tasks are done, and which Slurm jobs still run them.

A job records its stages (name and task count) in ``<work>/stages.json`` when it starts, and on Slurm
the jobs it submitted in ``<work>/slurm.json``. Completed tasks are datatrove's completion marks
(``<work>/logs/<n>_<stage>/completions/<rank>``). From these, :func:`job_state` says, without running
anything, how far the job is, and for a Slurm job which of its jobs the queue still holds (``squeue``),
so that running the command again neither submits a second copy of a job still queued nor waits for
one: it says where things stand.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from longctx.core.atomic import write_json
from longctx.core.errors import EngineError

STAGES_FILE = "stages.json"
SLURM_FILE = "slurm.json"


def stage_folder(work: Path, number: int, name: str) -> Path:
    """The datatrove logging folder of stage ``number`` (from 1) of a job: logs, stats, completions."""
    return work / "logs" / f"{number}_{name}"


def completed_tasks(folder: Path) -> int:
    """Tasks of a stage marked as completed in its logging folder."""
    completions = folder / "completions"
    return sum(1 for _ in completions.iterdir()) if completions.is_dir() else 0


def record_stages(work: Path, stages: list[tuple[str, int]]) -> None:
    """Record a job's stages, as ``(name, tasks)`` in order, for :func:`job_state`."""
    write_json(work / STAGES_FILE, [{"name": name, "tasks": tasks} for name, tasks in stages])


@dataclass(frozen=True)
class SlurmJob:
    """One stage submitted to Slurm: its job array's id and where its tasks' Slurm logs go."""

    number: int
    name: str
    tasks: int
    job_id: str
    logs: str


def record_slurm_jobs(work: Path, jobs: list[SlurmJob]) -> None:
    write_json(work / SLURM_FILE, [job.__dict__ for job in jobs])


def slurm_jobs(work: Path) -> list[SlurmJob]:
    """The jobs last submitted for this work folder (none when it never went to Slurm)."""
    path = work / SLURM_FILE
    return [SlurmJob(**job) for job in json.loads(path.read_text())] if path.is_file() else []


def queued(job_ids: list[str]) -> dict[str, str]:
    """The state (``PENDING``, ``RUNNING``...) of each of ``job_ids`` (job arrays) that Slurm's queue
    still holds; those it no longer lists (finished, failed or cancelled) are left out."""
    if not job_ids:
        return {}
    if shutil.which("squeue") is None:
        raise EngineError("squeue is not on the PATH: cannot tell which submitted Slurm jobs still run")
    done = subprocess.run(
        ["squeue", "--noheader", "--array", "--format=%F|%T|%r"], capture_output=True, text=True, timeout=60
    )
    if done.returncode != 0:
        raise EngineError(f"squeue failed: {done.stderr.strip() or done.returncode}")
    states: dict[str, str] = {}
    for line in done.stdout.splitlines():
        array_id, state, reason = (line.split("|") + ["", ""])[:3]
        if array_id in job_ids and states.get(array_id) != "RUNNING":
            states[array_id] = state if reason in ("", "None") else f"{state} ({reason})"
    return states


@dataclass(frozen=True)
class StageState:
    number: int
    name: str
    tasks: int
    done: int
    job: SlurmJob | None
    queue: str | None  # the Slurm job's state while the queue holds it


@dataclass(frozen=True)
class JobState:
    """Where a job recorded in a work folder stands."""

    work: Path
    stages: list[StageState]

    @property
    def complete(self) -> bool:
        return bool(self.stages) and all(s.done >= s.tasks for s in self.stages)

    @property
    def queued(self) -> list[str]:
        """Ids of the job's Slurm jobs still in the queue."""
        return [s.job.job_id for s in self.stages if s.job is not None and s.queue is not None]

    def lines(self) -> list[str]:
        """One line per stage: tasks done, and its Slurm job with its state."""
        if not self.stages:
            return [f"{self.work}: no job has started here"]
        width = max(len(s.name) for s in self.stages)
        out = []
        for s in self.stages:
            line = f"  {s.number}/{len(self.stages)} {s.name:<{width}}  {s.done}/{s.tasks} tasks done"
            if s.job is not None:
                line += f"  Slurm job {s.job.job_id}: {s.queue or 'no longer queued'}"
            out.append(line)
        return out


def job_state(work: Path, *, ask_slurm: bool = True) -> JobState:
    """The state of the job recorded in ``work``: each stage's completed tasks, and with
    ``ask_slurm``, the queue state of the Slurm jobs it submitted."""
    path = work / STAGES_FILE
    recorded = json.loads(path.read_text()) if path.is_file() else []
    jobs = {job.number: job for job in slurm_jobs(work)}
    queue = queued([job.job_id for job in jobs.values()]) if ask_slurm and jobs else {}
    stages = []
    for number, stage in enumerate(recorded, start=1):
        job = jobs.get(number)
        stages.append(
            StageState(
                number,
                stage["name"],
                stage["tasks"],
                completed_tasks(stage_folder(work, number, stage["name"])),
                job,
                queue.get(job.job_id) if job else None,
            )
        )
    return JobState(work, stages)
