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


def parse_config(data: dict[str, Any], origin: str = "<dict>") -> RootConfig:
    """Validate a config mapping; raise :class:`ConfigError` naming every bad key."""
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: the top level must be a mapping of sections, got {type(data).__name__}")
    return validate_section(RootConfig, data, origin)


def _refuse_duplicate_keys(
    node: yaml.Node, origin: str, where: str = "", seen: set[int] | None = None
) -> None:
    """Refuse a mapping that holds one key twice, at any depth: YAML loaders keep the last one, so a
    repeated ``output:`` would silently override the first. Names the dotted key and both lines."""
    seen = set() if seen is None else seen
    if id(node) in seen:  # an alias of a node already checked
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        lines: dict[tuple[str, str], int] = {}
        for key, value in node.value:
            if key.tag == "tag:yaml.org,2002:merge":  # `<<: *defaults`: explicit keys override merged ones
                _refuse_duplicate_keys(value, origin, where, seen)
                continue
            name = str(key.value) if isinstance(key, yaml.ScalarNode) else f"<{key.id}>"
            dotted = f"{where}.{name}" if where else name
            line = key.start_mark.line + 1
            if isinstance(key, yaml.ScalarNode) and (key.tag, str(key.value)) in lines:
                first = lines[(key.tag, str(key.value))]
                raise ConfigError(
                    f"{origin}: key '{dotted}' appears twice (lines {first} and {line}); keep one"
                )
            lines[(key.tag, str(key.value))] = line
            _refuse_duplicate_keys(value, origin, dotted, seen)
    elif isinstance(node, yaml.SequenceNode):
        for number, item in enumerate(node.value):
            _refuse_duplicate_keys(item, origin, f"{where}.{number}" if where else str(number), seen)


def read_yaml(text: str, origin: str) -> Any:
    """``yaml.safe_load`` of ``text``, refusing a key repeated in one mapping
    (:func:`_refuse_duplicate_keys`)."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _refuse_duplicate_keys(node, origin)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> RootConfig:
    """Read a YAML config (``yaml.safe_load``, a key repeated in one mapping refused), apply dotted-key
    overrides, validate it."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = read_yaml(path.read_text(encoding="utf-8"), str(path)) or {}
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
