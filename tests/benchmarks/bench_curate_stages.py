"""Where a curation's CPU goes, stage by stage: ``longctx curate`` with 2 tasks on 2 cores against
1 task on 1 core (the baseline, same input, same run), on the input ``bench_curate.py`` builds (books
and papers of the shared corpus, standard-library packages as code repositories).

A stage's CPU is that of every process of the command (the driver, the executor's manager, the
forkserver and its pool workers, live or already reaped), read from ``/proc`` when the console
shows the next stage start; so process start-up (imports, forks) counts in the stage that pays it.
The two-task run's extra CPU over the one-task run is what keeps two tasks from running twice as
fast. Medians [min-max] of ``--reps`` interleaved repetitions.

    .venv/bin/python tests/benchmarks/bench_curate_stages.py [--reps 3] [--corpus DIR] [--copies 4]
        [--input corpus|mixed]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from bench_curate import build_input, curate_config, reader_texts, train_tokenizer
from benchtools import CORPUS, become_subreaper, fmt, reap_descendants, require_corpus

STAGE_LINE = re.compile(r"^\[curate (\d+)/(\d+)\] (\w+):")
_TICKS = os.sysconf("SC_CLK_TCK")


def tree_cpu(root: int) -> float:
    """CPU seconds of every live process descending from ``root`` (itself excluded), with the
    children each has already reaped."""
    procs: dict[int, tuple[int, float]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        procs[int(entry)] = (int(fields[1]), sum(int(x) for x in fields[11:15]) / _TICKS)
    total = 0.0
    for _pid, (parent, cpu) in procs.items():
        while parent in procs and parent != root:
            parent = procs[parent][0]
        if parent == root:
            total += cpu
    return total


def reaped_cpu() -> float:
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_curate(config: Path, cores: set[int]) -> dict[str, tuple[float, float]]:
    """Wall and CPU seconds of each stage of one ``longctx curate`` run (``startup`` before the
    first stage), every process of the command counted (orphans are adopted: we are a subreaper)."""
    me = os.getpid()
    start, start_cpu = time.perf_counter(), reaped_cpu()
    proc = subprocess.Popen(
        [sys.executable, "-m", "longctx.cli", "curate", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: os.sched_setaffinity(0, cores),
    )
    stages: dict[str, tuple[float, float]] = {}
    name, last_wall, last_cpu = "startup", 0.0, 0.0
    assert proc.stdout is not None
    for line in proc.stdout:
        match = STAGE_LINE.match(line)
        if not match:
            continue
        reap_descendants()
        wall, cpu = time.perf_counter() - start, reaped_cpu() - start_cpu + tree_cpu(me)
        stages[name] = (wall - last_wall, cpu - last_cpu)
        name, last_wall, last_cpu = match.group(3), wall, cpu
    if proc.wait() != 0:
        sys.exit(f"bench: curate {config} failed")
    while True:
        try:
            os.wait()
        except ChildProcessError:
            break
    wall, cpu = time.perf_counter() - start, reaped_cpu() - start_cpu
    stages[name] = (wall - last_wall, cpu - last_cpu)
    stages["total"] = (wall, cpu)
    return stages


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument(
        "--copies",
        type=int,
        default=1,
        help="books and papers this many times, as bench_curate.py --copies builds them",
    )
    parser.add_argument("--input", choices=("corpus", "mixed"), default="corpus", help="as bench_curate.py's")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    require_corpus(args.corpus, "bench_curate_stages")
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        print("bench_curate_stages: needs at least 2 cores", file=sys.stderr)
        return 2
    become_subreaper("bench_curate_stages")
    work = Path(tempfile.mkdtemp(prefix="bench_stages_"))
    try:
        input_dir = build_input(args.corpus, work / "input", args.copies, args.input)
        tokenizer = train_tokenizer(reader_texts(input_dir, work), work / "tokenizer.json", 8192)
        runs: dict[int, list[dict[str, tuple[float, float]]]] = {1: [], 2: []}
        for rep in range(args.reps):
            for tasks, given in ((2, set(cores[:2])), (1, {cores[0]})):
                output = work / f"out{tasks}"
                shutil.rmtree(output, ignore_errors=True)
                config = work / f"curate{tasks}.yaml"
                config.write_text(yaml.safe_dump(curate_config(input_dir, output, tokenizer, tasks)))
                runs[tasks].append(run_curate(config, given))
            print(f"  repetition {rep + 1}/{args.reps} done", flush=True)
        with open("/proc/loadavg") as f:
            load = " ".join(f.read().split()[:3])
        print(f"\nseconds per stage, median [min-max] of {args.reps}; load average {load}")
        print(
            f"{'stage':14s}{'1 task CPU':>24s}{'2 tasks CPU':>24s}{'extra CPU':>11s}"
            f"{'1 task wall':>24s}{'2 tasks wall':>24s}"
        )
        for stage in runs[2][0]:
            one = [r[stage] for r in runs[1] if stage in r]
            two = [r[stage] for r in runs[2] if stage in r]
            if not one or not two:
                continue
            c1, c2 = [c for _, c in one], [c for _, c in two]
            w1, w2 = [w for w, _ in one], [w for w, _ in two]
            print(
                f"{stage:14s}{fmt(c1):>24s}{fmt(c2):>24s}"
                f"{statistics.median(c2) - statistics.median(c1):11.2f}{fmt(w1):>24s}{fmt(w2):>24s}"
            )
        total1 = statistics.median(r["total"][1] for r in runs[1])
        total2 = statistics.median(r["total"][1] for r in runs[2])
        wall1 = statistics.median(r["total"][0] for r in runs[1])
        wall2 = statistics.median(r["total"][0] for r in runs[2])
        print(f"\nCPU of 2 tasks / CPU of 1 task: {total2 / total1:.2f} (1.00 would let 2 cores give 2x)")
        print(f"scaling, wall of 1 task on 1 core / 2 tasks on 2 cores: {wall1 / wall2:.2f}x (goal 1.8)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
