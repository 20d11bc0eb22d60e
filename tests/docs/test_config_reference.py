"""docs/configuration.md is the config models, rendered: the file in the checkout is what the
generator makes of today's models, and the generator leaves out no key. The independent reference
for the second claim is pydantic's own JSON schema of :class:`RootConfig`: every section it reaches
has a table in the page holding exactly its keys, with its defaults."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from longctx.config import RootConfig
from longctx.config_reference import COMMAND, main, render

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "configuration.md"


def test_the_checked_in_page_is_the_models_rendered() -> None:
    assert PAGE.read_text(encoding="utf-8") == render(), (
        f"docs/configuration.md is stale: regenerate it with `{COMMAND}` (or `make docs`)"
    )


def schema_sections() -> dict[str, dict[str, Any]]:
    """``{dotted path: {key: property schema}}`` for every section the JSON schema reaches (lists of
    sections as ``path[]``; a mapping's sections, its ``additionalProperties``, as ``path``), deprecated
    keys left out; a required key's schema gets ``required``."""
    schema = RootConfig.model_json_schema()
    defs = schema.get("$defs", {})
    out: dict[str, dict[str, Any]] = {}

    def refs(prop: dict[str, Any]) -> list[tuple[str, bool]]:
        found = []
        if "$ref" in prop:
            found.append((prop["$ref"].split("/")[-1], False))
        if "items" in prop:
            found += [(name, True) for name, _ in refs(prop["items"])]
        if isinstance(prop.get("additionalProperties"), dict):
            found += refs(prop["additionalProperties"])
        for alternative in prop.get("anyOf", []):
            found += refs(alternative)
        return found

    def walk(model: dict[str, Any], path: str) -> None:
        required = set(model.get("required", ()))
        props = {
            k: v | {"required": k in required}
            for k, v in model["properties"].items()
            if not v.get("deprecated")
        }
        out[path] = props
        for key, prop in props.items():
            for name, in_list in refs(prop):
                walk(defs[name], f"{path}.{key}".lstrip(".") + ("[]" if in_list else ""))

    walk(schema, "")
    return out


def page_sections(text: str) -> dict[str, dict[str, str]]:
    """``{dotted path: {key: default cell}}`` from the page's tables (the top level under "")."""
    out: dict[str, dict[str, str]] = {}
    paths = [""]
    for line in text.splitlines():
        heading = re.match(r"## (`.*`)$", line)
        if heading:
            paths = re.findall(r"`([^`]+)`", heading.group(1))
        row = re.match(r"\| `([^`]+)` \| .*? \| (.*?) \| .* \|$", line)
        if row:
            for path in paths:
                out.setdefault(path, {})[row.group(1)] = row.group(2)
    return out


def same_default(cell: str, expected: Any) -> bool:
    text = cell.strip("`")
    if text == str(expected):
        return True
    try:
        if yaml.safe_load(text) == expected:
            return True
        return isinstance(expected, float) and float(text) == expected
    except (yaml.YAMLError, ValueError):
        return False


def test_every_section_and_key_of_the_schema_is_in_the_page_with_its_default() -> None:
    expected = schema_sections()
    page = page_sections(render())
    assert set(page) == set(expected)
    for path, props in expected.items():
        assert set(page[path]) == set(props), path
        for key, prop in props.items():
            cell = page[path][key]
            assert (cell == "*required*") == prop["required"], (path, key, cell)
            if "default" not in prop:
                continue  # a default_factory: pydantic's schema does not evaluate it
            if isinstance(prop["default"], dict) and f"{path}.{key}".lstrip(".") in expected:
                assert cell == "(its defaults)", (path, key, cell)  # a section's own defaults
            else:
                assert same_default(cell, prop["default"]), (path, key, cell, prop["default"])


def test_the_generator_writes_the_page_atomically_and_prints_without_a_path(tmp_path: Path, capsys) -> None:
    target = tmp_path / "docs" / "configuration.md"
    target.parent.mkdir()
    assert main([str(target)]) == 0
    assert target.read_text(encoding="utf-8") == render()
    assert sorted(p.name for p in target.parent.iterdir()) == ["configuration.md"]
    assert main([]) == 0
    assert capsys.readouterr().out == render()


@pytest.mark.parametrize("key", ["grad_accum"])
def test_removed_keys_are_named_as_removed_not_listed(key: str) -> None:
    text = render()
    assert f"| `{key}` |" not in text and f"`{key}` (replaced by" in text
