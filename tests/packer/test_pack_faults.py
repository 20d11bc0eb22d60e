"""`longctx pack` on a broken output folder or config: one line naming the path or key (exit 2, no
traceback), before any work where that is possible, nothing changed by a refused run, and no
temporary file left by a failed one. A run that failed on a full disk resumes, once there is room,
to the same bytes as a run that never failed.

Faults are real where the machine allows it (a small tmpfs that fills up, a read-only bind mount:
tests/core/disks.py); the full disk is also simulated at the write call, which runs everywhere.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from longctx.cli import main
from longctx.core import atomic
from tests.core.disks import read_only, resize, small_disk, tree
from tests.core.faults import run_longctx
from tests.packer.test_pack_helpers import ORIGINAL, SEQ_LENS, TARGET, make_run


@pytest.fixture(scope="module")
def curated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A curated run folder (documents and tokenizer), copied by each test that packs it."""
    root = tmp_path_factory.mktemp("curated")
    make_run(root)
    return root


@pytest.fixture(scope="module")
def clean_shards(curated: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """Shards of a run that never failed."""
    root = tmp_path_factory.mktemp("clean") / "run"
    shutil.copytree(curated, root)
    assert main(["pack", "--config", str(write_config(root, root))]) == 0
    return shard_bytes(root)


def write_config(output: Path, where: Path, **pack: object) -> Path:
    settings = {
        "seq_lens": SEQ_LENS,
        "shard_tokens": 4096,
        "pool_tokens": 8192,
        "executor": {"tasks": 2, "workers": 1},
    }
    config = {
        "output": str(output),
        "context": {"original": ORIGINAL, "target": TARGET},
        "pack": settings | pack,
    }
    path = where.parent / f"{where.name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def shard_bytes(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted((root / "shards").rglob("*")) if p.is_file()
    }


def refusal(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run the CLI; it must exit 2 with one line on stderr (returned), no traceback."""
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err
    assert len(err.splitlines()) == 1, err
    return err


def test_output_that_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    output = tmp_path / "run"
    output.write_text("a file where the run folder should be")
    err = refusal(capsys, ["pack", "--config", str(write_config(output, output))])
    assert err == f"longctx pack: output: {output} is a file, not a folder; choose another output"


def test_read_only_output_is_refused_before_work(
    curated: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "run"
    shutil.copytree(curated, root)
    config = write_config(root, tmp_path / "cfg")
    before = tree(root)
    with read_only(root):
        err = refusal(capsys, ["pack", "--config", str(config)])
    assert err.startswith(f"longctx pack: output: cannot write to {root}")
    assert err.endswith(("read-only file system", "permission denied"))
    assert tree(root) == before


def test_disk_too_small_is_refused_before_work(
    curated: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with small_disk(tmp_path / "disk", 400) as root:
        for item in curated.iterdir():
            shutil.copytree(item, root / item.name) if item.is_dir() else shutil.copy(item, root)
        before = tree(root)
        err = refusal(capsys, ["pack", "--config", str(write_config(root, tmp_path / "cfg"))])
        assert (
            f"output: {root}/shards has " in err
            and "free on its file system, but this run writes about" in err
        )
        assert tree(root) == before  # no work/ or shards/ folder, nothing written


def assert_no_temporaries(root: Path) -> None:
    assert not [p for p in root.rglob("*") if p.name.endswith(atomic.TEMP_SUFFIX)], "temporary files left"


def one_line(result: subprocess.CompletedProcess[str]) -> str:
    """What a user saw of a failed run: exit 2, and one line on stderr (no traceback)."""
    assert result.returncode == 2, result.stderr[-3000:]
    err = result.stderr.strip()
    assert len(err.splitlines()) == 1, err
    return err


def test_disk_that_fills_up_during_the_run_then_resumes(
    curated: Path, tmp_path: Path, clean_shards: dict[str, bytes]
) -> None:
    """A real full disk: the free-space estimate let the run start (here: told so), the disk filled
    up anyway. Once there is room, the run resumes to the bytes of a run that never failed."""
    with small_disk(tmp_path / "disk", 400) as root:
        for item in curated.iterdir():
            shutil.copytree(item, root / item.name) if item.is_dir() else shutil.copy(item, root)
        config = write_config(root, tmp_path / "cfg")
        err = one_line(run_longctx(["pack", "--config", str(config)], no_space_estimate=True))
        assert err.startswith(f"longctx pack: {root}/") and "No space left on device" in err
        assert_no_temporaries(root)
        resize(root, 4096)
        assert main(["pack", "--config", str(config)]) == 0
        assert shard_bytes(root) == clean_shards
        assert_no_temporaries(root)


def test_simulated_full_disk_during_the_run_then_resumes(
    curated: Path, tmp_path: Path, clean_shards: dict[str, bytes]
) -> None:
    """The same without a mount (runs everywhere): the write call of the first shard to go past
    30 KB fails with ENOSPC after writing what fits."""
    root = tmp_path / "run"
    shutil.copytree(curated, root)
    config = write_config(root, tmp_path / "cfg")
    err = one_line(run_longctx(["pack", "--config", str(config)], full_disk_after=30_000))
    assert err.startswith(f"longctx pack: {root}/shards/seq") and err.endswith(
        ".arrow: No space left on device; free some space and run again to resume"
    )
    assert_no_temporaries(root)
    assert main(["pack", "--config", str(config)]) == 0
    assert shard_bytes(root) == clean_shards


@pytest.mark.parametrize(
    ("argv", "pack", "expected"),
    [
        (
            ["--workers", "0"],
            {},
            "--workers 0: must be at least 1, or -1 to run every task at once "
            "(it sets pack.executor.workers)",
        ),
        ([], {"executor": {"tasks": 2, "workers": 0}}, "pack.executor.workers: must be at least 1"),
        ([], {"mix": {"books": 0.5, "..": 0.5}}, "pack.mix: '..' cannot be a source"),
        ([], {"mix": {"books": 0.5, "a/b": 0.5}}, "pack.mix: 'a/b' cannot be a source"),
    ],
    ids=["workers-flag", "workers-key", "mix-dotdot", "mix-slash"],
)
def test_bad_settings_are_refused_before_work(
    curated: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    pack: dict,
    expected: str,
) -> None:
    root = tmp_path / "run"
    shutil.copytree(curated, root)
    before = tree(root)
    assert main(["pack", "--config", str(write_config(root, tmp_path / "cfg", **pack)), *argv]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err
    assert tree(root) == before
