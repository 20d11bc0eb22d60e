"""The curation job: sources -> readable -> token length -> exact and near dedup -> Parquet + ledger.

Stages (each a datatrove executor; completed tasks are skipped when the job runs again):

0. with code sources and ``curate.dedup.files`` enabled, file-level deduplication of code
   (:mod:`longctx.pipeline.filededup`): ``files`` (N tasks), ``file_buckets`` (over the MinHash
   bands, tasks as for ``buckets`` below) and ``file_resolve`` (1 task) decide which files
   repositories lose as copies of another's.
1. ``read`` (N tasks): readers, input tally, skipped/copied/unreadable and length filters, the
   model-based dependency score (with ``curate.dependency.model``), intermediate documents, dedup
   index and MinHash signatures.
2. ``buckets`` (locally N tasks, each for some of the MinHash buckets; one per bucket on Slurm and
   Ray): datatrove's LSH candidate pairs.
3. ``resolve`` (1 task): exact-hash and MinHash pairs -> which document duplicates which, the kept
   copy chosen by the keep policy; then (unless ``curate.dependency`` computes no score) each
   source's chance similarity, every document's long-range dependency score and the
   ``curate.dependency.filters`` decisions (:mod:`longctx.pipeline.dependency`; the ``read`` stage
   measured what each document's segments share).
4. ``write`` (N tasks): the documents that are neither duplicates nor dropped by a dependency filter,
   from the stage files' Arrow columns into curated files per source, with their scores; the kept,
   duplicate and dependency-filtered rows of the ledger.
5. ``finalize`` (1 task): merged ledger checked against the inputs and the files under every folder
   source, stats and figure.
6. ``synthetic`` (1 task, when ``curate.synthetic`` is set): needle and variable-tracking tasks
   built over the kept documents, written as one more source for the packer to mix.

With ``curate.output``, the finished curation is then published there (:mod:`longctx.pipeline.publish`);
a job submitted to Slurm publishes when ``longctx curate`` is run again after it finished.

A second ``curate`` on the same output while one runs is refused (:mod:`longctx.core.runlock`).
Before any of it, and before anything is written, the run is checked: the output folder (not a
file, writable, outside the input), every source (it exists, locally or in object storage), the
tokenizer (a file, a folder or a hub id) and the special tokens pack will frame documents with, and
the run's identity (every setting that changes the output's bytes) against the one recorded in the
output folder. A refused run changes nothing.
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
from datatrove.io import DataFolder
from datatrove.pipeline.base import PipelineStep
from datatrove.pipeline.dedup.minhash import MinhashConfig

from longctx.core import remote
from longctx.core.atomic import atomic_path, discard, write_json, write_table
from longctx.core.config import ContextConfig, TokenizerConfig
from longctx.core.engines import check_engine
from longctx.core.errors import ConfigError
from longctx.core.executors import Stage, concurrent_tasks, run_stages
from longctx.core.layout import RunLayout
from longctx.core.preflight import check_output_folder, disk_fault
from longctx.core.progress import stderr_to_file
from longctx.core.run_record import check_same_run, config_hash, recorded_inputs
from longctx.core.runlock import run_lock
from longctx.core.text import plural
from longctx.core.tokenizer import (
    BOS_TOKEN,
    EOS_TOKEN,
    PAD_TOKEN,
    TokenizerFiles,
    document_specials,
    load_tokenizer,
    resolve_tokenizer,
    tokenizer_fingerprint,
)
from longctx.pipeline.config import CurateConfig, SourceConfig
from longctx.pipeline.dedup import DedupIndex, DuplicateResolver, GroupedMinhashBuckets
from longctx.pipeline.dependency import DependencyScorer, DependencySelection, read_backgrounds
from longctx.pipeline.dependency_model import (
    check_dependency_model,
    dependency_model_identity,
    dependency_model_steps,
)
from longctx.pipeline.docstore import StageDocumentWriter
from longctx.pipeline.filters import ReadableFilter, TokenLengthFilter
from longctx.pipeline.input_filters import RepositoryCopyFilter, SkippedInputFilter
from longctx.pipeline.inputs import check_inputs, list_inputs, mark_changes
from longctx.pipeline.ledger import InputTally, LedgerWriter, check_file_counts, merge_ledger
from longctx.pipeline.parquet import read_parquet
from longctx.pipeline.publish import publish_curation
from longctx.pipeline.readers.listing import count_files, is_url, list_tree, open_folder
from longctx.pipeline.signatures import MinhashSignature
from longctx.pipeline.stats import plot_summary, summarize_ledger
from longctx.pipeline.write_stage import WriteCuratedDocuments

INPUT_SUBFOLDERS = ("books", "papers", "code")
FOLDER_KINDS = frozenset(INPUT_SUBFOLDERS)


def join_location(location: str, sub: str) -> str:
    """``sub`` inside ``location`` (a local path or a URL)."""
    return location.rstrip("/") + "/" + sub if is_url(location) else str(Path(location) / sub)


def resolve_sources(curate: CurateConfig, layout: RunLayout) -> list[SourceConfig]:
    """The sources of a run: ``curate.input``'s ``books/``, ``papers/``, ``code/`` subfolders, then
    ``curate.sources``; the embedded default corpus (written later, once the run is checked) when
    neither is given. Every folder is checked to exist, locally or remotely; nothing is written."""
    sources: list[SourceConfig] = []
    if curate.input is not None:
        folder = open_folder(curate.input, curate.storage_options)
        with remote.remote_errors(curate.input, "listing curate.input"):  # e.g. access denied
            if not folder.isdir(""):
                raise ConfigError(f"curate.input: {curate.input} does not exist or is not a folder")
            found = [sub for sub in INPUT_SUBFOLDERS if folder.isdir(sub)]
        if not found:
            raise ConfigError(
                f"curate.input: {curate.input} has none of the subfolders {', '.join(INPUT_SUBFOLDERS)}"
            )
        sources += [
            SourceConfig(
                name=sub,
                kind=sub,
                path=join_location(curate.input, sub),
                storage_options=curate.storage_options,
            )
            for sub in found
        ]
    for number, source in enumerate(curate.sources):
        if not is_url(source.path):
            continue
        with remote.remote_errors(source.path, f"listing curate.sources.{number}.path"):
            if not open_folder(source.path, source.storage_options).exists(""):
                raise ConfigError(f"curate.sources.{number}.path: {source.path} does not exist")
    sources += curate.sources
    if not sources:
        from longctx.pipeline.default_corpus import default_corpus_sources

        sources = default_corpus_sources(layout.default_corpus)
    names = [s.name for s in sources]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ConfigError(f"curate.sources: source names must be unique; repeated: {', '.join(repeated)}")
    return sources


def source_location(source: SourceConfig) -> str | tuple[str, dict]:
    """What datatrove's readers take as a data folder: the path, with its fsspec options if any."""
    return (source.path, dict(source.storage_options)) if source.storage_options else source.path


def make_reader(
    source: SourceConfig, curate: CurateConfig, file_decisions: Path | None = None
) -> PipelineStep:
    """The datatrove reader step for one source; code readers consult ``file_decisions`` (the
    output of file-level deduplication) when given."""
    location = source_location(source)
    if source.kind == "books":
        from longctx.pipeline.readers.books import BookFolderReader

        return BookFolderReader(
            location, source.name, source.strip_gutenberg, max_bytes=curate.max_book_bytes, limit=source.limit
        )
    if source.kind == "papers":
        from longctx.pipeline.readers.papers import PaperReader

        return PaperReader(location, source=source.name, limit=source.limit)
    if source.kind == "code":
        from longctx.pipeline.readers.code import CodeRepoReader

        return CodeRepoReader(
            location,
            source=source.name,
            max_file_bytes=curate.max_file_bytes,
            limit=source.limit,
            vendored="read" if curate.vendored_code == "dedup" else "skip",
            file_decisions=file_decisions,
        )
    from longctx.pipeline.readers.tabular import make_tabular_reader

    return make_tabular_reader(
        source.kind, location, source.name, source.text_key, source.id_key, source.glob, source.limit
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


def find_tokenizer(tokenizer: TokenizerConfig) -> TokenizerFiles | None:
    """The files of ``tokenizer.path`` (loaded once to refuse a malformed file early), or None when
    curation is to train one."""
    if tokenizer.path is None:
        return None
    files = resolve_tokenizer(tokenizer.path)
    try:
        load_tokenizer(files.tokenizer)
    except (FileNotFoundError, ValueError) as err:
        raise ConfigError(f"tokenizer.path: {err}") from None
    return files


def check_specials(files: TokenizerFiles | None, specials: dict[str, Any]) -> dict[str, Any]:
    """Check, before any work, that the special tokens pack will frame documents with exist in the
    tokenizer (``specials``: pack's ``eos``/``bos``/``pad`` settings, None where the tokenizer's
    own declaration is to be used). Returns the resolved tokens, which are part of the run's
    identity. A trained tokenizer will have :data:`EOS_TOKEN`, :data:`BOS_TOKEN` and :data:`PAD_TOKEN`."""
    if files is None:
        ours = (EOS_TOKEN, BOS_TOKEN, PAD_TOKEN)
        for name, token in specials.items():
            if isinstance(token, str) and token not in ours:
                raise ConfigError(
                    f"pack.{name}_token: {token!r} is not a special token of the tokenizer curation trains "
                    f"(it has {', '.join(ours)}); set tokenizer.path to bring yours"
                )
        return {
            "eos": specials.get("eos") or EOS_TOKEN,
            "bos": specials.get("bos"),
            "pad": specials.get("pad"),
        }
    found = document_specials(files.tokenizer, **specials)
    return {"eos": found.eos, "bos": found.bos, "pad": found.pad}


def tokenizer_identity(tokenizer: TokenizerConfig, files: TokenizerFiles | None) -> dict[str, Any]:
    """What decides the run's tokenizer: the bytes of the given files, or the training settings."""
    if files is None:
        return {
            "train_vocab_size": tokenizer.train_vocab_size,
            "train_sample_bytes": tokenizer.train_sample_bytes,
        }
    return {
        "sha256": tokenizer_fingerprint(files.tokenizer),
        "config_sha256": tokenizer_fingerprint(files.config) if files.config else None,
    }


def prepare_tokenizer(
    tokenizer: TokenizerConfig,
    files: TokenizerFiles | None,
    curate: CurateConfig,
    layout: RunLayout,
    sources: list[SourceConfig],
) -> Path:
    """Put the run's tokenizer at ``<output>/tokenizer.json`` (and its ``tokenizer_config.json`` and
    ``chat_template.jinja`` beside it, when it has them): a copy of the given files, or a byte-level
    BPE trained on a sample of every source (kept across reruns). Called only once the run's identity
    is checked."""
    if files is not None:
        given = (files.tokenizer, files.config, files.chat_template)
        for source, target in zip(given, layout.tokenizer_files, strict=True):
            if source is None:
                discard(target)
            elif not target.exists() or target.read_bytes() != source.read_bytes():
                with atomic_path(target) as tmp:
                    shutil.copyfile(source, tmp)
        return layout.tokenizer
    if not layout.tokenizer.exists():
        from longctx.pipeline.bpe import train_bpe

        print(
            f"training a {tokenizer.train_vocab_size}-token byte-level BPE on a sample of the input ...",
            flush=True,
        )
        train_bpe(
            _sample_texts(sources, curate, tokenizer.train_sample_bytes),
            tokenizer.train_vocab_size,
            layout.tokenizer,
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
    """Single task: the merged ledger, checked against the inputs and against the files under every
    folder source (``folder_sources``: name -> datatrove data folder, which holds its storage options
    in its file system, where datatrove's JSON record of the step does not show them: never as a plain
    mapping, which it would write out, credentials included), ``stats.json`` and ``stats.png``."""

    type = "🧾 - LEDGER"
    name = "🏁 Finalize"

    def __init__(
        self,
        layout: RunLayout,
        run_info: dict[str, Any],
        folder_sources: dict[str, DataFolder],
        file_decisions: Path | None = None,
    ) -> None:
        super().__init__()
        self.layout = layout
        self.run_info = run_info
        self.folder_sources = folder_sources
        self.file_decisions = file_decisions

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        ledger = merge_ledger(self.layout.work / "ledger", self.layout.work / "inputs")
        listed = {name: count_files(list_tree(folder)) for name, folder in self.folder_sources.items()}
        check_file_counts(ledger, listed)
        ledger, update = mark_changes(self.layout, ledger)
        write_table(self.layout.ledger, ledger)
        summary = summarize_ledger(ledger, read_backgrounds(self.layout.work / "dependency")) | {
            "run": self.run_info
        }
        if update is not None:
            summary["update"] = update
        if self.file_decisions is not None:
            summary["file_dedup"] = summarize_file_decisions(self.file_decisions, ledger)
        write_json(self.layout.stats, summary)
        plot_summary(summary, self.layout.plot)
        if data:
            yield from data


def summarize_file_decisions(decisions_file: Path, ledger) -> dict[str, Any]:
    """Files removed by file-level deduplication, by kind and by repository, and the repositories
    that became copies of another."""
    decisions = read_parquet(decisions_file).to_pylist()
    by_repo: dict[str, int] = {}
    for row in decisions:
        by_repo[row["repo"]] = by_repo.get(row["repo"], 0) + 1
    reasons = ledger.column("reason").to_pylist()
    return {
        "files_removed": len(decisions),
        "exact": sum(1 for r in decisions if r["kind"] == "exact_duplicate"),
        "near": sum(1 for r in decisions if r["kind"] == "near_duplicate"),
        "by_repository": dict(sorted(by_repo.items())),
        "repository_copies": reasons.count("repository_copy"),
    }


def run_fingerprint(
    curate: CurateConfig,
    target: int,
    sources: list[SourceConfig],
    tokenizer: dict[str, Any],
    specials: dict[str, Any],
) -> dict[str, Any]:
    """What determines the output's bytes: resolved sources (their dump leaves out the storage options,
    which hold credentials and do not change what is read), bounds, dedup settings (with the keep policy
    and file-level deduplication), the dependency scores and filters, reader limits, the tokenizer (its
    bytes, or its training settings), the special tokens, the task count, and the dependency score's
    model (its files' identity) when one is set."""
    return {
        "sources": [json.loads(s.model_dump_json()) for s in sources],
        "bounds": {k: list(v) for k, v in length_bounds(curate, target, sources).items()},
        "dedup": json.loads(curate.dedup.model_dump_json()),
        "dependency": json.loads(curate.dependency.model_dump_json()),
        "synthetic": json.loads(curate.synthetic.model_dump_json()) if curate.synthetic else None,
        "max_file_bytes": curate.max_file_bytes,
        "max_book_bytes": curate.max_book_bytes,
        "vendored_code": curate.vendored_code,
        "tasks": curate.executor.tasks,
        "tokenizer": tokenizer,
        "specials": specials,
        **dependency_model_identity(curate.dependency),
    }


def bucket_tasks(curate: CurateConfig, num_buckets: int) -> int:
    """Tasks of a MinHash bucket stage: the job's task count, at most one per bucket (each task
    searches several buckets: a bucket costs less to search than a task to start, on a cluster too)."""
    return min(num_buckets, curate.executor.tasks)


def file_dedup_stages(
    curate: CurateConfig, work: Path, sources: list[SourceConfig]
) -> tuple[list[Stage], Path | None]:
    """The file-level deduplication stages for the code sources, and the decisions file the code
    readers consult (none without code sources or with ``dedup.files`` disabled)."""
    from longctx.pipeline.filededup import (
        FileDuplicateResolver,
        FileSignatureIndex,
        RepositoryFiles,
        minhash_config,
    )

    cfg = curate.dedup.files
    code = [s for s in sources if s.kind == "code"]
    if not cfg.enabled or not code:
        return [], None
    folder = work / "filededup"
    decisions = folder / "decisions.parquet"
    readers = [make_reader(s, curate) for s in code]
    config = minhash_config(cfg)
    stages: list[Stage] = [
        (
            "files",
            [RepositoryFiles(readers), FileSignatureIndex(folder / "sigs", folder / "index", cfg)],
            curate.executor.tasks,
        ),
        (
            "file_buckets",
            [GroupedMinhashBuckets(folder / "sigs", folder / "buckets", config)],
            bucket_tasks(curate, cfg.minhash.num_buckets),
        ),
        ("file_resolve", [FileDuplicateResolver(folder / "index", folder / "buckets", decisions, cfg)], 1),
    ]
    return stages, decisions


LIGHT_STAGES = frozenset({"file_buckets", "buckets"})
"""Stages run in the driver locally, whatever their task count: searching MinHash buckets costs
less (0.1 s on the bench's 20 MB) than starting a pool's workers for it (0.3-0.5 s)."""

FILES_IN_DRIVER_BYTES = 6 << 20
"""Code inputs up to this size are split into files and signed (the ``files`` stage) in the driver,
while the forkserver starts on another core: about 0.6 s per MB there, against 0.3 s per MB on two
workers that first wait ~2 s for a forkserver started from a fresh interpreter (measured on the bench's
2.7 MB of code). A forkserver forked from the driver is ready in ~0.2 s; on 3.1 MB of code, the stage
took the same wall time either way (6.9-7.2 s for the whole curation, 3 runs each)."""


def driver_stages(curate: CurateConfig, sources: list[SourceConfig]) -> frozenset[str]:
    """The stages that run in the driver when run locally (:func:`~longctx.core.executors.run_stages`'
    ``in_driver``): :data:`LIGHT_STAGES`, and ``files`` when the code sources hold at most
    :data:`FILES_IN_DRIVER_BYTES` (listed, as the ``files`` stage lists them)."""
    if curate.executor.kind != "local":
        return LIGHT_STAGES
    code = [s for s in sources if s.kind == "code"]
    if not curate.dedup.files.enabled or not code:
        return LIGHT_STAGES
    size = 0
    for source in code:
        units, _ = make_reader(source, curate).list_units()
        size += sum(max(0, unit.size) for unit in units)
    return LIGHT_STAGES | {"files"} if size <= FILES_IN_DRIVER_BYTES else LIGHT_STAGES


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
    stages, file_decisions = file_dedup_stages(curate, work, sources)
    read: list[PipelineStep] = [make_reader(s, curate, file_decisions) for s in sources]
    read += [
        InputTally(work / "inputs"),
        SkippedInputFilter(exclusion_writer=LedgerWriter(work / "ledger" / "skipped", "skipped")),
        RepositoryCopyFilter(exclusion_writer=LedgerWriter(work / "ledger" / "copies", "duplicate")),
        ReadableFilter(exclusion_writer=LedgerWriter(work / "ledger" / "unreadable", "filtered")),
        TokenLengthFilter(
            tokenizer_path,
            length_bounds(curate, target, sources),
            exclusion_writer=LedgerWriter(work / "ledger" / "length", "filtered"),
            concurrent_tasks=concurrent_tasks(curate.executor, curate.executor.tasks),
        ),
        *dependency_model_steps(curate, tokenizer_path),
        *([DependencyScorer(work / "dependency")] if curate.dependency.enabled else []),
        StageDocumentWriter(work / "filtered"),
        DedupIndex(work / "dedup" / "index"),
    ]
    if mh.enabled:
        read.append(MinhashSignature(work / "dedup" / "sigs", config=minhash))
    tasks = curate.executor.tasks
    stages.append(("read", read, tasks))
    if mh.enabled:
        buckets = GroupedMinhashBuckets(work / "dedup" / "sigs", work / "dedup" / "buckets", minhash)
        stages.append(("buckets", [buckets], bucket_tasks(curate, mh.num_buckets)))
    dups_folder = work / "dedup" / "buckets" if mh.enabled else None
    resolver = DuplicateResolver(
        work / "dedup" / "index",
        dups_folder,
        work / "dedup" / "decisions.parquet",
        curate.dedup.exact,
        inputs_folder=work / "inputs",
        keep=curate.dedup.keep,
    )
    resolve: list[PipelineStep] = [resolver]
    scores = None
    dependency = curate.dependency
    if dependency.enabled or dependency.model is not None:  # scored once duplicates are known
        filters = {name: (f.min_dependency, f.keep_top_fraction) for name, f in dependency.filters.items()}
        model_scores = work / "filtered" if dependency.model is not None else None
        resolve.append(
            DependencySelection(
                work / "dependency", work / "dedup" / "decisions.parquet", filters, model_scores
            )
        )
        scores = work / "dependency" / "scores.parquet"
    stages.append(("resolve", resolve, 1))
    write = WriteCuratedDocuments(
        work / "filtered",
        work / "dedup" / "decisions.parquet",
        layout.documents,
        work / "ledger",
        tokenizer_sha256,
        scores,
    )
    stages.append(("write", [write], tasks))
    folder_sources = {
        s.name: open_folder(s.path, s.storage_options) for s in sources if s.kind in FOLDER_KINDS
    }
    stages.append(("finalize", [FinalizeCuration(layout, run_info, folder_sources, file_decisions)], 1))
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
    specials: dict[str, Any] | None = None,
    verbose: bool = False,
    update: bool = False,
    fresh_process: bool = False,
) -> dict[str, Any] | None:
    """Run (or resume) curation into the run folder ``output``.

    The run's input files are part of its identity (:mod:`longctx.pipeline.inputs`): when they
    changed since the run started, it is refused, or with ``update`` curated anew over them.

    ``specials`` are the special-token settings the next job (pack) will frame documents with
    (``eos``, ``bos``, ``pad``; None or missing: what the tokenizer declares); they are checked
    before any work. Returns the summary written to ``stats.json`` once the stages have run (local
    and Ray executors); None when they were submitted to Slurm.

    ``fresh_process``: this process has run nothing before the job (the ``longctx curate`` command),
    so that, locally, the job's forkserver may be forked from it (``run_stages``' ``fork_server``)
    unless the run itself runs a thread pool here first: it trains its tokenizer, or checks a
    dependency model (torch). A Python session may have tokenized already: by default the
    forkserver starts from a fresh interpreter.
    """
    check_no_credentials_for_slurm(curate)  # the config's own fault first, then the machine's
    check_engine(curate.executor, "curate.executor", verbose=verbose)
    output = Path(output)
    check_output_folder(output)
    layout = RunLayout(output, "curate")
    sources = resolve_sources(curate, layout)
    check_dependency_filters(curate, sources)
    check_outside_inputs(curate, sources, layout)  # before the lock, which would write there
    with run_lock(layout.work, "curate"):  # one curation per output folder
        return _run_curation(
            curate, context, tokenizer, layout, sources, specials, verbose, update, fresh_process
        )


def _run_curation(
    curate: CurateConfig,
    context: ContextConfig,
    tokenizer: TokenizerConfig,
    layout: RunLayout,
    sources: list[SourceConfig],
    specials: dict[str, Any] | None,
    verbose: bool,
    update: bool,
    fresh_process: bool,
) -> dict[str, Any] | None:
    """:func:`run_curation` of ``sources`` once the run holds the output folder's lock."""
    output = layout.root
    if curate.output is not None:
        check_publish_destination(curate.output, layout, curate.storage_options)
    files = find_tokenizer(tokenizer)
    check_dependency_model(curate, tokenizer, files)
    resolved_specials = check_specials(files, dict(specials or {}))
    fingerprint = run_fingerprint(
        curate, context.target, sources, tokenizer_identity(tokenizer, files), resolved_specials
    )
    embedded = curate.input is None and not curate.sources  # the run's own corpus: not an input
    inputs = None
    if not embedded:
        recorded = recorded_inputs(layout) or []
        inputs = list_inputs(sources, rehash={entry[0] for entry in recorded if entry[3]})
    try:
        check_same_run(layout, fingerprint, layout.root, fresh=False, inputs=inputs)
        if inputs is not None:
            check_inputs(layout, sources, inputs, update=update)
        if embedded:
            from longctx.pipeline.default_corpus import build_default_corpus

            build_default_corpus(layout.default_corpus)
        trains = files is None and not layout.tokenizer.exists()  # the tokenizer's thread pool, here
        fork_server = fresh_process and not trains and curate.dependency.model is None
        with contextlib.nullcontext() if verbose else stderr_to_file(layout.console_log):
            tokenizer_path = prepare_tokenizer(tokenizer, files, curate, layout, sources)
        run_info = {
            "config_hash": config_hash(fingerprint)[:16],
            "tokenizer_sha256": tokenizer_fingerprint(tokenizer_path),
            "specials": resolved_specials,
            "context": {"original": context.original, "target": context.target},
            "bounds": fingerprint["bounds"],
            "keep": list(curate.dedup.keep),
            "minhash_threshold": round(curate.dedup.minhash.threshold, 3)
            if curate.dedup.minhash.enabled
            else None,
        }
        stages = build_stages(curate, layout, sources, tokenizer_path, run_info, target=context.target)
        # workers from a forkserver (the default): with "fork", one of ~14 two-task runs under load
        # failed (the next stage's Manager found work/curate/tmp gone); cause not found
        in_driver = driver_stages(curate, sources)
        done = run_stages(
            curate.executor,
            stages,
            layout.work,
            "curate",
            verbose,
            in_driver=in_driver,
            fork_server=fork_server,
        )
        if not done:
            return None
    except OSError as err:
        fault = disk_fault(err, None if err.filename else output)
        if fault is None:
            raise
        raise fault from None
    if curate.output is not None:
        sent = publish_curation(layout, curate.output, curate.storage_options)
        done = f"published {plural(len(sent), 'file')}" if sent else "already published, unchanged"
        print(f"{curate.output}: {done}", flush=True)
    return json.loads(layout.stats.read_text(encoding="utf-8"))


def check_dependency_filters(curate: CurateConfig, sources: list[SourceConfig]) -> None:
    """Refuse, before any work, ``curate.dependency.filters`` for a source the run does not have, or
    filters when no dependency score is computed (``enabled: false`` and no ``model``)."""
    dependency = curate.dependency
    names = [s.name for s in sources]
    for name in dependency.filters:
        if name not in names:
            raise ConfigError(
                f"curate.dependency.filters.{name}: the run has no source named {name!r} "
                f"(its sources: {', '.join(names)})"
            )
    if dependency.filters and not dependency.enabled and dependency.model is None:
        raise ConfigError(
            "curate.dependency.filters: no dependency score is computed to filter by "
            "(curate.dependency.enabled is false and curate.dependency.model is not set)"
        )


def check_no_credentials_for_slurm(curate: CurateConfig) -> None:
    """Refuse credentials in ``storage_options`` for a job submitted to Slurm: datatrove pickles the
    job's steps, with their file systems and so the credentials, into ``executor.pik`` files in the
    run folder for the Slurm tasks to load. Locally (and on Ray) they reach the workers in memory."""
    if curate.executor.kind != "slurm":
        return
    given = [("curate.storage_options", curate.storage_options)]
    given += [
        (f"curate.sources.{n}.storage_options", s.storage_options) for n, s in enumerate(curate.sources)
    ]
    for key, options in given:
        found = remote.credential_keys(options)
        if found:
            raise ConfigError(
                f"{key}: {', '.join(found)} would be written to disk in the job datatrove submits to Slurm; "
                "give the Slurm jobs their credentials through the environment (AWS_ACCESS_KEY_ID...) instead"
            )


def check_outside_inputs(curate: CurateConfig, sources: list[SourceConfig], layout: RunLayout) -> None:
    """Refuse, before any work, an output folder (or a local ``curate.output``) that is an input
    folder or lies inside one: the run would read what it writes, and its next run other inputs."""
    outputs = [("output", layout.root)]
    if curate.output is not None and not remote.is_remote(curate.output):
        outputs.append(("curate.output", Path(curate.output.removeprefix("file://"))))
    inputs = [(f"source {s.name!r}", s.path) for s in sources]
    if curate.input is not None:
        inputs.insert(0, ("curate.input", curate.input))
    for what, location in inputs:
        if is_url(location):
            continue
        folder = Path(location).resolve()
        for key, path in outputs:
            target = path.resolve()
            if target == folder or folder in target.parents:
                where = "is" if target == folder else "lies inside"
                raise ConfigError(
                    f"{key}: {path} {where} the input folder {location} ({what}); "
                    f"choose another {key} outside the input"
                )


def check_publish_destination(url: str, layout: RunLayout, storage_options: dict[str, Any]) -> None:
    """Refuse, before any work, a ``curate.output`` inside the run folder or whose bucket is missing."""
    if not remote.is_remote(url):
        target = Path(url.removeprefix("file://")).resolve()
        if target == layout.root.resolve() or layout.root.resolve() in target.parents:
            raise ConfigError(f"curate.output {url} is inside the run folder {layout.root}; leave it unset")
    remote.check_destination(url, storage_options)
