"""longctx.core.remote without a server: URL handling, the cache layout, publishing to a local
fsspec destination (manifest last) and fetching with checksums. The S3 paths are tested against a
real server in tests/packer/test_remote_shards.py and tests/trainer/test_train_s3.py."""

from __future__ import annotations

import hashlib
from pathlib import Path

import fsspec.implementations.local as local_fs
import pytest

from longctx.core.remote import RemoteError, cache_folder, fetch_files, is_remote, join, publish_folder


def test_urls_and_cache_folders(tmp_path: Path) -> None:
    assert is_remote("s3://b/k") and is_remote("gs://b") and is_remote("hf://datasets/x")
    assert not is_remote("/data/x") and not is_remote("file:///data/x") and not is_remote(tmp_path)
    assert join("s3://b/run/", "/shards", "seq8") == "s3://b/run/shards/seq8"
    assert (
        cache_folder("s3://b/run/shards/seq8", tmp_path) == tmp_path / "s3" / "b" / "run" / "shards" / "seq8"
    )
    for bad in ("s3://", "s3://b/../../etc"):
        with pytest.raises(RemoteError, match="not a folder URL"):
            cache_folder(bad, tmp_path)


def make_folder(root: Path) -> Path:
    (root / "sub").mkdir(parents=True)
    for name, data in {"a.bin": b"a" * 10, "sub/b.bin": b"b" * 20, "manifest.json": b"{}"}.items():
        (root / name).write_bytes(data)
    return root


def test_publish_sends_every_file_and_the_manifest_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = make_folder(tmp_path / "src")
    order: list[str] = []
    put = local_fs.LocalFileSystem.put_file

    def spy(self, lpath, rpath, **kwargs):
        order.append(Path(lpath).relative_to(source).as_posix())
        return put(self, lpath, rpath, **kwargs)

    monkeypatch.setattr(local_fs.LocalFileSystem, "put_file", spy)
    sent = publish_folder(source, f"file://{tmp_path / 'dest'}", last="manifest.json")
    assert order == sent == ["a.bin", "sub/b.bin", "manifest.json"]
    assert {p.relative_to(tmp_path / "dest") for p in (tmp_path / "dest").rglob("*") if p.is_file()} == {
        Path("a.bin"),
        Path("sub/b.bin"),
        Path("manifest.json"),
    }
    with pytest.raises(RemoteError, match=r"no missing\.json to publish"):
        publish_folder(source, f"file://{tmp_path / 'dest2'}", last="missing.json")


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def test_fetch_checks_every_file_and_keeps_nothing_damaged(tmp_path: Path) -> None:
    source = make_folder(tmp_path / "src")
    url = f"file://{source}"
    files = {"a.bin": md5(source / "a.bin"), "sub/b.bin": md5(source / "sub/b.bin")}
    dest = fetch_files(url, tmp_path / "cache", files, md5, last=("manifest.json", b"{}"))
    assert (dest / "sub/b.bin").read_bytes() == b"b" * 20 and (dest / "manifest.json").read_bytes() == b"{}"
    (source / "a.bin").write_bytes(b"x" * 10)  # the remote copy changes; the cached one still matches
    assert (fetch_files(url, dest, files, md5) / "a.bin").read_bytes() == b"a" * 10
    (dest / "a.bin").unlink()
    with pytest.raises(RemoteError, match=rf"^{url}/a.bin: checksum differs"):
        fetch_files(url, dest, files, md5, last=("manifest.json", b"{new}"))
    assert sorted(p.name for p in dest.iterdir()) == ["sub"]  # no damaged file, no stale manifest, no temp


def test_missing_remote_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(RemoteError, match=rf"^file://{tmp_path}/nothing/a.bin: no such bucket or key"):
        fetch_files(f"file://{tmp_path}/nothing", tmp_path / "cache", {"a.bin": "0"}, md5)


def test_an_unknown_scheme_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(RemoteError, match=r"^nosuch://b/x: .*nosuch"):
        fetch_files("nosuch://b/x", tmp_path, {}, md5)
