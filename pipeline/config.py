"""YAML configuration, validated before any work starts.

One YAML file describes a run. Its sections are validated by pydantic models that forbid unknown
keys, so a typo (``min_token`` for ``min_tokens``) is an error naming the key and a suggestion,
never a silently ignored setting. Paths must exist where the model says so. Relative paths are
taken relative to the current working directory.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from pipeline.errors import LongctxError


class ConfigError(LongctxError, ValueError):
    """A configuration file is malformed, names an unknown key, has a wrong type or a missing path."""


class StrictModel(BaseModel):
    """Base for every config section: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def _must_exist(value: Path | None) -> Path | None:
    if value is not None and not Path(value).exists():
        raise ValueError(f"path does not exist: {value}")
    return value


class ContextConfig(StrictModel):
    """The model's pretraining window and the window the run extends it to, in tokens."""

    original: int = Field(gt=0, description="context length the model was pretrained at")
    target: int = Field(gt=0, description="context length to extend to")

    @model_validator(mode="after")
    def _target_above_original(self) -> "ContextConfig":
        if self.target < self.original:
            raise ValueError(f"target ({self.target}) must be at least original ({self.original})")
        return self


class TokenizerConfig(StrictModel):
    """Which tokenizer counts (and later packs) tokens.

    ``path`` is a Hugging Face ``tokenizer.json`` (bring your model's). When it is null, curation
    trains a small byte-level BPE on the input and saves it as ``<output>/tokenizer.json``: good for
    the demo, not for a real model.
    """

    path: Path | None = None
    train_vocab_size: int = Field(default=4096, ge=260)
    train_sample_bytes: int = Field(default=20_000_000, gt=0, description="text sampled for BPE training")

    _exists = field_validator("path")(_must_exist)


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

    _exists = field_validator("path")(_must_exist)

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


class SlurmConfig(StrictModel):
    """Passed to datatrove's ``SlurmPipelineExecutor``."""

    partition: str
    time: str = "24:00:00"
    cpus_per_task: int = 1
    mem_per_cpu_gb: int = 2
    qos: str = "normal"
    sbatch_args: dict[str, str] = Field(default_factory=dict)


class ExecutorConfig(StrictModel):
    """Where stages run: datatrove's local, Slurm or Ray executor."""

    kind: Literal["local", "slurm", "ray"] = "local"
    tasks: int = Field(default=2, gt=0, description="shards of the input, one task each")
    workers: int = Field(default=-1, description="tasks run at once on the local executor; -1 = all")
    slurm: SlurmConfig | None = None

    @model_validator(mode="after")
    def _slurm_needs_settings(self) -> "ExecutorConfig":
        if self.kind == "slurm" and self.slurm is None:
            raise ValueError("kind: slurm needs a 'slurm' section (at least 'partition')")
        return self


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

    _exists = field_validator("input")(_must_exist)


class RootConfig(StrictModel):
    """A whole run."""

    output: Path = Path("runs/default")
    context: ContextConfig
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    curate: CurateConfig = Field(default_factory=CurateConfig)
    pack: packer.config.PackConfig | None = None
    train: trainer.config.TrainConfig | None = None
    eval: trainer.config.EvalConfig | None = None


# packer.config and trainer.config build on the sections above, so they are imported after them;
# RootConfig's ``pack``, ``train`` and ``eval`` annotations are resolved when a config is first validated.
import packer.config  # noqa: E402
import trainer.config  # noqa: E402


def _known_keys(model: type[BaseModel], loc: tuple[Any, ...]) -> list[str]:
    """Field names of the model found at ``loc`` (for "did you mean" suggestions)."""
    current: Any = model
    for part in loc:
        if isinstance(part, int) or not (isinstance(current, type) and issubclass(current, BaseModel)):
            continue
        field = current.model_fields.get(part)
        if field is None:
            break
        annotation = field.annotation
        for candidate in getattr(annotation, "__args__", ()) or (annotation,):
            if isinstance(candidate, type) and issubclass(candidate, BaseModel):
                current = candidate
                break
            for inner in getattr(candidate, "__args__", ()):
                if isinstance(inner, type) and issubclass(inner, BaseModel):
                    current = inner
                    break
    if isinstance(current, type) and issubclass(current, BaseModel):
        return list(current.model_fields)
    return []


def format_validation_error(err: ValidationError, model: type[BaseModel], origin: str) -> str:
    """One line per problem, each naming the dotted key."""
    lines = [f"invalid configuration in {origin}:"]
    for problem in err.errors():
        loc = tuple(problem["loc"])
        key = ".".join(str(p) for p in loc) or "<root>"
        if problem["type"] == "extra_forbidden":
            known = _known_keys(model, loc[:-1])
            close = difflib.get_close_matches(str(loc[-1]), known, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else (f" (known keys: {', '.join(known)})" if known else "")
            lines.append(f"  {key}: unknown key{hint}")
        else:
            msg = problem["msg"].removeprefix("Value error, ")
            lines.append(f"  {key}: {msg} (got {problem.get('input')!r})")
    return "\n".join(lines)


def parse_config(data: dict[str, Any], origin: str = "<dict>") -> RootConfig:
    """Validate a config mapping; raise :class:`ConfigError` naming every bad key."""
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: the top level must be a mapping of sections, got {type(data).__name__}")
    try:
        return RootConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, RootConfig, origin)) from None


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> RootConfig:
    """Read a YAML config with ``yaml.safe_load``, apply dotted-key overrides, validate it."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    for dotted, value in (overrides or {}).items():
        if value is None:
            continue
        target = data
        *parents, last = dotted.split(".")
        for part in parents:
            target = target.setdefault(part, {})
        target[last] = value
    return parse_config(data, str(path))
