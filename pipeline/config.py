"""The ``curate`` section of a run's YAML config: sources, length bounds, deduplication, executor and
synthetic tasks. Built on the strict base of ``longctx.core.config``; the roof (``longctx.config``)
puts it into the run config beside the other parts' sections.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator

from longctx.core.config import ExecutorConfig, StrictModel, must_exist

SourceKind = Literal["books", "papers", "code", "jsonl", "parquet", "hf_dataset"]


class SourceConfig(StrictModel):
    """One input source.

    ``kind`` chooses the reader: ``books`` (a folder of .txt files), ``papers`` (LaTeX folders or
    files, Markdown, text), ``code`` (a folder whose subfolders are repositories), or datatrove's
    ``jsonl``/``parquet`` readers and ``hf_dataset`` (a ``datasets.save_to_disk`` folder) for
    pre-extracted text. Length bounds default to the curation-wide rule; set both for a short
    "anchor" source.
    """

    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    kind: SourceKind
    path: Path
    min_tokens: int | None = Field(default=None, ge=0)
    max_tokens: int | None = Field(default=None, gt=0)
    text_key: str = "text"
    id_key: str = "id"
    glob: str | None = None
    strip_gutenberg: bool = True
    limit: int = -1

    _exists = field_validator("path")(must_exist)

    @model_validator(mode="after")
    def _bounds(self) -> "SourceConfig":
        if self.min_tokens is not None and self.max_tokens is not None and self.max_tokens < self.min_tokens:
            raise ValueError(f"max_tokens ({self.max_tokens}) is below min_tokens ({self.min_tokens})")
        return self


class MinHashConfig(StrictModel):
    """datatrove MinHash LSH settings. Pairs whose Jaccard similarity is above about
    ``(1/num_buckets) ** (1/hashes_per_bucket)`` are found with high probability."""

    enabled: bool = True
    n_grams: int = Field(default=5, gt=0)
    num_buckets: int = Field(default=14, gt=0)
    hashes_per_bucket: int = Field(default=8, gt=0)
    seed: int = 1

    @property
    def threshold(self) -> float:
        """Approximate similarity at which a pair has a 50% chance of being a candidate."""
        return (1.0 / self.num_buckets) ** (1.0 / self.hashes_per_bucket)


class DedupConfig(StrictModel):
    exact: bool = True
    minhash: MinHashConfig = Field(default_factory=MinHashConfig)


class SyntheticConfig(StrictModel):
    """Synthetic long-context tasks (needle retrieval, variable tracking) built from the curated
    documents as haystack and written as one more curated source, which the packer mixes like any
    other (long-context recipes give retrieval tasks about 20% of the mix)."""

    source: str = Field(default="synthetic", pattern=r"^[A-Za-z0-9_.-]+$")
    n_examples: int = Field(default=64, ge=0, description="examples per task kind")
    context_tokens: list[int] = Field(
        default_factory=list, description="prompt lengths in tokens; empty: context.target minus 64"
    )
    kinds: list[Literal["single_needle", "multi_key", "multi_value", "variable_tracking"]] = Field(
        default_factory=lambda: ["single_needle", "multi_key", "multi_value", "variable_tracking"]
    )
    depths: list[float] | None = Field(default=None, description="needle depths in [0, 1]; null: uniform")
    seed: int = 0


class CurateConfig(StrictModel):
    """Curation: read sources, filter by token length, remove exact and near duplicates."""

    input: Path | None = Field(
        default=None, description="a folder with books/, papers/ and code/ subfolders, each read as its source"
    )
    sources: list[SourceConfig] = Field(default_factory=list)
    min_fraction_of_target: float = Field(default=0.5, ge=0.0)
    max_file_bytes: int = Field(default=1_000_000, gt=0, description="code files above this are skipped")
    max_book_bytes: int = Field(default=64 * 2**20, gt=0, description="book files above this are refused as too_large")
    dedup: DedupConfig = Field(default_factory=DedupConfig)
    executor: ExecutorConfig = Field(default_factory=ExecutorConfig)
    synthetic: SyntheticConfig | None = None

    _exists = field_validator("input")(must_exist)
