"""The refusals of a hostile-input sweep, through the command line, on one curated and packed run:
each is one line (``longctx <command>: ...``, exit status 2, no traceback) and leaves every byte of
the run folder and of the input as it was (the reference: their contents read before the probe).

Families: config (a key given twice, an output inside the input), inputs (a book
added since the run), state (a changed setting, a changed pack strategy, shard size or seed, another
tokenizer), security (credentials a Slurm job would write to disk). The disk, S3, concurrency and kill
families need mounts, a server or processes of their own: tests/pipeline/test_curate_faults.py,
tests/packer/test_pack_faults.py, tests/pipeline/test_curate_s3.py, tests/core/test_remote_s3.py,
tests/cli/test_concurrent_runs.py, tests/core/test_process_cleanup.py.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from longctx.cli import main
from longctx.pipeline.bpe import train_bpe
from tests.pipeline.test_curate import prose, wrap


def contents(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("refusals")
    books = root / "input" / "books"
    books.mkdir(parents=True)
    for i in range(3):
        (books / f"book{i}.txt").write_text(wrap(prose(40 + i, 600), 70))
    train_bpe([prose(s, 1500) for s in range(3)], 300, root / "tok" / "tokenizer.json")
    train_bpe([prose(s, 1500) for s in range(7, 10)], 320, root / "other" / "tokenizer.json")
    config = {
        "output": str(root / "run"),
        "context": {"original": 64, "target": 256},
        "tokenizer": {"path": str(root / "tok" / "tokenizer.json")},
        "curate": {"input": str(root / "input"), "executor": {"tasks": 1, "workers": 1}},
        "pack": {"seq_lens": [256], "shard_tokens": 1024, "executor": {"tasks": 1, "workers": 1}},
    }
    (root / "run.yaml").write_text(yaml.safe_dump(config))
    assert main(["curate", "--config", str(root / "run.yaml")]) == 0
    assert main(["pack", "--config", str(root / "run.yaml")]) == 0
    return {"root": root, "config": root / "run.yaml"}


def changed(base: Path, where: Path, edit: Callable[[dict], None]) -> Path:
    config = yaml.safe_load(base.read_text())
    edit(config)
    where.write_text(yaml.safe_dump(config))
    return where


def set_key(*keys: str, value: object) -> Callable[[dict], None]:
    def edit(config: dict) -> None:
        target = config
        for key in keys[:-1]:
            target = target.setdefault(key, {})
        target[keys[-1]] = value

    return edit


PROBES: dict[str, tuple[str, Callable[[dict[str, Path], Path], list[str]], str]] = {
    "config: a key given twice": (
        "curate",
        lambda r, t: ["--config", str(t / "twice.yaml")],
        "key 'output' appears twice",
    ),
    "config: output inside the input": (
        "curate",
        lambda r, t: ["--config", str(r["config"]), "--output", str(r["root"] / "input" / "books" / "run")],
        "lies inside the input folder",
    ),
    "inputs: a book added": (
        "curate",
        lambda r, t: ["--config", str(r["config"])],
        "book9.txt was added since",
    ),
    "state: another curate setting": (
        "curate",
        lambda r, t: [
            "--config",
            str(changed(r["config"], t / "c.yaml", set_key("curate", "min_fraction_of_target", value=0.9))),
        ],
        "different configuration (different bounds)",
    ),
    "state: another pack strategy": (
        "pack",
        lambda r, t: [
            "--config",
            str(changed(r["config"], t / "c.yaml", set_key("pack", "strategy", value="concat"))),
        ],
        "was packed with other settings (pack.strategy: bfd, now concat)",
    ),
    "state: another shard size": (
        "pack",
        lambda r, t: [
            "--config",
            str(changed(r["config"], t / "c.yaml", set_key("pack", "shard_tokens", value=512))),
        ],
        "was packed with other settings (pack.shard_tokens: 1024, now 512)",
    ),
    "state: another pack seed": (
        "pack",
        lambda r, t: ["--config", str(changed(r["config"], t / "c.yaml", set_key("pack", "seed", value=3)))],
        "made from other data (different pack.seed)",
    ),
    "state: another tokenizer": (
        "pack",
        lambda r, t: [
            "--config",
            str(
                changed(
                    r["config"],
                    t / "c.yaml",
                    set_key("tokenizer", "path", value=str(r["root"] / "other" / "tokenizer.json")),
                )
            ),
        ],
        "is not this run's tokenizer",
    ),
    "security: credentials for Slurm": (
        "curate",
        lambda r, t: [
            "--config",
            str(
                changed(
                    r["config"],
                    t / "c.yaml",
                    lambda c: c["curate"].update(
                        executor={"kind": "slurm", "slurm": {"partition": "p"}},
                        storage_options={"secret": "s"},
                    ),
                )
            ),
        ],
        "curate.storage_options: secret would be written to disk",
    ),
}


@pytest.mark.parametrize("probe", sorted(PROBES))
def test_a_refused_run_is_one_line_and_changes_nothing(
    run: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], probe: str
) -> None:
    command, argv, said = PROBES[probe]
    root = run["root"]
    (tmp_path / "twice.yaml").write_text(run["config"].read_text() + f"output: {tmp_path / 'elsewhere'}\n")
    added = root / "input" / "books" / "book9.txt"
    if probe.startswith("inputs"):
        added.write_text(wrap(prose(99, 600), 70))
    before = contents(root / "run"), contents(root / "input")
    capsys.readouterr()
    try:
        status = main([command, *argv(run, tmp_path)])
    finally:
        after = contents(root / "run"), contents(root / "input")
        added.unlink(missing_ok=True)
    err = capsys.readouterr().err
    assert status == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"longctx {command}: ") and said in lines[0], err
    assert after == before
    assert not (tmp_path / "elsewhere").exists()
