"""The manifest of one output (``shards/seq<N>/manifest.json``) and the coverage check.

The manifest lists every shard with its row count and checksum, and says what the windows hold:
tokens and padding, tokens per source against the mix's targets, what the mix did with every
source (documents and tokens available, used, dropped, epochs, tokens by document length before and
after the mix), position histograms, the largest
position, and the fraction of tokens at positions at or above ``context.original``. Those are the
positions a context extension exists to train, so an output where no token reaches them is refused
(unless ``pack.allow_short_positions`` is set) and gets no manifest; readers refuse a folder
without one. The datatrove step that writes manifests is :class:`longctx.packer.stage.WriteManifests`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field, ValidationError

from longctx.core import remote
from longctx.core.atomic import write_json
from longctx.core.buckets import HISTOGRAM_BUCKETS, num_buckets
from longctx.core.errors import ConfigError
from longctx.core.remote import is_remote
from longctx.packer.format import FrozenModel, ShardError, ShardFile, ShardHeader, check_version
from longctx.packer.stats import OutputStats

MANIFEST_NAME = "manifest.json"


class CoverageError(ConfigError):
    """No packed token reaches ``context.original``: the output would not train longer positions."""


class SourceSummary(FrozenModel):
    tokens: int
    fraction: float
    target_fraction: float | None
    documents: int
    segments: int
    max_position: int
    long_tokens: int
    position_histogram: list[int]
    segment_length_histogram: list[int]


class SourceUse(FrozenModel):
    """What the mix does with one source. Tokens count what is packed: each document's tokens plus
    its EOS (and BOS) token; "used" counts every copy of a repeated document."""

    target_fraction: float | None
    fraction: float
    documents: int
    tokens: int
    documents_used: int
    documents_dropped: int
    tokens_dropped: int
    copies: int
    tokens_used: int
    epochs: float
    max_copies: int
    tokens_by_length: list[int] = Field(default_factory=list)
    tokens_used_by_length: list[int] = Field(default_factory=list)


class UpsampleUse(FrozenModel):
    """``pack.upsample_long`` as the mix applied it: documents of at least ``min_tokens`` tokens were
    used ``factor`` times as often as the other documents of their source."""

    min_tokens: int
    factor: float


class MixReport(FrozenModel):
    """Per source use of the curated documents, decided before packing (``seed`` is None without a
    ``pack.mix`` or ``pack.upsample_long``: then every document is used once). ``own_shares``: the
    targets are each source's share of the curated tokens (``pack.upsample_long`` without
    ``pack.mix``). A source's ``tokens_by_length`` and ``tokens_used_by_length`` count its tokens
    available and used per bucket of document length: bucket ``i`` holds documents of at least
    ``length_edges[i - 1]`` (0 for the first) and fewer than ``length_edges[i]`` tokens (EOS/BOS
    excluded; the last bucket has no upper end). Manifests written before these fields have none."""

    seed: int | None
    tokens_used: int
    sources: dict[str, SourceUse]
    own_shares: bool = False
    upsample_long: UpsampleUse | None = None
    length_edges: list[int] = Field(default_factory=list)


class Manifest(FrozenModel):
    """Everything about one output of ``seq_len``-token windows; see ``packer/FORMAT.md``."""

    header: ShardHeader
    config: dict[str, Any]
    shards: list[ShardFile]
    rows: int
    tokens: int
    padding: int
    efficiency: float
    max_position: int
    long_tokens: int
    long_fraction: float
    short_document_pieces: int
    histogram_buckets: str = HISTOGRAM_BUCKETS
    position_histogram: list[int]
    segment_length_histogram: list[int]
    sources: dict[str, SourceSummary]
    mix: MixReport | None = None


def build_manifest(
    header: ShardHeader,
    config: dict[str, Any],
    shards: list[ShardFile],
    stats: OutputStats,
    targets: Mapping[str, float] | None,
    mix: MixReport | None = None,
) -> Manifest:
    """Merge shards and statistics of all tasks into the manifest."""
    tokens = stats.tokens
    buckets = num_buckets(header.seq_len)
    position_histogram = np.zeros(buckets, dtype=np.int64)
    length_histogram = np.zeros(buckets, dtype=np.int64)
    sources = {}
    for name in sorted(stats.sources):
        s = stats.sources[name]
        position_histogram += s.position_histogram
        length_histogram += s.segment_length_histogram
        sources[name] = SourceSummary(
            tokens=s.tokens,
            fraction=s.tokens / tokens if tokens else 0.0,
            target_fraction=targets.get(name) if targets else None,
            documents=s.documents,
            segments=s.segments,
            max_position=s.max_position,
            long_tokens=s.long_tokens,
            position_histogram=s.position_histogram.tolist(),
            segment_length_histogram=s.segment_length_histogram.tolist(),
        )
    long_tokens = sum(s.long_tokens for s in sources.values())
    return Manifest(
        header=header,
        config=config,
        shards=shards,
        rows=stats.rows,
        tokens=tokens,
        padding=stats.padding,
        efficiency=tokens / (stats.rows * header.seq_len) if stats.rows else 0.0,
        max_position=max((s.max_position for s in sources.values()), default=-1),
        long_tokens=long_tokens,
        long_fraction=long_tokens / tokens if tokens else 0.0,
        short_document_pieces=stats.short_document_pieces,
        position_histogram=position_histogram.tolist(),
        segment_length_histogram=length_histogram.tolist(),
        sources=sources,
        mix=mix,
    )


def coverage_refusal(seq_len: int, original: int, longest: Mapping[str, int]) -> str | None:
    """Why windows of ``seq_len`` would train no position at or above ``original``, given the
    longest segment per source; None when some source reaches it."""
    if any(length > original for length in longest.values()):
        return None
    lines = [
        (
            f"seq_len {seq_len}: no token reaches position {original} (context.original), so these windows "
            "would never train the positions a context extension is for. Longest segment per source:"
        )
    ]
    lines += [
        f"  {name}: {length} tokens (positions 0..{length - 1})" for name, length in sorted(longest.items())
    ]
    if seq_len <= original:
        lines.append(f"Use a pack.seq_lens entry above {original}.")
    else:
        lines.append(
            f"Add a source with documents longer than {original} tokens (books, papers, code repositories), "
            "or raise the fraction of such sources in pack.mix."
        )
    lines.append("To pack anyway (e.g. a short warm-up stage), set pack.allow_short_positions: true.")
    return "\n".join(lines)


def write_manifest(folder: Path, manifest: Manifest) -> Path:
    """Write ``folder/manifest.json`` atomically."""
    path = folder / MANIFEST_NAME
    write_json(path, manifest.model_dump(mode="json"), indent=1)
    return path


def parse_manifest(data: bytes, origin: str) -> Manifest:
    """A manifest from the bytes of ``origin`` (a path or URL); :class:`ShardError` when malformed."""
    try:
        parsed = json.loads(data.decode("utf-8"))
        check_version(parsed.get("header") if isinstance(parsed, dict) else None, origin)
        return Manifest.model_validate(parsed)
    except (json.JSONDecodeError, ValidationError, UnicodeDecodeError) as err:
        raise ShardError(f"{origin}: malformed manifest: {err}") from None


def read_manifest_bytes(
    folder: str | os.PathLike, storage_options: Mapping[str, Any] | None = None
) -> tuple[bytes, str]:
    """The bytes of ``folder/manifest.json`` and its path or URL; ``folder`` may be an fsspec URL.
    :class:`ShardError` when there is none."""
    if is_remote(folder):
        url = remote.join(os.fspath(folder), MANIFEST_NAME)
        fs, path = remote.filesystem(url, storage_options)
        with remote.remote_errors(url, "reading"):
            fs.invalidate_cache(path)  # another process may have published it since this one listed
            found = fs.exists(path)
        if found:
            return remote.read_bytes(url, storage_options), url
        missing = url
    else:
        path = Path(folder) / MANIFEST_NAME
        if path.is_file():
            return path.read_bytes(), str(path)
        missing = str(path)
    raise ShardError(
        f"{os.fspath(folder)}: no {MANIFEST_NAME} ({missing}); the pack run that writes it has not finished "
        "(or refused this output)"
    )


def load_manifest(folder: str | os.PathLike, storage_options: Mapping[str, Any] | None = None) -> Manifest:
    """Read ``folder/manifest.json`` (``folder`` may be an fsspec URL); :class:`ShardError` when it is
    missing or malformed."""
    return parse_manifest(*read_manifest_bytes(folder, storage_options))
