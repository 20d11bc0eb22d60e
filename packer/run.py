"""The pack job: plan on the driver, then two datatrove stages.

1. Plan (driver, reads no text): resolve the tokenizer's special tokens, read document ids and
   token counts, decide the mix, refuse early when no document can reach ``context.original``, and
   refuse to resume into an output that a different configuration started.
2. ``pack`` (``pack.executor.tasks`` tasks): :class:`~longctx.packer.stage.PackDocuments` over each task's
   share of the curated files.
3. ``manifest`` (1 task): :class:`~longctx.packer.stage.WriteManifests`.

Completed tasks are recorded under ``<output>/work/pack/logs`` and skipped when the job runs again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from datatrove.pipeline.base import PipelineStep

from longctx.core.config import ContextConfig
from longctx.core.errors import ConfigError
from longctx.core.executors import Stage, run_stages
from longctx.core.layout import RunLayout
from longctx.core.preflight import check_output_folder
from longctx.core.run_record import check_same_run, config_hash
from longctx.packer.catalog import SourceCatalog, read_catalog, text_size
from longctx.packer.config import PackConfig
from longctx.packer.format import ShardHeader, TokenizerInfo
from longctx.packer.manifest import CoverageError, Manifest, MixReport, coverage_refusal, load_manifest
from longctx.packer.mix import (
    MixPlan,
    MixSampler,
    check_dropped,
    format_mix_report,
    mix_report,
    plan_mix,
)
from longctx.packer.stage import PackDocuments, WriteManifests
from longctx.packer.tokens import tokenizer_info
from longctx.pipeline.docstore import CuratedDocumentReader
from longctx.pipeline.documents import document_files, source_of


@dataclass(frozen=True)
class PackPlan:
    """Everything decided before any task runs."""

    config: dict[str, Any]
    headers: list[ShardHeader]
    mix: MixPlan | None
    planned_tokens: dict[str, int]
    report: MixReport | None


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


def make_plan(pack: PackConfig, context: ContextConfig, layout: RunLayout) -> PackPlan:
    """Validate inputs and settings and decide the mix; a :class:`ConfigError` says what is wrong."""
    if not layout.tokenizer.is_file():
        raise ConfigError(f"no tokenizer at {layout.tokenizer}; run `longctx curate` first")
    info: TokenizerInfo = tokenizer_info(layout.tokenizer, pack)
    catalogs = read_catalog(layout.documents)
    specials = 1 + (info.bos_id is not None)
    mix = plan_mix(catalogs, pack.mix, pack.seed, specials, pack.mix_total_tokens) if pack.mix else None
    copies = {name: _copies(cat, mix) for name, cat in catalogs.items()}
    report = None
    if all(cat.counts_known for cat in catalogs.values()):
        report = mix_report(catalogs, copies, specials, pack.mix, pack.seed if pack.mix else None)
        if pack.mix:
            check_dropped(report, pack.mix, pack.mix_max_dropped, catalogs, specials)
    seq_lens = pack.resolved_seq_lens(context.target)
    if not pack.allow_short_positions:
        check_planned_coverage(catalogs, copies, seq_lens, context.original, specials)
    config = {
        "pack": pack.output_fields() | {"seq_lens": seq_lens},
        "context": {"original": context.original, "target": context.target},
    }
    digest = config_hash(config)
    headers = [
        ShardHeader(
            seq_len=seq_len,
            original_context=context.original,
            target_context=context.target,
            strategy=pack.strategy,
            tokenizer=info,
            config_sha256=digest,
        )
        for seq_len in seq_lens
    ]
    planned = {
        name: int((copies[name] * (cat.token_counts + specials)).sum()) if cat.counts_known else -1
        for name, cat in catalogs.items()
    }
    return PackPlan(config, headers, mix, planned, report)


SHARD_BYTES_PER_TOKEN = 10
"""Bytes a shard takes per window token: ``input_ids`` and ``position_ids`` (4 each), ``loss_mask``
(1), and the per-segment lists."""
CHARS_PER_TOKEN = 3
"""For estimates where curation recorded no token counts (fewer than most text has per token)."""


def estimated_output_bytes(layout: RunLayout, plan: PackPlan) -> int:
    """About how many bytes the shards of ``plan`` still need: its tokens (curated counts, or the
    text's size where counts are unknown) at every window length, less what earlier runs wrote."""
    tokens = sum(n for n in plan.planned_tokens.values() if n >= 0)
    if any(n < 0 for n in plan.planned_tokens.values()):
        unknown = {name for name, n in plan.planned_tokens.items() if n < 0}
        text_bytes = sum(
            text_size(f)
            for f in document_files(layout.documents)
            if source_of(layout.documents, f) in unknown
        )
        tokens += text_bytes // CHARS_PER_TOKEN
    written = sum(
        f.stat().st_size
        for h in plan.headers
        if layout.shard_folder(h.seq_len).is_dir()
        for f in layout.shard_folder(h.seq_len).iterdir()
    )
    return max(0, tokens * SHARD_BYTES_PER_TOKEN * len(plan.headers) - written)


def run_fingerprint(layout: RunLayout, plan: PackPlan) -> dict[str, Any]:
    """What determines the shards: the settings, the tokenizer and the curated files (name and size)."""
    return {
        "config_sha256": plan.headers[0].config_sha256,
        "tokenizer_sha256": plan.headers[0].tokenizer.sha256,
        "documents": [
            [str(f.relative_to(layout.documents)), f.stat().st_size] for f in document_files(layout.documents)
        ],
    }


def build_stages(pack: PackConfig, layout: RunLayout, plan: PackPlan) -> list[Stage]:
    """The job's datatrove stages in order, as ``(name, pipeline, tasks)``."""
    steps: list[PipelineStep] = [
        CuratedDocumentReader(layout.documents, pack.batch_size, progress=pack.executor.kind == "local")
    ]
    if plan.mix is not None:
        steps.append(MixSampler(plan.mix))
    steps.append(PackDocuments(layout, plan.headers, pack.pool_tokens, pack.shard_tokens, pack.batch_size))
    manifests = WriteManifests(
        layout,
        plan.headers,
        plan.config,
        pack.executor.tasks,
        pack.mix,
        plan.report,
        pack.allow_short_positions,
    )
    return [("pack", steps, pack.executor.tasks), ("manifest", [manifests], 1)]


def run_pack(
    pack: PackConfig, *, context: ContextConfig, output: Path, verbose: bool = False
) -> dict[int, Manifest] | None:
    """Run (or resume) packing of ``<output>/documents`` into ``<output>/shards/seq<N>/``.

    Returns the manifest of each window length once the stages have run (local and Ray
    executors), or None when they were submitted to Slurm.
    """
    layout = RunLayout(output, "pack")
    check_output_folder(layout.root, key="output")
    plan = make_plan(pack, context, layout)
    check_output_folder(layout.shards, needed_bytes=estimated_output_bytes(layout, plan), key="output")
    if plan.report is not None:
        print(format_mix_report(plan.report), flush=True)
    check_same_run(layout, run_fingerprint(layout, plan), layout.shards)
    if not run_stages(pack.executor, build_stages(pack, layout, plan), layout.work, "pack", verbose):
        return None
    return {h.seq_len: load_manifest(layout.shard_folder(h.seq_len)) for h in plan.headers}
