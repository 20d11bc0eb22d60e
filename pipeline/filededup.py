"""File-level deduplication of code across repositories, before each repository is concatenated.

A repository that vendors another (pip's ``_vendor/requests``, ``third_party/`` trees) or a fork
holds copies of another repository's files inside a different document, which document-level
MinHash cannot see: the copy is a small part of a large document. As large code corpora do, files
are deduplicated across repositories first, in three datatrove stages that resume like the others:

1. ``files`` (N tasks, repositories shared by size as the reader shares them): every file a
   repository's document would keep becomes a document of its own (:class:`RepositoryFiles`);
   :class:`FileSignatureIndex` records its exact hash, n-gram count and full MinHash signature and
   writes datatrove's MinHash bucket files.
2. ``file_buckets`` (N tasks over the bands): datatrove's LSH stage emits candidate pairs.
3. ``file_resolve`` (1 task): :class:`FileDuplicateResolver` checks candidates against the full
   signatures (estimated Jaccard similarity, or containment of the smaller file in the larger), adds
   files with the same normalized text, and keeps, among copies in different repositories, the one
   ranked first by the keep policy (:func:`~longctx.pipeline.keep.file_rank`; by default the
   repository that declares the file's package or holds it at its import root first, a copy whose
   imports were rewritten under a vendor prefix last: :mod:`longctx.pipeline.provenance`). Every
   other copy is a decision: ``(repo, path) -> duplicate_of (repo), of_path, kind``.

The repository reader then consults the decisions
(:func:`~longctx.pipeline.file_decisions.load_file_decisions`): a file that
duplicates a kept file of another repository is left out of its document and listed in its
``duplicate_files``; a repository left with nothing of its own becomes a ledger ``duplicate`` of the
repository it copies. Copies inside one repository are left alone (they are part of its layout).
"""

from __future__ import annotations

import os
from collections import defaultdict, deque
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
from datatrove.data import Document, DocumentsPipeline
from datatrove.pipeline.base import PipelineStep
from datatrove.pipeline.dedup.minhash import MinhashConfig, MinhashDedupSignature
from datatrove.utils.hashing import HashConfig

from longctx.core.atomic import write_table
from longctx.pipeline.config import FileDedupConfig
from longctx.pipeline.dedup_inputs import read_minhash_pairs, read_rank_index
from longctx.pipeline.file_decisions import FILE_DECISIONS_SCHEMA
from longctx.pipeline.keep import file_rank
from longctx.pipeline.provenance import ELSEWHERE, declarations, provenance
from longctx.pipeline.readers.code import CodeRepoReader, scan_repo
from longctx.pipeline.readers.listing import Tree, assign_by_size
from longctx.pipeline.signatures import RegexWordTokenizer, exact_hash, minima_of_sets, shingle_sets

BATCH_CHARS = 1 << 22
"""Characters of files whose signatures are computed together (bounds the batch's arrays)."""

FILE_INDEX_SCHEMA = pa.schema(
    [
        ("idx", pa.int64()),
        ("repo", pa.string()),
        ("path", pa.string()),
        ("location", pa.string()),
        ("chars", pa.int64()),
        ("provenance", pa.int8()),  # 0: the declared upstream ... 3: a copy with rewritten imports
        ("text_hash", pa.string()),
        ("ngrams", pa.int64()),  # distinct word n-grams; 0 when too short for MinHash
        ("signature", pa.list_(pa.uint32())),  # empty when too short for MinHash
    ]
)


def minhash_config(cfg: FileDedupConfig) -> MinhashConfig:
    """datatrove's MinHash settings for files (32-bit hashes: a signature is 4 bytes per hash)."""
    mh = cfg.minhash
    return MinhashConfig(
        n_grams=mh.n_grams,
        num_buckets=mh.num_buckets,
        hashes_per_bucket=mh.hashes_per_bucket,
        seed=mh.seed,
        hash_config=HashConfig(precision=32),
    )


class RepositoryFiles(PipelineStep):
    """Every file each repository's document would keep, as a document of its own (``id``:
    ``{repository id}/{path}``; metadata ``repo``, ``rel``, ``location`` and ``provenance``: whether
    the repository is the file's upstream, :func:`~longctx.pipeline.provenance.provenance`).
    Repositories are listed and shared among tasks exactly as the ``readers`` (code sources) will
    read them."""

    type = "📖 - READER"
    name = "🗂️ Repository files"

    def __init__(self, readers: Sequence[CodeRepoReader]) -> None:
        super().__init__()
        self.readers = list(readers)

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        if data:
            yield from data
        for reader in self.readers:
            units, entries = reader.list_units()
            owners = assign_by_size([u.size for u in units], world_size)
            for unit, owner in zip(units, owners):
                if owner != rank or unit.skip or not unit.is_dir:
                    continue
                prefix = unit.path + "/"
                tree = Tree(reader.data_folder, unit.path, [e for e in entries if e.path.startswith(prefix)])
                texts, _ = scan_repo(tree, reader.max_file_bytes, reader.vendored)
                repo = reader.doc_id(unit.path)
                declared = declarations(tree)
                for rel, text in texts.items():
                    self.stat_update("files")
                    yield Document(
                        text=text,
                        id=f"{repo}/{rel}",
                        metadata={
                            "repo": repo,
                            "rel": rel,
                            "location": tree.url(rel),
                            "provenance": provenance(rel, text, tree, declared),
                        },
                    )


class FileSignatureIndex(MinhashDedupSignature):
    """datatrove's MinHash stage 1 over repository files, which also records every file's exact
    hash, distinct n-gram count and full signature in ``{index_folder}/{rank}.parquet`` (row ``idx``
    is the position datatrove's candidate pairs refer to). Files of fewer than ``min_words`` words
    get no signature: they are only compared exactly."""

    name = "🎯 File signatures"

    def __init__(
        self, output_folder: str | os.PathLike, index_folder: str | os.PathLike, cfg: FileDedupConfig
    ) -> None:
        super().__init__(str(output_folder), config=minhash_config(cfg), language=RegexWordTokenizer())
        self.index_folder = Path(index_folder)
        self.min_words = cfg.min_words
        self._ngrams = 0
        self._signature: list[int] = []
        self._computed: deque[tuple[int, np.ndarray | None]] = deque()

    def get_shingles(self, text: str) -> np.ndarray:
        """The file's permuted minima as a (1, num_hashes) array (empty below ``min_words``): computed
        for a batch of files before datatrove's loop asks for them (:meth:`_recording`), in order."""
        self._ngrams, minima = self._computed.popleft()
        return np.empty((0, 1), np.uint64) if minima is None else minima.reshape(1, -1)

    def get_signature(self, shingles: np.ndarray) -> list[list[int]]:
        mins = shingles.reshape(-1).astype(self.config.hash_config.np_dtype)
        self._signature = mins.tolist()
        return mins.reshape(self.config.num_buckets, -1).tolist()

    def _compute(self, docs: list[Document]) -> None:
        """Distinct n-gram counts and minima of a batch of files, from
        :func:`~longctx.pipeline.signatures.shingle_sets` and
        :func:`~longctx.pipeline.signatures.minima_of_sets`: datatrove's shingles and minima, at array
        speed over many files at once. Files of fewer than ``min_words`` words get none."""
        sets = shingle_sets([doc.text for doc in docs], self.config)
        short = [count + self.config.n_grams - 1 < self.min_words if count else True for count, _ in sets]
        minima = minima_of_sets(
            [np.empty(0, np.uint64) if s else u for s, (_, u) in zip(short, sets)], self.config
        )
        self._computed.extend(
            (0, None) if s else (int(u.size), m) for s, (_, u), m in zip(short, sets, minima)
        )

    def _batches(self, data: DocumentsPipeline) -> Iterator[Document]:
        """The files in order, each batch of about :data:`BATCH_CHARS` characters hashed before its
        first file is passed on."""
        batch: list[Document] = []
        chars = 0
        for doc in data:
            batch.append(doc)
            chars += len(doc.text)
            if chars >= BATCH_CHARS:
                self._compute(batch)
                yield from batch
                batch, chars = [], 0
        if batch:
            self._compute(batch)
            yield from batch

    def _recording(self, data: DocumentsPipeline, rows: dict[str, list]) -> Iterator[Document]:
        """Pass documents to datatrove's signature loop, recording each one once it was hashed."""
        pending: Document | None = None

        def record(doc: Document) -> None:
            rows["idx"].append(len(rows["idx"]))
            rows["repo"].append(doc.metadata["repo"])
            rows["path"].append(doc.metadata["rel"])
            rows["location"].append(doc.metadata["location"])
            rows["chars"].append(len(doc.text))
            rows["provenance"].append(int(doc.metadata.get("provenance", ELSEWHERE)))
            rows["text_hash"].append(exact_hash(doc.text))
            rows["ngrams"].append(self._ngrams)
            rows["signature"].append(self._signature if self._ngrams else [])

        for doc in self._batches(data):
            if pending is not None:
                record(pending)
            self._ngrams, self._signature = 0, []
            pending = doc
            yield doc
        if pending is not None:
            record(pending)

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> None:
        rows: dict[str, list] = {name: [] for name in FILE_INDEX_SCHEMA.names}
        super().run(self._recording(data, rows), rank, world_size)
        write_table(self.index_folder / f"{rank:05d}.parquet", pa.table(rows, schema=FILE_INDEX_SCHEMA))


def similarity(sig_a: np.ndarray, sig_b: np.ndarray, size_a: int, size_b: int) -> tuple[float, float]:
    """The Jaccard similarity of two n-gram sets estimated from their MinHash signatures, and the
    share of the first set that lies in the second (containment of A in B), from the sets' sizes:
    ``|A & B| = J (|A| + |B|) / (1 + J)``."""
    jaccard = float(np.mean(sig_a == sig_b))
    common = jaccard * (size_a + size_b) / (1.0 + jaccard)
    return jaccard, min(1.0, common / max(1, size_a))


def resolve_file_duplicates(
    index: pa.Table, pairs: list[tuple[int, int, int, int]], cfg: FileDedupConfig
) -> pa.Table:
    """Decide which files are copies of a kept file of another repository (see the module docstring).

    ``index`` is the file index of every rank with a ``rank`` column; ``pairs`` are datatrove's
    candidate pairs ``(rank1, idx1, rank2, idx2)``. Files connected by a verified pair or by the same
    exact hash form groups; in each group, in keep-policy order, a file is kept unless a file already
    kept in another repository is an exact or verified near copy of it.
    """
    n = index.num_rows
    repos = index.column("repo").to_pylist()
    paths = index.column("path").to_pylist()
    hashes = index.column("text_hash").to_pylist()
    ngrams = index.column("ngrams").to_pylist()
    signatures = index.column("signature").to_pylist()
    where = {
        (r, i): k
        for k, (r, i) in enumerate(zip(index.column("rank").to_pylist(), index.column("idx").to_pylist()))
    }
    ranks = [
        file_rank(cfg.keep, repo=repo, rel=rel, location=loc, chars=chars, provenance=level)
        for repo, rel, loc, chars, level in zip(
            repos,
            paths,
            index.column("location").to_pylist(),
            index.column("chars").to_pylist(),
            index.column("provenance").to_pylist(),
        )
    ]
    parent = list(range(n))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def duplicate(a: int, b: int) -> tuple[str, float, float] | None:
        """Whether file ``a`` is a copy of file ``b``: the same text, or a near copy (similar, or
        mostly contained in ``b``)."""
        if hashes[a] == hashes[b]:
            return "exact_duplicate", 1.0, 1.0
        if not ngrams[a] or not ngrams[b]:
            return None
        jaccard, containment = similarity(
            np.asarray(signatures[a]), np.asarray(signatures[b]), ngrams[a], ngrams[b]
        )
        if jaccard >= cfg.jaccard or containment >= cfg.containment:
            return "near_duplicate", jaccard, containment
        return None

    by_hash: dict[str, int] = {}
    for k, text_hash in enumerate(hashes):
        if text_hash in by_hash:
            parent[find(k)] = find(by_hash[text_hash])
        else:
            by_hash[text_hash] = k
    for r1, i1, r2, i2 in pairs:
        a, b = where.get((r1, i1)), where.get((r2, i2))
        if a is None or b is None:
            raise RuntimeError(
                f"file MinHash pair ({r1},{i1})-({r2},{i2}) names a file missing from the file index"
            )
        if repos[a] != repos[b] and (duplicate(a, b) or duplicate(b, a)):
            parent[find(a)] = find(b)
    groups: dict[int, list[int]] = defaultdict(list)
    for k in range(n):
        groups[find(k)].append(k)
    rows: dict[str, list] = {name: [] for name in FILE_DECISIONS_SCHEMA.names}
    for members in groups.values():
        if len({repos[k] for k in members}) < 2:
            continue
        kept: list[int] = []
        for k in sorted(members, key=lambda m: ranks[m]):
            found = next(((o, d) for o in kept if repos[o] != repos[k] and (d := duplicate(k, o))), None)
            if found is None:
                kept.append(k)
                continue
            origin, (kind, jaccard, containment) = found
            for name, value in zip(
                FILE_DECISIONS_SCHEMA.names,
                (
                    repos[k],
                    paths[k],
                    repos[origin],
                    paths[origin],
                    kind,
                    round(jaccard, 4),
                    round(containment, 4),
                ),
            ):
                rows[name].append(value)
    return pa.table(rows, schema=FILE_DECISIONS_SCHEMA).sort_by(
        [("repo", "ascending"), ("path", "ascending")]
    )


class FileDuplicateResolver(PipelineStep):
    """Single task: the file index of every rank and the candidate pairs -> ``file_decisions``."""

    type = "🫂 - DEDUP"
    name = "🔗 Resolve file duplicates"

    def __init__(
        self,
        index_folder: str | os.PathLike,
        dups_folder: str | os.PathLike,
        output_file: str | os.PathLike,
        cfg: FileDedupConfig,
    ) -> None:
        super().__init__()
        self.index_folder = Path(index_folder)
        self.dups_folder = Path(dups_folder)
        self.output_file = Path(output_file)
        self.cfg = cfg

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        if world_size != 1:
            raise ValueError("FileDuplicateResolver runs as a single task")
        index = read_rank_index(self.index_folder, FILE_INDEX_SCHEMA)
        pairs = read_minhash_pairs(self.dups_folder)
        decisions = resolve_file_duplicates(index, pairs, self.cfg)
        self.stat_update("duplicate_files", value=decisions.num_rows)
        write_table(self.output_file, decisions)
        if data:
            yield from data
