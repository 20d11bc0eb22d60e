"""Against a real S3-compatible server (moto's, on loopback): wrong credentials are access denied
(moto's own authentication, enforced), and publishing resumes over files large enough for
multipart uploads. The reference is the server's own ETag of what it received: resuming
must skip exactly the objects whose bytes are the local file's, whatever the upload's part count.
The part size is lowered to S3's smallest (5 MiB) so that an 11 MiB file takes three parts."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from longctx.core import remote
from longctx.core.remote import RemoteError, multipart_etag, publish_folder
from tests.s3server import S3, AuthS3, s3, s3_auth  # noqa: F401  (the fixtures)

PART = 5 * 2**20  # S3's smallest part (all but the last)


def test_resume_recognises_intact_multipart_uploads(s3: S3, tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    big = source / "big.bin"
    big.write_bytes(os.urandom(11 * 2**20))
    (source / "small.bin").write_bytes(b"small")
    (source / "manifest.json").write_bytes(b"{}")
    bucket = s3.bucket()
    url = f"s3://{bucket}/run"
    opts = s3.storage_options

    def publish() -> list[str]:
        return publish_folder(source, url, last="manifest.json", storage_options=opts, preferred_part=PART)

    assert publish() == ["big.bin", "small.bin", "manifest.json"]
    fs = s3.fs()
    etag = fs.info(f"{bucket}/run/big.bin")["ETag"].strip('"')
    assert etag.endswith("-3") and etag == multipart_etag(big, PART)  # the server's ETag of three parts
    assert etag.split("-")[0] != hashlib.md5(big.read_bytes()).hexdigest()  # not the file's MD5
    assert publish() == []  # resumed: the intact multipart copy is recognised, nothing is sent

    # a remote copy of the same size with other bytes (sent in the same parts) is sent again
    damaged = tmp_path / "damaged.bin"
    data = bytearray(big.read_bytes())
    data[7 * 2**20] ^= 0xFF
    damaged.write_bytes(bytes(data))
    fs.put_file(str(damaged), f"{bucket}/run/big.bin", chunksize=PART)
    assert fs.info(f"{bucket}/run/big.bin")["size"] == big.stat().st_size
    assert publish() == ["big.bin"]
    assert fs.cat_file(f"{bucket}/run/big.bin") == big.read_bytes()

    # an upload in other parts cannot be recognised from its ETag: sent again (bandwidth, not data)
    fs.put_file(str(big), f"{bucket}/run/big.bin", chunksize=11 * 2**19)  # 5.5 MiB: two parts
    assert fs.info(f"{bucket}/run/big.bin")["ETag"].strip('"').endswith("-2")
    assert publish() == ["big.bin"]
    assert publish() == []


def test_wrong_credentials_are_access_denied_not_a_missing_bucket(s3_auth: AuthS3) -> None:
    """With authentication enforced, an existing bucket reached with a wrong key or secret is access
    denied, naming the URL (it was "no such bucket 'credbkt'; create it first"); the right
    credentials pass, and a bucket that really is missing is still said to be missing."""
    url = f"s3://{s3_auth.bucket}/run"
    remote.check_destination(url, s3_auth.storage_options())
    for wrong in ({"key": "AKIAWRONGKEY000000000"}, {"secret": "not-the-secret"}):
        with pytest.raises(RemoteError) as err:
            remote.check_destination(url, s3_auth.storage_options(**wrong))
        message = str(err.value)
        assert message.startswith(
            f"{url}: access denied while checking the destination; check the credentials"
        )
        assert "\n" not in message and "no such bucket" not in message
    missing = "s3://no-such-bucket-here/run"
    with pytest.raises(RemoteError, match=r"no such bucket 'no-such-bucket-here'; create it first"):
        remote.check_destination(missing, s3_auth.storage_options())


def test_fetch_folder_copies_every_file_and_refetches_only_changed_ones(s3: S3, tmp_path: Path) -> None:
    """A folder without a manifest (a curated documents folder): every file under the URL comes down
    with its relative path; fetched again, an intact cached copy is kept (its modification time
    unchanged) and a remote file replaced by other bytes of the same size is downloaded again."""
    source = tmp_path / "documents"
    (source / "books").mkdir(parents=True)
    (source / "code").mkdir()
    (source / "books" / "a.parquet").write_bytes(b"book bytes")
    (source / "code" / "b.parquet").write_bytes(b"code bytes")
    url = f"s3://{s3.bucket()}/curation/documents"
    publish_folder(source, url, storage_options=s3.storage_options)
    dest = tmp_path / "cache"
    assert remote.fetch_folder(url, dest, storage_options=s3.storage_options) == dest
    copied = sorted(str(p.relative_to(dest)) for p in dest.rglob("*") if p.is_file())
    assert copied == ["books/a.parquet", "code/b.parquet"]
    kept = (dest / "books" / "a.parquet").stat().st_mtime_ns
    s3.fs().pipe_file(f"{url.removeprefix('s3://')}/code/b.parquet", b"CODE BYTES")  # same size
    remote.fetch_folder(url, dest, storage_options=s3.storage_options)
    assert (dest / "books" / "a.parquet").stat().st_mtime_ns == kept
    assert (dest / "code" / "b.parquet").read_bytes() == b"CODE BYTES"
    assert (
        remote.fetch_folder(
            f"s3://{s3.bucket()}/nothing", tmp_path / "none", storage_options=s3.storage_options
        )
        is None
    )
