"""The strict base of every config section, and the sections several parts share.

Sections are pydantic models that forbid unknown keys, so a typo (``min_token`` for ``min_tokens``)
is an error naming the key and a suggestion, never a silently ignored setting. Each part declares
its own sections on this base (``longctx.pipeline.config``, ``longctx.packer.config``,
``longctx.trainer.config``); the roof (``longctx.config``) assembles them into one run config.

Reading a config checks its structure only: keys, types, ranges, rules between fields. A field that
names something outside the file (a path that must exist, an optional package that must be
installed) carries a :class:`WorldCheck` instead of a validator, checked by :func:`world_problems`
when a command uses its section, so that no command is refused for a section it does not read.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from longctx.core.errors import ConfigError

M = TypeVar("M", bound=BaseModel)


class StrictModel(BaseModel):
    """Base for every config section: unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


StorageOptions = Annotated[
    dict[str, Any],
    Field(default_factory=dict, exclude=True, repr=False),  # may hold credentials: never shown or recorded
]
"""fsspec's keyword arguments for a URL (credentials, ``endpoint_url``...): the type of every
``storage_options`` field, left out of ``repr()`` and of every dump (run records, checkpoints,
evaluation results), so that credentials are never written anywhere."""


@dataclass(frozen=True)
class WorldCheck:
    """Marks a field whose value names something outside the config (``Annotated[Path, WorldCheck(f)]``):
    ``problem(value)`` says what is wrong with it (a path that does not exist, an extra that is not
    installed), or None. Run by :func:`world_problems` for the sections a command uses."""

    problem: Callable[[Any], str | None]


def world_problems(section: BaseModel, key: str) -> list[str]:
    """``<dotted key>: <problem>`` for every field of ``section``, and of the sections inside it, whose
    :class:`WorldCheck` fails; ``key`` is the section's own dotted key (``train.model``)."""
    problems = []
    for name, field in type(section).model_fields.items():
        value = getattr(section, name)
        dotted = f"{key}.{name}"
        for check in field.metadata:
            if isinstance(check, WorldCheck) and (problem := check.problem(value)) is not None:
                problems.append(f"{dotted}: {problem}")
        if isinstance(value, BaseModel):
            problems += world_problems(value, dotted)
        elif isinstance(value, list | tuple):
            problems += [
                line
                for number, item in enumerate(value)
                if isinstance(item, BaseModel)
                for line in world_problems(item, f"{dotted}.{number}")
            ]
    return problems


def _missing_path(value: str | os.PathLike | None) -> str | None:
    return f"path does not exist: {value}" if value is not None and not Path(value).exists() else None


MUST_EXIST = WorldCheck(_missing_path)
"""A local path that must exist when set."""


def missing_extra(module: str, extra: str) -> str | None:
    """Why a setting cannot be used when its optional dependency ``module`` is not installed (found
    without importing it), else None."""
    try:
        found = importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        found = False
    if found:
        return None
    return f"needs the {module} package, which is not installed: pip install 'longctx[{extra}]'"


def format_problems(origin: str, lines: Iterable[str]) -> str:
    """The message of a refused config: where it comes from, then one line per problem."""
    return "\n".join([f"invalid configuration in {origin}:", *(f"  {line}" for line in lines)])


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
    lines = []
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
            lines.append(f"{key}: unknown key{hint}")
        elif problem["type"] == "missing":  # its input is the mapping it is missing from: not shown
            lines.append(f"{key}: required, and missing")
        else:
            msg = problem["msg"].removeprefix("Value error, ")
            given = problem.get("input")
            # a whole section (a rule between its keys, which the message names) is not shown
            lines.append(f"{key}: {msg}" if isinstance(given, dict) else f"{key}: {msg} (got {given!r})")
    return format_problems(origin, lines)


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


def _missing_tokenizer(value: str | None) -> str | None:
    """A local tokenizer file or folder must exist; a Hugging Face hub id is fetched when used."""
    from longctx.core.tokenizer import looks_like_hub_id

    if value is None or Path(value).expanduser().exists() or looks_like_hub_id(value):
        return None
    return f"path does not exist: {value} (nor is it a Hugging Face hub id such as org/name)"


class TokenizerConfig(StrictModel):
    """Which tokenizer counts (and later packs) tokens.

    ``path`` is a Hugging Face ``tokenizer.json`` file, a folder holding one (and its
    ``tokenizer_config.json``), or a hub id such as ``meta-llama/Meta-Llama-3-8B`` (``@revision``
    optional), fetched through ``huggingface_hub``'s cache (``HF_HUB_OFFLINE=1`` is honoured): bring
    your model's. When it is null, curation trains a small byte-level BPE on the input and saves it as
    ``<output>/tokenizer.json``: good for the demo, not for a real model.
    """

    path: Annotated[str | None, WorldCheck(_missing_tokenizer)] = Field(
        default=None,
        description="a tokenizer.json, a folder holding one, or a hub id (org/name[@revision]); "
        "null: train a byte-level BPE on the input",
    )
    train_vocab_size: int = Field(
        default=4096, ge=260, description="vocabulary of the BPE trained when path is null"
    )
    train_sample_bytes: int = Field(default=20_000_000, gt=0, description="text sampled for BPE training")

    @field_validator("path", mode="before")
    @classmethod
    def _path_text(cls, value: Any) -> Any:
        return os.fspath(value) if isinstance(value, os.PathLike) else value


class SlurmConfig(StrictModel):
    """Passed to datatrove's ``SlurmPipelineExecutor``: each stage is one job array (one array task
    per datatrove task), submitted with a dependency on the stage before."""

    partition: str = Field(description="the Slurm partition the tasks are submitted to")
    time: str = Field(default="24:00:00", description="time limit of each job (sbatch --time)")
    cpus_per_task: int = Field(default=1, gt=0, description="CPUs per task (sbatch --cpus-per-task)")
    mem_per_cpu_gb: int = Field(default=2, gt=0, description="memory per CPU in GB (sbatch --mem-per-cpu)")
    qos: str = Field(default="normal", description="quality of service (sbatch --qos)")
    sbatch_args: dict[str, str] = Field(
        default_factory=dict, description="further sbatch options, e.g. {account: my_account}"
    )
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

    kind: Literal["local", "slurm", "ray"] = Field(
        default="local",
        description="local processes, Slurm jobs (needs slurm) or a Ray cluster (the ray extra)",
    )
    tasks: int = Field(default=2, gt=0, description="shards of the input, one task each")
    workers: int = Field(default=-1, description="tasks run at once; -1 = all")
    slurm: SlurmConfig | None = Field(default=None, description="the Slurm settings, needed by kind: slurm")
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
