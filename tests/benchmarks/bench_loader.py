"""The training loader against a plain memory-mapped read of the same rows, in the same run.

Shards of ``--rows`` windows at each length (16K and 64K tokens by default) are written to a
temporary folder (random documents, the real shard format and manifest). Each repetition reads all
rows, in a shuffled order, with:

- **baseline**: ``pa.memory_map`` + ``pa.ipc.open_stream`` of each shard (two shards per length,
  as the packer writes up to 64M tokens per shard), and for every row a copy
  of its ``input_ids``, ``position_ids``, ``loss_mask`` and ``cu_seqlens`` into fresh arrays (what
  any loader must at least do: touch the bytes and hand out memory it owns); the columns are the
  record batch's own arrays, zero-copy from the map;
- **verification alone**: ``ShardSet.verify()``, the checksum of every shard and the row checks of
  every row (the trust this loader adds, in blocks of rows as the loader checks them), without
  building tensors;
- ``torch.utils.data.DataLoader(PackedDataset, collate_fn=collate_packed)`` with ``num_workers=0``;
- ``PackedLoader`` (a DataLoader with an exact resume position) with ``num_workers`` 0 and 2, each
  measured two ways:

  - **first pass**: a new dataset and loader, one pass over all rows: it opens the folder, hashes
    every shard, checks every row and (with workers) starts the worker processes and stops them
    when the loader is dropped. This is what a run that reads its data once pays, with the workers'
    start (hundreds of milliseconds of CPU on a busy 2-core machine, against tens for the whole
    baseline pass) not spread over a long epoch as it would be in training.
  - **first pass, fresh process**: the same in a new interpreter that has imported torch and the
    loader and nothing else (this script imports pandas, through ``pa.array``, to write the shards):
    what a training process's first pass costs, with every module the loader imports on the way.
    The modules imported during those passes are listed.
  - **later passes**: one loader per case, made before the repetitions (its first pass untimed);
    each repetition times ``--passes`` further passes (one epoch each, a new shuffled order) and
    reports the cost per pass: the workers are the same processes throughout, the shards already
    hashed and their rows checked (what the second and later epochs of a run pay, and the per-row
    cost of a long epoch once every shard is verified).

Printed per case: wall and CPU seconds per pass (this process plus its worker processes, reaped or
still alive), median and spread (min-max) over ``--reps`` repetitions, tokens/s, and the ratio of
the baseline's median to the case's (throughput relative to the plain read; the goal is >= 0.3).
With workers, the CPU of the training process alone is printed too: what loading takes from the
process that drives the accelerator (the workers run beside it).
The CPU of workers still alive is read from ``/proc/<pid>/stat``, in clock ticks (10 ms), hence the
several passes per repetition. For each first pass, the wall-clock rate over its second half is
printed too (by then each worker has hashed its shards: the per-row cost of a first epoch, without
the workers' start). Repetitions are interleaved (each runs every case once, in turn), so a change
in the machine's load affects every case alike.

    .venv/bin/python tests/benchmarks/bench_loader.py [--seq-lens 16384 65536] [--rows 384] [--reps 5]
        [--passes 4]
"""

from __future__ import annotations

import argparse
import functools
import json
import multiprocessing
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
from torch.utils.data import DataLoader

from longctx.packer.dataset import PackedDataset, collate_packed
from longctx.packer.format import ShardHeader, TokenizerInfo, open_shard, shard_schema, write_shard
from longctx.packer.loader import PackedLoader
from longctx.packer.manifest import build_manifest, write_manifest
from longctx.packer.reader import ShardColumns
from longctx.packer.report import stats_from_shards

VOCAB = 32_000


def write_folder(folder: Path, seq_len: int, rows: int, rows_per_shard: int, seed: int) -> None:
    """``rows`` windows of random documents (lengths up to ``seq_len``) plus padding, in shards."""
    rng = np.random.default_rng(seed)
    header = ShardHeader(
        seq_len=seq_len,
        original_context=seq_len // 4,
        target_context=seq_len,
        strategy="bfd",
        tokenizer=TokenizerInfo(sha256="0" * 64, vocab_size=VOCAB, eos_id=0, bos_id=None, pad_id=0),
        config_sha256="0" * 64,
    )
    entries = []
    for first in range(0, rows, rows_per_shard):
        n = min(rows_per_shard, rows - first)
        cu_rows, ids, positions, masks, docs = [], [], [], [], []
        for _ in range(n):
            lengths = []
            while sum(lengths) < seq_len * 0.97:
                lengths.append(int(min(rng.integers(64, seq_len // 3), seq_len - sum(lengths))))
            padded = seq_len - sum(lengths)
            segs = lengths + ([padded] if padded else [])
            cu = np.concatenate([[0], np.cumsum(segs)]).astype(np.int32)
            pos = np.concatenate([np.arange(s) for s in segs]).astype(np.int32)
            mask = (pos > 0).astype(np.uint8)
            if padded:
                mask[-padded:] = 0
            row_ids = rng.integers(1, VOCAB, seq_len, dtype=np.int32)
            for end in cu[1 : len(lengths) + 1]:
                row_ids[end - 1] = 0  # EOS ends every document
            if padded:
                row_ids[-padded:] = 0
            cu_rows.append(cu)
            ids.append(row_ids)
            positions.append(pos)
            masks.append(mask)
            docs.append(len(lengths))
        names = [
            [f"d{i}_{j}" for j in range(k)] + ([None] if len(c) - 1 > k else [])
            for i, (k, c) in enumerate(zip(docs, cu_rows))
        ]
        columns = {
            "input_ids": pa.FixedSizeListArray.from_arrays(pa.array(np.concatenate(ids)), seq_len),
            "position_ids": pa.FixedSizeListArray.from_arrays(pa.array(np.concatenate(positions)), seq_len),
            "loss_mask": pa.FixedSizeListArray.from_arrays(pa.array(np.concatenate(masks)), seq_len),
            "cu_seqlens": pa.array([c.tolist() for c in cu_rows], pa.list_(pa.int32())),
            "doc_id": pa.array(names, pa.list_(pa.string())),
            "doc_source": pa.array(
                [[None if x is None else "s" for x in r] for r in names], pa.list_(pa.string())
            ),
            "doc_offset": pa.array(
                [[None if x is None else 0 for x in r] for r in names], pa.list_(pa.int64())
            ),
            "doc_length": pa.array(
                [
                    [None if names[i][j] is None else int(c[j + 1] - c[j]) for j in range(len(names[i]))]
                    for i, c in enumerate(cu_rows)
                ],
                pa.list_(pa.int64()),
            ),
        }
        batch = pa.RecordBatch.from_pydict(columns, schema=shard_schema(seq_len))
        entries.append(write_shard(folder / f"00000_{len(entries):05d}.arrow", batch, header))
    opened = [ShardColumns(*open_shard(folder / e.file)) for e in entries]
    stats = stats_from_shards(opened, seq_len, header.original_context)
    write_manifest(folder, build_manifest(header, {}, entries, stats, None))


def live_children_cpu() -> dict[int, float]:
    """CPU seconds so far of each live child process (``/proc/<pid>/stat``: user + system ticks)."""
    tick, found = os.sysconf("SC_CLK_TCK"), {}
    for child in multiprocessing.active_children():
        try:
            fields = Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        found[child.pid] = (int(fields[11]) + int(fields[12])) / tick
    return found


Measured = tuple[list[float], list[float], list[float], int]


def measure(cases: dict[str, tuple[Callable[[], int], int]], reps: int) -> dict[str, Measured]:
    """Wall and CPU seconds per pass (this process, its reaped children and its live children), and
    this process's CPU alone, of every case per repetition, and tokens per pass. A case is
    ``(run, passes)``: ``run()`` makes ``passes`` passes and returns the tokens read. Repetitions are
    interleaved (each runs every case once), so that a change in the machine's load during the run
    affects every case alike."""
    results: dict[str, Measured] = {name: ([], [], [], 0) for name in cases}
    for _ in range(reps):
        for name, (run, passes) in cases.items():
            walls, cpus, mains, _ = results[name]
            live = live_children_cpu()
            before, children = time.process_time(), resource.getrusage(resource.RUSAGE_CHILDREN)
            started = time.perf_counter()
            tokens = run()
            walls.append((time.perf_counter() - started) / passes)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            reaped = (after.ru_utime - children.ru_utime) + (after.ru_stime - children.ru_stime)
            now = live_children_cpu()
            # children alive before and after: their CPU in between; reaped meanwhile: all their CPU is
            # in ``reaped``, less what they had used before
            alive = sum(cpu - live.get(pid, 0.0) for pid, cpu in now.items())
            alive -= sum(cpu for pid, cpu in live.items() if pid not in now)
            main = time.process_time() - before
            cpus.append((main + reaped + alive) / passes)
            mains.append(main / passes)
            results[name] = (walls, cpus, mains, tokens // passes)
    return results


def mapped_rows(
    folder: Path, order: np.ndarray, starts: np.ndarray, files: list[str]
) -> Iterator[list[np.ndarray]]:
    """Each row of ``order``'s ``input_ids``, ``position_ids``, ``loss_mask`` and ``cu_seqlens``: views of
    the shards' record batches, zero-copy from ``pa.memory_map``."""
    tables = [pa.ipc.open_stream(pa.memory_map(str(folder / f))).read_all() for f in files]
    views = []
    for t in tables:
        seq_len = t.schema.field("input_ids").type.list_size
        # the record batch's own arrays, zero-copy from the map (combine_chunks would copy them)
        cu = t.column("cu_seqlens").chunk(0)
        views.append(
            [
                t.column(n).chunk(0).flatten().to_numpy().reshape(-1, seq_len)
                for n in ("input_ids", "position_ids", "loss_mask")
            ]
            + [cu.offsets.to_numpy(), cu.values.to_numpy()]
        )
    for r in order:
        s = int(np.searchsorted(starts, r, side="right")) - 1
        ids, pos, mask, off, val = views[s]
        i = int(r - starts[s])
        yield [ids[i], pos[i], mask[i], val[off[i] : off[i + 1]]]


def plain_read(folder: Path, order: np.ndarray, starts: np.ndarray, files: list[str]) -> int:
    """The baseline: every row's columns copied out of the map into fresh tensors."""
    tokens = 0
    for columns in mapped_rows(folder, order, starts, files):
        out = [torch.from_numpy(np.array(column)) for column in columns]
        tokens += out[0].numel()
    return tokens


def verification_only(folder: Path) -> int:
    """The checks every loader run makes, alone: each shard hashed, each block of rows checked."""
    ds = PackedDataset(folder, tokenizer=None, shuffle=False)
    ds.shards.verify()
    return len(ds.shards) * ds.seq_len


def child_first_pass(folder: str, workers: str) -> None:
    """Child: the first pass of a new dataset and loader in a fresh process, as a training process
    makes it (torch and the loader imported beforehand, untimed; nothing else). Prints its wall and
    CPU seconds (the workers' too: they are reaped by ``close``), the tokens read, and the modules
    first imported during the pass."""
    seen = set(sys.modules)
    before, children = time.process_time(), resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    ds = PackedDataset(Path(folder), tokenizer=None, seed=1)
    loader = PackedLoader(ds, batch_size=1, num_workers=int(workers))
    rows = sum(1 for _ in loader)
    loader.close()
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (
        time.process_time()
        - before
        + (after.ru_utime - children.ru_utime)
        + (after.ru_stime - children.ru_stime)
    )
    imported = sorted(m for m in set(sys.modules) - seen if "." not in m and not m.startswith("_"))
    print(json.dumps({"wall": wall, "cpu": cpu, "tokens": rows * ds.seq_len, "imported": imported}))


def fresh_first_passes(folder: Path, workers: int, reps: int) -> tuple[Measured, set[str]]:
    """:func:`child_first_pass` ``reps`` times, each in a new interpreter: (walls, CPUs, CPUs, tokens)
    as :func:`measure` gives them, and the top-level modules those passes imported."""
    walls, cpus, imported, tokens = [], [], set(), 0
    for _ in range(reps):
        out = subprocess.run(
            [sys.executable, __file__, "--child", str(folder), str(workers)],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        found = json.loads(out.strip().splitlines()[-1])
        walls.append(found["wall"])
        cpus.append(found["cpu"])
        tokens = found["tokens"]
        imported.update(found["imported"])
    return (walls, cpus, cpus, tokens), imported


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[16384, 65536])
    parser.add_argument(
        "--rows",
        type=int,
        default=384,
        help="windows at 64K (x 2 at 16K): 25M tokens, a baseline pass of ~15 ms (with 96, "
        "~5 ms passes were within the machine's noise and flattered the loader)",
    )
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--passes", type=int, default=4, help="later passes timed per repetition")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_first_pass(*args.child)
        return
    torch.set_num_threads(1)
    print(
        f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; "
        f"{args.reps} repetitions: median [min-max]"
    )
    with tempfile.TemporaryDirectory() as tmp:
        for seq_len in args.seq_lens:
            rows = args.rows * max(1, 65536 // seq_len // 2)
            folder = Path(tmp) / f"seq{seq_len}"
            folder.mkdir()
            write_folder(folder, seq_len, rows, rows_per_shard=max(4, rows // 2), seed=seq_len)
            probe = PackedDataset(folder, tokenizer=None, seed=1)
            order = probe.order(0)
            starts, files = probe.shards._starts, [e.file for e in probe.shards.manifest.shards]

            late: dict[str, list[float]] = {}  # first passes: wall-clock tokens/s over their second half

            def first_pass(
                workers: int | None,
                folder: Path = folder,
                seq_len: int = seq_len,
                late: dict[str, list[float]] = late,
            ) -> tuple[Callable[[], int], int]:
                """A new dataset and loader, one pass; ``workers`` None: a plain DataLoader, no workers."""

                def run() -> int:
                    ds = PackedDataset(folder, tokenizer=None, seed=1)
                    if workers is None:
                        loader = DataLoader(ds, batch_size=1, num_workers=0, collate_fn=collate_packed)
                    else:
                        loader = PackedLoader(ds, batch_size=1, num_workers=workers)
                    handed = [time.perf_counter() for _ in loader]  # when each batch (one row) arrived
                    del loader  # stops its workers (reaped, so their CPU is counted)
                    if workers is not None:
                        half = len(handed) // 2
                        rate = (len(handed) - 1 - half) * seq_len / (handed[-1] - handed[half])
                        late.setdefault(f"PackedLoader, workers {workers}, first pass", []).append(rate)
                    return len(handed) * seq_len

                return run, 1

            kept: list[PackedLoader] = []

            def later_passes(
                workers: int, folder: Path = folder, seq_len: int = seq_len, kept: list[PackedLoader] = kept
            ) -> tuple[Callable[[], int], int]:
                """One loader for every repetition, its first pass made now; each run makes
                ``passes`` more."""
                loader = PackedLoader(
                    PackedDataset(folder, tokenizer=None, seed=1), batch_size=1, num_workers=workers
                )
                for _ in loader:
                    pass
                kept.append(loader)

                def run() -> int:
                    return sum(1 for _ in range(args.passes) for _ in loader) * seq_len

                return run, args.passes

            cases = {
                "plain memory-mapped read (baseline)": (
                    functools.partial(plain_read, folder, order, starts, files),
                    1,
                ),
                "verification alone (checksums + row checks)": (
                    functools.partial(verification_only, folder),
                    1,
                ),
                "DataLoader(PackedDataset), workers 0": first_pass(None),
                "PackedLoader, workers 0, first pass": first_pass(0),
                "PackedLoader, workers 2, first pass": first_pass(2),
                "PackedLoader, workers 0, later passes": later_passes(0),
                "PackedLoader, workers 2, later passes": later_passes(2),
            }
            results = measure(cases, args.reps)
            imported: set[str] = set()
            for workers in (0, 2):
                name = f"PackedLoader, workers {workers}, first pass, fresh process"
                results[name], modules = fresh_first_passes(folder, workers, args.reps)
                imported |= modules
            for loader in kept:
                loader.close()
            base_wall, base_cpu, _, _ = results["plain memory-mapped read (baseline)"]
            print(f"\nseq_len {seq_len}: {rows} rows, {rows * seq_len / 1e6:.1f}M tokens per pass; per pass:")
            for name, (wall, cpu, _main, tokens) in results.items():
                w, c = statistics.median(wall), statistics.median(cpu)
                print(
                    f"  {name:50s} wall {w:7.3f} s [{min(wall):.3f}-{max(wall):.3f}]  CPU {c:7.3f} s "
                    f"[{min(cpu):.3f}-{max(cpu):.3f}]  {tokens / w / 1e6:6.0f}M tok/s  "
                    f"vs baseline: wall {statistics.median(base_wall) / w:.2f}x, CPU "
                    f"{statistics.median(base_cpu) / c:.2f}x"
                )
            for name, (_, _, main, _) in results.items():
                if "workers 2" in name and "fresh" not in name:  # a fresh process's split is not measured
                    m = statistics.median(main)
                    print(
                        f"  {name}: the training process's own CPU {m:.3f} s "
                        f"[{min(main):.3f}-{max(main):.3f}], vs baseline CPU "
                        f"{statistics.median(base_cpu) / m:.2f}x"
                    )
            print(f"  first passes in a fresh process imported: {', '.join(sorted(imported)) or 'nothing'}")
            base_rate = rows * seq_len / statistics.median(base_wall)
            for name, rates in late.items():
                rate = statistics.median(rates)
                print(
                    f"  {name}, over its second half: {rate / 1e6:.0f}M tok/s "
                    f"[{min(rates) / 1e6:.0f}-{max(rates) / 1e6:.0f}], "
                    f"vs baseline wall {rate / base_rate:.2f}x"
                )


if __name__ == "__main__":
    main()
