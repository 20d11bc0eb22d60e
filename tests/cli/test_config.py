"""Config validation: typos, wrong types and missing paths are errors naming the key."""

from __future__ import annotations

import typing
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel

from longctx.cli import main
from longctx.config import RootConfig, check_world, load_config, parse_config
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


def _outside(missing: Path) -> list[tuple[dict, str, str]]:
    """(settings, dotted key, problem) for every field that names something outside the file."""
    return [
        ({"tokenizer": {"path": str(missing)}}, "tokenizer.path", "path does not exist"),
        ({"curate": {"input": str(missing)}}, "curate.input", "path does not exist"),
        (
            {"curate": {"sources": [{"name": "b", "kind": "books", "path": str(missing)}]}},
            "curate.sources.0.path",
            "path does not exist",
        ),
        ({"train": {"model": {"hf_path": str(missing)}}}, "train.model.hf_path", "path does not exist"),
        ({"eval": {"shards": str(missing), "models": ["trained"]}}, "eval.shards", "path does not exist"),
        ({"eval": {"models": ["trained", str(missing)]}}, "eval.models", "nor a Hugging Face checkpoint"),
    ]


def test_missing_paths_are_named_when_their_section_is_checked(tmp_path: Path) -> None:
    """Reading the file does not look at the paths; checking a section names each missing one,
    with its dotted key, and checking the other sections does not."""
    sections = ("tokenizer", "curate", "pack", "train", "eval")
    for settings, key, problem in _outside(tmp_path / "nope"):
        cfg = parse_config(BASE | settings)
        section = key.split(".")[0]
        with pytest.raises(ConfigError) as err:
            check_world(cfg, [section])
        header, line = str(err.value).splitlines()  # one line for the one problem
        assert header == "invalid configuration in <dict>:"
        assert line.startswith(f"  {key}: ") and problem in line and str(tmp_path / "nope") in line
        check_world(cfg, [s for s in sections if s != section])


def test_every_missing_path_of_the_checked_sections_is_named(tmp_path: Path) -> None:
    settings: dict = dict(BASE)
    for more, _, _ in _outside(tmp_path / "nope"):
        for section, values in more.items():
            settings[section] = settings.get(section, {}) | values
    cfg = load_config(_write(tmp_path, settings))
    with pytest.raises(ConfigError) as err:
        check_world(cfg, ["tokenizer", "curate", "train.model"])
    lines = str(err.value).splitlines()
    assert lines[0] == f"invalid configuration in {tmp_path / 'cfg.yaml'}:"
    keys = [line.split(":")[0].strip() for line in lines[1:]]
    assert keys == ["tokenizer.path", "curate.input", "curate.sources.0.path", "train.model.hf_path"]


def test_present_paths_urls_and_hub_ids_pass(tmp_path: Path) -> None:
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text("{}")
    settings = BASE | {
        "tokenizer": {"path": "org/name@main"},
        "curate": {
            "input": "s3://bucket/corpus",
            "sources": [{"name": "b", "kind": "books", "path": tmp_path}],
        },
        "train": {"model": {"hf_path": str(tmp_path / "ckpt")}},
        "eval": {"shards": "s3://bucket/shards", "models": ["base", str(tmp_path / "ckpt")]},
    }
    check_world(parse_config(settings), ["tokenizer", "curate", "pack", "train", "eval"])


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


CONFIGS = Path(__file__).parents[2] / "configs"
SHIPPED = sorted(
    str(p.relative_to(CONFIGS)) for pattern in ("*.yaml", "recipes/*.yaml") for p in CONFIGS.glob(pattern)
)


def test_the_recipes_are_shipped() -> None:
    assert {"recipes/prolong_64k.yaml", "recipes/fu_128k.yaml"} <= set(SHIPPED)


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_configs_are_valid(name: str) -> None:
    # load_config reads as every command does (a key given twice is refused too); it checks the
    # structure only: paths (corpora absent on this machine) are the jobs' to check
    load_config(CONFIGS / name)


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


def _storage_options_keys(model: type[BaseModel], key: str) -> list[str]:
    """Dotted keys of every ``storage_options`` field of ``model`` and of the sections inside it."""
    found = []
    for name, field in model.model_fields.items():
        if name == "storage_options":
            found.append(f"{key}{name}")
        annotations = (field.annotation, *typing.get_args(field.annotation))  # X, X | None, list[X]
        inside = {c for a in annotations for c in (a, *typing.get_args(a)) if isinstance(c, type)}
        for section in sorted((c for c in inside if issubclass(c, BaseModel)), key=lambda c: c.__name__):
            found += _storage_options_keys(section, f"{key}{name}.")
    return found


def test_credentials_are_never_shown_nor_dumped(tmp_path: Path) -> None:
    secrets = {
        key: {
            "key": f"AKIA-{key}",
            "secret": f"s3cr3t-{key}",
            "client_kwargs": {"endpoint_url": f"http://{key}"},
        }
        for key in ("curate", "source", "pack", "train", "eval")
    }
    settings = BASE | {
        "curate": {
            "storage_options": secrets["curate"],
            "sources": [
                {"name": "b", "kind": "books", "path": "s3://bucket/b", "storage_options": secrets["source"]}
            ],
        },
        "pack": {"storage_options": secrets["pack"]},
        "train": {"storage_options": secrets["train"]},
        "eval": {"storage_options": secrets["eval"]},
    }
    cfg = parse_config(settings)
    # every storage_options field of the run config is one of the five filled here
    assert sorted(_storage_options_keys(RootConfig, "")) == sorted(
        [
            "curate.storage_options",
            "curate.sources.storage_options",
            "pack.storage_options",
            "train.storage_options",
            "eval.storage_options",
        ]
    )
    assert cfg.curate.sources[0].storage_options == secrets["source"]  # still there for fsspec
    assert cfg.eval is not None and cfg.eval.storage_options == secrets["eval"]
    shown = [
        repr(cfg),
        str(cfg),
        repr(cfg.curate),
        repr(cfg.curate.sources[0]),
        str(cfg.model_dump()),
        cfg.model_dump_json(),
        str(cfg.model_dump(mode="json")),
    ]
    for text in shown:
        for key, options in secrets.items():
            for value in (options["key"], options["secret"], options["client_kwargs"]["endpoint_url"]):
                assert value not in text, (key, text)


@pytest.mark.parametrize(
    ("text", "where", "problem"),
    [
        ("context: {original: 1\n  target: [\n", "line 2, column 9", "expected ',' or '}', but got ':'"),
        ("output: x\na: b: c\n", "line 2, column 5", "mapping values are not allowed here"),
        ("output: x\n\t- x\n", "line 2, column 1", "found character '\\t' that cannot start any token"),
        ("output: !!python/object x\n", "line 1, column 9", "could not determine a constructor for the tag"),
    ],
)
def test_a_yaml_syntax_error_is_one_line_naming_the_file_and_the_place(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, where: str, problem: str
) -> None:
    """Every command says ``longctx <command>: <file>, line L, column C: not valid YAML: <problem>``
    in one line, never PyYAML's ``in "<unicode string>"`` lines."""
    path = _write(tmp_path, text)
    for command in ("curate", "pack", "train", "eval", "plan", "demo"):
        assert main([command, "--config", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "<unicode string>" not in err, err
        assert err.startswith(f"longctx {command}: {path}, {where}: not valid YAML: "), err
        assert problem in err, err


def test_a_missing_section_is_named_without_the_config_it_is_missing_from(tmp_path: Path) -> None:
    """A required key that is absent says so; it does not print the mapping it is absent from."""
    path = _write(tmp_path, "output: somewhere\ntrain: {steps: 2, model: {tiny: {hidden_size: 32}}}\n")
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    assert str(refused.value) == f"invalid configuration in {path}:\n  context: required, and missing"


def test_a_rule_between_keys_of_a_section_does_not_print_the_section(tmp_path: Path) -> None:
    """``train.steps`` beside ``train.stages`` is refused naming both keys, without the section."""
    train = {"steps": 5, "stages": [{"seq_len": 256, "steps": 2}], "model": {"tiny": {"hidden_size": 32}}}
    path = _write(tmp_path, {"context": {"original": 128, "target": 256}, "train": train})
    with pytest.raises(ConfigError) as refused:
        load_config(path)
    assert str(refused.value) == (
        f"invalid configuration in {path}:\n  train: train.steps (or --steps) and train.stages: each stage "
        "has its own steps (train.stages[k].steps); remove train.steps"
    )
