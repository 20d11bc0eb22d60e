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
import hashlib
import json
import math
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from datatrove.data import DocumentsPipeline
from datatrove.pipeline.base import PipelineStep
from datatrove.pipeline.dedup.minhash import MinhashConfig, MinhashDedupBuckets

from pipeline.config import ConfigError, CurateConfig, RootConfig, SourceConfig
from pipeline.dedup import DedupIndex, DuplicateFilter, DuplicateResolver, LongDocMinhashSignature
from pipeline.docstore import DocumentWriter, RankDocumentReader
from pipeline.executors import Stage, run_stages
from pipeline.layout import RunLayout
from pipeline.filters import ReadableFilter, TokenLengthFilter
from pipeline.ledger import InputTally, LedgerWriter, merge_ledger, write_table_atomic
from pipeline.progress import stderr_to_file
from pipeline.stats import plot_summary, summarize_ledger, write_json_atomic

INPUT_SUBFOLDERS = ("books", "papers", "code")


def resolve_sources(cfg: RootConfig, layout: RunLayout) -> list[SourceConfig]:
    """The sources of a run: ``curate.input``'s ``books/``, ``papers/``, ``code/`` subfolders, then
    ``curate.sources``; the embedded default corpus when neither is given."""
    sources: list[SourceConfig] = []
    if cfg.curate.input is not None:
        found = [sub for sub in INPUT_SUBFOLDERS if (cfg.curate.input / sub).is_dir()]
        if not found:
            raise ConfigError(
                f"curate.input: {cfg.curate.input} has none of the subfolders {', '.join(INPUT_SUBFOLDERS)}"
            )
        sources += [SourceConfig(name=sub, kind=sub, path=cfg.curate.input / sub) for sub in found]
    sources += cfg.curate.sources
    if not sources:
        from pipeline.default_corpus import build_default_corpus

        sources = build_default_corpus(layout.default_corpus)
    names = [s.name for s in sources]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ConfigError(f"curate.sources: source names must be unique; repeated: {', '.join(repeated)}")
    return sources


def make_reader(source: SourceConfig, cfg: CurateConfig) -> PipelineStep:
    """The datatrove reader step for one source."""
    if source.kind == "books":
        from pipeline.readers.books import BookFolderReader

        return BookFolderReader(
            source.path, source.name, source.strip_gutenberg, max_bytes=cfg.max_book_bytes, limit=source.limit
        )
    if source.kind == "papers":
        from pipeline.readers.papers import PaperReader

        return PaperReader(source.path, source=source.name, limit=source.limit)
    if source.kind == "code":
        from pipeline.readers.code import CodeRepoReader

        return CodeRepoReader(source.path, source=source.name, max_file_bytes=cfg.max_file_bytes, limit=source.limit)
    from pipeline.readers.tabular import make_tabular_reader

    return make_tabular_reader(
        source.kind, source.path, source.name, source.text_key, source.id_key, source.glob, source.limit
    )


def length_bounds(cfg: RootConfig, sources: list[SourceConfig]) -> dict[str, tuple[int, int | None]]:
    """Per source ``(min_tokens, max_tokens)``: the source's own bounds, else at least
    ``min_fraction_of_target`` of the target context and no upper bound."""
    default_min = math.ceil(cfg.curate.min_fraction_of_target * cfg.context.target)
    return {
        s.name: (s.min_tokens if s.min_tokens is not None else default_min, s.max_tokens) for s in sources
    }


def prepare_tokenizer(cfg: RootConfig, layout: RunLayout, sources: list[SourceConfig]) -> Path:
    """Put the run's tokenizer at ``<output>/tokenizer.json``: a copy of ``tokenizer.path``, or a
    byte-level BPE trained on a sample of every source (kept across reruns)."""
    if cfg.tokenizer.path is not None:
        from pipeline.tokenizer import load_tokenizer

        load_tokenizer(cfg.tokenizer.path)  # fail early on a malformed file
        if not layout.tokenizer.exists() or layout.tokenizer.read_bytes() != cfg.tokenizer.path.read_bytes():
            layout.root.mkdir(parents=True, exist_ok=True)
            tmp = layout.tokenizer.with_name("tokenizer.json.tmp")
            shutil.copyfile(cfg.tokenizer.path, tmp)
            os.replace(tmp, layout.tokenizer)
        return layout.tokenizer
    if not layout.tokenizer.exists():
        from pipeline.tokenizer import train_bpe

        print(f"training a {cfg.tokenizer.train_vocab_size}-token byte-level BPE on a sample of the input ...", flush=True)
        train_bpe(
            _sample_texts(sources, cfg.curate, cfg.tokenizer.train_sample_bytes),
            cfg.tokenizer.train_vocab_size,
            layout.tokenizer,
        )
    return layout.tokenizer


def _sample_texts(sources: list[SourceConfig], cfg: CurateConfig, budget: int) -> Iterator[str]:
    """Up to ``budget / len(sources)`` characters of readable text from each source, in pieces."""
    per_source = budget // max(1, len(sources))
    for source in sources:
        taken = 0
        for doc in make_reader(source, cfg).run(None, 0, 1):
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
        write_table_atomic(ledger, self.layout.ledger)
        summary = summarize_ledger(ledger) | {"run": self.run_info}
        write_json_atomic(summary, self.layout.stats)
        plot_summary(summary, self.layout.plot)
        if data:
            yield from data


def run_fingerprint(cfg: RootConfig, sources: list[SourceConfig], tokenizer_path: Path) -> dict[str, Any]:
    """What determines the output: resolved sources, bounds, dedup settings, tokenizer, task count."""
    from pipeline.tokenizer import tokenizer_fingerprint

    return {
        "sources": [json.loads(s.model_dump_json()) for s in sources],
        "bounds": {k: list(v) for k, v in length_bounds(cfg, sources).items()},
        "dedup": json.loads(cfg.curate.dedup.model_dump_json()),
        "synthetic": json.loads(cfg.curate.synthetic.model_dump_json()) if cfg.curate.synthetic else None,
        "max_file_bytes": cfg.curate.max_file_bytes,
        "max_book_bytes": cfg.curate.max_book_bytes,
        "tasks": cfg.curate.executor.tasks,
        "tokenizer_sha256": tokenizer_fingerprint(tokenizer_path),
    }


def _check_same_run(layout: RunLayout, fingerprint: dict[str, Any]) -> None:
    """Refuse to resume into an output that an earlier, different configuration started."""
    changed = layout.changed_since_recorded(fingerprint)
    if changed is None:
        layout.record_run(fingerprint)
    elif changed:
        raise ConfigError(
            f"{layout.root} holds a curation run made with a different configuration (differs in: "
            f"{', '.join(changed)}); choose another --output or delete {layout.root}"
        )


def build_stages(
    cfg: RootConfig, layout: RunLayout, sources: list[SourceConfig], tokenizer_path: Path, run_info: dict[str, Any]
) -> list[Stage]:
    """The job's stages in order, as ``(name, pipeline, tasks)``."""
    work = layout.work
    mh = cfg.curate.dedup.minhash
    minhash = MinhashConfig(
        n_grams=mh.n_grams, num_buckets=mh.num_buckets, hashes_per_bucket=mh.hashes_per_bucket, seed=mh.seed
    )
    read: list[PipelineStep] = [make_reader(s, cfg.curate) for s in sources]
    read += [
        InputTally(work / "inputs"),
        ReadableFilter(exclusion_writer=LedgerWriter(work / "ledger" / "unreadable", "filtered")),
        TokenLengthFilter(
            tokenizer_path,
            length_bounds(cfg, sources),
            exclusion_writer=LedgerWriter(work / "ledger" / "length", "filtered"),
        ),
        DocumentWriter(work / "filtered"),
        DedupIndex(work / "dedup" / "index"),
    ]
    if mh.enabled:
        read.append(LongDocMinhashSignature(work / "dedup" / "sigs", config=minhash))
    tasks = cfg.curate.executor.tasks
    stages: list[Stage] = [("read", read, tasks)]
    if mh.enabled:
        buckets = MinhashDedupBuckets(str(work / "dedup" / "sigs"), str(work / "dedup" / "buckets"), config=minhash)
        stages.append(("buckets", [buckets], mh.num_buckets))
    dups_folder = work / "dedup" / "buckets" if mh.enabled else None
    resolver = DuplicateResolver(work / "dedup" / "index", dups_folder, work / "dedup" / "decisions.parquet", cfg.curate.dedup.exact)
    stages.append(("resolve", [resolver], 1))
    write: list[PipelineStep] = [
        RankDocumentReader(work / "filtered"),
        DuplicateFilter(
            work / "dedup" / "decisions.parquet",
            exclusion_writer=LedgerWriter(work / "ledger" / "duplicate", "duplicate"),
        ),
        DocumentWriter(layout.documents, "${source}/${rank}.parquet"),
        LedgerWriter(work / "ledger" / "kept", "kept"),
    ]
    stages.append(("write", write, tasks))
    stages.append(("finalize", [FinalizeCuration(layout, run_info)], 1))
    if cfg.curate.synthetic is not None:
        stages.append(("synthetic", synthetic_stage(cfg, layout, tokenizer_path), 1))
    return stages


def synthetic_stage(cfg: RootConfig, layout: RunLayout, tokenizer_path: Path) -> list[PipelineStep]:
    """Synthetic tasks over the kept documents, written as source ``curate.synthetic.source``.

    One task: every example may draw its haystack from any curated file, and generating examples is
    cheap next to curation. The synthetic documents are generated, not inputs, so they have no
    ledger rows.
    """
    from pipeline.synthetic import SyntheticTasks, synthetic_pipeline

    syn = cfg.curate.synthetic
    assert syn is not None
    tasks = SyntheticTasks(
        tokenizer_path,
        n_examples=syn.n_examples,
        context_tokens=syn.context_tokens or [cfg.context.target - 64],
        kinds=syn.kinds,
        depths=syn.depths,
        seed=syn.seed,
        source=syn.source,
    )
    return synthetic_pipeline(layout.root, tasks)


def run_curation(cfg: RootConfig, verbose: bool = False) -> dict[str, Any] | None:
    """Run (or resume) curation. Returns the summary written to ``stats.json`` once the stages have
    run (local and Ray executors); None when they were submitted to Slurm."""
    layout = RunLayout(cfg.output, "curate")
    sources = resolve_sources(cfg, layout)
    with contextlib.nullcontext() if verbose else stderr_to_file(layout.work / "logs" / "console.log"):
        tokenizer_path = prepare_tokenizer(cfg, layout, sources)
    fingerprint = run_fingerprint(cfg, sources, tokenizer_path)
    _check_same_run(layout, fingerprint)
    config_hash = hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:16]
    run_info = {
        "config_hash": config_hash,
        "tokenizer_sha256": fingerprint["tokenizer_sha256"],
        "context": {"original": cfg.context.original, "target": cfg.context.target},
        "bounds": fingerprint["bounds"],
        "minhash_threshold": round(cfg.curate.dedup.minhash.threshold, 3) if cfg.curate.dedup.minhash.enabled else None,
    }
    stages = build_stages(cfg, layout, sources, tokenizer_path, run_info)
    if not run_stages(cfg.curate.executor, stages, layout.work, "curate", verbose):
        return None
    return json.loads(layout.stats.read_text(encoding="utf-8"))
