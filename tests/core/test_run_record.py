"""Run records and the run folder layout."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from longctx.core.errors import ConfigError
from longctx.core.layout import RunLayout, shard_folder, shard_folders
from longctx.core.run_record import check_same_run, config_hash


def test_config_hash_is_sha256_of_canonical_json() -> None:
    data = {"b": [1, 2], "a": {"y": 1, "x": None}}
    assert config_hash(data) == hashlib.sha256(b'{"a": {"x": null, "y": 1}, "b": [1, 2]}').hexdigest()
    assert config_hash({"a": {"x": None, "y": 1}, "b": [1, 2]}) == config_hash(data)


def test_first_run_records_and_a_different_one_is_refused(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path / "run", "pack")
    output = layout.shards
    check_same_run(layout, {"config": "a", "tokenizer": "t"}, output)
    assert json.loads(layout.run_record.read_text()) == {"config": "a", "tokenizer": "t"}
    output.mkdir(parents=True)
    (output / "seq8").mkdir()
    check_same_run(layout, {"config": "a", "tokenizer": "t"}, output)  # the same run resumes
    with pytest.raises(ConfigError, match=r"different configuration \(different config, extra\)"):
        check_same_run(layout, {"config": "b", "tokenizer": "t", "extra": 1}, output)
    assert json.loads(layout.run_record.read_text()) == {"config": "a", "tokenizer": "t"}  # unchanged


def test_unrecorded_output_is_refused_unless_shared(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path / "run", "pack")
    (layout.shards / "seq8").mkdir(parents=True)
    with pytest.raises(ConfigError, match="was not written by this pack run"):
        check_same_run(layout, {"config": "a"}, layout.shards)
    assert not layout.run_record.exists()
    curate = RunLayout(tmp_path / "run", "curate")  # curation writes beside the run's other outputs
    check_same_run(curate, {"config": "a"}, curate.root, fresh=False)
    assert curate.run_record.is_file()


def test_layout_names_every_path_once(tmp_path: Path) -> None:
    layout = RunLayout(tmp_path, "pack")
    assert layout.shard_folder(2048) == shard_folder(layout.shards, 2048) == tmp_path / "shards" / "seq2048"
    assert layout.work == tmp_path / "work" / "pack" and layout.run_record == layout.work / "run.json"
    assert (layout.checkpoints, layout.metrics, layout.final_model) == (
        tmp_path / "train" / "checkpoints",
        tmp_path / "train" / "metrics.jsonl",
        tmp_path / "train" / "final",
    )
    for n in (2048, 512, 1024):
        layout.shard_folder(n).mkdir(parents=True)
    (layout.shards / "seqx").mkdir()
    assert [p.name for p in shard_folders(layout.shards)] == ["seq512", "seq1024", "seq2048"]
    with pytest.raises(ValueError, match="job"):
        _ = RunLayout(tmp_path).work
