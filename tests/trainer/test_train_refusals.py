"""``longctx train`` settings that cannot work are refused at config load, in one line naming the key,
before any rank starts and before anything is written (issue 27)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from longctx.cli import main
from tests.trainer.test_train import train_config


def refused(packed: Path, tmp_path: Path, capsys, **train: Any) -> str:
    """``longctx train --nproc 2`` on a config with ``train`` settings changed: exit 2, no traceback,
    nothing written; returns the message."""
    cfg = train_config(packed, tmp_path / "out", **train)
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["train", "--config", str(path), "--nproc", "2"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.startswith("longctx train: ")
    assert not (tmp_path / "out").exists()
    return err


TINY = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1}


@pytest.mark.parametrize(
    ("tiny", "key", "message"),
    [
        (
            {"hidden_size": 36, "num_attention_heads": 4},
            "num_attention_heads",
            "36 / 4 = 9 is an odd head size",
        ),
        ({"hidden_size": 30, "num_attention_heads": 4}, "num_attention_heads", "must be a multiple of"),
        ({"num_attention_heads": 4, "num_key_value_heads": 3}, "num_key_value_heads", "a multiple of"),
    ],
)
def test_a_tiny_model_rope_or_grouped_attention_cannot_use(
    packed: Path, tmp_path: Path, capsys, tiny: dict, key: str, message: str
) -> None:
    err = refused(packed, tmp_path, capsys, model={"tiny": {**TINY, **tiny}})
    (line,) = [line for line in err.splitlines() if f"train.model.tiny.{key}:" in line]
    assert message in line


@pytest.mark.parametrize(
    ("optim", "key", "message"),
    [
        ({"lr": float("inf")}, "lr", "finite"),
        ({"lr": float("nan")}, "lr", "finite"),
        ({"lr": -1e-3}, "lr", "greater than 0"),
        ({"lr": 0}, "lr", "greater than 0"),
        ({"eps": float("inf")}, "eps", "finite"),
        ({"weight_decay": float("nan")}, "weight_decay", "finite"),
        ({"grad_clip": float("inf")}, "grad_clip", "finite"),
        ({"min_lr_ratio": float("nan")}, "min_lr_ratio", "finite"),
        ({"betas": [0.9, 1.0]}, "betas", "[0, 1)"),
        ({"betas": [-0.1, 0.95]}, "betas", "[0, 1)"),
        ({"betas": [0.9, float("nan")]}, "betas.1", "finite"),
    ],
)
def test_optimizer_numbers_must_be_finite_and_in_range(
    packed: Path, tmp_path: Path, capsys, optim: dict, key: str, message: str
) -> None:
    err = refused(packed, tmp_path, capsys, optim={"warmup_steps": 1, **optim})
    (line,) = [line for line in err.splitlines() if f"train.optim.{key}:" in line]
    assert message in line


def test_yaml_inf_is_refused_as_written(packed: Path, tmp_path: Path, capsys) -> None:
    """The issue's spelling, ``lr: .inf`` in the YAML file itself."""
    cfg = train_config(packed, tmp_path / "out")
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg).replace("lr: 0.003", "lr: .inf"))
    assert "lr: .inf" in path.read_text()
    assert main(["train", "--config", str(path), "--nproc", "2"]) == 2
    err = capsys.readouterr().err
    assert "train.optim.lr: Input should be a finite number" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_read_only_output_is_refused_before_any_rank_starts(packed: Path, tmp_path: Path, capsys) -> None:
    """train (on 2 ranks), --export and eval on a read-only output folder: one line naming the path,
    as curate and pack say it, instead of OSError tracebacks; nothing changes on disk."""
    from longctx import jobs
    from longctx.config import parse_config
    from tests.core.disks import read_only, tree

    empty, trained = tmp_path / "empty", tmp_path / "trained"
    empty.mkdir()
    cfg = train_config(packed, trained, steps=2, checkpoint={"every": 1, "keep": 2})
    cfg["eval"] = {"models": ["trained"], "rows": 2, "needle": None}
    jobs.train(parse_config(cfg), progress=False)
    configs = {}
    for name, output in (("empty", empty), ("trained", trained)):
        path = tmp_path / f"{name}.yaml"
        path.write_text(yaml.safe_dump({**cfg, "output": str(output)}))
        configs[name] = path
    commands = [
        (["train", "--config", str(configs["empty"]), "--nproc", "2"], empty / "train"),
        (["train", "--config", str(configs["trained"]), "--export", "1"], trained / "train"),
        (["eval", "--config", str(configs["trained"])], trained / "eval"),
    ]
    for output in (empty, trained):
        before = tree(output)
        with read_only(output):
            for argv, folder in commands:
                if Path(argv[2]).stem != output.name:
                    continue
                assert main(argv) == 2, argv
                inside = "" if folder.exists() else f" (it would be created inside {output})"
                assert capsys.readouterr().err.splitlines() == [
                    f"longctx {argv[0]}: output: cannot write to {folder}{inside}: read-only file system"
                ], argv
        assert tree(output) == before


def test_a_truncated_base_checkpoint_is_refused_before_any_rank_starts(
    packed: Path, base_llama: Path, tmp_path: Path, capsys
) -> None:
    import shutil

    base = tmp_path / "base"
    shutil.copytree(base_llama, base)
    weights = base / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    err = refused(packed, tmp_path, capsys, model={"hf_path": str(base)})
    assert err.splitlines() == [
        f"longctx train: {weights}: not a complete safetensors file (incomplete metadata, file not fully "
        "covered); the folder is damaged: export or copy it again"
    ]


def test_a_shards_folder_that_does_not_exist_is_named_as_missing(
    packed: Path, tmp_path: Path, capsys
) -> None:
    """``train.shards`` (or a stage's ``shards``) naming no folder is said to be missing, under its
    key, not taken for a pack run that has not finished."""
    missing = tmp_path / "nowhere" / "seq256"
    err = refused(packed, tmp_path, capsys, shards=str(missing))
    assert f"train.shards: path does not exist: {missing}" in err and "pack" not in err, err
    cfg = train_config(packed, tmp_path / "out")
    for key in ("steps", "shards"):
        del cfg["train"][key]
    cfg["train"]["stages"] = [{"seq_len": 256, "steps": 1, "shards": str(missing)}]
    path = tmp_path / "staged.yaml"
    path.write_text(yaml.safe_dump(cfg))
    assert main(["train", "--config", str(path), "--nproc", "2"]) == 2
    err = capsys.readouterr().err
    assert f"train.stages.0.shards: path does not exist: {missing}" in err and "pack" not in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("train", "message"),
    [
        ({"cp": 2, "cp_mode": "hybrid"}, "train.cp_mode = hybrid needs train.ulysses between 1 and cp = 2"),
        ({"cp": 2, "ulysses": 2}, "train.ulysses is the all-to-all degree of train.cp_mode hybrid"),
        ({"cp": 2, "cp_mode": "ring", "ulysses": 2}, "remove it"),
        ({"cp": 2, "cp_mode": "ulsyses"}, "train.cp_mode"),
    ],
)
def test_cp_mode_settings_that_cannot_work_are_refused(
    packed: Path, tmp_path: Path, capsys, train: dict, message: str
) -> None:
    assert message in refused(packed, tmp_path, capsys, **train)


def test_heads_that_ulysses_cannot_split_are_refused_before_any_rank_starts(
    packed: Path, tmp_path: Path, capsys
) -> None:
    """3 query heads do not split over the 2 ranks of an all-to-all: named before any rank starts."""
    tiny = {**TINY, "hidden_size": 48, "num_attention_heads": 3, "num_key_value_heads": 1}
    err = refused(packed, tmp_path, capsys, model={"tiny": tiny}, cp=2, cp_mode="ulysses")
    assert "3 query heads do not split over 2 ranks" in err and "train.cp" in err
    assert len(err.strip().splitlines()) == 1
