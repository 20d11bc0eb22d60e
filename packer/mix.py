"""Mixing sources by target token fractions: how many times each document is used.

A source that should contribute ``f`` of ``total`` tokens but holds ``T`` needs a rate
``r = f * total / T``. Every document is used ``floor(r)`` times, and a seeded choice of documents
once more, chosen so their tokens come closest to the fractional part. The choice is a threshold on
a hash of ``(seed, source, document id)``, so a task decides each document's count locally, with no
coordination and the same answer on every machine.

``pack.upsample_long`` (Fu et al. 2024, "Data Engineering for Scaling Language Models to 128K
Context": keep each domain's share, upsample the long documents within it) splits each source in
two: the documents of at least ``min_tokens`` tokens (long) and the others (short). The source's
``f * total`` tokens are shared so that a long document's rate is ``factor`` times a short one's:
with ``T_long`` and ``T_short`` the tokens of each part, ``r_short = f * total / (factor * T_long +
T_short)`` and ``r_long = factor * r_short``. The long part is rounded to whole copies first, as
above; the short part then gets what is left of the source's tokens, so the source's total comes
as close to its share as without upsampling (within half a short document). Without ``pack.mix`` the
shares are the sources' own shares of the curated tokens.

What the mix does to every source is decided here, before any task runs, so it is reported up front
(:func:`mix_report`, printed by ``pack`` and recorded in every manifest): per source, the documents
and tokens available, used (counting repeats), dropped, the epochs (times the source is gone
through), and its tokens by document length (:func:`length_edges`) before and after. A mix that
drops more than ``pack.mix_max_dropped`` of a source's tokens is refused (:func:`check_dropped`),
naming the source and the settings that would avoid it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import xxhash
from datatrove.data import DocumentsPipeline
from datatrove.pipeline.base import PipelineStep

from longctx.core.errors import ConfigError
from longctx.packer.catalog import SourceCatalog
from longctx.packer.config import UpsampleLong
from longctx.packer.manifest import MixReport, SourceUse, UpsampleUse

_ALL = 1 << 64  # above every 64-bit hash

LENGTH_EDGES = (4096, 32768, 131072)
"""Document lengths (tokens) at which the report's length buckets start: ``<4K``, ``4K-32K``,
``32K-128K`` and ``>=128K``: a short-context window, the middle of a staged extension, a 128K
target."""


def doc_hash(seed: int, source: str, doc_id: str) -> int:
    """Stable 64-bit hash of a document under a seed."""
    return xxhash.xxh64_intdigest(f"{source}\x00{doc_id}".encode(), seed=seed & (_ALL - 1))


def length_edges(upsample: UpsampleLong | None) -> list[int]:
    """The lower edges of the mix report's length buckets after the first: :data:`LENGTH_EDGES`,
    and ``pack.upsample_long.min_tokens`` when set, so that its long documents have buckets of their own."""
    return sorted(set(LENGTH_EDGES) | ({upsample.min_tokens} if upsample else set()))


def is_long(token_counts: np.ndarray, upsample: UpsampleLong | None) -> np.ndarray:
    """Which documents (by curated token count, EOS/BOS excluded) ``upsample`` counts as long."""
    if upsample is None:
        return np.zeros(len(token_counts), dtype=bool)
    return np.asarray(token_counts) >= upsample.min_tokens


@dataclass(frozen=True)
class SourceRule:
    """Every document of the source is used ``base`` times, once more when its hash is below
    ``extra_below``."""

    base: int
    extra_below: int


NO_COPIES = SourceRule(0, 0)


@dataclass(frozen=True)
class MixPlan:
    """Per-source rules and the seed they were drawn with; with ``long_tokens`` (upsampling), a
    document of at least that many tokens follows its source's rule in ``long_rules`` instead."""

    seed: int
    rules: dict[str, SourceRule]
    long_tokens: int | None = None
    long_rules: dict[str, SourceRule] = field(default_factory=dict)

    def copies(self, source: str, doc_id: str, tokens: int) -> int:
        """Times the document ``doc_id`` of ``source``, of ``tokens`` tokens (its curated count), is used."""
        long = self.long_tokens is not None and tokens >= self.long_tokens
        rule = (self.long_rules if long else self.rules)[source]
        return rule.base + (doc_hash(self.seed, source, doc_id) < rule.extra_below)

    def copies_of(self, catalog: SourceCatalog) -> np.ndarray:
        """Copies of every document of ``catalog``, in catalog order."""
        return np.array(
            [
                self.copies(catalog.name, doc_id, tokens)
                for doc_id, tokens in zip(catalog.ids, catalog.token_counts.tolist(), strict=True)
            ],
            dtype=np.int64,
        )


def _check_counts(catalogs: Mapping[str, SourceCatalog], used: Iterable[str], key: str) -> None:
    """Refuse when a source of ``used`` has documents without a curated token count, which ``key`` needs."""
    unknown = sorted(name for name in used if not catalogs[name].counts_known)
    if unknown:
        raise ConfigError(
            f"{key} needs token counts, but documents of {', '.join(unknown)} have no token_count; "
            f"curate them with `longctx curate` or leave {key} out"
        )


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
    _check_counts(catalogs, [name for name in catalogs if mix[name] > 0], "pack.mix")


def curated_shares(catalogs: Mapping[str, SourceCatalog], specials_per_doc: int) -> dict[str, float]:
    """Each source's share of the curated tokens, every document counted once with its EOS/BOS: the
    mix that ``pack.upsample_long`` keeps when no ``pack.mix`` is given. Curated counts must be known."""
    _check_counts(catalogs, catalogs, "pack.upsample_long")
    tokens = {name: int((cat.token_counts + specials_per_doc).sum()) for name, cat in catalogs.items()}
    total = sum(tokens.values())
    return {name: n / total for name, n in tokens.items()}


def _fill(wanted: float, lengths: np.ndarray, hashes: np.ndarray) -> tuple[SourceRule, int]:
    """The rule that uses documents of ``lengths`` for about ``wanted`` tokens: every one
    ``floor(wanted / sum)`` times, and the first in hash order once more until their tokens come
    closest to the rest. Returns the rule and the tokens it uses."""
    available = int(lengths.sum())
    if available == 0:
        return NO_COPIES, 0
    base = math.floor(wanted / available)
    budget = wanted - base * available
    order = np.argsort(hashes, kind="stable")
    taken = np.concatenate([[0], np.cumsum(lengths[order])])
    cut = int(np.argmin(np.abs(taken - budget)))  # the first `cut` documents in hash order get one more copy
    rule = SourceRule(base, int(hashes[order[cut]]) if cut < len(order) else _ALL)
    return rule, base * available + int(taken[cut])


def plan_mix(
    catalogs: Mapping[str, SourceCatalog],
    mix: Mapping[str, float],
    seed: int,
    specials_per_doc: int,
    total_tokens: int | None = None,
    upsample: UpsampleLong | None = None,
) -> MixPlan:
    """Rules that bring every source to its fraction of ``total_tokens`` (default: all tokens of the
    sources with a fraction above 0), its long documents used ``upsample.factor`` times as often as
    its short ones when ``upsample`` is given. Document lengths are the curated counts plus
    ``specials_per_doc`` (EOS, BOS)."""
    _check_sources(catalogs, mix)
    lengths = {name: cat.token_counts + specials_per_doc for name, cat in catalogs.items()}
    total = total_tokens or int(sum(lengths[name].sum() for name, f in mix.items() if f > 0))
    factor = upsample.factor if upsample else 1.0
    rules: dict[str, SourceRule] = {}
    long_rules: dict[str, SourceRule] = {}
    for name, cat in catalogs.items():
        if mix[name] == 0:
            rules[name] = long_rules[name] = NO_COPIES
            continue
        if int(lengths[name].sum()) == 0:
            raise ConfigError(f"pack.mix: source {name} has no tokens to reach a fraction of {mix[name]}")
        wanted = mix[name] * total
        hashes = np.array([doc_hash(seed, name, doc_id) for doc_id in cat.ids], dtype=np.uint64)
        long = is_long(cat.token_counts, upsample)
        long_tokens, short_tokens = int(lengths[name][long].sum()), int(lengths[name][~long].sum())
        rate = wanted / (factor * long_tokens + short_tokens)  # a short document's; a long one's x factor
        long_rules[name], long_used = _fill(factor * rate * long_tokens, lengths[name][long], hashes[long])
        rules[name], _ = _fill(max(0.0, wanted - long_used), lengths[name][~long], hashes[~long])
    if upsample is None:
        return MixPlan(seed, rules)
    return MixPlan(seed, rules, upsample.min_tokens, long_rules)


class MixError(ConfigError):
    """The mix would leave out more of a source than ``pack.mix_max_dropped`` allows."""


def _by_length(bucket: np.ndarray, tokens: np.ndarray, buckets: int) -> list[int]:
    """``tokens`` summed per length bucket (``bucket[i]`` is document ``i``'s)."""
    sums = np.zeros(buckets, dtype=np.int64)
    np.add.at(sums, bucket, tokens)
    return sums.tolist()


def mix_report(
    catalogs: Mapping[str, SourceCatalog],
    copies: Mapping[str, np.ndarray],
    specials_per_doc: int,
    targets: Mapping[str, float] | None,
    seed: int | None,
    upsample: UpsampleLong | None = None,
    own_shares: bool = False,
) -> MixReport:
    """How many documents and tokens of each source are available, used (with repeats) and
    dropped, overall and by document length (:func:`length_edges`), given each document's number of
    ``copies`` (catalog order); curated counts must be known. ``upsample`` and ``own_shares`` (the
    targets are the sources' own shares) are recorded as the plan used them."""
    lengths = {name: cat.token_counts + specials_per_doc for name, cat in catalogs.items()}
    used = {name: int((copies[name] * lengths[name]).sum()) for name in catalogs}
    total = sum(used.values())
    edges = length_edges(upsample)
    sources = {}
    for name, cat in catalogs.items():
        n, length, tokens = copies[name], lengths[name], int(lengths[name].sum())
        bucket = np.searchsorted(edges, cat.token_counts, side="right")
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
            tokens_by_length=_by_length(bucket, length, len(edges) + 1),
            tokens_used_by_length=_by_length(bucket, n * length, len(edges) + 1),
        )
    return MixReport(
        seed=seed,
        tokens_used=total,
        sources=sources,
        own_shares=own_shares,
        upsample_long=UpsampleUse(min_tokens=upsample.min_tokens, factor=upsample.factor)
        if upsample
        else None,
        length_edges=edges,
    )


def _tokens(n: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:.0f}"


def _length(tokens: int) -> str:
    return f"{tokens // 1024}K" if tokens % 1024 == 0 else str(tokens)


def length_labels(edges: list[int]) -> list[str]:
    """Names of the length buckets that ``edges`` start: ``<4K``, ``4K-32K``, ..., ``>=128K``."""
    names = [_length(edge) for edge in edges]
    return [f"<{names[0]}"] + [f"{lo}-{hi}" for lo, hi in itertools.pairwise(names)] + [f">={names[-1]}"]


def _shares(tokens: list[int]) -> list[float] | None:
    total = sum(tokens)
    return [n / total for n in tokens] if total else None


def format_mix_report(report: MixReport) -> str:
    """The report as a table, one row per source, then each source's share of tokens by document
    length, available and used."""
    if report.seed is None:
        how = "no pack.mix: every document once"
    elif report.own_shares:
        how = f"each source's share of the curated tokens, seed {report.seed}"
    else:
        how = f"pack.mix, seed {report.seed}"
    if report.upsample_long is not None:
        up = report.upsample_long
        how += f"; documents of {up.min_tokens:,}+ tokens x{up.factor:g} within their source"
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
    if report.length_edges:
        labels = length_labels(report.length_edges)
        lines.append(
            "  share of each source's tokens by document length (EOS/BOS excluded), available -> used:"
        )
        lines.append(f"  {'source':<14}" + "".join(f"  {label:>14}" for label in labels))
        for name, s in sorted(report.sources.items()):
            before, after = _shares(s.tokens_by_length), _shares(s.tokens_used_by_length)
            cells = [
                f"{before[i] if before else 0:.3f} -> " + (f"{after[i]:.3f}" if after else "    -")
                for i in range(len(labels))
            ]
            lines.append(f"  {name:<14}" + "".join(f"  {cell:>14}" for cell in cells))
    return "\n".join(lines)


def total_without_drops(
    catalogs: Mapping[str, SourceCatalog],
    mix: Mapping[str, float],
    specials: int,
    upsample: UpsampleLong | None = None,
) -> int:
    """The smallest ``pack.mix_total_tokens`` at which the mix drops no document of a source it uses.
    With ``upsample`` a source's short documents are its least used: their rate must reach 1 even
    when the rounding of its long part (:func:`plan_mix`) has taken up to half a long document more."""

    def needed(cat: SourceCatalog, fraction: float) -> int:
        lengths = cat.token_counts + specials
        long = is_long(cat.token_counts, upsample)
        long_tokens, short_tokens = int(lengths[long].sum()), int(lengths[~long].sum())
        if not short_tokens:
            return math.ceil(long_tokens / fraction)
        factor = upsample.factor if upsample else 1.0
        slack = int(lengths[long].max(initial=0)) / 2
        return math.ceil((factor * long_tokens + short_tokens) * (1 + slack / short_tokens) / fraction)

    return max(needed(cat, mix[name]) for name, cat in catalogs.items() if mix[name] > 0)


def check_dropped(
    report: MixReport,
    mix: Mapping[str, float],
    max_dropped: float,
    catalogs: Mapping[str, SourceCatalog],
    specials: int,
    key: str = "pack.mix",
    upsample: UpsampleLong | None = None,
) -> None:
    """Refuse a mix that leaves out more than ``max_dropped`` of the tokens of a source it uses
    (a source with fraction 0 is left out on purpose), saying which, how much, and what to change;
    ``key`` names the setting that asked for the mix."""
    over = {
        name: s
        for name, s in sorted(report.sources.items())
        if mix.get(name, 0) > 0 and s.tokens and s.tokens_dropped / s.tokens > max_dropped
    }
    if not over:
        return
    worst = max(s.tokens_dropped / s.tokens for s in over.values())
    lines = [
        f"{key} would drop {s.documents_dropped:,} of {s.documents:,} documents of source '{name}' "
        f"({_tokens(s.tokens_dropped)} of {_tokens(s.tokens)} tokens, {s.tokens_dropped / s.tokens:.0%}), "
        f"more than pack.mix_max_dropped allows ({max_dropped:.0%})."
        for name, s in over.items()
    ]
    total = total_without_drops(catalogs, mix, specials, upsample)
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
            tokens = doc.metadata.get("token_count")
            copies = self.plan.copies(doc.metadata["source"], doc.id, -1 if tokens is None else int(tokens))
            self.stat_update("dropped" if copies == 0 else "kept")
            if copies:
                doc.metadata["copies"] = copies
                yield doc
