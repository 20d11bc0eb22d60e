"""Curation and packing on a Ray cluster against the local executor, on the same input and cores.

One local Ray cluster (``ray start --head`` with as many CPUs as the cores given, as the tests start
it: ``tests/cluster/raycluster.py``) serves every repetition. Each repetition runs, in a fresh output
folder, ``longctx curate`` then ``longctx pack`` (windows of 4096, reusing the ids curation stored),
once with ``curate.executor.kind: local`` and once with ``kind: ray``, both with 2 tasks and the same
tokenizer (trained beforehand, not timed). Printed as median [min-max] over the repetitions:

* wall seconds of each command, and the ratio Ray / local of the medians;
* CPU seconds: for local, the command and every process it started; for Ray, the command plus what
  the cluster's processes (workers, raylet, GCS) spent meanwhile (sampled every 0.1 s);
* that both outputs hold the same bytes (documents, ledger, shards).

The input is the shared corpus's books and papers plus some standard-library packages as code
repositories (``bench_curate.build_input``); ``--books N`` keeps the first N books only.

    .venv/bin/python tests/benchmarks/bench_cluster.py [--reps 3] [--corpus DIR] [--books N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import yaml
from bench_curate import build_input, reader_texts, train_tokenizer
from benchtools import CORPUS, REPO, become_subreaper, cpu_seconds, fmt, require_corpus

sys.path.insert(0, str(REPO))
from tests.cluster.raycluster import RayCluster, local_ray_cluster

KINDS = ("local", "ray")
COMPARED = ("documents", "ledger.parquet", "shards")


def config(input_dir: Path, output: Path, tokenizer: Path, kind: str, address: str) -> dict:
    executor = {"kind": kind, "tasks": 2} | ({"ray": {"address": address}} if kind == "ray" else {})
    return {
        "output": str(output),
        "context": {"original": 1024, "target": 4096},
        "tokenizer": {"path": str(tokenizer)},
        "curate": {"input": str(input_dir), "executor": executor},
        "pack": {"seq_lens": [4096], "executor": executor},
    }


def process_cpu(pids: list[int]) -> dict[int, float]:
    """CPU seconds spent so far by each of ``pids`` still alive (with the children it reaped)."""
    ticks = os.sysconf("SC_CLK_TCK")
    found = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        found[pid] = sum(int(v) for v in fields[11:15]) / ticks  # utime, stime, cutime, cstime
    return found


class ClusterCpu:
    """CPU seconds the cluster's processes spend while a command runs, sampled every 0.1 s (Ray ends
    a job's workers when its driver disconnects: what they spent is kept from the last sample)."""

    def __init__(self, cluster: RayCluster) -> None:
        self.cluster = cluster
        self.start = process_cpu(cluster.processes())
        self.seen = dict(self.start)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        while not self.stop.wait(0.1):
            self.seen |= process_cpu(self.cluster.processes())

    def spent(self) -> float:
        self.stop.set()
        self.thread.join()
        self.seen |= process_cpu(self.cluster.processes())
        return sum(cpu - self.start.get(pid, 0.0) for pid, cpu in self.seen.items())


def run_command(args: list[str], cluster: RayCluster | None) -> tuple[float, float]:
    """Wall and CPU seconds of ``longctx *args`` (with the cluster's CPU meanwhile when given)."""
    meter = ClusterCpu(cluster) if cluster else None
    cpu0, start = cpu_seconds(), time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "longctx.cli", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=cluster.client_env() if cluster else None,  # the cluster's token
    )
    wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"bench_cluster: longctx {' '.join(args)} failed:\n{done.stderr[-3000:]}")
    return wall, cpu_seconds() - cpu0 + (meter.spent() if meter else 0.0)


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Every file under the compared parts of an output folder, by relative path."""
    found = {}
    for name in COMPARED:
        path = root / name
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        found |= {str(f.relative_to(root)): f.read_bytes() for f in files}
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--books", type=int, help="keep the first N books of the corpus only")
    args = parser.parse_args()
    require_corpus(args.corpus, "bench_cluster")
    become_subreaper("bench_cluster")
    cores = len(os.sched_getaffinity(0))
    with tempfile.TemporaryDirectory(prefix="bench_cluster-") as tmp:
        work = Path(tmp)
        input_dir = build_input(args.corpus, work / "input")
        if args.books is not None:
            for extra in sorted((input_dir / "books").iterdir())[args.books :]:
                extra.unlink()
        size = sum(f.stat().st_size for f in input_dir.rglob("*") if f.is_file()) / 1e6
        tokenizer = train_tokenizer(reader_texts(input_dir, work), work / "tokenizer.json", 8192)
        times = {(kind, job): ([], []) for kind in KINDS for job in ("curate", "pack")}
        started = time.perf_counter()
        with local_ray_cluster(num_cpus=cores) as cluster:
            print(f"Ray cluster of {cores} CPUs started in {time.perf_counter() - started:.1f} s", flush=True)
            outputs: dict[str, dict[str, bytes]] = {}
            for rep in range(args.reps):
                for kind in KINDS:
                    output = work / f"{kind}{rep}"
                    path = work / f"{kind}{rep}.yaml"
                    path.write_text(
                        yaml.safe_dump(config(input_dir, output, tokenizer, kind, cluster.address))
                    )
                    for job in ("curate", "pack"):
                        wall, cpu = run_command(
                            [job, "--config", str(path)], cluster if kind == "ray" else None
                        )
                        times[kind, job][0].append(wall)
                        times[kind, job][1].append(cpu)
                        print(
                            f"  rep {rep} {kind:5s} {job:6s} {wall:6.1f} s wall, {cpu:6.1f} s CPU", flush=True
                        )
                    outputs[kind] = tree_bytes(output)
                    shutil.rmtree(output)
            same = outputs["ray"] == outputs["local"]
    print(
        f"\n{size:.1f} MB input ({args.corpus}, {'all' if args.books is None else args.books} books, "
        f"code from the standard library), 2 tasks, {cores} cores, {args.reps} repetitions"
    )
    print(f"{'':16s}{'wall s':>24s}{'CPU s':>24s}")
    for job in ("curate", "pack"):
        for kind in KINDS:
            wall, cpu = times[kind, job]
            print(f"{job + ' ' + kind:16s}{fmt(wall):>24s}{fmt(cpu):>24s}")
        ratio = statistics.median(times["ray", job][0]) / statistics.median(times["local", job][0])
        print(f"{job + ' Ray/local':16s}{ratio:>13.2f}x (medians of wall time)")
    both = {k: [c + p for c, p in zip(times[k, "curate"][0], times[k, "pack"][0])] for k in KINDS}
    ratio = statistics.median(both["ray"]) / statistics.median(both["local"])
    print(f"curate + pack: local {fmt(both['local'])} s, Ray {fmt(both['ray'])} s, Ray/local {ratio:.2f}x")
    print(f"outputs (documents, ledger, shards) byte-identical: {same}")
    if not same:
        sys.exit(1)


if __name__ == "__main__":
    main()
