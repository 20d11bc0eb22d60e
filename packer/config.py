"""The ``pack`` section of a run's YAML config: which windows to build from the curated documents.

The fields that change the bytes of the shards enter the config hash recorded in every shard
(:meth:`PackConfig.output_fields`).
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from longctx.core.config import ExecutorConfig, StorageOptions, StrictModel


def is_source_name(name: str) -> bool:
    """Whether ``name`` can name a source, i.e. a folder directly under ``<output>/documents``."""
    return bool(name) and name not in (".", "..") and not any(c in name for c in "/\\\0")


DATA_FIELDS = frozenset(
    {"mix", "mix_total_tokens", "upsample_long", "seed", "eos_token", "bos_token", "pad_token"}
)
"""Fields of :class:`PackConfig` that decide the tokens of every output of a run."""
WINDOW_FIELDS = frozenset({"strategy", "shard_tokens", "pool_tokens"})
"""Fields (besides ``executor.tasks``) that decide how one output is packed."""
NOT_IN_OUTPUT = frozenset(
    {
        "seq_lens",
        "executor",
        "batch_size",
        "allow_short_positions",
        "mix_max_dropped",
        "output",
        "input",
        "storage_options",
    }
)
"""Fields that do not change an output's bytes: which outputs to make, where tasks run, how many
documents one tokenizer call takes, whether a run is refused, where the shards are published, where
the documents are read from (what they are is part of the run record)."""


class UpsampleLong(StrictModel):
    """``pack.upsample_long``: documents of at least ``min_tokens`` tokens are used ``factor`` times as
    often as the other documents of their source, within the source's share of the mix."""

    min_tokens: int = Field(
        gt=0, description="a document of at least this many tokens (EOS/BOS excluded) is long"
    )
    factor: float = Field(
        ge=1,
        allow_inf_nan=False,
        description="how many times as often a long document is used as a short one",
    )


class PackConfig(StrictModel):
    """Tokenize, mix and pack curated documents into fixed-length windows.

    ``seq_lens`` lists one or more window lengths built from the same documents (a staged
    extension such as 8K, 32K, 128K); empty means ``[context.target]``. ``mix`` maps every curated
    source to the fraction of tokens it should contribute; sources are upsampled by repeating
    documents or downsampled by dropping them, chosen by ``seed``; a mix that would drop more than
    ``mix_max_dropped`` of a source's tokens is refused. Without ``mix`` every document is used
    exactly once.

    ``upsample_long`` repeats long documents within their source (Fu et al. 2024, "Data Engineering
    for Scaling Language Models to 128K Context"): each source keeps its share of the mix (without
    ``mix``: its share of the curated tokens), and within it a document of at least ``min_tokens``
    tokens is used ``factor`` times as often as a shorter one, so the short documents give way.

    ``output`` publishes the finished shards to another place, typically object storage
    (``s3://bucket/run/shards``): each ``<output>/shards/seq<N>/`` folder of the run is packed locally
    as usual, then uploaded to ``<pack.output>/seq<N>/`` with its manifest last (so a reader never
    sees part of it). ``storage_options`` are fsspec's options for it (credentials, endpoint).

    ``input`` packs a curation published elsewhere (``curate.output``, e.g. ``s3://bucket/run``)
    instead of the run folder's own ``documents/``: its files are copied into ``<output>/cache`` and
    each checked against the published ``curation.json`` first, and its tokenizer becomes the run's
    ``tokenizer.json`` (``storage_options`` apply to it too).
    """

    seq_lens: list[int] = Field(
        default_factory=list, description="window lengths in tokens; empty = [context.target]"
    )
    strategy: Literal["bfd", "concat"] = Field(
        default="bfd",
        description="bfd: best-fit decreasing, short documents kept whole; concat: concatenate and chunk",
    )
    mix: dict[str, float] | None = Field(
        default=None, description="source -> target fraction of tokens (sums to 1)"
    )
    mix_total_tokens: int | None = Field(
        default=None,
        gt=0,
        description="tokens the mix (pack.mix, or pack.upsample_long without it) should reach; default: all "
        "tokens of the sources it uses",
    )
    mix_max_dropped: float = Field(
        default=0.1,
        ge=0,
        le=1,
        description="largest share of a source's tokens the mix may leave out (fraction-0 sources excepted); "
        "a mix that drops more is refused",
    )
    upsample_long: UpsampleLong | None = Field(
        default=None,
        description="{min_tokens, factor}: documents of at least min_tokens tokens are used factor times as "
        "often as the shorter ones of their source, whose share stays as pack.mix sets it (without pack.mix: "
        "its share of the curated tokens)",
    )
    seed: int = Field(default=0, description="chooses which documents are repeated or dropped by the mix")
    eos_token: str | None = Field(
        default=None,
        description="appended to every document; default: the tokenizer's own end-of-document token "
        "(eos_token of the tokenizer_config.json beside it, else its post-processor's, else a conventional "
        "end-of-text special token)",
    )
    bos_token: str | None = Field(
        default=None,
        description="prepended to every document when set; default: the tokenizer's own, when its "
        "tokenizer_config.json says add_bos_token (or its post-processor prepends one)",
    )
    pad_token: str | None = Field(
        default=None, description="fills unused window tokens; default: the EOS token"
    )
    allow_short_positions: bool = Field(
        default=False, description="pack even when no token reaches position context.original"
    )
    shard_tokens: int = Field(
        default=1 << 26,
        gt=0,
        description="tokens per shard file, rounded down to whole windows (about 9 bytes each)",
    )
    pool_tokens: int = Field(
        default=1 << 28,
        gt=0,
        description="tokens a task holds in memory and packs together (about 4 bytes each)",
    )
    batch_size: int = Field(
        default=64, gt=0, description="documents per tokenizer call (encoded in parallel)"
    )
    executor: ExecutorConfig = Field(default_factory=ExecutorConfig)
    output: str | None = Field(
        default=None,
        description="also publish the shards here, as <output>/seq<N>/: an fsspec URL (s3://bucket/path) "
        "or a folder; default: only <run output>/shards",
    )
    input: str | None = Field(
        default=None,
        description="pack the curation published here (curate.output: an fsspec URL such as s3://bucket/run, "
        "or a folder) instead of <run output>/documents",
    )
    storage_options: StorageOptions = Field(
        description="fsspec options for pack.output and pack.input (credentials, endpoint_url...)",
    )

    @field_validator("seq_lens")
    @classmethod
    def _valid_seq_lens(cls, value: list[int]) -> list[int]:
        if any(n < 2 for n in value):
            raise ValueError(f"every seq_len must be at least 2 tokens, got {value}")
        if len(set(value)) != len(value):
            raise ValueError(f"seq_lens must be distinct, got {value}")
        return value

    @field_validator("mix")
    @classmethod
    def _valid_mix(cls, value: dict[str, float] | None) -> dict[str, float] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("mix must name at least one source (or be left out)")
        not_names = sorted(name for name in value if not is_source_name(name))
        if not_names:
            raise ValueError(
                f"{', '.join(map(repr, not_names))} cannot be a source: sources are the folder names "
                "under <output>/documents"
            )
        negative = sorted(name for name, fraction in value.items() if fraction < 0)
        if negative:
            raise ValueError(f"mix fractions must be >= 0; negative for: {', '.join(negative)}")
        total = sum(value.values())
        if not math.isclose(total, 1.0, abs_tol=1e-6):
            raise ValueError(f"mix fractions must sum to 1, they sum to {total:.6g}")
        return value

    @model_validator(mode="after")
    def _pool_holds_a_window(self) -> PackConfig:
        if self.seq_lens and self.pool_tokens < max(self.seq_lens):
            longest = max(self.seq_lens)
            raise ValueError(
                f"pool_tokens ({self.pool_tokens}) must be at least the longest seq_len {longest}"
            )
        return self

    def resolved_seq_lens(self, target_context: int) -> list[int]:
        """The window lengths to build, in ascending order."""
        return sorted(self.seq_lens) if self.seq_lens else [target_context]

    def upsampling(self) -> UpsampleLong | None:
        """``upsample_long`` when it changes anything (a factor of 1 uses every document as without it)."""
        return (
            self.upsample_long if self.upsample_long is not None and self.upsample_long.factor != 1 else None
        )

    def data_fields(self) -> dict[str, Any]:
        """The settings that decide which tokens every output holds (shared by all window lengths of
        a run): the mix, its total and seed, the upsampling of long documents, and the special tokens.
        ``upsample_long`` is left out when it changes nothing, so that a run without it (packed before
        it existed, or with a factor of 1) has the same config hash and resumes as it is."""
        fields = self.model_dump(mode="json", include=DATA_FIELDS - {"upsample_long"})
        upsampling = self.upsampling()
        return fields | ({"upsample_long": upsampling.model_dump(mode="json")} if upsampling else {})

    def window_fields(self) -> dict[str, Any]:
        """The settings that decide how one output's windows are packed and split into files: the
        strategy, the pool and shard sizes, and the task count (each task packs its own share of the
        documents). An output added to a run later may use other values than the earlier ones."""
        return self.model_dump(mode="json", include=WINDOW_FIELDS) | {"tasks": self.executor.tasks}

    def output_fields(self, seq_len: int) -> dict[str, Any]:
        """Everything that determines the bytes of the ``seq_len`` output (hashed into its
        ``config_sha256``). The other fields (:data:`NOT_IN_OUTPUT`) change where and whether the job
        runs, not what it writes, so changing them resumes the same run."""
        return self.data_fields() | self.window_fields() | {"seq_len": seq_len}
