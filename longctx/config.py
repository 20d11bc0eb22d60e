"""The run config: one YAML file whose sections are the parts' own config sections.

Each part declares its section (``curate``: ``longctx.pipeline.config``, ``pack``:
``longctx.packer.config``, ``train`` and ``eval``: ``longctx.trainer.config``); the sections several
parts read (``context``, ``tokenizer``) come from ``longctx.core.config``. :class:`RootConfig`
assembles them, and each command hands every job only its own section and what it needs besides.

Every section forbids unknown keys, so a typo (``min_token`` for ``min_tokens``) is an error naming
the key and a suggestion, never a silently ignored setting: the whole file is checked when it is
read. What a section names outside the file (paths that must exist, optional extras) is checked by
:func:`check_world` for the sections a job uses (``longctx.jobs``), so that a missing
``train.model.hf_path`` stops ``longctx train``, not ``longctx curate``. Relative paths are taken
relative to the current working directory.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, PrivateAttr

from longctx.core.config import (
    ContextConfig,
    StrictModel,
    TokenizerConfig,
    format_problems,
    validate_section,
    world_problems,
)
from longctx.core.errors import ConfigError
from longctx.packer.config import PackConfig
from longctx.pipeline.config import CurateConfig
from longctx.trainer.config import EvalConfig, TrainConfig


class RootConfig(StrictModel):
    """A whole run."""

    output: Path = Path("runs/default")
    context: ContextConfig
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    curate: CurateConfig = Field(default_factory=CurateConfig)
    pack: PackConfig | None = None
    train: TrainConfig | None = None
    eval: EvalConfig | None = None

    _origin: str = PrivateAttr(default="the run config")  # named in errors: the file it was read from


def parse_config(data: dict[str, Any], origin: str = "<dict>") -> RootConfig:
    """Validate a config mapping; raise :class:`ConfigError` naming every bad key."""
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: the top level must be a mapping of sections, got {type(data).__name__}")
    cfg = validate_section(RootConfig, data, origin)
    cfg._origin = origin
    return cfg


def check_world(cfg: RootConfig, sections: Iterable[str]) -> None:
    """Refuse a run whose ``sections`` (dotted keys such as ``curate`` or ``train.model``; absent ones
    are skipped) name a path that does not exist or an optional extra that is not installed: a
    :class:`ConfigError` naming every such key. Each job checks the sections it uses before any work."""
    problems = []
    for dotted in sections:
        section: Any = cfg
        for name in dotted.split("."):
            section = getattr(section, name) if section is not None else None
        if section is not None:
            problems += world_problems(section, dotted)
    if problems:  # a section inside another one checked too (train and train.model) is named once
        raise ConfigError(format_problems(cfg._origin, dict.fromkeys(problems)))


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> RootConfig:
    """Read a YAML config with ``yaml.safe_load``, apply dotted-key overrides, validate it."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    if not isinstance(data, dict):
        return parse_config(data, str(path))  # refused with the reason
    for dotted, value in (overrides or {}).items():
        if value is None:
            continue
        target = data
        *parents, last = dotted.split(".")
        for part in parents:
            target = target.setdefault(part, {})
        target[last] = value
    return parse_config(data, str(path))
