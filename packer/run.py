"""The pack job: plan on the driver, then two datatrove stages for the window lengths still to pack.

0. With ``pack.input``, a checked copy of the published curation is made (:mod:`longctx.packer.curated`).
1. Plan (driver, reads no text): check the output folder, resolve the tokenizer's special tokens,
   read document ids and token counts, decide the mix (refusing one that drops too much of a
   source), refuse early when no document can reach ``context.original``, and check the request
   against the run record (:mod:`longctx.packer.record`): finished outputs are kept untouched, only
   new or unfinished window lengths are packed, and other data than the run's is refused.
2. ``pack`` (``pack.executor.tasks`` tasks): :class:`~longctx.packer.stage.PackDocuments` over each
   task's share of the curated files, writing every length still to pack in one pass; locally, run in
   this process when it is small and tokenizes nothing (:func:`driver_stages`).
3. ``manifest`` (1 task): :class:`~longctx.packer.stage.WriteManifests`.
4. With ``pack.output``, each finished output is published there (``longctx.packer.remote``); a job
   submitted to Slurm publishes when ``longctx pack`` is run again after it finished.

A second ``pack`` on the same output while one runs is refused (:mod:`longctx.core.runlock`).
Completed tasks are recorded under ``<output>/work/pack/<lengths>/logs`` (one folder per set of
lengths packed together) and skipped when the job runs again.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from datatrove.pipeline.base import PipelineStep

from longctx.core import remote
from longctx.core.config import ContextConfig
from longctx.core.engines import check_engine
from longctx.core.errors import ConfigError
from longctx.core.executors import Stage, concurrent_tasks, run_stages
from longctx.core.jobstate import completed_tasks
from longctx.core.layout import RunLayout, shard_folder
from longctx.core.preflight import check_output_folder
from longctx.core.run_record import config_hash
from longctx.core.runlock import run_lock
from longctx.core.text import plural
from longctx.core.tokenizer import TokenizerFiles
from longctx.packer.catalog import SourceCatalog, read_catalog, text_size
from longctx.packer.config import PackConfig
from longctx.packer.curated import adopt_tokenizer, curated_source
from longctx.packer.format import ShardHeader, TokenizerInfo
from longctx.packer.manifest import CoverageError, Manifest, MixReport, coverage_refusal, load_manifest
from longctx.packer.mix import (
    MixPlan,
    MixSampler,
    check_dropped,
    curated_shares,
    format_mix_report,
    mix_report,
    plan_mix,
)
from longctx.packer.record import documents_fingerprint, plan_outputs, write_record
from longctx.packer.remote import publish_shards
from longctx.packer.stage import PackDocuments, WriteManifests, retokenized_documents
from longctx.packer.tokens import check_configured_tokenizer, tokenizer_info
from longctx.pipeline.docstore import CuratedDocumentReader
from longctx.pipeline.documents import document_files, file_tokenizer, source_of

SHARD_BYTES_PER_TOKEN = 10
"""Bytes a shard takes per window token: ``input_ids`` and ``position_ids`` (4 each), ``loss_mask``
(1), and the per-segment lists."""
CHARS_PER_TOKEN = 3
"""For estimates where curation recorded no token counts (fewer than most text has per token)."""
IN_DRIVER_TOKENS = 1 << 23
"""Locally, the pack stage runs its tasks one after another in the ``longctx pack`` process when no
document is tokenized and the plan holds at most this many tokens: packing stored ids costs about
50 ns of CPU per token, less at this size than a pool's workers cost to start and stop."""


@dataclass(frozen=True)
class PackPlan:
    """Everything decided before any task runs, for every requested window length."""

    configs: dict[int, dict[str, Any]]
    headers: list[ShardHeader]
    mix: MixPlan | None
    targets: dict[str, float] | None
    planned_tokens: dict[str, int]
    report: MixReport | None
    data: dict[str, Any]
    documents: Path

    def only(self, seq_lens: list[int]) -> PackPlan:
        """The same plan for some of its window lengths."""
        return PackPlan(
            {n: self.configs[n] for n in seq_lens},
            [h for h in self.headers if h.seq_len in seq_lens],
            self.mix,
            self.targets,
            self.planned_tokens,
            self.report,
            self.data,
            self.documents,
        )


def _copies(catalog: SourceCatalog, mix: MixPlan | None) -> np.ndarray:
    return mix.copies_of(catalog) if mix else np.ones(len(catalog.ids), dtype=np.int64)


def check_planned_coverage(
    catalogs: dict[str, SourceCatalog],
    copies: dict[str, np.ndarray],
    seq_lens: list[int],
    original: int,
    specials: int,
) -> None:
    """Refuse before tokenizing when the curated token counts show that no segment can be longer
    than ``original`` (skipped when counts are unknown; the manifest step checks the real windows)."""
    if not all(cat.counts_known for cat in catalogs.values()):
        return
    longest_doc = {
        name: int((cat.token_counts + specials)[copies[name] > 0].max())
        for name, cat in catalogs.items()
        if (copies[name] > 0).any()
    }
    for seq_len in seq_lens:
        refusal = coverage_refusal(
            seq_len, original, {n: min(seq_len, length) for n, length in longest_doc.items()}
        )
        if refusal:
            raise CoverageError(refusal)


def make_plan(
    pack: PackConfig, context: ContextConfig, layout: RunLayout, source: RunLayout | None = None
) -> PackPlan:
    """Validate inputs and settings and decide the mix; a :class:`ConfigError` says what is wrong.
    ``source`` is the curated run whose documents and tokenizer are packed (default: ``layout``)."""
    source = layout if source is None else source
    documents = source.documents
    if not source.tokenizer.is_file():
        raise ConfigError(f"no tokenizer at {source.tokenizer}; run `longctx curate` first")
    info: TokenizerInfo = tokenizer_info(source.tokenizer, pack)
    catalogs = read_catalog(documents, info.sha256)
    upsample = pack.upsampling()
    key = "pack.mix" if pack.mix else "pack.upsample_long"
    if pack.mix or upsample:  # they need the counts, which a tokenizer replaced after curation invalidates
        files = document_files(documents)
        used = {name for name, fraction in pack.mix.items() if fraction > 0} if pack.mix else set(catalogs)
        stale = sorted(
            {source_of(documents, f) for f in files if file_tokenizer(f) not in (None, info.sha256)} & used
        )
        if stale:
            raise ConfigError(
                f"{key}: the documents of {', '.join(stale)} were curated with another tokenizer than "
                f"{source.tokenizer}, so their token counts do not hold; curate them again with it, or "
                f"leave {key} out"
            )
    specials = 1 + (info.bos_id is not None)
    # without pack.mix, upsampling keeps every source's own share of the curated tokens
    targets = pack.mix if pack.mix or upsample is None else curated_shares(catalogs, specials)
    mix = None
    if targets is not None:
        mix = plan_mix(catalogs, targets, pack.seed, specials, pack.mix_total_tokens, upsample)
    copies = {name: _copies(cat, mix) for name, cat in catalogs.items()}
    report = None
    if all(cat.counts_known for cat in catalogs.values()):
        seed = pack.seed if mix is not None else None
        own = mix is not None and not pack.mix
        report = mix_report(catalogs, copies, specials, targets, seed, upsample, own_shares=own)
        if targets is not None:
            check_dropped(report, targets, pack.mix_max_dropped, catalogs, specials, key, upsample)
    seq_lens = pack.resolved_seq_lens(context.target)
    if not pack.allow_short_positions:
        check_planned_coverage(catalogs, copies, seq_lens, context.original, specials)
    shared_context = {"original": context.original, "target": context.target}
    configs = {n: {"pack": pack.output_fields(n), "context": shared_context} for n in seq_lens}
    headers = [
        ShardHeader(
            seq_len=n,
            original_context=context.original,
            target_context=context.target,
            strategy=pack.strategy,
            tokenizer=info,
            config_sha256=config_hash(configs[n]),
        )
        for n in seq_lens
    ]
    planned = {
        name: int((copies[name] * (cat.token_counts + specials)).sum()) if cat.counts_known else -1
        for name, cat in catalogs.items()
    }
    data = {f"pack.{key}": value for key, value in pack.data_fields().items()} | {
        "context": shared_context,
        "tokenizer_sha256": info.sha256,
        "documents": documents_fingerprint(documents, document_files(documents)),
    }
    return PackPlan(configs, headers, mix, targets, planned, report, data, documents)


def estimated_output_bytes(layout: RunLayout, plan: PackPlan) -> int:
    """About how many bytes the shards of ``plan`` still need: its tokens (curated counts, or the
    text's size where counts are unknown) at every window length, less what earlier runs wrote."""
    tokens = sum(n for n in plan.planned_tokens.values() if n >= 0)
    if any(n < 0 for n in plan.planned_tokens.values()):
        unknown = {name for name, n in plan.planned_tokens.items() if n < 0}
        text_bytes = sum(
            text_size(f) for f in document_files(plan.documents) if source_of(plan.documents, f) in unknown
        )
        tokens += text_bytes // CHARS_PER_TOKEN
    written = sum(
        f.stat().st_size
        for h in plan.headers
        if layout.shard_folder(h.seq_len).is_dir()
        for f in layout.shard_folder(h.seq_len).iterdir()
    )
    return max(0, tokens * SHARD_BYTES_PER_TOKEN * len(plan.headers) - written)


def pass_folder(layout: RunLayout, seq_lens: list[int]) -> Path:
    """The datatrove logs and completions of the pass that packs ``seq_lens`` together."""
    return layout.work / "+".join(shard_folder(Path(), n).name for n in seq_lens)


def forget_passes(layout: RunLayout, seq_lens: list[int]) -> None:
    """Remove the resume state (task completions) of every earlier pass that packed one of
    ``seq_lens`` and has completed tasks: their folders were emptied, so their tasks must run again.
    A pass with no task done keeps its state: it never started, or its jobs are still queued on Slurm
    (whose record says so, so that running ``pack`` again does not submit them twice)."""
    names = {shard_folder(Path(), n).name for n in seq_lens}
    if not names or not layout.work.is_dir():
        return
    for folder in layout.work.iterdir():
        if folder.is_dir() and names & set(folder.name.split("+")) and _tasks_done(folder):
            shutil.rmtree(folder)


def _tasks_done(work: Path) -> bool:
    """Whether any stage of the pass whose work folder is ``work`` recorded a completed task."""
    logs = work / "logs"
    return logs.is_dir() and any(completed_tasks(stage) for stage in logs.iterdir() if stage.is_dir())


def worker_start_method(documents: Path, tokenizer_sha256: str) -> str:
    """How local pools start the pack workers: ``"fork"`` (from this process, which has the job's
    modules imported: nothing to start) when every curated file's stored ids are of the run's
    tokenizer, so that no worker tokenizes; else ``"forkserver"`` (fresh workers), since the
    tokenizer runs on one thread in a worker forked from a process that has used its thread pool
    (a Python session that tokenized before packing)."""
    files = document_files(documents)
    return "fork" if all(file_tokenizer(f) == tokenizer_sha256 for f in files) else "forkserver"


def driver_stages(plan: PackPlan, start_method: str) -> frozenset[str]:
    """The stages that run in this process when run locally (:func:`~longctx.core.executors.run_stages`'
    ``in_driver``): ``pack`` when its workers would be forked (no document is tokenized: see
    :func:`worker_start_method`) and the tokens it writes (the plan's, known from the curated counts,
    at every window length) are at most :data:`IN_DRIVER_TOKENS`; else none (``manifest``, a single
    task, runs here anyway)."""
    tokens = plan.planned_tokens.values()
    small = all(n >= 0 for n in tokens) and sum(tokens) * len(plan.headers) <= IN_DRIVER_TOKENS
    return frozenset({"pack"}) if start_method == "fork" and small else frozenset()


def build_stages(pack: PackConfig, layout: RunLayout, plan: PackPlan) -> list[Stage]:
    """The job's datatrove stages in order, as ``(name, pipeline, tasks)``, for the lengths of ``plan``."""
    reader = CuratedDocumentReader(
        plan.documents,
        pack.batch_size,
        progress=pack.executor.kind == "local",
        ids_of=plan.headers[0].tokenizer.sha256,  # only the texts of documents pack tokenizes are read
    )
    steps: list[PipelineStep] = [reader]
    if plan.mix is not None:
        steps.append(MixSampler(plan.mix))
    running = concurrent_tasks(pack.executor, pack.executor.tasks)
    steps.append(
        PackDocuments(layout, plan.headers, pack.pool_tokens, pack.shard_tokens, pack.batch_size, running)
    )
    manifests = WriteManifests(
        layout,
        plan.headers,
        plan.configs,
        pack.executor.tasks,
        plan.targets,
        plan.report,
        pack.allow_short_positions,
    )
    return [("pack", steps, pack.executor.tasks), ("manifest", [manifests], 1)]


def run_pack(
    pack: PackConfig,
    *,
    context: ContextConfig,
    output: Path,
    verbose: bool = False,
    tokenizer: TokenizerFiles | None = None,
) -> dict[int, Manifest] | None:
    """Run (or resume, or extend with new window lengths) packing of ``<output>/documents`` (or of
    the published curation ``pack.input``) into ``<output>/shards/seq<N>/``; outputs already
    finished are kept as they are.

    ``tokenizer`` is the configured ``tokenizer.path``'s files, if any: they must be the run's
    tokenizer (the one its documents were curated with). Returns the manifest of each requested window
    length once the stages have run (local and Ray executors), or None when they were submitted to
    Slurm.
    """
    check_engine(pack.executor, "pack.executor", verbose=verbose)
    layout = RunLayout(output, "pack")
    check_output_folder(layout.root, key="output")
    with run_lock(layout.work, "pack"):  # one pack run per output folder
        return _run_pack(pack, context, layout, verbose, tokenizer)


def _run_pack(
    pack: PackConfig,
    context: ContextConfig,
    layout: RunLayout,
    verbose: bool,
    tokenizer: TokenizerFiles | None,
) -> dict[int, Manifest] | None:
    """:func:`run_pack` once the run holds the output folder's lock."""
    source = curated_source(pack, layout)
    check_configured_tokenizer(tokenizer, source)
    plan = make_plan(pack, context, layout, source)
    if pack.output is not None:
        local = not remote.is_remote(pack.output)
        if local and Path(pack.output.removeprefix("file://")).resolve() == layout.shards.resolve():
            raise ConfigError(f"pack.output {pack.output} is this run's own shards folder; leave it unset")
        remote.check_destination(pack.output, pack.storage_options)
    seq_lens = [h.seq_len for h in plan.headers]
    outputs = plan_outputs(layout, plan.data, {n: pack.window_fields() for n in seq_lens})
    todo = plan.only(outputs.to_pack)
    check_output_folder(layout.shards, needed_bytes=estimated_output_bytes(layout, todo), key="output")
    adopt_tokenizer(source, layout)
    write_record(layout, outputs)
    for n in outputs.kept:
        other = f" with other settings ({outputs.changed[n]})" if n in outputs.changed else ""
        print(f"{layout.shard_folder(n)}: already packed{other}, kept as it is", flush=True)
    forget_passes(layout, outputs.fresh)
    if outputs.to_pack:
        if plan.report is not None:
            print(format_mix_report(plan.report), flush=True)
        stages = build_stages(pack, layout, todo)
        start = worker_start_method(plan.documents, plan.headers[0].tokenizer.sha256)
        work = pass_folder(layout, outputs.to_pack)
        here = driver_stages(todo, start)
        if not run_stages(pack.executor, stages, work, "pack", verbose, start_method=start, in_driver=here):
            return None
        retokenized = retokenized_documents(layout, outputs.to_pack[0], pack.executor.tasks)
        for reason, count in sorted(retokenized.items()):
            print(f"re-tokenized {plural(count, 'document')}: {reason}", flush=True)
    manifests = {n: load_manifest(layout.shard_folder(n)) for n in seq_lens}
    if pack.output is not None:
        publish(layout, seq_lens, pack.output, pack.storage_options)
    return manifests


def publish(layout: RunLayout, seq_lens: list[int], output: str, storage_options: dict[str, Any]) -> None:
    """Upload each finished ``shards/seq<N>`` folder to ``<output>/seq<N>`` (manifest last; folders
    already there whole are not sent again)."""
    for n in seq_lens:
        folder = layout.shard_folder(n)
        url = remote.join(output, folder.name)
        sent = publish_shards(folder, url, storage_options)
        done = f"published {plural(len(sent), 'file')}" if sent else "already published, unchanged"
        print(f"{url}: {done}", flush=True)
