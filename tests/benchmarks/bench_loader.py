"""The training loader against a plain memory-mapped read of the same rows, in the same run.

Shards of ``--rows`` windows at each length (16K and 64K tokens by default) are written to a
temporary folder (random documents, the real shard format and manifest). Each repetition reads all
rows, in the same shuffled order, with:

- **baseline**: ``pa.memory_map`` + ``pa.ipc.open_stream`` of each shard (two shards per length,
  as the packer writes up to 64M tokens per shard), and for every row a copy
  of its ``input_ids``, ``position_ids``, ``loss_mask`` and ``cu_seqlens`` into fresh arrays (what
  any loader must at least do: touch the bytes and hand out memory it owns); the columns are the
  record batch's own arrays, zero-copy from the map;
- **verification alone**: ``ShardSet.verify()``, the checksum of every shard and the row checks of
  every row (the trust this loader adds, in blocks of rows as the loader checks them), without
  building tensors;
- ``torch.utils.data.DataLoader(PackedDataset, collate_fn=collate_packed)`` with ``num_workers=0``;
- ``PackedLoader`` (a DataLoader with an exact resume position) with ``num_workers`` 0 and 2.

Every loader run opens the folder afresh, so it includes the checksum of every shard and the row
checks of every row. Repetitions are interleaved (each runs every case once, in turn). Printed per
case: wall and CPU seconds (this process plus its worker processes), median and spread (min-max)
over ``--reps`` repetitions, tokens/s, and the ratio of the baseline's median to the case's
(throughput relative to the plain read; the goal is >= 0.3). Worker processes are started for every
pass, which dominates a pass this short (hundreds of milliseconds on a busy 2-core machine, against
tens for the whole baseline pass): the wall-clock rate after the first batch (workers running), and
over the second half of the pass (each worker has hashed its shards and mapped its shared-memory
slots, as in a long epoch), are printed too.

    .venv/bin/python tests/benchmarks/bench_loader.py [--seq-lens 16384 65536] [--rows 96] [--reps 5]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import torch
from torch.utils.data import DataLoader

from longctx.packer.dataset import PackedDataset, collate_packed
from longctx.packer.loader import PackedLoader
from longctx.packer.format import ShardHeader, TokenizerInfo, open_shard, shard_schema, write_shard
from longctx.packer.manifest import build_manifest, write_manifest
from longctx.packer.reader import ShardColumns
from longctx.packer.report import stats_from_shards

VOCAB = 32_000


def write_folder(folder: Path, seq_len: int, rows: int, rows_per_shard: int, seed: int) -> None:
    """``rows`` windows of random documents (lengths up to ``seq_len``) plus padding, in shards."""
    rng = np.random.default_rng(seed)
    header = ShardHeader(
        seq_len=seq_len, original_context=seq_len // 4, target_context=seq_len, strategy="bfd",
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
        names = [[f"d{i}_{j}" for j in range(k)] + ([None] if len(c) - 1 > k else []) for i, (k, c) in
                 enumerate(zip(docs, cu_rows))]
        columns = {
            "input_ids": pa.FixedSizeListArray.from_arrays(pa.array(np.concatenate(ids)), seq_len),
            "position_ids": pa.FixedSizeListArray.from_arrays(pa.array(np.concatenate(positions)), seq_len),
            "loss_mask": pa.FixedSizeListArray.from_arrays(pa.array(np.concatenate(masks)), seq_len),
            "cu_seqlens": pa.array([c.tolist() for c in cu_rows], pa.list_(pa.int32())),
            "doc_id": pa.array(names, pa.list_(pa.string())),
            "doc_source": pa.array([[None if x is None else "s" for x in r] for r in names], pa.list_(pa.string())),
            "doc_offset": pa.array([[None if x is None else 0 for x in r] for r in names], pa.list_(pa.int64())),
            "doc_length": pa.array(
                [[None if names[i][j] is None else int(c[j + 1] - c[j]) for j in range(len(names[i]))]
                 for i, c in enumerate(cu_rows)], pa.list_(pa.int64())),
        }
        batch = pa.RecordBatch.from_pydict(columns, schema=shard_schema(seq_len))
        entries.append(write_shard(folder / f"00000_{len(entries):05d}.arrow", batch, header))
    opened = [ShardColumns(*open_shard(folder / e.file)) for e in entries]
    stats = stats_from_shards(opened, seq_len, header.original_context)
    write_manifest(folder, build_manifest(header, {}, entries, stats, None))


def measure(cases: dict[str, Callable[[], int]], reps: int) -> dict[str, tuple[list[float], list[float], int]]:
    """Wall and CPU seconds (this process and its reaped children) of every case per repetition, and
    tokens read. Repetitions are interleaved (each runs every case once), so that a change in the
    machine's load during the run affects every case alike."""
    results: dict[str, tuple[list[float], list[float], int]] = {name: ([], [], 0) for name in cases}
    for _ in range(reps):
        for name, run in cases.items():
            walls, cpus, _ = results[name]
            before, children = time.process_time(), resource.getrusage(resource.RUSAGE_CHILDREN)
            started = time.perf_counter()
            tokens = run()
            walls.append(time.perf_counter() - started)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append(time.process_time() - before + (after.ru_utime - children.ru_utime) + (after.ru_stime - children.ru_stime))
            results[name] = (walls, cpus, tokens)
    return results


def plain_read(folder: Path, order: np.ndarray, starts: np.ndarray, files: list[str]) -> int:
    tables = [pa.ipc.open_stream(pa.memory_map(str(folder / f))).read_all() for f in files]
    views = []
    for t in tables:
        seq_len = t.schema.field("input_ids").type.list_size
        # the record batch's own arrays, zero-copy from the map (combine_chunks would copy them)
        cu = t.column("cu_seqlens").chunk(0)
        views.append(
            [t.column(n).chunk(0).flatten().to_numpy().reshape(-1, seq_len) for n in ("input_ids", "position_ids", "loss_mask")]
            + [cu.offsets.to_numpy(), cu.values.to_numpy()]
        )
    tokens = 0
    for r in order:
        s = int(np.searchsorted(starts, r, side="right")) - 1
        ids, pos, mask, off, val = views[s]
        i = int(r - starts[s])
        out = [torch.from_numpy(np.array(ids[i])), torch.from_numpy(np.array(pos[i])),
               torch.from_numpy(np.array(mask[i])), torch.from_numpy(np.array(val[off[i] : off[i + 1]]))]
        tokens += out[0].numel()
    return tokens


def verification_only(folder: Path) -> int:
    """The checks every loader run makes, alone: each shard hashed, each block of rows checked."""
    ds = PackedDataset(folder, tokenizer=None, shuffle=False)
    ds.shards.verify()
    return len(ds.shards) * ds.seq_len


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[16384, 65536])
    parser.add_argument("--rows", type=int, default=96, help="windows at 64K (x 2 at 16K)")
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; {args.reps} repetitions: median [min-max]")
    with tempfile.TemporaryDirectory() as tmp:
        for seq_len in args.seq_lens:
            rows = args.rows * max(1, 65536 // seq_len // 2)
            folder = Path(tmp) / f"seq{seq_len}"
            folder.mkdir()
            write_folder(folder, seq_len, rows, rows_per_shard=max(4, rows // 2), seed=seq_len)
            probe = PackedDataset(folder, tokenizer=None, seed=1)
            order = probe.order(0)
            starts, files = probe.shards._starts, [e.file for e in probe.shards.manifest.shards]

            # workers -> wall-clock tokens/s after the first batch, and over the second half of the pass
            steady: dict[int, list[float]] = {}
            late: dict[int, list[float]] = {}

            def dataloader(workers: int, packed: bool) -> Callable[[], int]:
                def run() -> int:
                    ds = PackedDataset(folder, tokenizer=None, seed=1)
                    if packed:
                        loader = PackedLoader(ds, batch_size=1, num_workers=workers)
                    else:
                        loader = DataLoader(ds, batch_size=1, num_workers=0, collate_fn=collate_packed)
                    handed = [time.perf_counter() for _ in loader]  # when each batch (one row) arrived
                    if packed:
                        half = len(handed) // 2
                        steady.setdefault(workers, []).append((len(handed) - 1) * seq_len / (handed[-1] - handed[0]))
                        late.setdefault(workers, []).append((len(handed) - 1 - half) * seq_len / (handed[-1] - handed[half]))
                    return len(handed) * seq_len
                return run

            cases = {
                "plain memory-mapped read (baseline)": lambda: plain_read(folder, order, starts, files),
                "verification alone (checksums + row checks)": lambda: verification_only(folder),
                "DataLoader(PackedDataset), workers 0": dataloader(0, packed=False),
                "PackedLoader, workers 0": dataloader(0, packed=True),
                "PackedLoader, workers 2": dataloader(2, packed=True),
            }
            results = measure(cases, args.reps)
            base_wall, base_cpu, _ = results["plain memory-mapped read (baseline)"]
            print(f"\nseq_len {seq_len}: {rows} rows, {rows * seq_len / 1e6:.1f}M tokens per repetition")
            for name, (wall, cpu, tokens) in results.items():
                w, c = statistics.median(wall), statistics.median(cpu)
                print(
                    f"  {name:44s} wall {w:7.3f} s [{min(wall):.3f}-{max(wall):.3f}]  CPU {c:7.3f} s "
                    f"[{min(cpu):.3f}-{max(cpu):.3f}]  {tokens / w / 1e6:6.0f}M tok/s  "
                    f"vs baseline: wall {statistics.median(base_wall) / w:.2f}x, CPU {statistics.median(base_cpu) / c:.2f}x"
                )
            base_rate = rows * seq_len / statistics.median(base_wall)
            for label, rates_of in (("after the first batch", steady), ("over the second half of the pass", late)):
                for workers, rates in sorted(rates_of.items()):
                    rate = statistics.median(rates)
                    print(
                        f"  PackedLoader, workers {workers}, {label}: {rate / 1e6:.0f}M tok/s "
                        f"[{min(rates) / 1e6:.0f}-{max(rates) / 1e6:.0f}], vs baseline wall {rate / base_rate:.2f}x"
                    )

if __name__ == "__main__":
    main()
