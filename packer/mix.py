"""Mixing sources by target token fractions: how many times each document is used.

A source that should contribute ``f`` of ``total`` tokens but holds ``T`` needs a rate
``r = f * total / T``. Every document is used ``floor(r)`` times, and a seeded choice of documents
once more, chosen so their tokens come closest to the fractional part. The choice is a threshold on
a hash of ``(seed, source, document id)``, so a task decides each document's count locally, with no
coordination and the same answer on every machine.

What the mix does to every source is decided here, before any task runs, so it is reported up front
(:func:`mix_report`, printed by ``pack`` and recorded in every manifest): per source, the documents
and tokens available, used (counting repeats), dropped, and the epochs (times the source is gone
through). A mix that drops more than ``pack.mix_max_dropped`` of a source's tokens is refused
(:func:`check_dropped`), naming the source and the settings that would avoid it.
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
from longctx.packer.manifest import MixReport, SourceUse

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


class MixError(ConfigError):
    """The mix would leave out more of a source than ``pack.mix_max_dropped`` allows."""


def mix_report(
    catalogs: Mapping[str, SourceCatalog],
    copies: Mapping[str, np.ndarray],
    specials_per_doc: int,
    targets: Mapping[str, float] | None,
    seed: int | None,
) -> MixReport:
    """How many documents and tokens of each source are available, used (with repeats) and
    dropped, given each document's number of ``copies`` (catalog order); curated counts must be known."""
    lengths = {name: cat.token_counts + specials_per_doc for name, cat in catalogs.items()}
    used = {name: int((copies[name] * lengths[name]).sum()) for name in catalogs}
    total = sum(used.values())
    sources = {}
    for name, cat in catalogs.items():
        n, length, tokens = copies[name], lengths[name], int(lengths[name].sum())
        sources[name] = SourceUse(
            target_fraction=targets.get(name) if targets else None,
            fraction=used[name] / total if total else 0.0,
            documents=len(cat.ids),
            tokens=tokens,
            documents_used=int((n > 0).sum()),
            documents_dropped=int((n == 0).sum()),
            tokens_dropped=int(length[n == 0].sum()),
            copies=int(n.sum()),
            tokens_used=used[name],
            epochs=used[name] / tokens if tokens else 0.0,
            max_copies=int(n.max(initial=0)),
        )
    return MixReport(seed=seed, tokens_used=total, sources=sources)


def _tokens(n: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:.0f}"


def format_mix_report(report: MixReport) -> str:
    """The report as a table, one row per source."""
    how = f"pack.mix, seed {report.seed}" if report.seed is not None else "no pack.mix: every document once"
    lines = [
        f"mix ({how}): {_tokens(report.tokens_used)} tokens, counting each document's EOS/BOS and repeats",
        (
            f"  {'source':<14} {'target':>6} {'share':>6} | {'docs':>6} {'used':>6} {'dropped':>7} | "
            f"{'tokens':>8} {'used':>8} {'dropped':>8} | {'epochs':>6} {'max copies':>10}"
        ),
    ]
    for name, s in sorted(report.sources.items()):
        target = f"{s.target_fraction:.3f}" if s.target_fraction is not None else "-"
        lines.append(
            f"  {name:<14} {target:>6} {s.fraction:>6.3f} | {s.documents:>6,} {s.documents_used:>6,} "
            f"{s.documents_dropped:>7,} | {_tokens(s.tokens):>8} {_tokens(s.tokens_used):>8} "
            f"{_tokens(s.tokens_dropped):>8} | {s.epochs:>6.2f} {s.max_copies:>10}"
        )
    return "\n".join(lines)


def total_without_drops(
    catalogs: Mapping[str, SourceCatalog], mix: Mapping[str, float], specials: int
) -> int:
    """The smallest ``pack.mix_total_tokens`` at which the mix drops no document of a source it uses."""
    return max(
        math.ceil(int((cat.token_counts + specials).sum()) / mix[name])
        for name, cat in catalogs.items()
        if mix[name] > 0
    )


def check_dropped(
    report: MixReport,
    mix: Mapping[str, float],
    max_dropped: float,
    catalogs: Mapping[str, SourceCatalog],
    specials: int,
) -> None:
    """Refuse a mix that leaves out more than ``max_dropped`` of the tokens of a source it uses
    (a source with fraction 0 is left out on purpose), saying which, how much, and what to change."""
    over = {
        name: s
        for name, s in sorted(report.sources.items())
        if mix.get(name, 0) > 0 and s.tokens and s.tokens_dropped / s.tokens > max_dropped
    }
    if not over:
        return
    worst = max(s.tokens_dropped / s.tokens for s in over.values())
    lines = [
        f"pack.mix would drop {s.documents_dropped:,} of {s.documents:,} documents of source '{name}' "
        f"({_tokens(s.tokens_dropped)} of {_tokens(s.tokens)} tokens, {s.tokens_dropped / s.tokens:.0%}), "
        f"more than pack.mix_max_dropped allows ({max_dropped:.0%})."
        for name, s in over.items()
    ]
    total = total_without_drops(catalogs, mix, specials)
    epochs = {
        name: mix[name] * total / int((cat.token_counts + specials).sum())
        for name, cat in catalogs.items()
        if mix[name] > 0
    }
    most = max(epochs, key=epochs.__getitem__)
    lines.append(
        f"To keep every document, set pack.mix_total_tokens: {total} (then '{most}' is repeated "
        f"{epochs[most]:.1f} times); to drop them anyway, set pack.mix_max_dropped: "
        f"{math.ceil(worst * 100) / 100:g}."
    )
    raise MixError("\n".join(lines))


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
