"""Curation faults end in one line naming the path or key, before any work where they can be known
then, and leave no temporary files: an output that is a file, a read-only or full file system (real
tmpfs and read-only mounts from ``tests/core/disks.py`` where the test may mount, an injected ENOSPC
everywhere), a source named ``..``, special tokens the tokenizer lacks."""

from __future__ import annotations

import errno
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from longctx import jobs
from longctx.config import parse_config
from longctx.core.errors import ConfigError, OutputError
from longctx.pipeline.bpe import train_bpe
from tests.core.disks import read_only, small_disk, tree
from tests.pipeline.test_curate import prose, wrap

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    train_bpe([prose(s, 1500) for s in range(3)], 300, path)
    return path


def books(root: Path, n: int, words: int) -> Path:
    folder = root / "input" / "books"
    folder.mkdir(parents=True)
    for i in range(n):
        (folder / f"book{i}.txt").write_text(wrap(prose(100 + i, words), 70))
    return root / "input"


def config(input_dir: Path, tokenizer: Path, output: Path, **extra) -> dict:
    return {
        "output": str(output),
        "context": {"original": 32, "target": 64},
        "tokenizer": {"path": str(tokenizer)},
        "curate": {"input": str(input_dir), "executor": {"tasks": 1, "workers": 1}},
    } | extra


def cli(cfg: dict, tmp_path: Path) -> subprocess.CompletedProcess:
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run(
        [sys.executable, "-m", "longctx.cli", "curate", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=600,
        env=env,
    )


def temporaries(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.name.endswith(".tmp")] if folder.exists() else []


def test_output_that_is_a_file_is_refused_in_one_line(tmp_path: Path, tokenizer: Path) -> None:
    output = tmp_path / "out"
    output.write_text("not a folder")
    with pytest.raises(OutputError, match=f"output: {output} is a file, not a folder; choose another output"):
        jobs.curate(parse_config(config(books(tmp_path, 1, 200), tokenizer, output)))
    below = output / "run"
    done = cli(config(tmp_path / "input", tokenizer, below), tmp_path)
    assert done.returncode == 2
    assert (
        done.stderr.strip()
        == f"longctx curate: output: {below} cannot be created: {output} is a file, not a folder; "
        "choose another output"
    )
    assert output.read_text() == "not a folder"


def test_read_only_output_is_refused_before_any_work(tmp_path: Path, tokenizer: Path) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    input_dir = books(tmp_path, 1, 200)
    with read_only(folder) as readonly:
        done = cli(config(input_dir, tokenizer, readonly / "out"), tmp_path)
        assert tree(readonly) == {}
    assert done.returncode == 2
    assert re.fullmatch(
        rf"longctx curate: output: cannot write to {re.escape(str(readonly / 'out'))} \(it would be created "
        rf"inside {re.escape(str(readonly))}\): (read-only file system|permission denied)",
        done.stderr.strip(),
    )


def test_full_disk_is_one_line_and_leaves_no_temporary_file(tmp_path: Path, tokenizer: Path) -> None:
    input_dir = books(tmp_path, 4, 30_000)  # about 1 MB of text to write four times over
    with small_disk(tmp_path / "small", 256) as small:
        done = cli(config(input_dir, tokenizer, small / "out"), tmp_path)
        leftovers = temporaries(small)
    assert done.returncode == 2, done.stderr[-3000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "No space left on device" in lines[0] and str(small) in lines[0]
    assert "Traceback" not in done.stderr
    assert leftovers == []


def test_injected_full_disk_while_writing_documents(tmp_path: Path, tokenizer: Path, monkeypatch) -> None:
    """Without a small file system to fill: the document writer's disk fills up in the middle of the
    run (one worker, in this process, so the fault can be injected)."""
    from longctx.pipeline.docstore import DocumentWriter

    def full(self, document, rank=0, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "out" / "work"))

    monkeypatch.setattr(DocumentWriter, "write", full)
    with pytest.raises(OutputError) as err:
        jobs.curate(parse_config(config(books(tmp_path, 2, 300), tokenizer, tmp_path / "out")))
    message = str(err.value)
    assert "\n" not in message and message.startswith(str(tmp_path / "out" / "work"))
    assert "No space left on device" in message
    assert temporaries(tmp_path / "out") == []


@pytest.mark.parametrize("field", ["sources", "synthetic"])
def test_source_named_dot_dot_is_a_config_error(tmp_path: Path, tokenizer: Path, field: str) -> None:
    books(tmp_path, 1, 200)
    curate = {"input": str(tmp_path / "input")}
    if field == "sources":
        curate["sources"] = [{"name": "..", "kind": "books", "path": str(tmp_path / "input" / "books")}]
        key = "curate.sources.0.name"
    else:
        curate["synthetic"] = {"source": ".."}
        key = "curate.synthetic.source"
    with pytest.raises(ConfigError, match=rf"{key}: '\.\.' cannot name a folder"):
        parse_config(config(tmp_path / "input", tokenizer, tmp_path / "out", curate=curate))


def test_specials_pack_needs_are_checked_before_any_work(tmp_path: Path, tokenizer: Path) -> None:
    cfg = config(books(tmp_path, 1, 200), tokenizer, tmp_path / "out", pack={"eos_token": "</s>"})
    with pytest.raises(ConfigError, match=r"pack\.eos_token: '</s>' is not in the vocabulary"):
        jobs.curate(parse_config(cfg))
    assert not (tmp_path / "out").exists()
    trained = config(tmp_path / "input", tokenizer, tmp_path / "out2", pack={"eos_token": "</s>"})
    del trained["tokenizer"]
    with pytest.raises(
        ConfigError, match=r"pack\.eos_token: '</s>' is not a special token of the tokenizer curation trains"
    ):
        jobs.curate(parse_config(trained))
    assert not (tmp_path / "out2").exists()


def test_missing_input_is_refused_before_any_work(tmp_path: Path, tokenizer: Path) -> None:
    books(tmp_path, 1, 200)
    cfg = config(tmp_path / "input", tokenizer, tmp_path / "out")
    cfg["curate"]["sources"] = [{"name": "remote", "kind": "books", "path": "memory://nowhere/books"}]
    with pytest.raises(ConfigError, match=r"curate\.sources\.0\.path: memory://nowhere/books does not exist"):
        jobs.curate(parse_config(cfg))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "inside", ["books/run", "run", "."], ids=["in-a-source", "in-the-input", "the-input"]
)
def test_output_inside_the_input_is_refused_before_any_work(
    tmp_path: Path, tokenizer: Path, inside: str
) -> None:
    """`curate --input in --output in/books/run` would read what it writes (it used to end in a
    LedgerMismatch traceback after the whole run): one line, and the input is left as it was."""
    input_dir = books(tmp_path, 2, 300)
    before = tree(input_dir)
    output = input_dir / inside
    done = cli(config(input_dir, tokenizer, output), tmp_path)
    assert done.returncode == 2, done.stderr[-2000:]
    where = "is" if inside == "." else "lies inside"
    assert done.stderr.strip() == (
        f"longctx curate: output: {output} {where} the input folder {input_dir} (curate.input); "
        "choose another output outside the input"
    )
    assert tree(input_dir) == before


def test_synthetic_context_too_short_for_its_task_is_one_line_naming_the_key(
    tmp_path: Path, tokenizer: Path
) -> None:
    """A ``curate.synthetic.context_tokens`` entry shorter than the task's own text fails in the
    synthetic stage's worker processes: the error still reaches the console as one line naming the
    key (not a worker's traceback)."""
    cfg = config(books(tmp_path, 2, 3000), tokenizer, tmp_path / "out")
    cfg["context"] = {"original": 256, "target": 512}
    cfg["curate"] |= {
        "executor": {"tasks": 2, "workers": 2},
        "min_fraction_of_target": 0.1,
        "synthetic": {"n_examples": 4, "kinds": ["single_needle"], "context_tokens": [20]},
    }
    done = cli(cfg, tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(
        "longctx curate: curate.synthetic.context_tokens: context_tokens=20 leaves no room"
    )
    assert "Traceback" not in done.stdout + done.stderr
