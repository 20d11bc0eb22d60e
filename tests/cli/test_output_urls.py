"""A URL where a command takes a local path (``--output s3://bucket/run``) is one line naming the flag
and what reaches object storage instead, before anything is written: ``Path`` would otherwise turn it
into a local folder literally named ``s3:/bucket/run``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from longctx.cli import main
from longctx.config import load_config, parse_config
from longctx.core.errors import ConfigError

URL = "s3://bucket/run"
CONFIG = {
    "context": {"original": 64, "target": 256},
    "pack": {"seq_lens": [256]},
    "train": {"steps": 1},
    "eval": {"rows": 1},
}


@pytest.fixture
def workdir(tmp_path: Path):
    """An empty current folder holding only the config, so that anything a command writes shows."""
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(CONFIG))
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        yield tmp_path
    finally:
        os.chdir(cwd)


@pytest.mark.parametrize(
    ("argv", "flag", "hint"),
    [
        (["curate", "--config", "cfg.yaml", "--output", URL], "--output", "--publish URL (curate.output)"),
        (["pack", "--config", "cfg.yaml", "--output", URL], "--output", "--publish URL (pack.output)"),
        (["train", "--config", "cfg.yaml", "--output", URL], "--output", "train.export.output"),
        (["eval", "--config", "cfg.yaml", "--output", URL], "--output", "local run folder"),
        (["demo", "--output", URL], "--output", "local run folder"),
        (["inspect", "shards", "--plot", URL + "/h.png"], "--plot", "local file"),
        (["inspect", URL + "/shards", "--cache", URL], "--cache", "local folder"),
        (
            ["plan", "--model", "llama-3-8b", "--lengths", "8K", "--csv", URL + "/p.csv"],
            "--csv",
            "local file",
        ),
    ],
)
def test_a_url_for_a_local_path_is_one_line_and_writes_nothing(
    workdir: Path, capsys, argv: list[str], flag: str, hint: str
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"longctx {argv[0]}: {flag} s3://bucket/") and hint in err[0], err[0]
    assert sorted(p.name for p in workdir.iterdir()) == ["cfg.yaml"]  # no s3: folder, nothing else


def test_output_as_a_url_in_the_config_is_one_line_pointing_to_publishing(workdir: Path, capsys) -> None:
    (workdir / "cfg.yaml").write_text(yaml.safe_dump(CONFIG | {"output": URL}))
    with pytest.raises(ConfigError) as refused:
        load_config(workdir / "cfg.yaml")
    message = str(refused.value)
    assert "\n" not in message and f"output {URL} is a URL" in message
    assert "curate.output" in message and "pack.output" in message and "train.export.output" in message
    with pytest.raises(ConfigError, match=r"^<dict>: output s3://bucket/run is a URL"):
        parse_config(CONFIG | {"output": URL})
    assert main(["curate", "--config", "cfg.yaml"]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert sorted(p.name for p in workdir.iterdir()) == ["cfg.yaml"]
    # a local output is still a path, relative to the current folder
    assert load_config(workdir / "cfg.yaml", {"output": "runs/x"}).output == Path("runs/x")
