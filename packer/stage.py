"""The datatrove steps of the pack job: read curated documents, tokenize them, pack and write shards;
then merge what every task wrote into each output's manifest.

Each task reads its share of the curated files, tokenizes documents in parallel batches, and packs
them pool by pool (``pool_tokens`` at a time) into every requested window length. Shards are named
``{rank:05d}_{index:05d}.arrow``; a task first removes what an interrupted attempt of the same rank
left behind, and finishes by writing a summary (its shards and statistics) that the manifest step
merges. The executor records the task as complete only after that, so a killed run redoes exactly
the unfinished tasks and, everything being deterministic, writes the same bytes.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from functools import cache, partial
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
from datatrove.data import DocumentsPipeline
from datatrove.pipeline.base import PipelineStep
from datatrove.utils.batching import batched
from datatrove.utils.logging import logger

from longctx.core.atomic import write_json
from longctx.core.layout import RunLayout, shard_folder
from longctx.core.text import plural
from longctx.packer.binpack import pack
from longctx.packer.format import SHARD_SUFFIX, ShardError, ShardFile, ShardHeader, write_shard
from longctx.packer.manifest import (
    CoverageError,
    Manifest,
    MixReport,
    build_manifest,
    coverage_refusal,
    write_manifest,
)
from longctx.packer.pool import DocumentPool, PoolBuilder
from longctx.packer.rows import build_rows
from longctx.packer.stats import OutputStats
from longctx.packer.tokens import document_ids, task_encoder

ROW_BUILD_TOKENS = 1 << 21  # rows are built this many tokens at a time (temporaries of ~20 bytes a token)


def summaries_folder(layout: RunLayout) -> Path:
    """Where the pack tasks record what they wrote, one ``seq<N>/<rank>.json`` per window length."""
    return layout.work / "tasks"


def summary_path(layout: RunLayout, seq_len: int, rank: int) -> Path:
    """Where task ``rank`` records what it wrote for windows of ``seq_len``."""
    return shard_folder(summaries_folder(layout), seq_len) / f"{rank:05d}.json"


def retokenized_documents(layout: RunLayout, seq_len: int, tasks: int) -> Counter[str]:
    """The documents the pack tasks of the pass that packed ``seq_len`` tokenized from their text
    (every task tokenizes for all lengths of its pass at once), by reason, from their summaries."""
    found: Counter[str] = Counter()
    for rank in range(tasks):
        path = summary_path(layout, seq_len, rank)
        if path.is_file():
            found.update(json.loads(path.read_text(encoding="utf-8")).get("retokenized", {}))
    return found


class ShardSeries:
    """The shards one task writes for one window length: rows are buffered into shards of
    ``rows_per_shard`` and statistics accumulated as windows are added."""

    def __init__(self, folder: Path, rank: int, header: ShardHeader, rows_per_shard: int) -> None:
        self.folder = folder
        self.rank = rank
        self.header = header
        self.rows_per_shard = rows_per_shard
        self.stats = OutputStats(header.seq_len, header.original_context)
        self.files: list[ShardFile] = []
        self._pending: list[pa.RecordBatch] = []

    def remove_previous_attempt(self) -> None:
        for path in self.folder.glob(f"{self.rank:05d}_*{SHARD_SUFFIX}*"):
            path.unlink()

    def add(self, pool: DocumentPool) -> None:
        """Pack every document of ``pool`` (with its copies) and buffer the rows, built a few
        million tokens at a time to bound the temporaries."""
        seq_len = self.header.seq_len
        packing = pack(pool.length, pool.copies, seq_len, self.header.strategy)
        step = max(1, ROW_BUILD_TOKENS // seq_len)
        for start in range(0, packing.num_windows, step):
            part = packing.window_slice(start, min(start + step, packing.num_windows))
            self._pending.append(build_rows(pool, part, seq_len, self.header.tokenizer.pad_id))
            self._write(final=False)
        self.stats.add_windows(
            packing.num_windows,
            [pool.sources[d] for d in packing.doc.tolist()],
            packing.length,
            pool.length[packing.doc],
        )
        self.stats.add_documents(pool.sources[d] for d in np.flatnonzero(pool.copies).tolist())

    def finish(self, layout: RunLayout, retokenized: Mapping[str, int]) -> None:
        """Write the last shard and the task's summary (with the documents it tokenized again, by
        reason: :func:`retokenized_documents`)."""
        self._write(final=True)
        summary = {
            "rank": self.rank,
            "shards": [f.model_dump() for f in self.files],
            "stats": self.stats.to_json(),
            "retokenized": dict(sorted(retokenized.items())),
        }
        write_json(summary_path(layout, self.header.seq_len, self.rank), summary, indent=1)

    def _write(self, final: bool) -> None:
        pending = sum(batch.num_rows for batch in self._pending)
        while pending >= self.rows_per_shard or (final and pending):
            table = pa.Table.from_batches(self._pending)
            rows = min(self.rows_per_shard, pending)
            batch = table.slice(0, rows).combine_chunks().to_batches()[0]
            path = self.folder / f"{self.rank:05d}_{len(self.files):05d}{SHARD_SUFFIX}"
            self.files.append(write_shard(path, batch, self.header))
            self._pending = table.slice(rows).to_batches()
            pending -= rows


class PackDocuments(PipelineStep):
    """Tokenize documents and pack them into shards for every window length in ``headers``.

    Documents pass through unchanged, so later steps can still see them. ``concurrent_tasks``: the
    pack tasks that run at once on this machine; a task that tokenizes uses its share of the cores.
    """

    type = "📦 - PACKER"
    name = "📦 Tokenize and pack"

    def __init__(
        self,
        layout: RunLayout,
        headers: list[ShardHeader],
        pool_tokens: int,
        shard_tokens: int,
        batch_size: int,
        concurrent_tasks: int = 1,
    ) -> None:
        super().__init__()
        self.layout = layout
        self.headers = headers
        self.pool_tokens = pool_tokens
        self.shard_tokens = shard_tokens
        self.batch_size = batch_size
        self.concurrent_tasks = concurrent_tasks

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        encoder = cache(
            partial(task_encoder, self.layout.tokenizer, self.concurrent_tasks)
        )  # when first needed
        info = self.headers[0].tokenizer
        series = [
            ShardSeries(self.layout.shard_folder(h.seq_len), rank, h, max(1, self.shard_tokens // h.seq_len))
            for h in self.headers
        ]
        for s in series:
            s.remove_previous_attempt()
        pool = PoolBuilder()
        retokenized: Counter[str] = Counter()
        for batch in batched(data or (), self.batch_size):
            with self.track_time("batch"):
                encoded = document_ids(encoder, batch, info, retokenized)
            for doc, ids in zip(batch, encoded, strict=True):
                pool.add(doc.id, doc.metadata["source"], ids, int(doc.metadata.get("copies", 1)))
                self.stat_update("documents")
                self.stat_update("tokens", value=len(ids))
            if pool.num_tokens >= self.pool_tokens:
                self._pack(pool.build(), series)
            yield from batch
        if len(pool):
            self._pack(pool.build(), series)
        for reason, count in sorted(retokenized.items()):
            logger.info(f"re-tokenized {plural(count, 'document')}: {reason}")
            self.stat_update("re-tokenized", value=count)
        for s in series:
            s.finish(self.layout, retokenized)

    def _pack(self, pool: DocumentPool, series: list[ShardSeries]) -> None:
        for s in series:
            s.add(pool)
        self.stat_update("pools", unit="task")


class WriteManifests(PipelineStep):
    """Single task after packing: merge every task's summary into each output's manifest, with the
    mix report of the plan.

    Refuses (raising :class:`CoverageError`) an output where no token reaches ``original_context``,
    unless ``allow_short_positions``; refuses a folder holding shards no task reported.
    """

    type = "🧾 - MANIFEST"
    name = "🧾 Write manifests"

    def __init__(
        self,
        layout: RunLayout,
        headers: list[ShardHeader],
        configs: Mapping[int, dict[str, Any]],
        tasks: int,
        targets: Mapping[str, float] | None,
        mix: MixReport | None,
        allow_short_positions: bool,
    ) -> None:
        super().__init__()
        self.layout = layout
        self.headers = headers
        self.configs = dict(configs)
        self.tasks = tasks
        self.targets = dict(targets) if targets else None
        self.mix = mix
        self.allow_short_positions = allow_short_positions

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        for header in self.headers:
            write_manifest(self.layout.shard_folder(header.seq_len), self.manifest_for(header))
        if data:
            yield from data

    def manifest_for(self, header: ShardHeader) -> Manifest:
        folder = self.layout.shard_folder(header.seq_len)
        stats = OutputStats(header.seq_len, header.original_context)
        files: list[ShardFile] = []
        for rank in range(self.tasks):
            path = summary_path(self.layout, header.seq_len, rank)
            if not path.is_file():
                raise ShardError(f"task {rank} left no summary at {path}; run pack again to finish it")
            summary = json.loads(path.read_text(encoding="utf-8"))
            files += [ShardFile.model_validate(f) for f in summary["shards"]]
            stats.merge(OutputStats.from_json(summary["stats"]))
        stray = sorted({p.name for p in folder.glob(f"*{SHARD_SUFFIX}")} - {f.file for f in files})
        if stray:
            raise ShardError(f"{folder} holds shards that no task of this run wrote: {', '.join(stray[:5])}")
        manifest = build_manifest(header, self.configs[header.seq_len], files, stats, self.targets, self.mix)
        refusal = coverage_refusal(
            header.seq_len,
            header.original_context,
            {n: s.max_position + 1 for n, s in manifest.sources.items()},
        )
        if refusal and not self.allow_short_positions:
            raise CoverageError(refusal)
        return manifest
