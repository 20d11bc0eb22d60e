"""Sections that disagree with each other are refused when the config is loaded, in one line naming
both keys, before any job starts (``longctx.config.check_sections``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from longctx.cli import main
from longctx.config import load_config, parse_config
from longctx.core.errors import ConfigError

CONTEXT = {"original": 512, "target": 2048}


def config(**sections) -> dict:
    return {"context": dict(CONTEXT)} | sections


def test_training_reads_a_length_that_pack_does_not_build() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(config(pack={"seq_lens": [1024]}, train={"cp": 1}), "run.yaml")
    message = str(err.value)
    assert "\n" not in message
    assert message == (
        "run.yaml: train.shards is unset, so training reads the windows of context.target = 2048 tokens, "
        "and pack.seq_lens [1024] does not build them: add 2048 to pack.seq_lens, or set train.shards"
    )
    # the lengths pack builds by default, or a list with the target, or shards named explicitly: accepted
    parse_config(config(pack={}, train={"cp": 1}))
    parse_config(config(pack={"seq_lens": [1024, 2048]}, train={"cp": 1}))
    parse_config(config(pack={"seq_lens": [1024]}, train={"cp": 1, "shards": "s3://bucket/run/seq1024"}))
    parse_config(config(pack={"seq_lens": [1024]}))  # no train section: nothing to disagree with


@pytest.mark.parametrize("target", [1000, 1024, 1536, 2046, 2048, 3000])
@pytest.mark.parametrize("cp", [1, 2, 3, 4, 8])
def test_the_window_training_reads_must_split_into_2cp_chunks(target: int, cp: int) -> None:
    """Zigzag context parallelism gives each of the ``cp`` ranks two of ``2 cp`` equal chunks of every
    window: a target that is not a multiple of ``2 cp`` is refused at load, whatever the command."""
    data = config(pack={}, train={"cp": cp}) | {"context": {"original": 512, "target": target}}
    if target % (2 * cp) == 0:
        assert parse_config(data).train.cp == cp
        return
    with pytest.raises(ConfigError) as err:
        parse_config(data, "run.yaml")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(
        f"run.yaml: context.target = {target} must be a positive multiple of 2 x train.cp = {2 * cp} (zigzag"
    )


def test_explicit_shards_are_checked_when_training_starts_not_at_load() -> None:
    """With ``train.shards`` the window length is in the shards' manifest, read before the ranks start
    (``longctx.trainer.preflight``); the target does not bind it."""
    data = config(train={"cp": 8, "shards": "s3://bucket/run/shards/seq4096"})
    data["context"]["target"] = 1000
    assert parse_config(data).train.shards == "s3://bucket/run/shards/seq4096"


def test_eval_of_the_base_model_needs_a_train_section() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(config(eval={}), "run.yaml")
    assert str(err.value) == (
        "run.yaml: eval.models: 'base' is the model of the train section, and this config has none"
    )
    assert parse_config(config(eval={"models": ["trained"]})).eval.models == ["trained"]
    assert parse_config(config(eval={}, train={})).eval.models == ["base", "trained"]


def test_a_mismatch_stops_the_first_job_in_one_line(tmp_path: Path, capsys) -> None:
    """Packing windows training cannot split is refused before packing, not after it."""
    out = tmp_path / "out"
    data = config(output=str(out), pack={"seq_lens": [1002]}, train={"cp": 2})
    data["context"]["target"] = 1002
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["pack", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"longctx pack: {path}: context.target = 1002 must be a positive multiple of 2 x train.cp = 4 "
        "(zigzag context parallelism cuts every window into 2 x cp equal chunks, two per rank); use windows "
        "of a multiple of 4 tokens, or a train.cp that divides 501"
    )
    assert not out.exists()
    # the override that fixes it is applied before the check
    with pytest.raises(ConfigError, match=r"pack\.seq_lens \[1002\] does not build them"):
        load_config(path, {"context.target": 1024})
    assert load_config(path, {"context.target": 1024, "pack.seq_lens": [1024]}).context.target == 1024
