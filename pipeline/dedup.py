"""Exact and near-duplicate removal.

Near duplicates are found by datatrove's MinHash stages 1 and 2 (signatures, then LSH buckets that
emit candidate pairs). Exact duplicates are found by hashing normalized text (both per-document
hashes come from :mod:`longctx.pipeline.signatures`). Both kinds of pair are joined in one
union-find by :class:`DuplicateResolver` (a single task), which keeps one document of each cluster,
chosen by the run's keep policy (:mod:`longctx.pipeline.keep`: by default the longest, then the one
not inside a vendored or forked path, then the smallest id), and records, for every other member,
the id it duplicates. datatrove's own cluster and filter stages (MinHash stages 3 and 4) say only
*that* a document is a duplicate, not *of what*, which the ledger needs; hence this resolver.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import pyarrow as pa
from datatrove.data import DocumentsPipeline
from datatrove.pipeline.base import PipelineStep
from datatrove.pipeline.dedup.minhash import MinhashConfig, MinhashDedupBuckets

from longctx.core.atomic import write_table
from longctx.pipeline.dedup_inputs import read_minhash_pairs, read_rank_index
from longctx.pipeline.keep import document_rank
from longctx.pipeline.parquet import read_parquet
from longctx.pipeline.signatures import exact_hash

INDEX_SCHEMA = pa.schema([("idx", pa.int64()), ("id", pa.string()), ("text_hash", pa.string())])
DECISIONS_SCHEMA = pa.schema([("id", pa.string()), ("duplicate_of", pa.string()), ("kind", pa.string())])


class GroupedMinhashBuckets(PipelineStep):
    """datatrove's MinHash stage 2 (:class:`MinhashDedupBuckets`) with several buckets per task.

    datatrove's stage wants one task (or more) per bucket; on one machine each task costs more to
    start (its logs, stats and completion marker) than a bucket of a few thousand signatures costs to
    search. Task ``rank`` of ``world_size`` runs datatrove's own step for buckets ``rank``,
    ``rank + world_size``, ... in turn, as the task of that bucket would: the same ``.dups`` files.
    """

    type = "🫂 - DEDUP"
    name = "🎯 MinHash buckets"

    def __init__(
        self, input_folder: str | os.PathLike, output_folder: str | os.PathLike, config: MinhashConfig
    ) -> None:
        super().__init__()
        self.buckets = MinhashDedupBuckets(str(input_folder), str(output_folder), config=config)
        self.stats = self.buckets.stats  # its counters are this step's

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        num_buckets = self.buckets.config.num_buckets
        for bucket in range(rank, num_buckets, world_size):
            self.buckets.run(None, bucket, num_buckets)
        if data:
            yield from data


class DedupIndex(PipelineStep):
    """Records, for each document in the order MinHash stage 1 sees them, its id and exact hash.

    The position ``idx`` is what MinHash's candidate pairs refer to, so this step must sit right
    before :class:`~longctx.pipeline.signatures.MinhashSignature` in the same pipeline.
    """

    type = "🫂 - DEDUP"
    name = "🔑 Dedup index"

    def __init__(self, output_folder: str | os.PathLike) -> None:
        super().__init__()
        self.output_folder = Path(output_folder)

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        ids: list[str] = []
        hashes: list[str] = []
        for doc in data:
            ids.append(doc.id)
            hashes.append(exact_hash(doc.text))
            yield doc
        table = pa.table({"idx": list(range(len(ids))), "id": ids, "text_hash": hashes}, schema=INDEX_SCHEMA)
        write_table(self.output_folder / f"{rank:05d}.parquet", table)


def _find(parent: dict[str, str], node: str) -> str:
    root = node
    while parent[root] != root:
        root = parent[root]
    while parent[node] != root:  # path compression
        parent[node], node = root, parent[node]
    return root


def _union(parent: dict[str, str], a: str, b: str) -> None:
    root_a, root_b = _find(parent, a), _find(parent, b)
    if root_a != root_b:
        parent[max(root_a, root_b)] = min(root_a, root_b)


def resolve_duplicates(
    index: pa.Table,
    pairs: list[tuple[int, int, int, int]],
    use_exact: bool,
    facts: pa.Table | None = None,
    keep: Sequence[str] = (),
) -> pa.Table:
    """Cluster documents connected by an exact-hash match or a MinHash candidate pair.

    ``index`` has columns ``rank``, ``idx``, ``id``, ``text_hash``; ``pairs`` are MinHash pairs
    ``(rank1, idx1, rank2, idx2)``; ``facts`` (columns ``id``, ``path``, ``chars``) feed the ``keep``
    rules (:func:`~longctx.pipeline.keep.document_rank`; without facts or rules the smallest id is
    kept). Returns one row per non-kept member: its id, the id of the cluster's kept document, and
    ``exact_duplicate`` when its normalized text equals the kept one's, else ``near_duplicate``.
    """
    ids = index.column("id").to_pylist()
    hashes = index.column("text_hash").to_pylist()
    position = {
        (r, i): doc_id
        for r, i, doc_id in zip(index.column("rank").to_pylist(), index.column("idx").to_pylist(), ids)
    }
    hash_of = dict(zip(ids, hashes))
    parent = {doc_id: doc_id for doc_id in ids}
    if use_exact:
        first_with_hash: dict[str, str] = {}
        for doc_id, text_hash in zip(ids, hashes):
            if text_hash in first_with_hash:
                _union(parent, first_with_hash[text_hash], doc_id)
            else:
                first_with_hash[text_hash] = doc_id
    for r1, i1, r2, i2 in pairs:
        a, b = position.get((r1, i1)), position.get((r2, i2))
        if a is None or b is None:
            raise RuntimeError(
                f"MinHash pair ({r1},{i1})-({r2},{i2}) names a document missing from the dedup index"
            )
        _union(parent, a, b)
    known = {}
    if facts is not None:
        known = {
            i: (p, c) for i, p, c in zip(*(facts.column(k).to_pylist() for k in ("id", "path", "chars")))
        }

    def rank(doc_id: str) -> tuple:
        path, chars = known.get(doc_id, ("", 0))
        return document_rank(keep, doc_id=doc_id, path=path, chars=chars)

    clusters: dict[str, list[str]] = {}
    for doc_id in ids:
        clusters.setdefault(_find(parent, doc_id), []).append(doc_id)
    rows: dict[str, list[str]] = {"id": [], "duplicate_of": [], "kind": []}
    for members in clusters.values():
        if len(members) < 2:
            continue
        kept = min(members, key=rank)
        for doc_id in members:
            if doc_id != kept:
                rows["id"].append(doc_id)
                rows["duplicate_of"].append(kept)
                rows["kind"].append(
                    "exact_duplicate" if hash_of[doc_id] == hash_of[kept] else "near_duplicate"
                )
    return pa.table(rows, schema=DECISIONS_SCHEMA).sort_by("id")


class DuplicateResolver(PipelineStep):
    """Single task: read the dedup index of every rank, MinHash stage 2's ``.dups`` files and the
    input tally (paths and lengths for the keep policy), and write ``decisions.parquet`` (see
    :func:`resolve_duplicates`)."""

    type = "🫂 - DEDUP"
    name = "🔗 Resolve duplicates"

    def __init__(
        self,
        index_folder: str | os.PathLike,
        dups_folder: str | os.PathLike | None,
        output_file: str | os.PathLike,
        use_exact: bool,
        inputs_folder: str | os.PathLike | None = None,
        keep: Sequence[str] = (),
    ) -> None:
        super().__init__()
        self.index_folder = Path(index_folder)
        self.dups_folder = Path(dups_folder) if dups_folder else None
        self.output_file = Path(output_file)
        self.use_exact = use_exact
        self.inputs_folder = Path(inputs_folder) if inputs_folder else None
        self.keep = tuple(keep)

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        if world_size != 1:
            raise ValueError("DuplicateResolver runs as a single task")
        index = read_rank_index(self.index_folder, INDEX_SCHEMA)
        pairs = read_minhash_pairs(self.dups_folder)
        facts = None
        if self.inputs_folder is not None:
            from longctx.pipeline.ledger import INPUTS_SCHEMA, read_parquet_folder

            facts = read_parquet_folder(self.inputs_folder, INPUTS_SCHEMA)
        decisions = resolve_duplicates(index, pairs, self.use_exact, facts, self.keep)
        self.stat_update("duplicates", value=len(decisions))
        write_table(self.output_file, decisions)
        if data:
            yield from data


def read_decisions(decisions_file: str | os.PathLike) -> dict[str, tuple[str, str]]:
    """The resolver's decisions: each duplicate's id -> (the id it duplicates, the kind of duplicate)."""
    table = read_parquet(decisions_file, DECISIONS_SCHEMA)
    return {
        i: (d, k) for i, d, k in zip(*(table.column(c).to_pylist() for c in ("id", "duplicate_of", "kind")))
    }
