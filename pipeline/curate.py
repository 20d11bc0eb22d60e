"""The curation job: sources -> readable -> token length -> exact and near dedup -> Parquet + ledger.

Stages (each a datatrove executor; completed tasks are skipped when the job runs again):

1. ``read`` (N tasks): readers, input tally, unreadable and length filters, intermediate
   documents, dedup index and MinHash signatures.
2. ``buckets`` (one task per MinHash bucket): datatrove's LSH candidate pairs.
3. ``resolve`` (1 task): exact-hash and MinHash pairs -> which document duplicates which.
4. ``write`` (N tasks): duplicate filter, curated documents per source, kept rows of the ledger.
5. ``finalize`` (1 task): merged ledger checked against the inputs, stats and figure.
6. ``synthetic`` (1 task, when ``curate.synthetic`` is set): needle and variable-tracking tasks
   built over the kept documents, written as one more source for the packer to mix.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from datatrove.data import DocumentsPipeline
from datatrove.pipeline.base import PipelineStep
from datatrove.pipeline.dedup.minhash import MinhashConfig, MinhashDedupBuckets

from longctx.core.atomic import atomic_path, write_json, write_table
from longctx.core.config import ContextConfig, TokenizerConfig
from longctx.core.errors import ConfigError
from longctx.core.executors import Stage, concurrent_tasks, run_stages
from longctx.core.layout import RunLayout
from longctx.core.progress import stderr_to_file
from longctx.core.run_record import check_same_run, config_hash
from longctx.core.tokenizer import load_tokenizer, tokenizer_fingerprint
from longctx.pipeline.config import CurateConfig, SourceConfig
from longctx.pipeline.dedup import DedupIndex, DuplicateFilter, DuplicateResolver
from longctx.pipeline.docstore import DocumentWriter, RankDocumentReader, StageDocumentWriter
from longctx.pipeline.filters import ReadableFilter, TokenLengthFilter
from longctx.pipeline.ledger import InputTally, LedgerWriter, merge_ledger
from longctx.pipeline.signatures import MinhashSignature
from longctx.pipeline.stats import plot_summary, summarize_ledger

INPUT_SUBFOLDERS = ("books", "papers", "code")


def resolve_sources(curate: CurateConfig, layout: RunLayout) -> list[SourceConfig]:
    """The sources of a run: ``curate.input``'s ``books/``, ``papers/``, ``code/`` subfolders, then
    ``curate.sources``; the embedded default corpus when neither is given."""
    sources: list[SourceConfig] = []
    if curate.input is not None:
        found = [sub for sub in INPUT_SUBFOLDERS if (curate.input / sub).is_dir()]
        if not found:
            raise ConfigError(
                f"curate.input: {curate.input} has none of the subfolders {', '.join(INPUT_SUBFOLDERS)}"
            )
        sources += [SourceConfig(name=sub, kind=sub, path=curate.input / sub) for sub in found]
    sources += curate.sources
    if not sources:
        from longctx.pipeline.default_corpus import build_default_corpus

        sources = build_default_corpus(layout.default_corpus)
    names = [s.name for s in sources]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ConfigError(f"curate.sources: source names must be unique; repeated: {', '.join(repeated)}")
    return sources


def make_reader(source: SourceConfig, curate: CurateConfig) -> PipelineStep:
    """The datatrove reader step for one source."""
    if source.kind == "books":
        from longctx.pipeline.readers.books import BookFolderReader

        return BookFolderReader(
            source.path, source.name, source.strip_gutenberg, max_bytes=curate.max_book_bytes, limit=source.limit
        )
    if source.kind == "papers":
        from longctx.pipeline.readers.papers import PaperReader

        return PaperReader(source.path, source=source.name, limit=source.limit)
    if source.kind == "code":
        from longctx.pipeline.readers.code import CodeRepoReader

        return CodeRepoReader(source.path, source=source.name, max_file_bytes=curate.max_file_bytes, limit=source.limit)
    from longctx.pipeline.readers.tabular import make_tabular_reader

    return make_tabular_reader(
        source.kind, source.path, source.name, source.text_key, source.id_key, source.glob, source.limit
    )


def length_bounds(
    curate: CurateConfig, target: int, sources: list[SourceConfig]
) -> dict[str, tuple[int, int | None]]:
    """Per source ``(min_tokens, max_tokens)``: the source's own bounds, else at least
    ``min_fraction_of_target`` of the ``target`` context and no upper bound."""
    default_min = math.ceil(curate.min_fraction_of_target * target)
    return {
        s.name: (s.min_tokens if s.min_tokens is not None else default_min, s.max_tokens) for s in sources
    }


def prepare_tokenizer(
    tokenizer: TokenizerConfig, curate: CurateConfig, layout: RunLayout, sources: list[SourceConfig]
) -> Path:
    """Put the run's tokenizer at ``<output>/tokenizer.json``: a copy of ``tokenizer.path``, or a
    byte-level BPE trained on a sample of every source (kept across reruns)."""
    if tokenizer.path is not None:
        load_tokenizer(tokenizer.path)  # fail early on a malformed file
        if not layout.tokenizer.exists() or layout.tokenizer.read_bytes() != tokenizer.path.read_bytes():
            with atomic_path(layout.tokenizer) as tmp:
                shutil.copyfile(tokenizer.path, tmp)
        return layout.tokenizer
    if not layout.tokenizer.exists():
        from longctx.pipeline.bpe import train_bpe

        print(f"training a {tokenizer.train_vocab_size}-token byte-level BPE on a sample of the input ...", flush=True)
        train_bpe(
            _sample_texts(sources, curate, tokenizer.train_sample_bytes), tokenizer.train_vocab_size, layout.tokenizer
        )
    return layout.tokenizer


def _sample_texts(sources: list[SourceConfig], curate: CurateConfig, budget: int) -> Iterator[str]:
    """Up to ``budget / len(sources)`` characters of readable text from each source, in pieces."""
    per_source = budget // max(1, len(sources))
    for source in sources:
        taken = 0
        for doc in make_reader(source, curate).run(None, 0, 1):
            if doc.metadata.get("skip_reason"):
                continue
            piece = doc.text[: per_source - taken]
            for start in range(0, len(piece), 100_000):
                yield piece[start : start + 100_000]
            taken += len(piece)
            if taken >= per_source:
                break


class FinalizeCuration(PipelineStep):
    """Single task: merged ledger (checked against the inputs), ``stats.json`` and ``stats.png``."""

    type = "🧾 - LEDGER"
    name = "🏁 Finalize"

    def __init__(self, layout: RunLayout, run_info: dict[str, Any]) -> None:
        super().__init__()
        self.layout = layout
        self.run_info = run_info

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        ledger = merge_ledger(self.layout.work / "ledger", self.layout.work / "inputs")
        write_table(self.layout.ledger, ledger)
        summary = summarize_ledger(ledger) | {"run": self.run_info}
        write_json(self.layout.stats, summary)
        plot_summary(summary, self.layout.plot)
        if data:
            yield from data


def run_fingerprint(
    curate: CurateConfig, target: int, sources: list[SourceConfig], tokenizer_path: Path
) -> dict[str, Any]:
    """What determines the output: resolved sources, bounds, dedup settings, tokenizer, task count."""
    return {
        "sources": [json.loads(s.model_dump_json()) for s in sources],
        "bounds": {k: list(v) for k, v in length_bounds(curate, target, sources).items()},
        "dedup": json.loads(curate.dedup.model_dump_json()),
        "synthetic": json.loads(curate.synthetic.model_dump_json()) if curate.synthetic else None,
        "max_file_bytes": curate.max_file_bytes,
        "max_book_bytes": curate.max_book_bytes,
        "tasks": curate.executor.tasks,
        "tokenizer_sha256": tokenizer_fingerprint(tokenizer_path),
    }


def build_stages(
    curate: CurateConfig,
    layout: RunLayout,
    sources: list[SourceConfig],
    tokenizer_path: Path,
    run_info: dict[str, Any],
    *,
    target: int,
) -> list[Stage]:
    """The job's stages in order, as ``(name, pipeline, tasks)``. ``target`` is the context length the
    run extends to: the default lower length bound and the synthetic prompt length follow from it."""
    work = layout.work
    tokenizer_sha256 = tokenizer_fingerprint(tokenizer_path)  # recorded with the stored token ids
    mh = curate.dedup.minhash
    minhash = MinhashConfig(
        n_grams=mh.n_grams, num_buckets=mh.num_buckets, hashes_per_bucket=mh.hashes_per_bucket, seed=mh.seed
    )
    read: list[PipelineStep] = [make_reader(s, curate) for s in sources]
    read += [
        InputTally(work / "inputs"),
        ReadableFilter(exclusion_writer=LedgerWriter(work / "ledger" / "unreadable", "filtered")),
        TokenLengthFilter(
            tokenizer_path,
            length_bounds(curate, target, sources),
            exclusion_writer=LedgerWriter(work / "ledger" / "length", "filtered"),
            concurrent_tasks=concurrent_tasks(curate.executor, curate.executor.tasks),
        ),
        StageDocumentWriter(work / "filtered"),
        DedupIndex(work / "dedup" / "index"),
    ]
    if mh.enabled:
        read.append(MinhashSignature(work / "dedup" / "sigs", config=minhash))
    tasks = curate.executor.tasks
    stages: list[Stage] = [("read", read, tasks)]
    if mh.enabled:
        buckets = MinhashDedupBuckets(str(work / "dedup" / "sigs"), str(work / "dedup" / "buckets"), config=minhash)
        stages.append(("buckets", [buckets], mh.num_buckets))
    dups_folder = work / "dedup" / "buckets" if mh.enabled else None
    resolver = DuplicateResolver(
        work / "dedup" / "index", dups_folder, work / "dedup" / "decisions.parquet", curate.dedup.exact
    )
    stages.append(("resolve", [resolver], 1))
    write: list[PipelineStep] = [
        RankDocumentReader(work / "filtered"),
        DuplicateFilter(
            work / "dedup" / "decisions.parquet",
            exclusion_writer=LedgerWriter(work / "ledger" / "duplicate", "duplicate"),
        ),
        DocumentWriter(layout.documents, "${source}/${rank}.parquet", tokenizer_sha256=tokenizer_sha256),
        LedgerWriter(work / "ledger" / "kept", "kept"),
    ]
    stages.append(("write", write, tasks))
    stages.append(("finalize", [FinalizeCuration(layout, run_info)], 1))
    if curate.synthetic is not None:
        from longctx.pipeline.synthetic.stage import synthetic_pipeline, synthetic_tasks

        step = synthetic_tasks(curate.synthetic, tokenizer_path, target)
        stages.append(("synthetic", synthetic_pipeline(layout.root, step), 1))
    return stages


def run_curation(
    curate: CurateConfig,
    *,
    context: ContextConfig,
    tokenizer: TokenizerConfig,
    output: Path,
    verbose: bool = False,
) -> dict[str, Any] | None:
    """Run (or resume) curation into the run folder ``output``.

    Returns the summary written to ``stats.json`` once the stages have run (local and Ray executors);
    None when they were submitted to Slurm.
    """
    layout = RunLayout(output, "curate")
    sources = resolve_sources(curate, layout)
    with contextlib.nullcontext() if verbose else stderr_to_file(layout.console_log):
        tokenizer_path = prepare_tokenizer(tokenizer, curate, layout, sources)
    fingerprint = run_fingerprint(curate, context.target, sources, tokenizer_path)
    check_same_run(layout, fingerprint, layout.root, fresh=False)
    run_info = {
        "config_hash": config_hash(fingerprint)[:16],
        "tokenizer_sha256": fingerprint["tokenizer_sha256"],
        "context": {"original": context.original, "target": context.target},
        "bounds": fingerprint["bounds"],
        "minhash_threshold": round(curate.dedup.minhash.threshold, 3) if curate.dedup.minhash.enabled else None,
    }
    stages = build_stages(curate, layout, sources, tokenizer_path, run_info, target=context.target)
    if not run_stages(curate.executor, stages, layout.work, "curate", verbose):
        return None
    return json.loads(layout.stats.read_text(encoding="utf-8"))
