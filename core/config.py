"""The strict base of every config section, and the sections several parts share.

Sections are pydantic models that forbid unknown keys, so a typo (``min_token`` for ``min_tokens``)
is an error naming the key and a suggestion, never a silently ignored setting. Each part declares
its own sections on this base (``longctx.pipeline.config``, ``longctx.packer.config``,
``longctx.trainer.config``); the roof (``longctx.config``) assembles them into one run config.
"""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from longctx.core.errors import ConfigError

M = TypeVar("M", bound=BaseModel)


class StrictModel(BaseModel):
    """Base for every config section: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


def must_exist(value: Path | None) -> Path | None:
    """Field validator: a path that must exist when set."""
    if value is not None and not Path(value).exists():
        raise ValueError(f"path does not exist: {value}")
    return value


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
            hint = (
                f" (did you mean '{close[0]}'?)"
                if close
                else (f" (known keys: {', '.join(known)})" if known else "")
            )
            lines.append(f"  {key}: unknown key{hint}")
        else:
            msg = problem["msg"].removeprefix("Value error, ")
            lines.append(f"  {key}: {msg} (got {problem.get('input')!r})")
    return "\n".join(lines)


def validate_section(model: type[M], data: Any, origin: str) -> M:
    """``model`` validated from ``data``; a :class:`ConfigError` naming every bad key otherwise."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, model, origin)) from None


class ContextConfig(StrictModel):
    """The model's pretraining window and the window the run extends it to, in tokens."""

    original: int = Field(gt=0, description="context length the model was pretrained at")
    target: int = Field(gt=0, description="context length to extend to")

    @model_validator(mode="after")
    def _target_above_original(self) -> ContextConfig:
        if self.target < self.original:
            raise ValueError(f"target ({self.target}) must be at least original ({self.original})")
        return self


def _tokenizer_location(value: Any) -> Any:
    """A local tokenizer file or folder (which must exist), or a Hugging Face hub id."""
    from longctx.core.tokenizer import looks_like_hub_id

    if value is None:
        return None
    value = str(value)
    if not Path(value).expanduser().exists() and not looks_like_hub_id(value):
        raise ValueError(f"path does not exist: {value} (nor is it a Hugging Face hub id such as org/name)")
    return value


class TokenizerConfig(StrictModel):
    """Which tokenizer counts (and later packs) tokens.

    ``path`` is a Hugging Face ``tokenizer.json`` file, a folder holding one (and its
    ``tokenizer_config.json``), or a hub id such as ``meta-llama/Meta-Llama-3-8B`` (``@revision``
    optional), fetched through ``huggingface_hub``'s cache (``HF_HUB_OFFLINE=1`` is honoured): bring
    your model's. When it is null, curation trains a small byte-level BPE on the input and saves it as
    ``<output>/tokenizer.json``: good for the demo, not for a real model.
    """

    path: str | None = None
    train_vocab_size: int = Field(default=4096, ge=260)
    train_sample_bytes: int = Field(default=20_000_000, gt=0, description="text sampled for BPE training")

    _location = field_validator("path", mode="before")(_tokenizer_location)


class SlurmConfig(StrictModel):
    """Passed to datatrove's ``SlurmPipelineExecutor``: each stage is one job array (one array task
    per datatrove task), submitted with a dependency on the stage before."""

    partition: str
    time: str = "24:00:00"
    cpus_per_task: int = 1
    mem_per_cpu_gb: int = 2
    qos: str = "normal"
    sbatch_args: dict[str, str] = Field(default_factory=dict)
    env_command: str | None = Field(
        default=None,
        description="shell line each job runs first to find longctx (default: put the folder of the "
        "Python that submits on the PATH, which the nodes must see at the same path)",
    )


class RayConfig(StrictModel):
    """The Ray cluster stages run on (``kind: ray``) and what each task reserves there."""

    address: str | None = Field(
        default=None,
        description="the cluster: its head's host:port (what `ray start --head` prints), 'auto' (the "
        "cluster started on this machine) or ray://host:port (Ray Client); default: RAY_ADDRESS",
    )
    cpus_per_task: float = Field(default=1, gt=0, description="CPUs each task reserves")
    mem_per_cpu_gb: float | None = Field(
        default=None, gt=0, description="memory each task reserves per CPU; default: none reserved"
    )
    retries: int = Field(default=3, ge=0, description="times a task whose worker or node died is run again")


class ExecutorConfig(StrictModel):
    """Where stages run: datatrove's local, Slurm or Ray executor."""

    kind: Literal["local", "slurm", "ray"] = "local"
    tasks: int = Field(default=2, gt=0, description="shards of the input, one task each")
    workers: int = Field(default=-1, description="tasks run at once; -1 = all")
    slurm: SlurmConfig | None = None
    ray: RayConfig = Field(default_factory=RayConfig)

    @field_validator("workers")
    @classmethod
    def _workers_positive_or_all(cls, value: int) -> int:
        if value != -1 and value < 1:
            raise ValueError("must be at least 1, or -1 to run every task at once")
        return value

    @model_validator(mode="after")
    def _slurm_needs_settings(self) -> ExecutorConfig:
        if self.kind == "slurm" and self.slurm is None:
            raise ValueError("kind: slurm needs a 'slurm' section (at least 'partition')")
        return self
