"""The ``curate`` section of a run's YAML config: sources, length bounds, deduplication, executor and
synthetic tasks. Built on the strict base of ``longctx.core.config``; the roof (``longctx.config``)
puts it into the run config beside the other parts' sections.

Input locations are local paths or fsspec URLs (``s3://bucket/books``, ``gs://...``, ``hf://...``),
read through datatrove's data folders; a local path must exist when ``longctx curate`` starts, a URL
is checked when the run starts reading. ``storage_options`` (credentials, endpoints) are passed to
fsspec and are never shown nor part of a run's recorded identity.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from longctx.core.config import ExecutorConfig, StorageOptions, StrictModel, WorldCheck, missing_extra
from longctx.pipeline.synthetic.kinds import DEFAULT_KINDS, TaskKind

SourceKind = Literal["books", "papers", "code", "jsonl", "parquet", "hf_dataset"]
DocumentKeepRule = Literal["longest", "not_vendored"]
FileKeepRule = Literal["upstream", "not_vendored", "longest", "shallowest"]


def _folder_name(value: str) -> str:
    """A source name, which names a folder of curated documents: no path separators, not hidden."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", value) or value.startswith("."):
        raise ValueError(
            f"{value!r} cannot name a folder: use letters, digits, '_', '-' and '.', not starting with '.'"
        )
    return value


def _location_text(value: Any) -> Any:
    """A location given as a path object, as a string."""
    return os.fspath(value) if isinstance(value, os.PathLike) else value


def _missing_location(value: str | None) -> str | None:
    """A local path must exist; an fsspec URL is checked when it is read."""
    if value is None or "://" in value or Path(value).exists():
        return None
    return f"path does not exist: {value}"


LOCATION = WorldCheck(_missing_location)
"""A local path (which must exist when a command uses the section) or an fsspec URL."""


def _missing_reader(kind: str) -> str | None:
    """``hf_dataset`` reads through the ``datasets`` package (datatrove's reader imports it), which
    the base install does not bring."""
    return missing_extra("datasets", "datasets") if kind == "hf_dataset" else None


class SourceConfig(StrictModel):
    """One input source.

    ``kind`` chooses the reader: ``books`` (a folder of .txt files), ``papers`` (LaTeX folders or
    files, Markdown, text), ``code`` (a folder whose subfolders are repositories), or datatrove's
    ``jsonl``/``parquet`` readers and ``hf_dataset`` (a ``datasets.save_to_disk`` folder, read with
    the ``datasets`` extra) for pre-extracted text. Length bounds default to the curation-wide rule;
    set both for a short "anchor" source.
    """

    name: str = Field(description="names the source's folder of curated documents")
    kind: Annotated[SourceKind, WorldCheck(_missing_reader)] = Field(
        description="the reader: a folder of books, papers or code repositories, or rows "
        "(hf_dataset needs the datasets extra)"
    )
    path: Annotated[str, LOCATION] = Field(
        description="a local path or an fsspec URL (s3://, gs://, hf://...)"
    )
    storage_options: StorageOptions = Field(description="fsspec options for a URL")
    min_tokens: int | None = Field(
        default=None, ge=0, description="shortest document kept; default: curate.min_fraction_of_target"
    )
    max_tokens: int | None = Field(default=None, gt=0, description="longest document kept; default: no bound")
    text_key: str = Field(default="text", description="jsonl/parquet/hf_dataset: the column holding the text")
    id_key: str = Field(
        default="id", description="jsonl/parquet/hf_dataset: the column holding a row's id, if any"
    )
    glob: str | None = Field(
        default=None, description="jsonl/parquet: files to read; default `**/*.jsonl*` or `**/*.parquet`"
    )
    strip_gutenberg: bool = Field(default=True, description="books: remove Project Gutenberg's boilerplate")
    limit: int = Field(
        default=-1,
        description="read only the first N units (rows: N per task), the rest recorded as skipped; -1: all",
    )

    _location = field_validator("path", mode="before")(_location_text)
    _name = field_validator("name")(_folder_name)

    @model_validator(mode="after")
    def _bounds(self) -> SourceConfig:
        if self.min_tokens is not None and self.max_tokens is not None and self.max_tokens < self.min_tokens:
            raise ValueError(f"max_tokens ({self.max_tokens}) is below min_tokens ({self.min_tokens})")
        return self


class MinHashConfig(StrictModel):
    """datatrove MinHash LSH settings. Pairs whose Jaccard similarity is above about
    ``(1/num_buckets) ** (1/hashes_per_bucket)`` are found with high probability."""

    enabled: bool = Field(default=True, description="find near duplicates (false: exact ones only)")
    n_grams: int = Field(default=5, gt=0, description="words per shingle")
    num_buckets: int = Field(default=14, gt=0, description="LSH bands")
    hashes_per_bucket: int = Field(default=8, gt=0, description="hashes per band")
    seed: int = Field(default=1, description="seed of the hash functions")

    @property
    def threshold(self) -> float:
        """Approximate similarity at which a pair has a 50% chance of being a candidate."""
        return (1.0 / self.num_buckets) ** (1.0 / self.hashes_per_bucket)


class FileMinHashConfig(MinHashConfig):
    """MinHash for code files: more, shorter bands than for documents, so that pairs down to a
    Jaccard similarity of about 0.3 become candidates; candidates are then checked against the
    full signatures (:class:`FileDedupConfig`)."""

    num_buckets: int = Field(default=40, gt=0)
    hashes_per_bucket: int = Field(default=3, gt=0)


class FileDedupConfig(StrictModel):
    """File-level deduplication of code across repositories, before each repository is concatenated.

    Two files of different repositories are duplicates when their normalized text is the same
    (``exact_duplicate``), or when the MinHash estimate of their word n-gram sets has a Jaccard
    similarity of at least ``jaccard`` or holds at least ``containment`` of the smaller file's
    n-grams (``near_duplicate``: an older vendored copy is mostly contained in its upstream). Of the
    copies, the one ranked first by ``keep`` stays (``upstream``: the repository that declares the
    file's package, not a copy with imports rewritten under a vendor prefix; see
    :mod:`longctx.pipeline.keep`); the others are dropped from their repository's document and
    listed in its ``duplicate_files``.
    """

    enabled: bool = Field(default=True, description="deduplicate code files across repositories")
    keep: list[FileKeepRule] = Field(
        default_factory=lambda: ["upstream", "not_vendored", "longest", "shallowest"],
        description="order of preference among copies of a file; ties end with the repository id and path",
    )
    jaccard: float = Field(
        default=0.7, gt=0.0, le=1.0, description="near duplicates: at least this Jaccard similarity..."
    )
    containment: float = Field(
        default=0.8,
        gt=0.0,
        le=1.0,
        description="...or this share of the smaller file's n-grams in the larger",
    )
    min_words: int = Field(default=50, ge=1, description="shorter files are only compared exactly")
    minhash: FileMinHashConfig = Field(default_factory=FileMinHashConfig)


class DedupConfig(StrictModel):
    """Document-level exact and near deduplication (and file-level, for code).

    ``keep`` orders the copies in a cluster of duplicates; the first is kept: ``longest`` (the most
    complete document: the longest text after cleaning), ``not_vendored`` (the one whose path has
    fewer vendored or forked folders: ``vendor/``, ``third_party/``, ``forks/``, ``*-fork``...).
    Remaining ties go to the smallest id.
    """

    exact: bool = Field(default=True, description="remove exact duplicates (normalized text hash)")
    minhash: MinHashConfig = Field(default_factory=MinHashConfig)
    keep: list[DocumentKeepRule] = Field(
        default_factory=lambda: ["longest", "not_vendored"],
        description="order of preference among copies of a document; ties go to the smallest id",
    )
    files: FileDedupConfig = Field(default_factory=FileDedupConfig)

    @field_validator("keep")
    @classmethod
    def _distinct(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError(f"keep rules must be distinct, got {value}")
        return value


class SyntheticConfig(StrictModel):
    """Synthetic long-context tasks (needle retrieval, variable tracking, the RULER-style
    multi-query, document QA and word-aggregation tasks, and the HELMET- and NoLiMa-style JSON
    key-value, in-context learning and associative needle tasks) built from the curated
    documents as haystack and written as one more curated source, which the packer mixes like any
    other (long-context recipes give retrieval tasks about 20% of the mix)."""

    source: str = Field(
        default="synthetic", description="the source name: documents/<source>/, and its name in pack.mix"
    )
    n_examples: int = Field(default=64, ge=0, description="examples per task kind")
    context_tokens: list[int] = Field(
        default_factory=list, description="prompt lengths in tokens; empty: context.target minus 64"
    )
    kinds: list[TaskKind] = Field(
        default_factory=lambda: list(DEFAULT_KINDS),
        description="task kinds (longctx.pipeline.synthetic.kinds): default the four retrieval kinds; "
        "multi_query, document_qa, common_words, frequent_words, json_kv, icl_labels and nolima_needle "
        "may be added",
    )
    depths: list[float] | None = Field(default=None, description="needle depths in [0, 1]; null: uniform")
    seed: int = Field(default=0, description="the same seed and documents give the same tasks")

    _name = field_validator("source")(_folder_name)


class DependencyFilter(StrictModel):
    """Which documents of one source the dependency scores keep (``curate.dependency.filters``);
    each dropped document is recorded in the ledger with its reason and score."""

    min_dependency: float | None = Field(
        default=None,
        description="drop documents whose score (the model's where a document has one, else the "
        "model-free one, for which 0 is chance) is below (ledger reason low_dependency)",
    )
    keep_top_fraction: float | None = Field(
        default=None,
        gt=0.0,
        le=1.0,
        description="keep this fraction (rounded up) of the source's scored documents that are not "
        "duplicates, best scores first (ledger reason not_top_dependency)",
    )


class DependencyConfig(StrictModel):
    """Long-range dependency scores of each curated document (ProLong-data, LongWanjuan): stored
    beside its text, in the ledger and in stats; ``filters`` drop documents by them."""

    enabled: bool = Field(
        default=True,
        description="compute the model-free score: token trigrams distant segments share, against "
        "chance (about 2% of the tokenizer's CPU)",
    )
    model: str | None = Field(
        default=None,
        description="also score with this Hugging Face causal LM (a local folder, or a hub id already in "
        "the cache: nothing is downloaded): the loss of later segments given a distant context against a "
        "local one",
    )
    filters: dict[str, DependencyFilter] = Field(
        default_factory=dict,
        description="per source name (a source of the run): which documents the scores keep; documents "
        "too short to be scored (under 4,096 tokens) are kept",
    )
    model_segment_tokens: int = Field(
        default=128, gt=0, description="model score: tokens of each later segment whose loss is compared"
    )
    model_local_tokens: int = Field(
        default=128,
        gt=0,
        description="model score: the short view's context, the tokens just before a segment (the long "
        "view reads them too)",
    )
    model_context_tokens: int | None = Field(
        default=None,
        gt=0,
        description="model score: the long view's context, the tokens before a segment (distant, then "
        "local); null: 4096, or fewer to fit the model's max_position_embeddings",
    )
    model_segments: int = Field(
        default=8,
        gt=0,
        description="model score: segments scored per document, evenly spaced where each has the whole "
        "context before it",
    )
    model_batch_size: int = Field(
        default=8, gt=0, description="model score: sequences per forward pass (and documents per batch)"
    )
    model_device: Literal["auto", "cpu", "cuda"] = Field(
        default="auto",
        description="model score: auto is a GPU when torch sees one (the tasks of a machine take its GPUs "
        "in turn), else the CPU",
    )


class CurateConfig(StrictModel):
    """Curation: read sources, filter by token length, remove exact and near duplicates."""

    input: Annotated[str | None, LOCATION] = Field(
        default=None,
        description="a folder (local path or fsspec URL) with books/, papers/ and code/ "
        "subfolders, each read as its source",
    )
    storage_options: StorageOptions = Field(
        description="fsspec options for input and output (credentials, endpoint_url...)"
    )
    output: str | None = Field(
        default=None,
        description="also publish the finished curation here (documents/, tokenizer, ledger, stats, then "
        "curation.json): an fsspec URL (s3://bucket/run) or a folder, which pack.input reads",
    )
    sources: list[SourceConfig] = Field(
        default_factory=list, description="sources listed one by one, besides input's"
    )
    min_fraction_of_target: float = Field(
        default=0.5, ge=0.0, description="keep documents of at least this fraction of context.target tokens"
    )
    max_file_bytes: int = Field(default=1_000_000, gt=0, description="code files above this are skipped")
    max_book_bytes: int = Field(
        default=64 * 2**20, gt=0, description="book files above this are refused as too_large"
    )
    vendored_code: Literal["dedup", "skip"] = Field(
        default="dedup",
        description="vendored folders of repositories (vendor/, third_party/...): read and "
        "deduplicated per file, or skipped",
    )
    dedup: DedupConfig = Field(default_factory=DedupConfig)
    dependency: DependencyConfig = Field(default_factory=DependencyConfig)
    executor: ExecutorConfig = Field(default_factory=ExecutorConfig)
    synthetic: SyntheticConfig | None = None

    _location = field_validator("input", mode="before")(_location_text)
