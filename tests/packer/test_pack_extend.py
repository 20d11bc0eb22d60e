"""Adding a window length to a finished run packs only the new length and leaves the others
untouched: same bytes, same files (not rewritten). The reference for the new output is a fresh run
that packs that length alone: an output's bytes depend on the run's data and its own settings,
never on which other lengths exist."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from longctx import jobs
from longctx.cli import main
from longctx.core.errors import ConfigError
from longctx.packer.config import DATA_FIELDS, NOT_IN_OUTPUT, WINDOW_FIELDS, PackConfig
from longctx.packer.validate import validate_folder
from tests.core.disks import tree
from tests.packer.test_pack_helpers import make_config, make_run


def files_of(folder: Path) -> dict[str, tuple[bytes, int, int]]:
    """Every file with its bytes, inode and modification time: equal only if never rewritten."""
    return {p.name: (p.read_bytes(), p.stat().st_ino, p.stat().st_mtime_ns) for p in sorted(folder.iterdir())}


def bytes_of(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def curated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("curated")
    make_run(root)
    return root


def copy_of(curated: Path, where: Path) -> Path:
    shutil.copytree(curated, where)
    return where


def test_adding_a_length_packs_only_it_and_keeps_the_others(
    curated: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = copy_of(curated, tmp_path / "run")
    jobs.pack(make_config(root, seq_lens=[256]))
    before = files_of(root / "shards" / "seq256")

    manifests = jobs.pack(make_config(root, seq_lens=[256, 1024]))
    assert f"{root / 'shards' / 'seq256'}: already packed, kept as it is" in capsys.readouterr().out
    assert files_of(root / "shards" / "seq256") == before
    assert set(manifests) == {256, 1024} and validate_folder(root / "shards" / "seq1024") == []

    alone = copy_of(curated, tmp_path / "alone")
    jobs.pack(make_config(alone, seq_lens=[1024]))
    assert bytes_of(root / "shards" / "seq1024") == bytes_of(alone / "shards" / "seq1024")
    together = copy_of(curated, tmp_path / "together")
    jobs.pack(make_config(together, seq_lens=[256, 1024]))
    for n in (256, 1024):
        assert bytes_of(root / "shards" / f"seq{n}") == bytes_of(together / "shards" / f"seq{n}")

    record = json.loads((root / "work" / "pack" / "run.json").read_text())
    assert set(record["outputs"]) == {"256", "1024"}
    again = files_of(root / "shards" / "seq1024")
    jobs.pack(make_config(root, seq_lens=[1024, 256]))  # nothing left to do: nothing rewritten
    assert files_of(root / "shards" / "seq1024") == again and files_of(root / "shards" / "seq256") == before


def test_a_new_length_may_need_other_packing_settings(curated: Path, tmp_path: Path) -> None:
    """A longer window needs a larger pool: allowed for the new length, the finished one is kept."""
    root = copy_of(curated, tmp_path / "run")
    jobs.pack(make_config(root, seq_lens=[256], pool_tokens=4096, shard_tokens=2048))
    before = files_of(root / "shards" / "seq256")
    manifests = jobs.pack(make_config(root, seq_lens=[256, 8192], pool_tokens=16384, shard_tokens=8192))
    assert files_of(root / "shards" / "seq256") == before
    assert manifests[256].config["pack"]["pool_tokens"] == 4096
    assert manifests[8192].config["pack"]["pool_tokens"] == 16384
    assert manifests[8192].header.config_sha256 != manifests[256].header.config_sha256


def test_other_data_is_refused_and_changes_nothing(curated: Path, tmp_path: Path) -> None:
    root = copy_of(curated, tmp_path / "run")
    jobs.pack(make_config(root, seq_lens=[256]))
    before = tree(root / "shards"), tree(root / "work", folder_times=False)  # work/pack/.lock comes and goes
    with pytest.raises(ConfigError, match=r"made from other data \(different pack\.eos_token\)"):
        jobs.pack(make_config(root, seq_lens=[256, 1024], eos_token="<|pad|>"))
    with pytest.raises(ConfigError, match=r"made from other data \(different context\)"):
        cfg = make_config(root, seq_lens=[256, 1024])
        jobs.pack(cfg.model_copy(update={"context": cfg.context.model_copy(update={"original": 64})}))
    (root / "documents" / "books" / "extra.parquet").write_bytes(
        (root / "documents" / "books" / "00000.parquet").read_bytes()
    )
    with pytest.raises(ConfigError, match=r"\(different documents\)"):
        jobs.pack(make_config(root, seq_lens=[256, 1024]))
    (root / "documents" / "books" / "extra.parquet").unlink()
    assert (tree(root / "shards"), tree(root / "work", folder_times=False)) == before  # changes nothing


def test_an_unfinished_length_resumes_only_with_its_own_settings(curated: Path, tmp_path: Path) -> None:
    root = copy_of(curated, tmp_path / "run")
    jobs.pack(make_config(root, seq_lens=[256, 1024]))
    (root / "shards" / "seq1024" / "manifest.json").unlink()  # as a run killed before its last stage
    with pytest.raises(
        ConfigError,
        match=r"seq1024 is half packed with other settings \(pack\.shard_tokens: 4096, now 8192\)",
    ):
        jobs.pack(make_config(root, seq_lens=[256, 1024], shard_tokens=8192))
    finished = jobs.pack(make_config(root, seq_lens=[256, 1024]))
    assert validate_folder(root / "shards" / "seq1024") == [] and finished[1024].rows > 0


def test_a_folder_the_run_did_not_write_is_refused(curated: Path, tmp_path: Path) -> None:
    root = copy_of(curated, tmp_path / "run")
    jobs.pack(make_config(root, seq_lens=[256]))
    (root / "shards" / "seq1024").mkdir()
    (root / "shards" / "seq1024" / "stray.arrow").write_bytes(b"x")
    config = root.parent / "run.yaml"
    config.write_text(
        f"output: {root}\ncontext: {{original: 128, target: 1024}}\n"
        "pack: {seq_lens: [256, 1024], shard_tokens: 4096, pool_tokens: 8192, "
        "executor: {tasks: 2, workers: 1}}\n"
    )
    assert main(["pack", "--config", str(config)]) == 2


def test_every_pack_setting_is_classified() -> None:
    """A new setting must say whether it changes every output, one output, or none."""
    assert set(PackConfig.model_fields) == DATA_FIELDS | WINDOW_FIELDS | NOT_IN_OUTPUT
    assert not (DATA_FIELDS & WINDOW_FIELDS or DATA_FIELDS & NOT_IN_OUTPUT or WINDOW_FIELDS & NOT_IN_OUTPUT)


WINDOW_CHANGES = {
    "strategy": ({"strategy": "concat"}, "pack.strategy: bfd, now concat"),
    "shard_tokens": ({"shard_tokens": 2048}, "pack.shard_tokens: 4096, now 2048"),
    "pool_tokens": ({"pool_tokens": 2048}, "pack.pool_tokens: 8192, now 2048"),
    "tasks": ({"executor": {"tasks": 3, "workers": 1}}, "pack.executor.tasks: 2, now 3"),
}
DATA_CHANGES = {
    "mix": {"mix": {"books": 0.6, "papers": 0.3, "anchor": 0.1}, "mix_max_dropped": 1.0},
    "mix_total_tokens": {"mix_total_tokens": 10_000},
    "upsample_long": {"upsample_long": {"min_tokens": 1000, "factor": 3}, "mix_max_dropped": 1.0},
    "seed": {"seed": 5},
    "eos_token": {"eos_token": "<|pad|>"},
    "bos_token": {"bos_token": "<|bos|>"},
    "pad_token": {"pad_token": "<|pad|>"},
}


def contents(root: Path) -> dict[str, bytes]:
    """Every file of the run's shards and pack state, with its bytes."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for sub in ("shards", "work")
        for p in sorted((root / sub).rglob("*"))
        if p.is_file()
    }


def test_every_byte_changing_setting_is_tested() -> None:
    assert set(WINDOW_CHANGES) == WINDOW_FIELDS | {"tasks"} and set(DATA_CHANGES) == DATA_FIELDS


@pytest.mark.parametrize("name", sorted(WINDOW_CHANGES))
def test_a_rerun_with_other_window_settings_is_refused_not_kept(
    curated: Path, tmp_path: Path, name: str
) -> None:
    """A finished output rerun with another strategy, shard or pool size or task count was "already
    packed, kept as it is", though its bytes are not what the config asks for: refused like a changed
    seed, naming the setting and both values, changing nothing. Deleting the folder packs it anew
    with the new settings, to the bytes of a run that packed it so from the start."""
    change, said = WINDOW_CHANGES[name]
    root = copy_of(curated, tmp_path / "run")
    jobs.pack(make_config(root, seq_lens=[256]))
    before = contents(root)
    folder = root / "shards" / "seq256"
    with pytest.raises(ConfigError) as err:
        jobs.pack(make_config(root, seq_lens=[256], **change))
    assert str(err.value) == (
        f"{folder} was packed with other settings ({said}); run with its settings, or delete {folder} to "
        "pack it anew"
    )
    assert contents(root) == before
    shutil.rmtree(folder)
    again = jobs.pack(make_config(root, seq_lens=[256], **change))
    fresh = copy_of(curated, tmp_path / "fresh")
    jobs.pack(make_config(fresh, seq_lens=[256], **change))
    assert bytes_of(folder) == bytes_of(fresh / "shards" / "seq256")
    assert validate_folder(folder) == [] and again[256].rows > 0


@pytest.mark.parametrize("name", sorted(DATA_CHANGES))
def test_a_rerun_with_other_data_settings_is_refused(curated: Path, tmp_path: Path, name: str) -> None:
    root = copy_of(curated, tmp_path / "run")
    jobs.pack(make_config(root, seq_lens=[256]))
    before = contents(root)
    with pytest.raises(ConfigError, match=rf"made from other data \(different pack\.{name}\)"):
        jobs.pack(make_config(root, seq_lens=[256], **DATA_CHANGES[name]))
    assert contents(root) == before


def test_a_finished_length_kept_beside_a_new_one_says_its_other_settings(
    curated: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With a new length to pack, the new settings are that length's: the finished one is kept and
    the console says it was packed otherwise; a rerun of that config changes nothing."""
    root = copy_of(curated, tmp_path / "run")
    jobs.pack(make_config(root, seq_lens=[256]))
    capsys.readouterr()
    jobs.pack(make_config(root, seq_lens=[256, 1024], strategy="concat"))
    folder = root / "shards" / "seq256"
    assert (
        f"{folder}: already packed with other settings (pack.strategy: bfd, now concat), kept as it is"
        in capsys.readouterr().out
    )
    before = contents(root)
    jobs.pack(make_config(root, seq_lens=[256, 1024], strategy="concat"))
    assert contents(root) == before
    with pytest.raises(ConfigError, match=r"seq256 was packed with other settings"):
        jobs.pack(make_config(root, seq_lens=[256], strategy="concat"))


def test_only_passes_with_tasks_done_are_forgotten(tmp_path: Path) -> None:
    """A length recorded but with an empty folder is packed anew: the resume state of a pass that
    completed tasks for it goes (its shards were deleted), while a pass with no task done keeps its
    state, the Slurm jobs it records included (still queued: running pack again must not submit them
    twice; the Slurm test in tests/cluster resubmitted them before)."""
    from longctx.core.jobstate import SlurmJob, record_slurm_jobs, record_stages, slurm_jobs, stage_folder
    from longctx.core.layout import RunLayout
    from longctx.packer.run import forget_passes

    layout = RunLayout(tmp_path, "pack")
    queued, done, other = (layout.work / name for name in ("seq256+seq512", "seq256", "seq1024"))
    for work in (queued, done, other):
        record_stages(work, [("pack", 2), ("manifest", 1)])
    record_slurm_jobs(queued, [SlurmJob(1, "pack", 2, "28", str(queued / "logs"))])
    for work in (done, other):
        marks = stage_folder(work, 1, "pack") / "completions"
        marks.mkdir(parents=True)
        (marks / "00000").touch()
    forget_passes(layout, [256])
    assert not done.exists()  # its shards are gone: its tasks must run again
    assert [job.job_id for job in slurm_jobs(queued)] == ["28"]  # nothing done yet: kept as it is
    assert (other / "logs").is_dir()  # another length's pass is not touched
