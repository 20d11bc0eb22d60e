"""The run config: one YAML file whose sections are the parts' own config sections.

Each part declares its section (``curate``: ``longctx.pipeline.config``, ``pack``:
``longctx.packer.config``, ``train`` and ``eval``: ``longctx.trainer.config``); the sections several
parts read (``context``, ``tokenizer``) come from ``longctx.core.config``. :class:`RootConfig`
assembles them, and each command hands every job only its own section and what it needs besides.

Every section forbids unknown keys, so a typo (``min_token`` for ``min_tokens``) is an error naming
the key and a suggestion, never a silently ignored setting. Paths must exist where a section says
so; relative paths are taken relative to the current working directory. Sections that disagree with
each other are refused at load, before any job starts (:func:`check_sections`).
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
from longctx.trainer.config import EvalConfig, TrainConfig, check_base_model
from longctx.trainer.mesh import MeshShape
from longctx.trainer.stage_plan import check_stage_plan


class RootConfig(StrictModel):
    """A whole run."""

    output: Path = Field(
        default=Path("runs/default"),
        description="the run folder: documents, tokenizer, shards, checkpoints, model and evaluations",
    )
    context: ContextConfig
    tokenizer: TokenizerConfig = Field(default_factory=TokenizerConfig)
    curate: CurateConfig = Field(default_factory=CurateConfig)
    pack: PackConfig | None = None
    train: TrainConfig | None = None
    eval: EvalConfig | None = None


def parse_config(data: dict[str, Any], origin: str = "<dict>") -> RootConfig:
    """Validate a config mapping; raise :class:`ConfigError` naming every bad key, or the first
    pair of sections that disagree."""
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: the top level must be a mapping of sections, got {type(data).__name__}")
    cfg = validate_section(RootConfig, data, origin)
    check_sections(cfg, origin)
    return cfg


def check_sections(cfg: RootConfig, origin: str) -> None:
    """Refuse sections that disagree with each other, in one line that names both keys, so that a run
    that would fail in a later job (training after curation and packing) fails before the first.

    The rules are their owners': the window length a ``train.cp`` can split is the mesh's
    (:meth:`~longctx.trainer.mesh.MeshShape.check_window`), the shard folder training reads is the run
    layout's, ``base`` needing a train section is evaluation's, a stage plan's are
    :func:`~longctx.trainer.stage_plan.check_stage_plan`'s. A section left out (None) is not checked.
    """
    train, pack, context = cfg.train, cfg.pack, cfg.context
    try:
        if train is not None and train.stages:  # each stage reads its own length's windows
            check_stage_plan(train, context, pack.resolved_seq_lens(context.target) if pack else None)
        elif train is not None and train.shards is None:  # training reads <output>/shards/seq<target>
            if pack is not None and context.target not in pack.resolved_seq_lens(context.target):
                raise ConfigError(
                    f"train.shards is unset, so training reads the windows of context.target = "
                    f"{context.target} tokens, and pack.seq_lens {pack.seq_lens} does not build them: add "
                    f"{context.target} to pack.seq_lens, or set train.shards"
                )
            MeshShape.check_window(context.target, train.cp, length_key="context.target", cp_key="train.cp")
        if cfg.eval is not None:
            check_base_model(cfg.eval.models, train)
    except ConfigError as err:
        raise ConfigError(f"{origin}: {err}") from None


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
