r"""``PackedLoader`` feeding one GPU: worker processes and pinned memory, checked and timed.

For 16K and 64K windows (random documents in the real shard format, written as
``bench_loader.py`` writes them), on a CUDA device:

1. **Exactness.** Every batch of ``PackedLoader(num_workers=W, pin_memory=True)`` for W = 0, 2, 4,
   copied to the GPU with ``non_blocking=True``, equals (once the GPU is synchronized) the reference:
   :func:`collate_packed` of the samples ``PackedDataset`` gives in-process, in the same order, for two
   passes (epochs 0 and 1); with workers, every tensor of every batch is in pinned memory. A loader
   stopped after a third of a pass and resumed from ``dataset.state_dict()`` in a fresh dataset and
   loader gives the rest of the reference exactly.
2. **Throughput.** Wall seconds and this process's CPU seconds per pass of the same rows onto the GPU,
   against the baseline doing the bare work: a plain memory-mapped read of each row's columns
   (``pa.memory_map``, zero-copy views) copied into pinned memory and then to the GPU; median and spread
   of ``--reps`` passes after one warm-up pass, ratios against the baseline in the same run. Each
   loader is made once and iterated for every pass (as a training run does over its epochs).

Exit status 0 when every exactness check passed, 1 otherwise, 2 without a CUDA device (unless
``--cpu-smoke``, which runs every path on the CPU, small, without pinned memory). On this workplace's
lent H200 (after ``make gpu-wheels``), ``run`` with ``carry=[".whl"]`` and::

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl && export PYTHONPATH=/tmp/site || exit; python3 tests/benchmarks/gpu_loader.py \
        --out $OUT/gpu_loader.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_loader import mapped_rows, write_folder

from longctx.packer.dataset import PackedDataset, collate_packed
from longctx.packer.loader import PackedLoader

BATCH = 2


def reference(folder: Path, epochs: int) -> list[dict[str, torch.Tensor]]:
    """The batches of ``epochs`` passes, collated from the in-process dataset's samples."""
    dataset = PackedDataset(folder, tokenizer=None, seed=1)
    batches: list[dict[str, torch.Tensor]] = []
    for _ in range(epochs):
        samples = list(dataset)
        batches += [collate_packed(samples[i : i + BATCH]) for i in range(0, len(samples), BATCH)]
    return batches


def to_device(batch: dict, device: torch.device) -> dict:
    """The batch's tensors copied to ``device`` (asynchronously from pinned memory); other values kept."""
    return {
        k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in batch.items()
    }


def first_difference(got: list[dict[str, torch.Tensor]], want: list[dict[str, torch.Tensor]]) -> str | None:
    """Where ``got`` (device batches) first differs from ``want`` (CPU batches); None when equal."""
    if len(got) != len(want):
        return f"{len(got)} batches, expected {len(want)}"
    for i, (a, b) in enumerate(zip(got, want)):
        if sorted(a) != sorted(b):
            return f"batch {i}: keys {sorted(a)}, expected {sorted(b)}"
        for key in b:
            if not isinstance(b[key], torch.Tensor):
                if a[key] != b[key]:
                    return f"batch {i}, {key}: {a[key]!r}, expected {b[key]!r}"
                continue
            x = a[key].cpu()
            if x.dtype != b[key].dtype or x.shape != b[key].shape or not torch.equal(x, b[key]):
                return (
                    f"batch {i}, {key}: {x.dtype} {tuple(x.shape)} differs from "
                    f"{b[key].dtype} {tuple(b[key].shape)}"
                )
    return None


def check_loader(folder: Path, workers: int, device: torch.device, pin: bool) -> dict:
    """Exactness (two passes, then a resumed pass) of one ``num_workers`` setting."""
    want = reference(folder, 2)
    dataset = PackedDataset(folder, tokenizer=None, seed=1)
    loader = PackedLoader(dataset, batch_size=BATCH, num_workers=workers, pin_memory=pin)
    got, unpinned = [], 0
    for _ in range(2):
        for batch in loader:
            unpinned += (
                sum(not t.is_pinned() for t in batch.values() if isinstance(t, torch.Tensor)) if pin else 0
            )
            got.append(to_device(batch, device))
    if device.type == "cuda":
        torch.cuda.synchronize()
    problem = first_difference(got, want)

    per_pass = len(want) // 2
    stop = max(1, per_pass // 3)
    first = PackedDataset(folder, tokenizer=None, seed=1)
    resumed = []
    for i, batch in enumerate(PackedLoader(first, batch_size=BATCH, num_workers=workers, pin_memory=pin)):
        resumed.append(to_device(batch, device))
        if i + 1 == stop:
            break
    state = first.state_dict()
    second = PackedDataset(folder, tokenizer=None, seed=1)
    second.load_state_dict(state)
    resumed += [
        to_device(b, device)
        for b in PackedLoader(second, batch_size=BATCH, num_workers=workers, pin_memory=pin)
    ]
    if device.type == "cuda":
        torch.cuda.synchronize()
    resume_problem = first_difference(resumed, want[:per_pass])
    ok = problem is None and resume_problem is None and unpinned == 0
    return {
        "workers": workers,
        "batches": len(got),
        "equal": problem is None,
        "difference": problem,
        "resumed_at_batch": stop,
        "resume_equal": resume_problem is None,
        "resume_difference": resume_problem,
        "unpinned_tensors": unpinned,
        "passed": ok,
    }


def plain_pass(folder: Path, device: torch.device, pin: bool) -> Callable[[], int]:
    """The baseline: each row's columns from the memory map into pinned memory, then to the device."""
    dataset = PackedDataset(folder, tokenizer=None, seed=1)
    order, starts = dataset.order(0), dataset.shards._starts
    files = [e.file for e in dataset.shards.manifest.shards]

    def run() -> int:
        tokens, held = 0, []
        for columns in mapped_rows(folder, order, starts, files):
            for column in columns:
                host = torch.empty(
                    column.shape, dtype=torch.from_numpy(np.empty(0, column.dtype)).dtype, pin_memory=pin
                )
                host.numpy()[...] = column
                held.append(host.to(device, non_blocking=True))
            tokens += len(columns[0])
        if device.type == "cuda":
            torch.cuda.synchronize()
        return tokens

    return run


def loader_pass(folder: Path, workers: int, device: torch.device, pin: bool) -> Callable[[], int]:
    """One pass of a ``PackedLoader`` made once (its dataset moves to the next epoch each pass)."""
    dataset = PackedDataset(folder, tokenizer=None, seed=1)
    loader = PackedLoader(dataset, batch_size=BATCH, num_workers=workers, pin_memory=pin)

    def run() -> int:
        tokens, held = 0, []
        for batch in loader:
            held.append(to_device(batch, device))
            tokens += batch["input_ids"].numel()
        if device.type == "cuda":
            torch.cuda.synchronize()
        return tokens

    return run


def time_cases(cases: dict[str, Callable[[], int]], reps: int) -> dict[str, dict]:
    """Per case: one untimed warm-up pass, then ``reps`` interleaved timed passes."""
    walls: dict[str, list[float]] = {name: [] for name in cases}
    cpus: dict[str, list[float]] = {name: [] for name in cases}
    tokens: dict[str, int] = {}
    for _name, run in cases.items():
        run()
    for _ in range(reps):
        for name, run in cases.items():
            cpu, wall = time.process_time(), time.perf_counter()
            tokens[name] = run()
            walls[name].append(time.perf_counter() - wall)
            cpus[name].append(time.process_time() - cpu)
    return {name: {"tokens": tokens[name], "wall_s": walls[name], "cpu_s": cpus[name]} for name in cases}


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.4f} [{min(values):.4f}-{max(values):.4f}]"


def passes(args: argparse.Namespace, device: torch.device, pin: bool) -> Iterator[dict]:
    """Exactness and throughput at each window length; one report entry each."""
    with tempfile.TemporaryDirectory(prefix="gpu_loader_") as tmp:
        for seq_len in args.seq_lens:
            rows = args.rows * max(1, 65536 // seq_len)
            folder = Path(tmp) / f"seq{seq_len}"
            folder.mkdir()
            write_folder(folder, seq_len, rows, rows_per_shard=max(4, rows // 2), seed=seq_len)
            checks = [check_loader(folder, w, device, pin) for w in args.workers]
            for c in checks:
                print(
                    f"seq_len {seq_len}, workers {c['workers']}: {c['batches']} batches "
                    f"{'equal' if c['equal'] else 'DIFFER: ' + str(c['difference'])}; resumed at batch "
                    f"{c['resumed_at_batch']}: "
                    f"{'equal' if c['resume_equal'] else 'DIFFER: ' + str(c['resume_difference'])}; "
                    f"unpinned tensors {c['unpinned_tensors']}",
                    flush=True,
                )
            cases = {"plain read -> pinned -> GPU (baseline)": plain_pass(folder, device, pin)}
            cases |= {
                f"PackedLoader workers {w} -> GPU": loader_pass(folder, w, device, pin) for w in args.workers
            }
            timed = time_cases(cases, args.reps)
            base = timed["plain read -> pinned -> GPU (baseline)"]
            print(
                f"seq_len {seq_len}: {rows} rows per pass; wall / CPU s per pass, "
                f"median [min-max] of {args.reps}"
            )
            for name, t in timed.items():
                t["wall_ratio"] = statistics.median(base["wall_s"]) / statistics.median(t["wall_s"])
                t["cpu_ratio"] = statistics.median(base["cpu_s"]) / statistics.median(t["cpu_s"])
                rate = t["tokens"] / statistics.median(t["wall_s"])
                print(
                    f"  {name:42s} wall {spread(t['wall_s'])}  CPU {spread(t['cpu_s'])}  "
                    f"{rate / 1e6:7.0f}M tok/s  vs baseline: wall {t['wall_ratio']:.2f}x, "
                    f"CPU {t['cpu_ratio']:.2f}x",
                    flush=True,
                )
            yield {"seq_len": seq_len, "rows": rows, "checks": checks, "timing": timed}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[16384, 65536])
    parser.add_argument(
        "--rows", type=int, default=96, help="windows per pass at 64K (more at shorter lengths)"
    )
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2, 4])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", type=Path, help="the JSON report")
    parser.add_argument(
        "--cpu-smoke", action="store_true", help="every path on the CPU, small, without pinning"
    )
    args = parser.parse_args(argv)
    if args.cpu_smoke:
        device, pin = torch.device("cpu"), False
        args.seq_lens, args.rows, args.reps, args.workers = [2048], 8, 1, [0, 2]
    elif torch.cuda.is_available():
        device, pin = torch.device("cuda"), True
    else:
        print("error: no CUDA device (use --cpu-smoke for a dry run)", file=sys.stderr)
        return 2
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    print(
        f"{name}; torch {torch.__version__}; {os.cpu_count()} CPUs; load {os.getloadavg()[0]:.1f}", flush=True
    )
    entries = list(passes(args, device, pin))
    passed = all(c["passed"] for e in entries for c in e["checks"])
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.out.with_name(args.out.name + ".tmp")
        tmp.write_text(
            json.dumps(
                {
                    "device": name,
                    "torch": torch.__version__,
                    "cpus": os.cpu_count(),
                    "passed": passed,
                    "lengths": entries,
                },
                indent=1,
            )
        )
        tmp.replace(args.out)
    print("PackedLoader on the GPU:", "PASSED" if passed else "FAILED")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
