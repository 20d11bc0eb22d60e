"""Config validation: typos, wrong types and missing paths are errors naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from longctx.cli import main
from longctx.config import load_config, parse_config
from longctx.core.errors import ConfigError

BASE = {"context": {"original": 512, "target": 2048}}


def _write(tmp_path: Path, data) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(data) if not isinstance(data, str) else data)
    return path


def test_minimal_config_gets_defaults() -> None:
    cfg = parse_config(dict(BASE))
    assert cfg.curate.min_fraction_of_target == 0.5
    assert cfg.curate.dedup.minhash.num_buckets == 14
    assert cfg.curate.executor.kind == "local"


def test_unknown_key_is_named_with_a_suggestion(tmp_path: Path) -> None:
    path = _write(tmp_path, BASE | {"curate": {"min_fraction_of_targt": 0.3}})
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "curate.min_fraction_of_targt: unknown key" in str(err.value)
    assert "did you mean 'min_fraction_of_target'" in str(err.value)


def test_unknown_nested_source_key(tmp_path: Path) -> None:
    src = {"name": "b", "kind": "books", "path": str(tmp_path), "min_token": 5}
    with pytest.raises(ConfigError) as err:
        parse_config(BASE | {"curate": {"sources": [src]}})
    assert "curate.sources.0.min_token: unknown key (did you mean 'min_tokens'?)" in str(err.value)


def test_wrong_type_is_named() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config({"context": {"original": "lots", "target": 2048}})
    assert "context.original" in str(err.value)


def test_missing_path_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    src = {"name": "b", "kind": "books", "path": str(missing)}
    with pytest.raises(ConfigError) as err:
        parse_config(BASE | {"curate": {"sources": [src]}})
    assert "curate.sources.0.path: path does not exist" in str(err.value)
    with pytest.raises(ConfigError, match=r"tokenizer\.path: path does not exist"):
        parse_config(BASE | {"tokenizer": {"path": str(missing)}})


def test_semantic_checks() -> None:
    with pytest.raises(ConfigError, match=r"target .* must be at least original"):
        parse_config({"context": {"original": 4096, "target": 1024}})
    with pytest.raises(ConfigError, match="needs a 'slurm' section"):
        parse_config(BASE | {"curate": {"executor": {"kind": "slurm"}}})
    with pytest.raises(ConfigError, match="kind"):
        parse_config(BASE | {"curate": {"sources": [{"name": "x", "kind": "pdf", "path": "."}]}})


def test_malformed_yaml_and_non_mapping(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(_write(tmp_path, "context: [unclosed"))
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(_write(tmp_path, "- a\n- b\n"))
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "absent.yaml")


def test_overrides_apply_dotted_keys(tmp_path: Path) -> None:
    cfg = load_config(_write(tmp_path, BASE), {"curate.executor.tasks": 7, "output": str(tmp_path / "o")})
    assert cfg.curate.executor.tasks == 7
    assert cfg.output == tmp_path / "o"


def test_cli_reports_config_errors_before_work(tmp_path: Path, capsys) -> None:
    path = _write(tmp_path, BASE | {"curate": {"bogus": 1}, "output": str(tmp_path / "out")})
    assert main(["curate", "--config", str(path)]) == 2
    assert "curate.bogus: unknown key" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "name", sorted(p.name for p in (Path(__file__).parents[2] / "configs").glob("*.yaml"))
)
def test_shipped_configs_are_valid(name: str) -> None:
    path = Path(__file__).parents[2] / "configs" / name
    data = yaml.safe_load(path.read_text())
    # paths in shipped configs may point at corpora absent on this machine; validate the rest
    data.get("curate", {}).pop("input", None)
    parse_config(data, name)


def test_every_subcommand_has_help(capsys) -> None:
    from longctx.cli import COMMANDS

    for command in COMMANDS:
        with pytest.raises(SystemExit) as done:
            main([command, "--help"])
        assert done.value.code == 0
        assert "usage: longctx " + command in capsys.readouterr().out


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "output: runs/a\ncontext: {original: 512, target: 2048}\noutput: runs/b\n",
            "key 'output' appears twice (lines 1 and 3)",
        ),
        (
            "context:\n  original: 512\n  target: 2048\ncurate:\n  executor:\n    tasks: 2\n    workers: 1\n"
            "    tasks: 4\n",
            "key 'curate.executor.tasks' appears twice (lines 6 and 8)",
        ),
        (
            "context: {original: 512, target: 2048}\ncurate:\n  sources:\n"
            "    - {name: a, kind: books, path: ., name: b}\n",
            "key 'curate.sources.0.name' appears twice (lines 4 and 4)",
        ),
    ],
    ids=["top-level", "nested", "in-a-list"],
)
def test_a_key_given_twice_is_refused_naming_it_and_both_lines(
    tmp_path: Path, text: str, message: str
) -> None:
    """yaml.safe_load keeps the last of two equal keys; the config refuses them instead."""
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == f"{path}: {message}; keep one"
    assert yaml.safe_load(text)  # the reference: plain YAML accepts it silently


def test_merge_keys_may_be_overridden(tmp_path: Path) -> None:
    """A key given beside a ``<<`` merge overrides the merged one: not a repetition."""
    path = _write(tmp_path, "context:\n  <<: {original: 512, target: 1024}\n  target: 2048\n")
    assert load_config(path).context.target == 2048
