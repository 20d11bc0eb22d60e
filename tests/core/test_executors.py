"""The same stages are handed to datatrove's local, Slurm or Ray executor as the config says."""

from __future__ import annotations

from pathlib import Path

import pytest
from datatrove.executor import LocalPipelineExecutor, SlurmPipelineExecutor
from datatrove.pipeline.base import PipelineStep

from longctx.config import parse_config
from longctx.core.config import ExecutorConfig
from longctx.core.executors import make_executor, run_stages
from longctx.core.layout import RunLayout
from longctx.pipeline.bpe import train_bpe
from longctx.pipeline.curate import build_stages, resolve_sources

SLURM = {"kind": "slurm", "tasks": 3, "slurm": {"partition": "cpu", "time": "01:00:00", "cpus_per_task": 4}}


def _config(tmp_path: Path, executor: dict):
    (tmp_path / "in" / "books").mkdir(parents=True)
    (tmp_path / "in" / "books" / "a.txt").write_text("some words " * 50)
    tok = tmp_path / "tok.json"
    train_bpe(["some words"] * 10, 270, tok)
    return parse_config(
        {
            "output": str(tmp_path / "out"),
            "context": {"original": 8, "target": 16},
            "tokenizer": {"path": str(tok)},
            "curate": {"input": str(tmp_path / "in"), "executor": executor},
        }
    )


def test_local_executor_caps_workers_at_tasks(tmp_path: Path) -> None:
    cfg = _config(tmp_path, {"tasks": 2, "workers": 8})
    ex = make_executor(cfg.curate.executor, [], tasks=2, logging_dir=tmp_path / "logs", job_name="x")
    assert isinstance(ex, LocalPipelineExecutor) and ex.workers == 2 and ex.tasks == 2


def test_slurm_stages_are_chained_and_submitted_once(tmp_path: Path, monkeypatch) -> None:
    cfg = _config(tmp_path, SLURM)
    layout = RunLayout(cfg.output, "curate")
    sources = resolve_sources(cfg.curate, layout)
    stages = build_stages(cfg.curate, layout, sources, cfg.tokenizer.path, {}, target=cfg.context.target)
    submitted: list[SlurmPipelineExecutor] = []
    monkeypatch.setattr(SlurmPipelineExecutor, "run", lambda self: submitted.append(self))  # no sbatch
    assert run_stages(cfg.curate.executor, stages, layout.work, "curate") is False
    assert len(submitted) == 1
    chain, ex = [], submitted[0]
    while ex is not None:
        chain.append(ex)
        ex = ex.depends
    chain.reverse()
    assert [e.job_name for e in chain] == [f"curate_{name}" for name, _, _ in stages]
    assert [e.tasks for e in chain] == [3, 3, 1, 3, 1]  # the bucket stage's 14 buckets in 3 tasks
    assert all(e.partition == "cpu" and e.cpus_per_task == 4 for e in chain)


class _Record(PipelineStep):
    """Appends ``<stage> <rank> <start>`` and ``... <end>`` lines to a shared file; fails when told."""

    def __init__(self, log: Path, stage: str, fail: bool = False) -> None:
        super().__init__()
        self.log, self.stage, self.fail = log, stage, fail

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        with open(self.log, "a") as f:
            f.write(f"{self.stage} {rank} start\n")
        if self.fail:
            raise RuntimeError(f"stage {self.stage} broke")
        with open(self.log, "a") as f:
            f.write(f"{self.stage} {rank} end\n")
        yield from data or ()


def test_local_stages_chain_in_order_and_resume(tmp_path: Path, capsys) -> None:
    log = tmp_path / "order.log"
    local = ExecutorConfig(tasks=2, workers=2)

    def stages(fail: bool) -> list:
        return [
            ("a", [_Record(log, "a")], 2),
            ("b", [_Record(log, "b", fail)], 2),
            ("c", [_Record(log, "c")], 1),
        ]

    with pytest.raises(RuntimeError, match="stage b broke"):
        run_stages(local, stages(fail=True), tmp_path / "work", "job")
    out = capsys.readouterr()
    assert "[job 1/3] a: 2 tasks" in out.out and "[job 2/3] b: 2 tasks" in out.out
    assert "[job 3/3] c" not in out.out  # never started after its dependency failed
    assert "job stage 'b' failed; last lines of" in out.err and "stage b broke" in out.err
    lines = log.read_text().splitlines()
    assert sorted(lines[:4]) == ["a 0 end", "a 0 start", "a 1 end", "a 1 start"]  # a finished before b began
    assert {line.split()[0] for line in lines[4:]} == {"b"}

    log.unlink()
    assert run_stages(local, stages(fail=False), tmp_path / "work", "job") is True
    out = capsys.readouterr().out
    assert "[job 1/3] a: 2 tasks, 2 done in an earlier run" in out
    assert "a" not in {line.split()[0] for line in log.read_text().splitlines()}  # not redone
    assert log.read_text().splitlines()[-2:] == ["c 0 start", "c 0 end"]


class _Parent(PipelineStep):
    """Writes the parent pid of the process that runs each task."""

    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.folder = folder

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        import os

        (self.folder / f"{rank}.ppid").write_text(str(os.getppid()))
        yield from data or ()


@pytest.mark.parametrize("start_method", ["fork", "forkserver"])
def test_pool_workers_start_as_asked(tmp_path: Path, start_method: str) -> None:
    """With ``fork`` the pool's workers are children of this process; with ``forkserver`` children
    of the server (datatrove's default); the stage runs either way."""
    import os

    assert run_stages(
        ExecutorConfig(tasks=2, workers=2),
        [("s", [_Parent(tmp_path)], 2)],
        tmp_path / "w",
        "job",
        start_method=start_method,
    )
    parents = {int((tmp_path / f"{rank}.ppid").read_text()) for rank in range(2)}
    assert (parents == {os.getpid()}) == (start_method == "fork")


@pytest.mark.timeout(120)
def test_forked_workers_end_whatever_sigterm_handler_the_driver_has(tmp_path: Path) -> None:
    """The pool terminates its idle workers with SIGTERM when the stage ends. A handler the driver
    holds (``ray.init()`` installs one) must not be inherited by them: one that returns would keep a
    worker alive and the driver waiting forever (it held CI until its limit)."""
    import signal

    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        for attempt in range(3):  # an idle worker at the end is likely, not certain
            assert run_stages(
                ExecutorConfig(tasks=2, workers=2),
                [("s", [_Parent(tmp_path)], 2)],
                tmp_path / f"w{attempt}",
                "job",
                start_method="fork",
            )
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_a_fork_waits_for_the_progress_line_being_printed() -> None:
    """os.fork() takes the progress printer's lock, so a child never starts with it (and with
    sys.stdout's lock) held by a thread it does not have."""
    import os
    import threading
    import time

    from longctx.core import progress

    held = threading.Event()

    def printer() -> None:
        with progress._print_lock:
            held.set()
            time.sleep(0.3)

    thread = threading.Thread(target=printer)
    thread.start()
    held.wait()
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child: the lock is free here
        os._exit(0 if progress._print_lock.acquire(blocking=False) else 1)
    waited = time.monotonic() - start
    thread.join()
    assert os.waitpid(pid, 0)[1] == 0
    assert waited >= 0.2


class _Where(PipelineStep):
    """Records the pid of the process that runs each task, and writes a line to stderr."""

    def __init__(self, folder: Path, stage: str) -> None:
        super().__init__()
        self.folder, self.stage = folder, stage

    def run(self, data=None, rank: int = 0, world_size: int = 1):
        import os
        import sys

        (self.folder / f"{self.stage}.{rank}.pid").write_text(str(os.getpid()))
        print(f"task {self.stage} {rank} says this on stderr", file=sys.stderr, flush=True)
        yield from data or ()


def test_driver_stages_run_here_and_pooled_tasks_log_to_the_console_log(
    tmp_path: Path, capfd, monkeypatch
) -> None:
    """Stages named in ``in_driver`` run their tasks in this process, the others in pool workers
    (from the forkserver started before the first stage, whose workers' stderr is the console log,
    not the terminal); completions are recorded either way, and a finished job starts no forkserver
    when run again."""
    import os

    from longctx.core import executors

    stages = [(name, [_Where(tmp_path, name)], 2) for name in ("small", "big", "tail")]
    cfg = ExecutorConfig(tasks=2, workers=2)
    assert run_stages(cfg, stages, tmp_path / "w", "job", in_driver={"small", "tail"})
    pids = {
        name: {int((tmp_path / f"{name}.{rank}.pid").read_text()) for rank in range(2)}
        for name in ("small", "big", "tail")
    }
    assert pids["small"] == pids["tail"] == {os.getpid()}
    assert os.getpid() not in pids["big"]
    captured = capfd.readouterr()
    assert "task big" not in captured.err and "task big" not in captured.out
    log = (tmp_path / "w" / "logs" / "console.log").read_text()
    assert "task big 0 says this on stderr" in log and "task big 1 says this on stderr" in log

    started: list[bool] = []
    monkeypatch.setattr(executors, "start_forkserver", lambda: started.append(True))
    assert run_stages(cfg, stages, tmp_path / "w", "job", in_driver={"small", "tail"})
    assert "[job 1/3] small: 2 tasks, 2 done in an earlier run" in capfd.readouterr().out
    assert started == []


def test_workers_start_with_the_check_datatrove_repeats_per_process(monkeypatch) -> None:
    """Once the executors are imported, building a Parquet step reads no distribution's metadata
    (datatrove's check that pyarrow is installed is answered)."""
    import importlib.metadata

    from datatrove.utils import _import_utils

    from longctx.core import executors
    from longctx.pipeline.docstore import StageDocumentWriter

    _import_utils._is_distribution_available.cache_clear()  # whatever earlier tests left there
    executors.warm_task_caches()
    calls = []
    monkeypatch.setattr(importlib.metadata, "distributions", lambda *a, **k: calls.append(a) or [])
    StageDocumentWriter("unused")
    assert calls == []
