"""The run config: one YAML file whose sections are the parts' own config sections.

Each part declares its section (``curate``: ``longctx.pipeline.config``, ``pack``:
``longctx.packer.config``, ``train`` and ``eval``: ``longctx.trainer.config``); the sections several
parts read (``context``, ``tokenizer``) come from ``longctx.core.config``. :class:`RootConfig`
assembles them, and each command hands every job only its own section and what it needs besides.

Every section forbids unknown keys, so a typo (``min_token`` for ``min_tokens``) is an error naming
the key and a suggestion, never a silently ignored setting. Paths must exist where a section says
so; relative paths are taken relative to the current working directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import Field

from longctx.core.config import ContextConfig, StrictModel, TokenizerConfig, validate_section
from longctx.core.errors import ConfigError
from longctx.core.remote import is_remote
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


LOCAL_RUN_FOLDER = (
    "the run folder holds resume state, locks and temporary files, which object storage cannot hold "
    "safely, so it is a local path; jobs publish their results to object storage instead: curate.output "
    "(`longctx curate --publish URL`), pack.output (`longctx pack --publish URL`), train.export.output"
)
"""Why ``output`` (``--output``) is never a URL, and what to use instead."""


def parse_config(data: dict[str, Any], origin: str = "<dict>") -> RootConfig:
    """Validate a config mapping; raise :class:`ConfigError` naming every bad key."""
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: the top level must be a mapping of sections, got {type(data).__name__}")
    if isinstance(data.get("output"), str) and is_remote(data["output"]):
        raise ConfigError(f"{origin}: output {data['output']} is a URL; {LOCAL_RUN_FOLDER}")
    return validate_section(RootConfig, data, origin)


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
