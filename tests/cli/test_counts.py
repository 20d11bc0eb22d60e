"""Counts given on the command line are refused at 0 (or below) in one line naming the flag, before
any work: none is taken as 1, nor blamed on the config file; and a flag that only means something
with another one (``--stage`` with ``--export``, the rendezvous flags with ``--nproc``) is refused
without it rather than ignored."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from longctx.cli import main

TINY = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1}


@pytest.fixture
def config(tmp_path: Path) -> Path:
    """A run config with every section a command reads, over a run folder that does not exist."""
    path = tmp_path / "run.yaml"
    settings = {
        "output": str(tmp_path / "run"),
        "context": {"original": 128, "target": 256},
        "pack": {"seq_lens": [256]},
        "train": {"steps": 2, "model": {"tiny": TINY}},
        "eval": {"rows": 2},
    }
    path.write_text(yaml.safe_dump(settings))
    return path


PROBES: dict[str, tuple[list[str], str]] = {
    "train --steps 0": (["train", "--steps", "0"], "--steps 0: "),
    "train --steps -3": (["train", "--steps", "-3"], "--steps -3: "),
    "train --nproc 0": (["train", "--nproc", "0"], "--nproc 0: must be at least 1"),
    "train --nnodes 0": (["train", "--nproc", "2", "--nnodes", "0"], "--nnodes 0: must be at least 1"),
    "train --nnodes without --nproc": (["train", "--nnodes", "2"], "--nnodes needs --nproc"),
    "train --rdzv-endpoint without --nproc": (
        ["train", "--rdzv-endpoint", "h:1"],
        "--rdzv-endpoint needs --nproc",
    ),
    "train --stage without --export": (["train", "--stage", "2"], "--stage 2 needs --export STEP"),
    "train --export -1": (["train", "--export", "-1"], "--export -1: must be at least 1"),
    "curate --tasks 0": (["curate", "--tasks", "0"], "--tasks 0: "),
    "curate --workers 0": (["curate", "--workers", "0"], "--workers 0: must be at least 1, or -1"),
    "pack --tasks 0": (["pack", "--tasks", "0"], "--tasks 0: "),
    "pack --workers 0": (["pack", "--workers", "0"], "--workers 0: must be at least 1, or -1"),
}


@pytest.mark.parametrize("probe", sorted(PROBES))
def test_a_count_of_zero_is_refused_naming_the_flag(
    config: Path, capsys: pytest.CaptureFixture[str], probe: str
) -> None:
    argv, said = PROBES[probe]
    command, *flags = argv
    assert main([command, "--config", str(config), *flags]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"longctx {command}: {said}"), err
    assert str(config) not in lines[0]  # the flag is wrong, not the file
    assert not (config.parent / "run").exists()


PLAN = ["plan", "--model", "llama-3-8b", "--lengths", "8K"]


@pytest.mark.parametrize(
    "flags",
    [
        ["--cp", "0"],
        ["--cp", "-2"],
        ["--dp-replicate", "0"],
        ["--state-shards", "0"],
        ["--gpus", "0"],
        ["--gpus", "0", "--tokens", "1B"],
    ],
)
def test_plan_refuses_a_count_of_zero_naming_the_flag(
    flags: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*PLAN, *flags]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"longctx plan: {flags[0]} {flags[1]}: must be at least 1", err


@pytest.mark.parametrize("flag", ["--max-errors", "--max-chars"])
def test_inspect_refuses_a_count_of_zero_naming_the_flag(
    flag: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["inspect", str(tmp_path), flag, "0"]) == 2
    assert capsys.readouterr().err.strip() == f"longctx inspect: {flag} 0: must be at least 1"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("eval.needle.lengths", [0, 256]),
        ("eval.needle.lengths", []),
        ("eval.needle.depths", []),
        ("eval.needle.kinds", []),
        ("curate.executor.slurm.cpus_per_task", 0),
        ("curate.executor.slurm.mem_per_cpu_gb", 0),
    ],
)
def test_a_config_count_of_zero_is_refused_naming_the_key(key: str, value: object) -> None:
    """Counts in the config file: a needle grid without cells, a Slurm job without CPUs or memory."""
    from longctx.config import parse_config
    from longctx.core.errors import ConfigError

    settings: dict = {
        "context": {"original": 128, "target": 256},
        "curate": {"executor": {"kind": "slurm", "slurm": {"partition": "p"}}},
        "eval": {"needle": {}},
    }
    *parents, last = key.split(".")
    section = settings
    for part in parents:
        section = section.setdefault(part, {})
    section[last] = value
    with pytest.raises(ConfigError) as refused:
        parse_config(settings)
    assert f"\n  {key}" in str(refused.value) or f"\n  {key}." in str(refused.value), refused.value
