"""Mixing sources by target token fractions: how many times each document is used.

A source that should contribute ``f`` of ``total`` tokens but holds ``T`` needs a rate
``r = f * total / T``. Every document is used ``floor(r)`` times, and a seeded choice of documents
once more, chosen so their tokens come closest to the fractional part. The choice is a threshold on
a hash of ``(seed, source, document id)``, so a task decides each document's count locally, with no
coordination and the same answer on every machine.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import xxhash
from datatrove.data import DocumentsPipeline
from datatrove.pipeline.base import PipelineStep

from longctx.core.errors import ConfigError
from longctx.packer.catalog import SourceCatalog

_ALL = 1 << 64  # above every 64-bit hash


def doc_hash(seed: int, source: str, doc_id: str) -> int:
    """Stable 64-bit hash of a document under a seed."""
    return xxhash.xxh64_intdigest(f"{source}\x00{doc_id}".encode(), seed=seed & (_ALL - 1))


@dataclass(frozen=True)
class SourceRule:
    """Every document of the source is used ``base`` times, once more when its hash is below
    ``extra_below``."""

    base: int
    extra_below: int


@dataclass(frozen=True)
class MixPlan:
    """Per-source rules and the seed they were drawn with."""

    seed: int
    rules: dict[str, SourceRule]

    def copies(self, source: str, doc_id: str) -> int:
        rule = self.rules[source]
        return rule.base + (doc_hash(self.seed, source, doc_id) < rule.extra_below)

    def copies_of(self, catalog: SourceCatalog) -> np.ndarray:
        """Copies of every document of ``catalog``, in catalog order."""
        return np.array([self.copies(catalog.name, doc_id) for doc_id in catalog.ids], dtype=np.int64)


def _check_sources(catalogs: Mapping[str, SourceCatalog], mix: Mapping[str, float]) -> None:
    missing = sorted(set(catalogs) - set(mix))
    if missing:
        raise ConfigError(
            f"pack.mix gives no fraction for curated source(s) {', '.join(missing)}; "
            "give every source a fraction (0 leaves it out)"
        )
    unknown = sorted(set(mix) - set(catalogs))
    if unknown:
        raise ConfigError(
            f"pack.mix names source(s) {', '.join(unknown)} that have no curated documents; "
            f"the curated sources are: {', '.join(sorted(catalogs))}"
        )
    unknown_counts = sorted(name for name, cat in catalogs.items() if mix[name] > 0 and not cat.counts_known)
    if unknown_counts:
        raise ConfigError(
            f"pack.mix needs token counts, but documents of {', '.join(unknown_counts)} have no token_count; "
            "curate them with `longctx curate` or leave pack.mix out"
        )


def plan_mix(
    catalogs: Mapping[str, SourceCatalog],
    mix: Mapping[str, float],
    seed: int,
    specials_per_doc: int,
    total_tokens: int | None = None,
) -> MixPlan:
    """Rules that bring every source to its fraction of ``total_tokens`` (default: all tokens of the
    sources with a fraction above 0). Document lengths are the curated counts plus
    ``specials_per_doc`` (EOS, BOS)."""
    _check_sources(catalogs, mix)
    lengths = {name: cat.token_counts + specials_per_doc for name, cat in catalogs.items()}
    total = total_tokens or int(sum(lengths[name].sum() for name, f in mix.items() if f > 0))
    rules: dict[str, SourceRule] = {}
    for name, cat in catalogs.items():
        available = int(lengths[name].sum())
        if mix[name] == 0:
            rules[name] = SourceRule(0, 0)
            continue
        if available == 0:
            raise ConfigError(f"pack.mix: source {name} has no tokens to reach a fraction of {mix[name]}")
        wanted = mix[name] * total
        base = math.floor(wanted / available)
        budget = wanted - base * available
        hashes = np.array([doc_hash(seed, name, doc_id) for doc_id in cat.ids], dtype=np.uint64)
        order = np.argsort(hashes, kind="stable")
        taken = np.concatenate([[0], np.cumsum(lengths[name][order])])
        cut = int(
            np.argmin(np.abs(taken - budget))
        )  # the first `cut` documents in hash order get one more copy
        rules[name] = SourceRule(base, int(hashes[order[cut]]) if cut < len(order) else _ALL)
    return MixPlan(seed, rules)


def format_fractions(targets: Mapping[str, float] | None, tokens: Mapping[str, int], title: str) -> str:
    """A table of token fractions per source, with the target where one was set."""
    total = sum(tokens.values()) or 1
    lines = [title]
    for name in sorted(set(tokens) | set(targets or {})):
        share = tokens.get(name, 0) / total
        target = f"target {targets[name]:.3f}, " if targets and name in targets else ""
        lines.append(f"  {name:<16} {target}share {share:.3f} ({tokens.get(name, 0):,} tokens)")
    return "\n".join(lines)


class MixSampler(PipelineStep):
    """Drops documents the plan uses 0 times and sets ``metadata["copies"]`` on the others."""

    type = "🎛 - MIXER"
    name = "🎛 Mix sources"

    def __init__(self, plan: MixPlan) -> None:
        super().__init__()
        self.plan = plan

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        for doc in data or ():
            copies = self.plan.copies(doc.metadata["source"], doc.id)
            self.stat_update("dropped" if copies == 0 else "kept")
            if copies:
                doc.metadata["copies"] = copies
                yield doc
