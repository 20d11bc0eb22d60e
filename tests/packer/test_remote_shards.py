"""Shards on object storage, against a real S3-compatible server (moto's, on loopback): ``longctx
pack`` publishes to ``s3://`` and the loader reads from it through a checked local cache. The
reference is the same run packed and read locally: the published objects must be its bytes, and the
loader must yield its rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from longctx import jobs
from longctx.core.errors import ConfigError
from longctx.core.remote import RemoteError, cache_folder, publish_folder
from longctx.packer import PackedDataset, ShardError
from longctx.packer.manifest import load_manifest
from longctx.packer.remote import fetch_shards
from tests.packer.test_pack_helpers import SEQ_LENS, PackedRun, make_config, make_run
from tests.s3server import S3, local_files, remote_files, s3  # noqa: F401  (the fixture)

pytest_plugins = ["tests.packer.test_pack_helpers"]  # the shared packed_run fixture

SEQ_LEN = 256


@pytest.fixture(scope="module")
def published(s3: S3, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A run packed with ``pack.output`` on a fresh bucket: ``(local run folder, shards URL)``."""
    root = tmp_path_factory.mktemp("remote_pack")
    make_run(root)
    url = f"s3://{s3.bucket()}/run/shards"
    cfg = make_config(root, output=url, storage_options=s3.storage_options)
    assert jobs.pack(cfg) is not None
    return root, url


def test_published_shards_are_the_local_packs_bytes(published, packed_run: PackedRun, s3: S3) -> None:
    """Every output folder is uploaded whole, and equals byte for byte what a purely local pack of
    the same input wrote (the shared ``packed_run``, packed without ``pack.output``)."""
    root, url = published
    objects = remote_files(s3, url)
    for n in SEQ_LENS:
        expected = local_files(packed_run.folder(n))
        assert expected == local_files(root / "shards" / f"seq{n}")
        assert {
            k.removeprefix(f"seq{n}/"): v for k, v in objects.items() if k.startswith(f"seq{n}/")
        } == expected
    assert len(objects) == sum(len(local_files(packed_run.folder(n))) for n in SEQ_LENS)


def test_publishing_again_sends_nothing_and_an_interrupted_publish_resumes(
    published,
    s3: S3,
    capsys: pytest.CaptureFixture,
) -> None:
    root, url = published
    folder = root / "shards" / f"seq{SEQ_LEN}"
    assert (
        publish_folder(
            folder, f"{url}/seq{SEQ_LEN}", last="manifest.json", storage_options=s3.storage_options
        )
        == []
    )
    # an upload killed after one shard: the manifest and the other shards are missing remotely
    fs = s3.fs()
    shards = sorted(p.name for p in folder.glob("*.arrow"))
    prefix = f"{url.removeprefix('s3://')}/seq{SEQ_LEN}"
    for name in ["manifest.json", *shards[1:]]:
        fs.rm_file(f"{prefix}/{name}")
    jobs.pack(make_config(root, output=url, storage_options=s3.storage_options))
    assert f"{url}/seq{SEQ_LEN}: published {len(shards)} files" in capsys.readouterr().out
    assert remote_files(s3, f"{url}/seq{SEQ_LEN}") == local_files(folder)


def rows(ds: PackedDataset) -> list[dict[str, torch.Tensor]]:
    return [ds[i] for i in range(len(ds.shards))] + list(ds)


def test_the_loader_reads_s3_shards_as_the_local_ones(published, s3: S3, tmp_path: Path) -> None:
    root, url = published
    kwargs = {"tokenizer": root / "tokenizer.json", "seed": 3, "holdout_rows": 2}
    local = PackedDataset(root / "shards" / f"seq{SEQ_LEN}", **kwargs)
    remote = PackedDataset(
        f"{url}/seq{SEQ_LEN}", cache=tmp_path, storage_options=s3.storage_options, **kwargs
    )
    assert remote.shards.source == f"{url}/seq{SEQ_LEN}"
    assert remote.shards.folder == cache_folder(f"{url}/seq{SEQ_LEN}", tmp_path)
    assert remote.heldout_rows() == local.heldout_rows()
    expected, got = rows(local), rows(remote)
    assert len(got) == len(expected) > 0
    for a, b in zip(expected, got, strict=True):
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_cached_shards_are_reused_and_damaged_ones_fetched_again(published, s3: S3, tmp_path: Path) -> None:
    root, url = published
    folder = fetch_shards(f"{url}/seq{SEQ_LEN}", tmp_path, s3.storage_options)
    first = sorted(folder.glob("*.arrow"))[0]
    stamp = first.stat().st_mtime_ns
    damaged = sorted(folder.glob("*.arrow"))[-1]
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0xFF
    damaged.write_bytes(bytes(data))
    assert fetch_shards(f"{url}/seq{SEQ_LEN}", tmp_path, s3.storage_options) == folder
    assert first.stat().st_mtime_ns == stamp  # intact: not downloaded again
    assert local_files(folder) == local_files(root / "shards" / f"seq{SEQ_LEN}")  # repaired
    assert not list(folder.glob("*.tmp"))


def test_a_damaged_remote_shard_is_refused_naming_it(published, s3: S3, tmp_path: Path) -> None:
    root, url = published
    bucket_url = url.replace("/run/", "/damaged/")
    source = root / "shards" / f"seq{SEQ_LEN}"
    publish_folder(
        source, f"{bucket_url}/seq{SEQ_LEN}", last="manifest.json", storage_options=s3.storage_options
    )
    victim = sorted(source.glob("*.arrow"))[1].name
    data = bytearray(source.joinpath(victim).read_bytes())
    data[-100] ^= 0x01
    s3.fs().pipe_file(f"{bucket_url.removeprefix('s3://')}/seq{SEQ_LEN}/{victim}", bytes(data))
    with pytest.raises(RemoteError, match=rf"^{bucket_url}/seq{SEQ_LEN}/{victim}: checksum differs"):
        PackedDataset(
            f"{bucket_url}/seq{SEQ_LEN}", tokenizer=None, cache=tmp_path, storage_options=s3.storage_options
        )
    cached = cache_folder(f"{bucket_url}/seq{SEQ_LEN}", tmp_path)
    assert not (cached / victim).exists() and not (cached / "manifest.json").exists()
    assert not [p for p in cached.iterdir() if p.name.endswith(".tmp")]


def test_missing_bucket_folder_and_manifest_are_one_line_errors(published, s3: S3, tmp_path: Path) -> None:
    root, url = published
    opts = s3.storage_options
    with pytest.raises(ShardError, match=r"^s3://no-such-bucket/x: no manifest.json"):
        PackedDataset("s3://no-such-bucket/x", tokenizer=None, cache=tmp_path, storage_options=opts)
    with pytest.raises(ShardError, match=rf"^{url}/seq999: no manifest.json"):
        load_manifest(f"{url}/seq999", opts)
    with pytest.raises(RemoteError, match=r"^s3://no-such-bucket/shards: no such bucket 'no-such-bucket'"):
        jobs.pack(make_config(root, output="s3://no-such-bucket/shards", storage_options=opts))
    with pytest.raises(ConfigError, match=r"is this run's own shards folder"):
        jobs.pack(make_config(root, output=str(root / "shards")))
    assert not list(tmp_path.iterdir())


def test_without_credentials_the_error_says_so(
    published, s3: S3, monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    _, url = published
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    opts = {k: v for k, v in s3.storage_options.items() if k not in ("key", "secret")} | {
        "skip_instance_cache": True
    }
    with pytest.raises(RemoteError, match=rf"^{url}/seq{SEQ_LEN}/manifest.json: no credentials found"):
        load_manifest(f"{url}/seq{SEQ_LEN}", opts)


def test_storage_options_are_never_recorded(published) -> None:
    root, _ = published
    for path in (root / "work").rglob("*.json"):
        assert "endpoint_url" not in path.read_text(), path
    manifest = json.loads((root / "shards" / f"seq{SEQ_LEN}" / "manifest.json").read_text())
    assert "output" not in manifest["config"]["pack"] and "storage_options" not in manifest["config"]["pack"]


def test_the_readme_object_storage_snippet_runs(published, s3: S3, tmp_path: Path, monkeypatch) -> None:
    """The README's dataloader snippet, pointed at this server's bucket, reads the published rows."""
    from tests.readme import code_blocks

    root, url = published
    (code,) = code_blocks("Object storage", "python")
    code = (
        code.replace("s3://my-bucket/run/shards/seq2048", f"{url}/seq{SEQ_LEN}")
        .replace("runs/demo/tokenizer.json", str(root / "tokenizer.json"))
        .replace("http://127.0.0.1:9000", s3.endpoint)
    )
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(code, "README.md", "exec"), namespace)
    assert len(namespace["ds"].shards) == load_manifest(root / "shards" / f"seq{SEQ_LEN}").rows
    assert (tmp_path / "runs" / "cache" / "s3").is_dir()


def _fetch_in_process(url: str, cache: str, storage_options: dict, out: str) -> None:
    """A rank fetching the folder (run in a spawned process)."""
    Path(out).write_text(str(fetch_shards(url, cache, storage_options)))


def test_ranks_fetching_into_one_cache_at_once_get_one_intact_copy(published, s3: S3, tmp_path: Path) -> None:
    """The ranks of a torchrun job all fetch ``train.shards`` into ``<output>/cache`` at the same
    time: the lock on the folder gives each an intact copy and leaves no temporary file."""
    import multiprocessing

    root, url = published
    ctx = multiprocessing.get_context("spawn")
    args = [
        (f"{url}/seq{SEQ_LEN}", str(tmp_path / "cache"), s3.storage_options, str(tmp_path / f"r{i}"))
        for i in range(2)
    ]
    procs = [ctx.Process(target=_fetch_in_process, args=a) for a in args]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    folders = {(tmp_path / f"r{i}").read_text() for i in range(2)}
    assert len(folders) == 1
    assert local_files(Path(folders.pop())) == local_files(root / "shards" / f"seq{SEQ_LEN}")


@pytest.fixture()
def endpoint_env(s3: S3, monkeypatch: pytest.MonkeyPatch) -> None:
    """What a user of the CLI sets: the endpoint in the environment (credentials already are)."""
    import s3fs

    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)
    s3fs.S3FileSystem.clear_instance_cache()  # no file system made before the variable was set
    yield
    s3fs.S3FileSystem.clear_instance_cache()


def test_inspect_reads_s3_shards_as_the_local_ones(published, endpoint_env, tmp_path: Path, capsys) -> None:
    """``longctx inspect URL --validate`` (a shards folder above seq<N> folders, and one shard file)
    prints what inspecting the local pack prints, the URL in place of the path, from a checked copy."""
    from longctx.cli import main

    root, url = published
    assert main(["inspect", str(root / "shards"), "--validate"]) == 0
    local = capsys.readouterr().out
    assert main(["inspect", url, "--validate", "--cache", str(tmp_path)]) == 0
    got = capsys.readouterr().out
    assert local.count("valid (every invariant holds)") == len(SEQ_LENS)
    assert got == local.replace(str(root / "shards"), url)
    for n in SEQ_LENS:
        assert local_files(cache_folder(f"{url}/seq{n}", tmp_path)) == local_files(
            root / "shards" / f"seq{n}"
        )

    shard = sorted((root / "shards" / f"seq{SEQ_LEN}").glob("*.arrow"))[1]
    assert main(["inspect", str(shard), "--validate", "--show", "1"]) == 0
    local = capsys.readouterr().out
    one = [
        "--validate",
        "--show",
        "1",
        "--tokenizer",
        str(root / "tokenizer.json"),
        "--cache",
        str(tmp_path / "one"),
    ]
    assert main(["inspect", f"{url}/seq{SEQ_LEN}/{shard.name}", *one]) == 0
    assert capsys.readouterr().out == local.replace(str(shard), f"{url}/seq{SEQ_LEN}/{shard.name}")
    copied = cache_folder(f"{url}/seq{SEQ_LEN}", tmp_path / "one")
    assert [p.name for p in copied.iterdir()] == [shard.name]  # only that shard, and no manifest


def test_inspect_refuses_missing_and_damaged_remote_shards_in_one_line(
    published,
    endpoint_env,
    s3: S3,
    tmp_path: Path,
    capsys,
) -> None:
    from longctx.cli import main

    root, url = published
    for missing in (f"{url}/seq999", "s3://no-such-bucket/shards", f"{url}/seq{SEQ_LEN}/99999_00000.arrow"):
        assert main(["inspect", missing, "--cache", str(tmp_path)]) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith(f"longctx inspect: {missing}"), err
    damaged_url = url.replace("/run/", "/inspect-damaged/")
    source = root / "shards" / f"seq{SEQ_LEN}"
    publish_folder(
        source, f"{damaged_url}/seq{SEQ_LEN}", last="manifest.json", storage_options=s3.storage_options
    )
    victim = sorted(source.glob("*.arrow"))[0].name
    data = bytearray(source.joinpath(victim).read_bytes())
    data[len(data) // 2] ^= 0x01
    s3.fs().pipe_file(f"{damaged_url.removeprefix('s3://')}/seq{SEQ_LEN}/{victim}", bytes(data))
    for target in (damaged_url, f"{damaged_url}/seq{SEQ_LEN}/{victim}"):
        assert main(["inspect", target, "--validate", "--cache", str(tmp_path)]) == 2
        err = capsys.readouterr().err.strip()
        assert err == (
            f"longctx inspect: {damaged_url}/seq{SEQ_LEN}/{victim}: checksum differs from the manifest's "
            "(the remote file was modified or damaged); re-publish it"
        )
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and p.name == victim]
