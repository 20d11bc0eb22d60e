"""The model-free long-range dependency score of a curated document, and the stages that compute it
and filter by it.

A document teaches long context when its distant parts depend on each other: a book whose last
chapter needs its first, a repository whose modules use each other's names, as opposed to a long
aggregate of unrelated pieces. ProLong-data (Chen et al. 2024, "Long Context is Not Long at All")
measures this with a language model: how much a distant earlier segment lowers the loss of a later
one (``curate.dependency.model``, another module). LongWanjuan (Lv et al. 2024) separates holistic
long texts from aggregated ones with statistical measures of how much the parts of a text share.
This score takes the second road with the first one's framing, at almost no cost: it counts the
token n-grams that distant segments of a document share, against what segments of unrelated
documents share by chance.

**The score**, from the document's token ids (stored by the length filter, so nothing is tokenized
again):

1. *Segments.* The ids are cut into segments of :data:`SEGMENT_TOKENS` (512) tokens; a tail shorter
   than a segment is left out. A segment is the set of its token trigrams (:data:`NGRAM`; each
   trigram starts in the segment, hashed to 56 bits).
2. *Similarity* of two segments: the Jaccard index of their sets, ``|A & B| / |A | B|``.
3. *Near and far.* ``near`` is the mean similarity of adjacent segments; ``far`` that of segment
   pairs a quarter to three quarters of the document apart (distances of 2/8 ... 6/8 of the segment
   count, :data:`FAR_DISTANCES`, at most :data:`PAIRS_PER_DISTANCE` evenly spaced pairs at each).
   Distances are relative to the document's length and both are means over pairs, so that the score
   does not grow or shrink with the length itself (ProLong-data likewise measures distance as a
   fraction of the document).
4. *Chance*, the ``background``: the mean similarity between segments of *different* documents of
   the same source (:data:`BACKGROUND_SEGMENTS` segments of each of at most
   :data:`BACKGROUND_DOCUMENTS` documents, chosen by a hash of their id; duplicates left out). This
   is what two segments share through their language alone: function words, a programming
   language's keywords and idioms. A source with fewer than two scored documents is measured
   against the documents of all sources; a run with fewer than two, against nothing (0).
5. ``dependency = (far - background) / max(near - background, background)``: **0 when distant
   segments share no more than segments of unrelated documents**, 1 when they share as much as
   adjacent segments do, negative below chance. The denominator is the document's own local
   sharing above chance, so that a terse text and a repetitive one are measured on their own scale;
   it is at least the background, so that a text whose adjacent segments share hardly more than
   chance is not amplified into an extreme score.

A document of fewer than :data:`MIN_SEGMENTS` segments (4,096 tokens) has no score (null): too few
segment pairs at a distance to measure. Measured on the shared corpus' books (``bench_dependency.py``),
novels score 0.1-0.7 and the same books with their chapters dealt out at random across books about 0.

**What it does not see.** Order: the similarity is symmetric, so a repository in dependency order
and the same files in a random order score within noise of each other (the model score sees which
file comes first). Meaning beyond repeated tokens: a paraphrase shares no trigram. And repetition:
a document made of one passage repeated scores about 1, as a perfectly holistic one would;
ProLong-data's "dependency specificity" term addresses this for its model score, and deduplication
does not catch repetition inside one document.

**Cost.** The ids are hashed and sorted :data:`BLOCK_SEGMENTS` segments at a time, a trigram's hash
and its segment's number in one 64-bit key, so that a trigram two adjacent segments share is two
neighbouring keys; the few segments the distant pairs need are kept and intersected. Memory is a few
arrays of one block, whatever the document's length; the CPU, about 2% of the tokenizer's per
megabyte (``tests/benchmarks/bench_curate.py``, ``bench_dependency.py``).

**Stages.** :class:`DependencyScorer`, in curation's ``read`` stage after the length filter, records
``near``, ``far`` and the segment count of each document (``<folder>/sharing/<rank>.parquet``) and the
segments of its candidates for the background (``<folder>/background/<rank>.parquet``).
:class:`DependencySelection`, after the duplicate resolver in curation's single-task ``resolve``
stage, measures each source's background, scores every document, applies
``curate.dependency.filters`` and writes
``<folder>/scores.parquet`` (id, source, ``dependency``, ``dependency_model``, the filter's reason) and
``<folder>/background.json``. The ``write`` stage stores the scores as columns beside each kept
document's text and in every ledger row, and records the documents the filters dropped.

The model score, where ``curate.dependency.model`` computes one, is read from the stage files'
``dependency_model`` column (document metadata ``dependency_model``, set before the stage files are
written); the filters use it where present, else the model-free ``dependency``.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from datatrove.data import DocumentsPipeline
from datatrove.pipeline.base import PipelineStep

from longctx.core.atomic import write_json, write_table
from longctx.pipeline.dedup import read_decisions
from longctx.pipeline.parquet import read_parquet

SEGMENT_TOKENS = 512
"""Tokens per segment."""
NGRAM = 3
"""Tokens per n-gram: trigrams of subword tokens are about a word or two, specific enough that
unrelated English text shares a fraction of a percent of them per segment, common enough that a name
or a phrase repeated far away is one."""
MIN_SEGMENTS = 8
"""Documents with fewer segments get no score."""
FAR_DISTANCES = (2, 3, 4, 5, 6)
"""Distances of the ``far`` pairs, in eighths of the document's segment count."""
PAIRS_PER_DISTANCE = 16
"""At most this many pairs (evenly spaced along the document) at each far distance."""
BLOCK_SEGMENTS = 64
"""Segments hashed and sorted at a time (32K tokens): memory stays bounded whatever the document's
length, and each block's keys fit a core's cache."""
ROW_BITS = 8
"""Low bits of a key that hold the segment's number within its block (a block and the next block's
first segment); the other 56 hold the trigram's hash. Two different trigrams of one block share a
hash with probability about ``k**2 / 2**57`` for ``k`` trigrams: never, in practice."""
BACKGROUND_DOCUMENTS = 64
"""Documents per source whose segments measure the chance similarity."""
BACKGROUND_SEGMENTS = 4
"""Segments of each background document (evenly spaced)."""
BACKGROUND_PAIRS = 4096
"""Segment pairs of different documents averaged for the background (evenly spaced among all)."""
REASONS = ("low_dependency", "not_top_dependency")
"""Ledger reasons of the documents the filters drop: below ``min_dependency``; outside the
``keep_top_fraction`` best of the source."""

_MIX = [
    np.uint64(x) for x in (0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xFF51AFD7ED558CCD)
]
_ROW_MASK = np.uint64((1 << ROW_BITS) - 1)
_HASH_MASK = ~_ROW_MASK

SHARING_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("source", pa.string()),
        ("segments", pa.int64()),
        ("near", pa.float64()),
        ("far", pa.float64()),
    ]
)
BACKGROUND_SCHEMA = pa.schema(
    [
        ("source", pa.string()),
        ("order", pa.uint64()),
        ("id", pa.string()),
        ("hashes", pa.large_list(pa.uint64())),
    ]
)
SCORES_SCHEMA = pa.schema(
    [
        ("id", pa.string()),
        ("source", pa.string()),
        ("dependency", pa.float64()),
        ("dependency_model", pa.float64()),
        ("reason", pa.string()),
    ]
)


@dataclass(frozen=True)
class Sharing:
    """What a document's segments share: their count, the mean Jaccard similarity of adjacent
    segments (``near``) and of segments a quarter to three quarters of the document apart (``far``)."""

    segments: int
    near: float
    far: float


def block_keys(ids: np.ndarray, first: int, stop: int, total: int) -> np.ndarray:
    """The sorted distinct keys of segments ``first`` to ``stop - 1`` of a document of ``total``
    segments: a trigram's hash in the high bits, its segment's number counted from ``first`` in the
    low :data:`ROW_BITS`. A segment's trigrams are those that start in it (the document's last
    segment has :data:`NGRAM` - 1 fewer)."""
    end = min(stop * SEGMENT_TOKENS + NGRAM - 1, total * SEGMENT_TOKENS)
    x = np.asarray(ids[first * SEGMENT_TOKENS : end], dtype=np.uint64)
    n = len(x) - NGRAM + 1
    h = x[:n] * _MIX[0]
    for k in range(1, NGRAM):
        h += x[k : k + n] * _MIX[k]
    h ^= h >> np.uint64(31)
    h *= _MIX[3]
    h ^= h >> np.uint64(29)
    keys = (h & _HASH_MASK) | (np.arange(n, dtype=np.uint64) // np.uint64(SEGMENT_TOKENS))
    keys.sort()
    distinct = np.empty(len(keys), dtype=bool)
    distinct[:1] = True
    np.not_equal(keys[1:], keys[:-1], out=distinct[1:])
    return keys[distinct]


def _jaccard(shared: np.ndarray, size_a: np.ndarray, size_b: np.ndarray) -> np.ndarray:
    union = size_a + size_b - shared
    return np.divide(shared, union, out=np.zeros(len(shared)), where=union > 0)


def far_pairs(segments: int) -> list[tuple[int, np.ndarray]]:
    """The ``far`` pairs of a document of ``segments`` segments: ``(distance, first segments)`` for
    each distance of :data:`FAR_DISTANCES` (at least 2: distance 1 is ``near``), with at most
    :data:`PAIRS_PER_DISTANCE` first segments evenly spaced among those that have a partner."""
    pairs = []
    for distance in sorted({max(2, round(eighths * segments / 8)) for eighths in FAR_DISTANCES}):
        starts = segments - distance
        if starts <= 0:
            continue
        firsts = np.unique(
            np.linspace(0, starts - 1, min(PAIRS_PER_DISTANCE, starts)).round().astype(np.int64)
        )
        pairs.append((distance, firsts))
    return pairs


def spread(count: int, segments: int) -> list[int]:
    """``count`` segments evenly spaced along a document of ``segments`` (fewer if it is shorter)."""
    return sorted({round(x) for x in np.linspace(0, segments - 1, min(count, segments))})


def scan_segments(ids: np.ndarray, segments: int, kept: set[int]) -> tuple[np.ndarray, np.ndarray, dict]:
    """One pass over a document's first ``segments`` segments, :data:`BLOCK_SEGMENTS` at a time:
    each segment's count of distinct trigrams, the trigrams each shares with the next (a trigram in
    segments ``r`` and ``r + 1`` is two neighbouring keys), and the sorted distinct trigram hashes of
    the segments in ``kept``."""
    sizes = np.zeros(segments, dtype=np.int64)
    shared = np.zeros(max(0, segments - 1), dtype=np.int64)
    sets: dict[int, np.ndarray] = {}
    for first in range(0, segments, BLOCK_SEGMENTS):
        stop = min(segments, first + BLOCK_SEGMENTS + 1)  # and the next block's first segment
        keys = block_keys(ids, first, stop, segments)
        rows = (keys & _ROW_MASK).astype(np.int64)
        hashes = keys >> np.uint64(ROW_BITS)
        sizes[first:stop] = np.bincount(rows, minlength=stop - first)
        step = (hashes[1:] == hashes[:-1]) & (rows[1:] == rows[:-1] + 1)
        shared[first : stop - 1] = np.bincount(rows[:-1][step], minlength=stop - first - 1)
        wanted = sorted(kept.intersection(range(first, stop)))
        if wanted:  # each segment's hashes, still sorted: a stable sort by segment of the sorted keys
            grouped = hashes[np.argsort(rows.astype(np.uint8), kind="stable")]  # a radix sort
            offsets = np.concatenate(([0], np.cumsum(sizes[first:stop])))
            for row in wanted:
                sets[row] = grouped[offsets[row - first] : offsets[row - first + 1]]
    return sizes, shared, sets


def document_sharing(
    ids: np.ndarray | None, background: bool = False
) -> tuple[Sharing | None, list[np.ndarray]]:
    """:class:`Sharing` of a document's token ids (None with fewer than :data:`MIN_SEGMENTS`
    segments) and, with ``background``, the trigram hashes of :data:`BACKGROUND_SEGMENTS` evenly
    spaced segments of a scored document (for :func:`background_similarity`)."""
    segments = 0 if ids is None else len(ids) // SEGMENT_TOKENS
    if segments < MIN_SEGMENTS:
        return None, []
    pairs = far_pairs(segments)
    picked = spread(BACKGROUND_SEGMENTS, segments) if background else []
    ends = {int(r) for distance, firsts in pairs for r in (*firsts, *(firsts + distance))}
    sizes, shared, sets = scan_segments(ids, segments, ends | set(picked))
    near = float(_jaccard(shared, sizes[:-1], sizes[1:]).mean())
    similarities = [
        _jaccard(
            np.array(
                [len(np.intersect1d(sets[r], sets[r + d], assume_unique=True)) for r in firsts.tolist()]
            ),
            sizes[firsts],
            sizes[firsts + d],
        )
        for d, firsts in pairs
    ]
    far = float(np.concatenate(similarities).mean())
    return Sharing(segments, near, far), [sets[r] for r in picked]


def segment_sharing(ids: np.ndarray | None) -> Sharing | None:
    """:class:`Sharing` of a document's token ids; None with fewer than :data:`MIN_SEGMENTS` segments."""
    return document_sharing(ids)[0]


def background_similarity(documents: list[list[np.ndarray]]) -> float:
    """Mean Jaccard similarity of segments of different documents (each a list of sorted distinct
    hash arrays): over every such pair, or :data:`BACKGROUND_PAIRS` evenly spaced among them. 0 for
    fewer than two documents."""
    owner = [d for d, segs in enumerate(documents) for _ in segs]
    flat = [seg for segs in documents for seg in segs]
    first, second = np.triu_indices(len(flat), k=1)
    different = np.asarray(owner)[first] != np.asarray(owner)[second] if flat else np.empty(0, bool)
    first, second = first[different], second[different]
    if len(first) == 0:
        return 0.0
    if len(first) > BACKGROUND_PAIRS:
        pick = np.linspace(0, len(first) - 1, BACKGROUND_PAIRS).round().astype(np.int64)
        first, second = first[pick], second[pick]
    total = 0.0
    for a, b in zip(first.tolist(), second.tolist()):
        shared = len(np.intersect1d(flat[a], flat[b], assume_unique=True))
        union = len(flat[a]) + len(flat[b]) - shared
        total += shared / union if union else 0.0
    return total / len(first)


def dependency_score(sharing: Sharing, background: float) -> float:
    """``(far - background) / max(near - background, background)``; 0 when that is 0 / 0."""
    scale = max(sharing.near - background, background)
    return (sharing.far - background) / scale if scale > 0 else 0.0


def id_order(doc_id: str) -> int:
    """A document's place in the background sample (smallest first): a hash of its id, so that the
    sample is the same whatever the tasks and their order."""
    return int.from_bytes(hashlib.blake2b(doc_id.encode("utf-8"), digest_size=8).digest(), "little")


class DependencyScorer(PipelineStep):
    """In the ``read`` stage, after the length filter: each document's :class:`Sharing` (from
    ``metadata["token_ids"]``) into ``<folder>/sharing/<rank>.parquet``, and the background segments
    of the :data:`BACKGROUND_DOCUMENTS` documents of each source that come first by :func:`id_order`
    into ``<folder>/background/<rank>.parquet``. Documents pass through unchanged."""

    type = "📊 - STATS"
    name = "🔗 Dependency (model-free)"

    def __init__(self, folder: str | os.PathLike) -> None:
        super().__init__()
        self.folder = Path(folder)

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        rows: dict[str, list] = {name: [] for name in SHARING_SCHEMA.names}
        sample: dict[str, list[tuple[int, str, list[np.ndarray]]]] = {}  # a max-heap by order, per source
        for doc in data:
            source = str(doc.metadata.get("source", ""))
            heap = sample.setdefault(source, [])
            order = id_order(doc.id)
            candidate = len(heap) < BACKGROUND_DOCUMENTS or -heap[0][0] > order
            with self.track_time():
                sharing, segments = document_sharing(doc.metadata.get("token_ids"), background=candidate)
            if sharing is None:
                self.stat_update("unscored")
                yield doc
                continue
            self.stat_update("scored")
            for name, value in zip(
                SHARING_SCHEMA.names, (doc.id, source, sharing.segments, sharing.near, sharing.far)
            ):
                rows[name].append(value)
            if candidate:
                entry = (-order, doc.id, segments)
                (heapq.heappush if len(heap) < BACKGROUND_DOCUMENTS else heapq.heapreplace)(heap, entry)
            yield doc
        write_table(self.folder / "sharing" / f"{rank:05d}.parquet", pa.table(rows, schema=SHARING_SCHEMA))
        background: dict[str, list] = {name: [] for name in BACKGROUND_SCHEMA.names}
        for source, heap in sorted(sample.items()):
            for negative, doc_id, segments in sorted(heap, reverse=True):
                for segment in segments:
                    for name, value in zip(BACKGROUND_SCHEMA.names, (source, -negative, doc_id, segment)):
                        background[name].append(value)
        write_table(
            self.folder / "background" / f"{rank:05d}.parquet", pa.table(background, schema=BACKGROUND_SCHEMA)
        )


def _read_folder(folder: Path, schema: pa.Schema) -> pa.Table:
    files = sorted(folder.glob("*.parquet")) if folder.is_dir() else []
    return pa.concat_tables([read_parquet(f, schema) for f in files]) if files else schema.empty_table()


def source_backgrounds(
    background: pa.Table, duplicates: set[str], sources: Iterable[str]
) -> dict[str, dict[str, Any]]:
    """The chance similarity of each of ``sources``, from the background candidates of every task
    (``background``, :data:`BACKGROUND_SCHEMA`): the :data:`BACKGROUND_DOCUMENTS` first by order that
    are not ``duplicates``. ``{source: {"similarity", "documents", "measured_on"}}``, ``measured_on``
    being ``"source"``, ``"all sources"`` (the source has fewer than two documents of its own: those
    of every source together) or ``"nothing"`` (the run has fewer than two; similarity 0)."""
    segments: dict[str, dict[tuple[int, str], list[np.ndarray]]] = {}
    columns = [background.column(name).to_pylist() for name in ("source", "order", "id")]
    hashes = background.column("hashes")
    for i, (source, order, doc_id) in enumerate(zip(*columns)):
        if doc_id not in duplicates:
            segments.setdefault(source, {}).setdefault((order, doc_id), []).append(
                np.asarray(hashes[i].values, dtype=np.uint64)
            )
    chosen = {s: [docs[k] for k in sorted(docs)[:BACKGROUND_DOCUMENTS]] for s, docs in segments.items()}
    pooled = [doc for s in sorted(chosen) for doc in chosen[s]]
    everywhere: dict[str, Any] | None = None
    result = {}
    for source in sorted(set(sources)):
        docs = chosen.get(source, [])
        if len(docs) >= 2:
            result[source] = {
                "similarity": background_similarity(docs),
                "documents": len(docs),
                "measured_on": "source",
            }
            continue
        if everywhere is None:
            everywhere = {
                "similarity": background_similarity(pooled),
                "documents": len(pooled) if len(pooled) >= 2 else 0,
                "measured_on": "all sources" if len(pooled) >= 2 else "nothing",
            }
        result[source] = everywhere
    return result


def read_model_scores(stage_folder: Path) -> dict[str, tuple[str, float]]:
    """The model scores the stage files hold (their ``dependency_model`` column; none where null):
    id -> (source, score)."""
    scores: dict[str, tuple[str, float]] = {}
    for path in sorted(stage_folder.glob("*.parquet")) if stage_folder.is_dir() else []:
        table = pq.ParquetFile(path).read(columns=["id", "source", "dependency_model"])
        columns = (table.column(c).to_pylist() for c in ("id", "source", "dependency_model"))
        for doc_id, source, value in zip(*columns):
            if value is not None:
                scores[doc_id] = (source, value)
    return scores


def select(
    scored: dict[str, tuple[str, float | None, float | None]],
    duplicates: set[str],
    filters: dict[str, tuple[float | None, float | None]],
) -> dict[str, str]:
    """The documents the filters drop, with their reason. ``scored``: id -> (source, model-free score,
    model score); a document is judged by its model score where it has one, else by the model-free
    one, and not at all without either. ``filters``: source -> (``min_dependency``,
    ``keep_top_fraction``). Duplicates are neither judged nor ranked. Below ``min_dependency``:
    ``low_dependency``; outside the ``ceil(keep_top_fraction * n)`` best of the source's ``n`` judged
    documents (ties: the smaller id first): ``not_top_dependency``."""
    by_source: dict[str, list[tuple[float, str]]] = {}
    for doc_id, (source, free, model) in scored.items():
        score = model if model is not None else free
        if score is not None and doc_id not in duplicates and source in filters:
            by_source.setdefault(source, []).append((score, doc_id))
    dropped: dict[str, str] = {}
    for source, judged in by_source.items():
        minimum, fraction = filters[source]
        top = None
        if fraction is not None:
            ranked = sorted(judged, key=lambda item: (-item[0], item[1]))
            top = {doc_id for _, doc_id in ranked[: math.ceil(fraction * len(ranked))]}
        for score, doc_id in judged:
            if minimum is not None and score < minimum:
                dropped[doc_id] = "low_dependency"
            elif top is not None and doc_id not in top:
                dropped[doc_id] = "not_top_dependency"
    return dropped


class DependencySelection(PipelineStep):
    """Single task, once duplicates are resolved (after the resolver in its stage, or in a stage
    after it): each source's background
    (:func:`source_backgrounds`), every document's ``dependency`` (:func:`dependency_score`) beside
    its ``dependency_model`` (from the stage files in ``stage_folder``, when given), and the filters'
    decisions (:func:`select`), into ``<folder>/scores.parquet`` (:data:`SCORES_SCHEMA`, ``reason``
    empty for a document the filters keep) and ``<folder>/background.json``."""

    type = "🔻 - FILTER"
    name = "🔗 Dependency filters"

    def __init__(
        self,
        folder: str | os.PathLike,
        decisions_file: str | os.PathLike,
        filters: dict[str, tuple[float | None, float | None]],
        stage_folder: str | os.PathLike | None = None,
    ) -> None:
        super().__init__()
        self.folder = Path(folder)
        self.decisions_file = Path(decisions_file)
        self.filters = dict(filters)
        self.stage_folder = Path(stage_folder) if stage_folder is not None else None

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        if world_size != 1:
            raise ValueError("DependencySelection runs as a single task")
        if data:  # the steps before it (the duplicate resolver) run first
            yield from data
        duplicates = set(read_decisions(self.decisions_file))
        sharing = _read_folder(self.folder / "sharing", SHARING_SCHEMA).to_pylist()
        backgrounds = source_backgrounds(
            _read_folder(self.folder / "background", BACKGROUND_SCHEMA),
            duplicates,
            {row["source"] for row in sharing},
        )
        scored: dict[str, tuple[str, float | None, float | None]] = {}
        for row in sharing:
            chance = backgrounds[row["source"]]["similarity"]
            free = dependency_score(Sharing(row["segments"], row["near"], row["far"]), chance)
            scored[row["id"]] = (row["source"], free, None)
        if self.stage_folder is not None:
            for doc_id, (source, model) in read_model_scores(self.stage_folder).items():
                scored[doc_id] = (source, scored.get(doc_id, (source, None, None))[1], model)
        dropped = select(scored, duplicates, self.filters)
        for reason in dropped.values():
            self.stat_update(reason)
        self.stat_update("scored", value=len(scored))
        table = {
            "id": list(scored),
            "source": [v[0] for v in scored.values()],
            "dependency": [v[1] for v in scored.values()],
            "dependency_model": [v[2] for v in scored.values()],
            "reason": [dropped.get(doc_id, "") for doc_id in scored],
        }
        write_table(self.folder / "scores.parquet", pa.table(table, schema=SCORES_SCHEMA).sort_by("id"))
        write_json(self.folder / "background.json", dict(sorted(backgrounds.items())))


def read_scores(scores_file: str | os.PathLike) -> dict[str, tuple[float | None, float | None, str]]:
    """:class:`DependencySelection`'s output: id -> (``dependency``, ``dependency_model``, reason)."""
    table = read_parquet(scores_file, SCORES_SCHEMA)
    columns = (table.column(c).to_pylist() for c in ("id", "dependency", "dependency_model", "reason"))
    return {doc_id: (free, model, reason) for doc_id, free, model, reason in zip(*columns)}


def read_backgrounds(folder: Path) -> dict[str, dict[str, Any]]:
    """The background of each source a run measured (``background.json``; empty when none)."""
    path = folder / "background.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
