"""The run config: one YAML file whose sections are the parts' own config sections.

Each part declares its section (``curate``: ``longctx.pipeline.config``, ``pack``:
``longctx.packer.config``, ``train`` and ``eval``: ``longctx.trainer.config``); the sections several
parts read (``context``, ``tokenizer``) come from ``longctx.core.config``. :class:`RootConfig`
assembles them, and each command hands every job only its own section and what it needs besides.

Every section forbids unknown keys, so a typo (``min_token`` for ``min_tokens``) is an error naming
the key and a suggestion, never a silently ignored setting: the whole file is checked when it is
read, and sections that disagree with each other are refused at load, before any job starts
(:func:`check_sections`). What a section names outside the file (paths that must exist, optional
extras) is checked by :func:`check_world` for the sections a job uses (``longctx.jobs``), so that a
missing ``train.model.hf_path`` stops ``longctx train``, not ``longctx curate``. Relative paths are
taken relative to the current working directory.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, PrivateAttr, ValidationError

from longctx.core.config import (
    ContextConfig,
    StrictModel,
    TokenizerConfig,
    format_problems,
    validate_section,
    world_problems,
)
from longctx.core.errors import ConfigError
from longctx.core.remote import is_remote
from longctx.packer.config import PackConfig
from longctx.pipeline.config import CurateConfig
from longctx.trainer.config import EvalConfig, TrainConfig, check_base_model
from longctx.trainer.parallel.mesh import MeshShape
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

    _origin: str = PrivateAttr(default="the run config")  # named in errors: the file it was read from


LOCAL_RUN_FOLDER = (
    "the run folder holds resume state, locks and temporary files, which object storage cannot hold "
    "safely, so it is a local path; jobs publish their results to object storage instead: curate.output "
    "(`longctx curate --publish URL`), pack.output (`longctx pack --publish URL`), train.export.output"
)
"""Why ``output`` (``--output``) is never a URL, and what to use instead."""


def parse_config(data: dict[str, Any], origin: str = "<dict>") -> RootConfig:
    """Validate a config mapping; raise :class:`ConfigError` naming every bad key, or the first
    pair of sections that disagree."""
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: the top level must be a mapping of sections, got {type(data).__name__}")
    if isinstance(data.get("output"), str) and is_remote(data["output"]):
        raise ConfigError(f"{origin}: output {data['output']} is a URL; {LOCAL_RUN_FOLDER}")
    cfg = validate_section(RootConfig, data, origin)
    check_sections(cfg, origin)
    cfg._origin = origin
    return cfg


def check_sections(cfg: RootConfig, origin: str) -> None:
    """Refuse sections that disagree with each other, in one line that names both keys, so that a run
    that would fail in a later job (training after curation and packing) fails before the first.

    The rules are their owners': the window length a ``train.cp`` can split is the mesh's
    (:meth:`~longctx.trainer.parallel.mesh.MeshShape.check_window`), the shard folder training reads is the
    run
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


def _check_flags(data: dict[str, Any], flags: dict[str, str]) -> None:
    """Refuse a value given on the command line that its config key does not take, in one line naming
    the flag (``--steps 0: ...``) rather than the config file, which holds no such value."""
    try:
        RootConfig.model_validate(data)
    except ValidationError as err:
        for problem in err.errors():
            key = ".".join(str(part) for part in problem["loc"])
            if key in flags:
                message = problem["msg"].removeprefix("Value error, ")
                given = problem.get("input")
                values = given if isinstance(given, list) else [given]  # a flag given several times
                typed = " ".join(f"{flags[key]} {value}" for value in values)
                raise ConfigError(f"{typed}: {message} (it sets {key})") from None


def yaml_problem(path: Path, err: yaml.MarkedYAMLError) -> str:
    """PyYAML's error as one line naming the file and the place: ``run.yaml, line 2, column 9: not
    valid YAML: expected ',' or '}', but got ':' (while parsing a flow mapping at line 1, column
    10)`` (PyYAML's own text spans lines and names ``<unicode string>``)."""

    def place(mark: yaml.Mark) -> str:
        return f"line {mark.line + 1}, column {mark.column + 1}"

    mark = err.problem_mark or err.context_mark
    where = f"{path}, {place(mark)}" if mark is not None else str(path)
    problem = err.problem or err.context or "unreadable"
    if err.problem and err.context:
        problem += f" ({err.context}" + (f" at {place(err.context_mark)})" if err.context_mark else ")")
    return f"{where}: not valid YAML: {' '.join(problem.split())}"


def load_config(
    path: str | Path, overrides: dict[str, Any] | None = None, flags: dict[str, str] | None = None
) -> RootConfig:
    """Read a YAML config (``yaml.safe_load``, a key repeated in one mapping refused), apply dotted-key
    overrides, validate it. ``flags`` names the command-line flag of each overridden key: a value the
    key does not take is refused naming the flag."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = read_yaml(path.read_text(encoding="utf-8"), str(path)) or {}
    except yaml.MarkedYAMLError as err:
        raise ConfigError(yaml_problem(path, err)) from None
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
    given = {key: flag for key, flag in (flags or {}).items() if (overrides or {}).get(key) is not None}
    if given:
        _check_flags(data, given)
    return parse_config(data, str(path))
