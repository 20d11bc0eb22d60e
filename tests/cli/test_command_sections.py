"""Each command checks what the sections it uses name outside the config file (paths, extras), and
only those: a missing ``train.model.hf_path`` stops ``train``, ``eval`` of the base model, ``plan`` and
the demo, never ``curate`` or ``pack``. ``pack`` uses ``tokenizer.path`` (it refuses one other than the
run's tokenizer). The refusal is one line naming the key, before any work."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import yaml

from longctx.cli import main
from longctx.pipeline.bpe import train_bpe
from tests.packer.test_pack_helpers import make_run

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"]


def missing_everywhere(missing: Path) -> dict[str, Any]:
    """Sections whose every outside path is missing."""
    return {
        "tokenizer": {"path": str(missing / "tokenizer.json")},
        "curate": {
            "input": str(missing / "corpus"),
            "sources": [{"name": "extra", "kind": "books", "path": str(missing / "books")}],
        },
        "train": {"model": {"hf_path": str(missing / "model")}, "shards": str(missing / "shards")},
        "eval": {"models": ["trained", str(missing / "checkpoint")], "shards": str(missing / "shards")},
    }


def write_config(path: Path, settings: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(settings))
    return path


def refusal(capsys: pytest.CaptureFixture[str], command: str) -> str:
    """The problem line of a refused config, checked to be the only one."""
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and err[0].startswith(f"longctx {command}: invalid configuration in "), err
    return err[1].strip()


@pytest.mark.slow
def test_curate_runs_whatever_the_other_sections_name(tmp_path: Path, capsys) -> None:
    books = tmp_path / "corpus" / "books"
    books.mkdir(parents=True)
    rng = random.Random(0)
    texts = ["\n".join(" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(300)) for _ in range(2)]
    for number, text in enumerate(texts):
        (books / f"book{number}.txt").write_text(text)
    train_bpe(texts, 300, tmp_path / "tokenizer.json")
    settings = missing_everywhere(tmp_path / "missing") | {
        "output": str(tmp_path / "out"),
        "context": {"original": 64, "target": 256},
        "tokenizer": {"path": str(tmp_path / "tokenizer.json")},
        "curate": {"input": str(tmp_path / "corpus"), "executor": {"tasks": 1}},
    }
    assert main(["curate", "--config", str(write_config(tmp_path / "run.yaml", settings))]) == 0
    assert {p.parent.name for p in (tmp_path / "out" / "documents").rglob("*.parquet")} == {"books"}
    capsys.readouterr()

    # its own sections' paths are checked before anything is written
    settings |= {"output": str(tmp_path / "refused")}
    settings["curate"] = settings["curate"] | {
        "sources": [{"name": "more", "kind": "books", "path": str(tmp_path / "nowhere")}]
    }
    assert main(["curate", "--config", str(write_config(tmp_path / "own.yaml", settings))]) == 2
    line = refusal(capsys, "curate")
    assert line == f"curate.sources.0.path: path does not exist: {tmp_path / 'nowhere'}"
    assert not (tmp_path / "refused").exists()


def test_pack_runs_whatever_the_other_sections_name(tmp_path: Path, capsys) -> None:
    make_run(tmp_path)
    settings = missing_everywhere(tmp_path / "missing") | {
        "output": str(tmp_path),
        "context": {"original": 128, "target": 256},
        "pack": {"seq_lens": [256], "executor": {"tasks": 1}},
    }
    # its own sections' paths are checked before anything is written: the tokenizer is one of them
    assert main(["pack", "--config", str(write_config(tmp_path / "run.yaml", settings))]) == 2
    line = refusal(capsys, "pack")
    assert line == (
        f"tokenizer.path: path does not exist: {tmp_path / 'missing' / 'tokenizer.json'} "
        "(nor is it a Hugging Face hub id such as org/name)"
    )
    assert not (tmp_path / "shards").exists() and not (tmp_path / "work").exists()

    settings["tokenizer"] = {"path": str(tmp_path / "tokenizer.json")}  # the run's own
    assert main(["pack", "--config", str(write_config(tmp_path / "run.yaml", settings))]) == 0
    assert (tmp_path / "shards" / "seq256" / "manifest.json").is_file()


def test_train_checks_its_section_only(tmp_path: Path, capsys) -> None:
    settings = missing_everywhere(tmp_path / "missing") | {
        "output": str(tmp_path / "out"),
        "context": {"original": 128, "target": 256},
    }
    settings["train"] = {"shards": str(tmp_path / "no_shards")}  # the tiny model: no path
    assert main(["train", "--config", str(write_config(tmp_path / "run.yaml", settings))]) == 2
    err = capsys.readouterr().err
    # refused for the shards it was given, not for the other sections' paths
    assert f"train.shards: path does not exist: {tmp_path / 'no_shards'}" in err
    assert "curate." not in err and "tokenizer.path" not in err and "eval." not in err

    settings["train"] = {"model": {"hf_path": str(tmp_path / "missing" / "model")}}
    assert main(["train", "--config", str(write_config(tmp_path / "run.yaml", settings))]) == 2
    line = refusal(capsys, "train")
    assert line == f"train.model.hf_path: path does not exist: {tmp_path / 'missing' / 'model'}"
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_eval_checks_its_section_and_the_base_model(tmp_path: Path, capsys) -> None:
    make_run(tmp_path)  # a run folder with its tokenizer, not trained
    settings = missing_everywhere(tmp_path / "missing") | {
        "output": str(tmp_path),
        "context": {"original": 128, "target": 256},
    }
    settings["eval"] = {"models": ["trained"]}
    config = write_config(tmp_path / "run.yaml", settings)
    assert main(["eval", "--config", str(config)]) == 2
    # past the config (train.model is not used without 'base'): there is no trained model yet
    assert "eval.models: no trained model at" in capsys.readouterr().err

    assert main(["eval", "--config", str(config), "--model", "base"]) == 2
    line = refusal(capsys, "eval")
    assert line == f"train.model.hf_path: path does not exist: {tmp_path / 'missing' / 'model'}"

    settings["eval"] = {"models": ["trained"], "shards": str(tmp_path / "missing" / "shards")}
    assert main(["eval", "--config", str(write_config(tmp_path / "run.yaml", settings))]) == 2
    line = refusal(capsys, "eval")
    assert line == f"eval.shards: path does not exist: {tmp_path / 'missing' / 'shards'}"
    assert not (tmp_path / "eval").exists()


def test_plan_checks_the_model_it_reads(tmp_path: Path, capsys) -> None:
    settings = missing_everywhere(tmp_path / "missing") | {"context": {"original": 128, "target": 4096}}
    settings["train"] = {"cp": 2}
    config = write_config(tmp_path / "run.yaml", settings)
    assert main(["plan", "--config", str(config), "--model", "llama-3-8b"]) == 0
    assert "llama" in capsys.readouterr().out.lower()

    settings["train"]["model"] = {"hf_path": str(tmp_path / "missing" / "model")}
    assert main(["plan", "--config", str(write_config(tmp_path / "run.yaml", settings))]) == 2
    line = refusal(capsys, "plan")
    assert line == f"train.model.hf_path: path does not exist: {tmp_path / 'missing' / 'model'}"


def test_demo_checks_every_section_before_its_first_stage(tmp_path: Path, capsys) -> None:
    assert main(["demo", "--print-config"]) == 0
    settings = yaml.safe_load(capsys.readouterr().out)
    settings["train"]["model"]["hf_path"] = str(tmp_path / "missing" / "model")
    config = write_config(tmp_path / "demo.yaml", settings)
    assert main(["demo", "--config", str(config), "--output", str(tmp_path / "out")]) == 2
    line = refusal(capsys, "demo")
    assert line == f"train.model.hf_path: path does not exist: {tmp_path / 'missing' / 'model'}"
    assert not (tmp_path / "out").exists()
