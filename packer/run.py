"""The pack job: plan on the driver, then two datatrove stages.

1. Plan (driver, reads no text): resolve the tokenizer's special tokens, read document ids and
   token counts, decide the mix, refuse early when no document can reach ``context.original``, and
   refuse to resume into an output that a different configuration started.
2. ``pack`` (``pack.executor.tasks`` tasks): :class:`~packer.stage.PackDocuments` over each task's
   share of the curated files.
3. ``manifest`` (1 task): :class:`~packer.stage.WriteManifests`.

Completed tasks are recorded under ``<output>/work/pack/logs`` and skipped when the job runs again.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import numpy as np
from datatrove.pipeline.base import PipelineStep

from packer.catalog import SourceCatalog, document_files, read_catalog
from packer.config import PackConfig
from packer.format import ShardHeader, TokenizerInfo
from packer.manifest import CoverageError, Manifest, coverage_refusal, load_manifest
from packer.mix import MixPlan, MixSampler, format_fractions, plan_mix
from packer.stage import CuratedDocumentReader, PackDocuments, WriteManifests
from packer.tokens import tokenizer_info
from pipeline.config import ConfigError, RootConfig
from pipeline.executors import Stage, run_stages
from pipeline.layout import RunLayout


@dataclass(frozen=True)
class PackPlan:
    """Everything decided before any task runs."""

    config: dict[str, Any]
    headers: list[ShardHeader]
    mix: MixPlan | None
    planned_tokens: dict[str, int]


def config_sha256(config: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()


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


def make_plan(cfg: RootConfig, layout: RunLayout) -> PackPlan:
    """Validate inputs and settings and decide the mix; a :class:`ConfigError` says what is wrong."""
    pack = cfg.pack or PackConfig()
    if not layout.tokenizer.is_file():
        raise ConfigError(f"no tokenizer at {layout.tokenizer}; run `longctx curate` first")
    info: TokenizerInfo = tokenizer_info(layout.tokenizer, pack)
    catalogs = read_catalog(layout.documents)
    specials = 1 + (info.bos_id is not None)
    mix = plan_mix(catalogs, pack.mix, pack.seed, specials, pack.mix_total_tokens) if pack.mix else None
    copies = {name: _copies(cat, mix) for name, cat in catalogs.items()}
    seq_lens = pack.resolved_seq_lens(cfg.context.target)
    if not pack.allow_short_positions:
        check_planned_coverage(catalogs, copies, seq_lens, cfg.context.original, specials)
    config = {
        "pack": pack.output_fields() | {"seq_lens": seq_lens},
        "context": {"original": cfg.context.original, "target": cfg.context.target},
    }
    digest = config_sha256(config)
    headers = [
        ShardHeader(
            seq_len=seq_len,
            original_context=cfg.context.original,
            target_context=cfg.context.target,
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
    return PackPlan(config, headers, mix, planned)


def _check_same_run(layout: RunLayout, plan: PackPlan) -> None:
    """Refuse to resume into shards that a different configuration, tokenizer or input started."""
    fingerprint = {
        "config_sha256": plan.headers[0].config_sha256,
        "tokenizer_sha256": plan.headers[0].tokenizer.sha256,
        "documents": [
            [str(f.relative_to(layout.documents)), f.stat().st_size] for f in document_files(layout.documents)
        ],
    }
    changed = layout.changed_since_recorded(fingerprint)
    if changed:
        raise ConfigError(
            f"{layout.shards} holds a pack run made with a different {', '.join(changed)}; "
            f"delete {layout.shards} and {layout.work} (or choose another output) to pack again"
        )
    if changed is None:
        if layout.shards.exists() and any(layout.shards.iterdir()):
            raise ConfigError(
                f"{layout.shards} exists but was not written by this pack run; delete it or choose another output"
            )
        layout.record_run(fingerprint)


def build_stages(
    cfg: RootConfig, layout: RunLayout, plan: PackPlan
) -> list[Stage]:
    """The job's datatrove stages in order, as ``(name, pipeline, tasks)``."""
    pack = cfg.pack or PackConfig()
    summaries = layout.work / "tasks"
    steps: list[PipelineStep] = [
        CuratedDocumentReader(layout.documents, pack.batch_size, progress=pack.executor.kind == "local")
    ]
    if plan.mix is not None:
        steps.append(MixSampler(plan.mix))
    steps.append(
        PackDocuments(
            layout.tokenizer,
            plan.headers,
            layout.shards,
            summaries,
            pack.pool_tokens,
            pack.shard_tokens,
            pack.batch_size,
        )
    )
    manifests = WriteManifests(
        plan.headers,
        plan.config,
        layout.shards,
        summaries,
        pack.executor.tasks,
        pack.mix,
        pack.allow_short_positions,
    )
    return [("pack", steps, pack.executor.tasks), ("manifest", [manifests], 1)]


def run_pack(cfg: RootConfig, verbose: bool = False) -> dict[int, Manifest] | None:
    """Run (or resume) packing of ``<output>/documents`` into ``<output>/shards/seq<N>/``.

    Returns the manifest of each window length once the stages have run (local and Ray
    executors), or None when they were submitted to Slurm.
    """
    pack = cfg.pack or PackConfig()
    layout = RunLayout(cfg.output, "pack")
    plan = make_plan(cfg, layout)
    if plan.mix is not None and all(n >= 0 for n in plan.planned_tokens.values()):
        print(
            format_fractions(pack.mix, plan.planned_tokens, "planned mix (from curated token counts):"),
            flush=True,
        )
    _check_same_run(layout, plan)
    if not run_stages(pack.executor, build_stages(cfg, layout, plan), layout.work, "pack", verbose):
        return None
    return {h.seq_len: load_manifest(layout.output(h.seq_len)) for h in plan.headers}
