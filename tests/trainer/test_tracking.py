"""Training metrics sent to TensorBoard and Weights & Biases equal the JSONL records.

The references are the trackers' own files, read back independently: TensorBoard's event files with
its ``EventAccumulator``, and the W&B offline run's transaction log (``run-<id>.wandb``) decoded
record by record with W&B's protobuf schema. No network is used (W&B runs offline) and no W&B
background process may outlive training.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from longctx import jobs
from longctx.config import parse_config
from longctx.core.errors import ConfigError
from longctx.trainer.tracking import scalars
from tests.conftest import WINDOW
from tests.readme import code_blocks

pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
pytest.importorskip("wandb", reason="the wandb extra is not installed")

SEQ_LEN = WINDOW


@pytest.fixture(autouse=True)
def wandb_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """W&B's own caches and settings in the test's folder, not the user's home."""
    for var in ("WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home" / var.lower()))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONSOLE", "off")


def run_config(root: Path, output: Path, **train: Any) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "shards": str(root / "shards" / f"seq{SEQ_LEN}"),
        "steps": 4,
        "optim": {"lr": 3e-3, "warmup_steps": 1},
        "coverage": {"required_position": 200},
        "checkpoint": {"every": 2, "keep": 3},
        "model": {
            "tiny": {
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_attention_heads": 2,
                "num_key_value_heads": 1,
            }
        },
        # the README's tracking section, logging every step
        "log": {**readme_log_section(), "every": 1},
    }
    settings.update(train)
    return {
        "output": str(output),
        "context": {"original": 128, "target": SEQ_LEN},
        "tokenizer": {"path": str(root / "tokenizer.json")},
        "train": settings,
    }


def readme_log_section() -> dict[str, Any]:
    """``train.log`` as the README's tracking section shows it."""
    (block,) = code_blocks("Tracking: TensorBoard and Weights & Biases", "yaml")
    log = yaml.safe_load(block)["train"]["log"]
    assert log["tensorboard"] is True and log["wandb"]["mode"] == "offline"  # what the test reads back
    return log


def jsonl(output: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (output / "train" / "metrics.jsonl").read_text().splitlines()]


def tensorboard_scalars(folder: Path) -> dict[str, dict[int, float]]:
    """``{tag: {step: value}}`` as TensorBoard shows it (purged steps of an earlier run removed)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}


def wandb_records(path: Path) -> list[Any]:
    """The protobuf records of a W&B transaction log: a 7-byte header (``:W&B``, 0xBEE1, version),
    then LevelDB-log framing in 32 KiB blocks (record header: crc32, length, type FULL/FIRST/
    MIDDLE/LAST). W&B has no offline reader for it (``wandb sync`` only uploads)."""
    from wandb.proto import wandb_internal_pb2

    data, block = path.read_bytes(), 32768
    assert data[:4] == b":W&B" and struct.unpack("<H", data[4:6])[0] == 0xBEE1
    records, pending, i = [], b"", 7
    while i + 7 <= len(data):
        if block - i % block < 7:  # a block's tail too short for a header is padding
            i += block - i % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[i : i + 7])
        if kind == 0:
            break
        chunk, i = data[i + 7 : i + 7 + length], i + 7 + length
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def wandb_run(run_dir: Path) -> tuple[str, dict[int, dict[str, float]], dict[str, Any]]:
    """A W&B offline run's id, history ``{step: {key: value}}`` and config."""
    (log,) = run_dir.glob("run-*.wandb")
    history: dict[int, dict[str, float]] = {}
    config: dict[str, Any] = {}
    for record in wandb_records(log):
        kind = record.WhichOneof("record_type")
        if kind == "history":
            items = {
                item.key or "/".join(item.nested_key): json.loads(item.value_json)
                for item in record.history.item
            }
            history[items.pop("_step")] = {k: v for k, v in items.items() if not k.startswith("_")}
        elif kind == "run":
            config.update({item.key: json.loads(item.value_json) for item in record.run.config.update})
        elif kind == "config":
            config.update({item.key: json.loads(item.value_json) for item in record.config.update})
    return log.stem.removeprefix("run-"), history, config


def child_processes() -> list[str]:
    """Command lines of this process's children (W&B starts ``wandb-core``)."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == os.getpid():
                children.append((stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode())
        except (OSError, IndexError):
            continue
    return children


def assert_tracked(
    records: list[dict[str, Any]], tb: dict[str, dict[int, float]], wb: dict[int, dict[str, float]]
) -> None:
    """Every number of every JSONL record is in TensorBoard (float32) and W&B (exact) at its step."""
    import numpy as np

    expected_tags = set()
    for record in records:
        values = scalars(record)
        assert values, record
        expected_tags |= set(values)
        for tag, value in values.items():
            assert tb[tag][record["step"]] == np.float32(value), (tag, record["step"])
        assert wb[record["step"]] == values, record["step"]
    assert set(tb) == expected_tags


def test_scalars_are_the_numbers_of_a_record() -> None:
    record = {
        "step": 3,
        "loss": 2.5,
        "mfu": None,
        "lr": 1e-3,
        "loss_by_position": {"0": 3.0, "128": None, "64": 2},
    }
    assert scalars(record) == {
        "train/loss": 2.5,
        "train/lr": 1e-3,
        "loss_by_position/000": 3.0,  # zero-padded to the widest bucket start, 128
        "loss_by_position/064": 2.0,
    }


def test_loss_by_position_tags_sort_as_their_buckets() -> None:
    """TensorBoard and W&B order tags as text: the bucket starts of a 64K run (with the split at the
    original context, 8K) must sort in numeric order, the same at every step."""
    from longctx.trainer.coverage import position_edges

    edges = position_edges(65536, 8192)
    tags = [t for t in scalars({"loss_by_position": {str(e): 1.0 for e in edges}}) if t.startswith("loss_by")]
    assert sorted(tags) == tags and [int(t.split("/")[1]) for t in tags] == edges
    assert tags[-1] == "loss_by_position/32768" and tags[1] == "loss_by_position/00001"


@pytest.mark.slow
def test_trackers_get_every_jsonl_record_also_across_a_resume(packed: Path, tmp_path: Path) -> None:
    """A 4-step run, then the same run killed after its step-2 checkpoint having logged steps 3-4
    with other values, and resumed: TensorBoard (purging the killed run's steps) and the W&B run
    (continued under the same id) hold the JSONL values, and no W&B process is left."""
    output = tmp_path / "run"
    cfg = run_config(packed, output)
    jobs.train(parse_config(cfg), progress=False)
    records = jsonl(output)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    (run_dir,) = (output / "train" / "wandb").glob("offline-run-*")
    run_id, history, config = wandb_run(run_dir)
    assert_tracked(records, tensorboard_scalars(output / "train" / "tensorboard"), history)
    assert config["train"]["steps"] == 4 and config["seq_len"] == SEQ_LEN
    assert (output / "train" / "wandb" / "run_id").read_text().strip() == run_id
    assert not [c for c in child_processes() if "wandb" in c]

    checkpoints = output / "train" / "checkpoints"
    shutil.rmtree(checkpoints / "step_0000004")
    (checkpoints / "latest").write_text("step_0000002\n")
    # what the killed run logged for steps 3-4, with other values than the resumed run will log
    for r in records[2:]:
        r["loss"] += 1.0
    (output / "train" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))

    resumed = jobs.train(parse_config(cfg), progress=False)
    assert resumed.resumed_from == 2
    records = jsonl(output)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    assert [r["loss"] for r in records[2:]] == resumed.losses
    second = next(r for r in (output / "train" / "wandb").glob("offline-run-*") if r != run_dir)
    second_id, second_history, _ = wandb_run(second)
    assert second_id == run_id and sorted(second_history) == [3, 4]
    merged = {**{step: h for step, h in history.items() if step <= 2}, **second_history}
    assert_tracked(records, tensorboard_scalars(output / "train" / "tensorboard"), merged)
    assert not [c for c in child_processes() if "wandb" in c]


def test_a_missing_extra_is_a_config_error_naming_the_key(packed: Path, tmp_path: Path) -> None:
    """Without the tensorboard / wandb packages the config is refused before anything runs, with
    the pip command, on the console without a traceback."""
    blocker = (
        "import importlib.abc, sys\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('tensorboard', 'wandb'):\n"
        "            raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, Block())\n"
        "from longctx.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    for log, key, extra in (
        ({"tensorboard": True}, "train.log.tensorboard", "tensorboard"),
        ({"wandb": {"project": "p", "mode": "offline"}}, "train.log.wandb", "wandb"),
    ):
        path = tmp_path / f"{extra}.yaml"
        path.write_text(yaml.safe_dump(run_config(packed, tmp_path / extra, log=log)))
        done = subprocess.run(
            [sys.executable, "-c", blocker, "train", "--config", str(path)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2, done.stderr
        assert key in done.stderr and f"pip install 'longctx[{extra}]'" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
        assert not (tmp_path / extra).exists()
    with pytest.raises(ConfigError, match=r"train\.log\.wandb\.project"):
        parse_config(run_config(packed, tmp_path / "x", log={"wandb": {"mode": "offline"}}))
    with pytest.raises(ConfigError, match=r"train\.log_every: unknown key"):
        parse_config(run_config(packed, tmp_path / "x", log_every=5))
