"""The configuration reference (``docs/configuration.md``), rendered from the config models themselves.

Every section of :class:`~longctx.config.RootConfig` becomes a table of its keys with their type,
constraints, default and description; nested sections (``curate.dedup``, ``train.model.tiny``...)
get tables of their own, linked from their parent. The page is generated so that it cannot drift
from the models: ``tests/docs/test_config_reference.py`` fails when the file and the models
disagree. Regenerate it with::

    python -m longctx.config_reference docs/configuration.md    # or: make docs

Without a path the page is printed.
"""

from __future__ import annotations

import argparse
import re
import sys
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from longctx.config import RootConfig

Sections = dict[type[BaseModel], list[str]]
"""Each config model and the dotted paths it sits at (the first names its part of the page)."""

COMMAND = "python -m longctx.config_reference docs/configuration.md"
"""The one command that regenerates the page (also ``make docs``)."""

INTRO = f"""\
# Configuration reference

<!-- Generated from the config models by `{COMMAND}`
     (or `make docs`). Do not edit by hand: change the models' descriptions and docstrings, then
     regenerate. -->

A run is one YAML file (examples in [`configs/`](../configs/)); its sections are validated before
any work starts. An unknown key is an error naming it, with a "did you mean" suggestion; a wrong
type or a missing local path is an error naming the key, and so is a key given twice in one mapping
(YAML would keep the last one; the error names both lines). Relative paths are relative to the folder
`longctx` runs in. Command-line flags override the file (see each command's `--help`). Each part
owns its sections: `context`, `tokenizer` and the executor settings come from `longctx.core.config`,
`curate` from `longctx.pipeline.config`, `pack` from `longctx.packer.config`, `train` and `eval`
from `longctx.trainer.config`; `longctx.config.RootConfig` assembles them, and each job receives
only the sections it uses.

In the tables, *required* marks a key without a default, and a section's default of `null` means
the section is off (or, for `pack`, `train` and `eval`, that the run has none) until it is written.
"""


def _is_model(value: Any) -> bool:
    return isinstance(value, type) and issubclass(value, BaseModel)


def _anchor(path: str) -> str:
    return path.replace(".", "-").replace("[]", "")


def _plain(text: str, sections: Sections | None = None) -> str:
    """Docstring text (reST) as Markdown on one line: ``x`` -> `x`; :class:`~a.B` -> a link to B's
    section when B is a config model, else `B`."""
    by_name = {model.__name__: paths[0] for model, paths in (sections or {}).items()}

    def reference(match: re.Match) -> str:
        name = match.group(1).split(".")[-1]
        return f"[`{by_name[name]}`](#{_anchor(by_name[name])})" if name in by_name else f"`{name}`"

    text = re.sub(r":[a-z]+:`~?([^`]+)`", reference, text)
    text = text.replace("``", "`")
    # outside code spans, <output> and <N> are text, not HTML tags
    parts = re.split(r"(`[^`]*`)", " ".join(text.split()))
    return "".join(p if p.startswith("`") else p.replace("<", "&lt;").replace(">", "&gt;") for p in parts)


def _paragraphs(doc: str | None, sections: Sections) -> list[str]:
    if not doc:
        return []
    return [_plain(p, sections) for p in re.split(r"\n\s*\n", doc.strip()) if p.strip()]


def _first_sentence(doc: str | None, sections: Sections) -> str:
    first = _plain((doc or "").strip().split("\n\n")[0], sections)
    return first.split(". ")[0].rstrip(".")


def _constraints(field: FieldInfo) -> list[str]:
    out = []
    for item in field.metadata:
        for attr, sign in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
            value = getattr(item, attr, None)
            if isinstance(item, annotated_types.BaseMetadata) and value is not None:
                out.append(f"{sign} {value}")
        if isinstance(item, annotated_types.MinLen) and item.min_length:
            out.append(f"at least {item.min_length} {'item' if item.min_length == 1 else 'items'}")
    return out


def _scalar(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_scalar(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_scalar(v)}" for k, v in value.items()) + "}"
    return str(value)


def _type_name(annotation: Any, sections: Sections) -> str:
    """A YAML reader's name for the type: `int`, `bfd` or `concat`, list of ..., or a section link."""
    if annotation is type(None):
        return "null"
    if _is_model(annotation):
        path = sections[annotation][0]
        return f"[section](#{_anchor(path)})"
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is Literal:
        return " / ".join(f"`{_scalar(a)}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        names = [_type_name(a, sections) for a in args if a is not type(None)]
        return " or ".join(names) + (" or null" if type(None) in args else "")
    if origin in (list, tuple):
        if origin is tuple and args and args[-1] is not Ellipsis:
            return "[" + ", ".join(_type_name(a, sections) for a in args) + "]"
        return f"list of {_type_name(args[0], sections)}"
    if origin is dict:
        key, value = args
        return (
            "mapping"
            if value is Any
            else f"mapping of {_type_name(key, sections)} to {_type_name(value, sections)}"
        )
    if annotation is Any:
        return "any"
    return {Path: "path", str: "string", int: "integer", float: "number", bool: "boolean"}.get(
        annotation, getattr(annotation, "__name__", str(annotation))
    )


def _default(field: FieldInfo) -> str:
    if field.is_required():
        return "*required*"
    value = field.default_factory() if field.default_factory is not None else field.default
    if value is PydanticUndefined:
        return "*required*"
    if isinstance(value, BaseModel):
        return "(its defaults)"
    return f"`{_scalar(value)}`"


def _nested_models(annotation: Any) -> Iterator[tuple[type[BaseModel], bool]]:
    """Models inside a field's type, each with whether it is a list item."""
    if _is_model(annotation):
        yield annotation, False
        return
    origin = typing.get_origin(annotation)
    for arg in typing.get_args(annotation):
        for model, in_list in _nested_models(arg):
            yield model, in_list or origin in (list, tuple)


def _sections(model: type[BaseModel], path: str, out: Sections) -> None:
    """Map every model reachable from ``model`` to its dotted paths (``curate.sources[]``; a model
    used in several places, such as the executor of ``curate`` and of ``pack``, has several)."""
    for name, field in model.model_fields.items():
        for nested, in_list in _nested_models(field.annotation):
            nested_path = f"{path}.{name}".lstrip(".") + ("[]" if in_list else "")
            out.setdefault(nested, []).append(nested_path)
            _sections(nested, nested_path, out)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _table(model: type[BaseModel], sections: Sections) -> list[str]:
    rows = ["| key | type | default | description |", "|---|---|---|---|"]
    removed = []
    for name, field in model.model_fields.items():
        if field.deprecated:
            removed.append(f"`{name}` ({_plain(str(field.deprecated))})")
            continue
        kind = _type_name(field.annotation, sections)
        limits = _constraints(field)
        if limits:
            kind += f" ({', '.join(limits)})"
        section = next((m for m, _ in _nested_models(field.annotation)), None)
        description = _plain(field.description or "") or _first_sentence(
            section and section.__doc__, sections
        )
        rows.append(f"| `{name}` | {_cell(kind)} | {_cell(_default(field))} | {_cell(description)} |")
    if removed:
        rows += ["", "Removed keys, refused with a pointer to their replacement: " + "; ".join(removed) + "."]
    return rows


def render(root: type[BaseModel] = RootConfig) -> str:
    """The Markdown reference of ``root`` and every section below it."""
    sections: Sections = {}
    _sections(root, "", sections)
    lines = [INTRO, "## The top level", ""]
    lines += [*_paragraphs(root.__doc__, sections)[:1], ""] if root.__doc__ else []
    lines += _table(root, sections)
    for model, paths in sections.items():
        lines += ["", f'<a id="{_anchor(paths[0])}"></a>', "", "## " + ", ".join(f"`{p}`" for p in paths), ""]
        for paragraph in _paragraphs(model.__doc__, sections):
            lines += [paragraph, ""]
        lines += _table(model, sections)
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m longctx.config_reference",
        description="Render the configuration reference from the config models.",
    )
    parser.add_argument("path", nargs="?", type=Path, help="write here (atomically) instead of printing")
    args = parser.parse_args(argv)
    text = render()
    if args.path is None:
        sys.stdout.write(text)
    else:
        from longctx.core.atomic import write_text

        write_text(args.path, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
