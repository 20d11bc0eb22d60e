"""Folders on object storage (``s3://``, ``gs://``, ...) through fsspec: publish a finished local
folder, fetch a remote one into a local cache.

Jobs write locally and publish when done, and readers read from a local copy: shards are memory
mapped, which object storage cannot do, and a local write is atomic where a remote one is not.

- :func:`publish_folder` uploads every file of a local folder, the ``last`` file (a manifest) after
  all others, so a reader that waits for the manifest never sees part of a folder. A remote manifest
  that differs from the local one is deleted first, so the folder reads as unfinished while it is
  being replaced. Running it again resumes: files already uploaded whole are not sent again (S3's
  ETag of the object, a single-part MD5 or a multipart MD5 of part MD5s, computed locally with the
  part size the upload used).
- :func:`fetch_files` copies listed files into a local folder, each checked against its expected
  checksum before it is renamed into place; cached files whose checksum matches are reused. It holds
  a lock on the folder, so several processes (the ranks of one job) can fetch into it at once.
  :func:`fetch_folder` copies a whole folder published without a manifest (a curated documents
  folder), keeping cached files the remote objects' ETags show to be intact.

Credentials and endpoints come from ``storage_options`` (fsspec's keyword arguments, e.g.
``{"client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"}}``) or the environment the backend
reads (``AWS_ACCESS_KEY_ID``, ``AWS_ENDPOINT_URL``...). Failures are one-line
:class:`RemoteError` s naming the URL.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

from longctx.core.atomic import atomic_path, discard, write_bytes
from longctx.core.errors import LongctxError

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

CACHE_ENV = "LONGCTX_CACHE"
"""Environment variable naming the default cache folder (else ``$XDG_CACHE_HOME/longctx``, else
``~/.cache/longctx``)."""


class RemoteError(LongctxError, OSError):
    """A remote location cannot be read or written: no such bucket or key, no credentials, access
    denied, no fsspec backend for its scheme, or a fetched file that differs from its checksum."""


_CREDENTIAL_NAME = re.compile(r"(^key$|_key$|secret|token|password|credential)", re.IGNORECASE)


def credential_keys(options: Mapping[str, Any], prefix: str = "") -> list[str]:
    """The (dotted) keys of fsspec ``options`` that look like credentials (``key``, ``secret``,
    ``token``, ``*_key``, ``password``...), for refusing to write them where they would be kept."""
    found = []
    for name, value in options.items():
        dotted = f"{prefix}{name}"
        if isinstance(value, Mapping):
            found += credential_keys(value, f"{dotted}.")
        elif _CREDENTIAL_NAME.search(str(name)) and value:
            found.append(dotted)
    return found


def is_remote(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a URL of a non-local file system (``s3://b/k``; not ``file://`` or a path)."""
    text = os.fspath(path)
    scheme, sep, _ = text.partition("://")
    return bool(sep) and scheme not in ("", "file", "local")


def join(url: str, *parts: str) -> str:
    """``url`` with ``parts`` appended, separated by single slashes."""
    return "/".join([url.rstrip("/"), *(p.strip("/") for p in parts)])


def default_cache() -> Path:
    """The user's longctx cache folder (see :data:`CACHE_ENV`)."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "longctx"


def cache_folder(url: str, cache: str | os.PathLike) -> Path:
    """Where a copy of the remote folder ``url`` lives under ``cache``:
    ``<cache>/<scheme>/<bucket>/<key>``."""
    scheme, _, rest = url.partition("://")
    parts = [p for p in PurePosixPath(rest).parts if p not in ("", "/")]
    if not parts or any(p in (".", "..") for p in parts):
        raise RemoteError(f"{url}: not a folder URL (expected {scheme}://bucket/path)")
    return Path(cache) / scheme / Path(*parts)


@contextlib.contextmanager
def remote_errors(url: str, doing: str) -> Iterator[None]:
    """Turn the backend's errors (missing bucket or key, credentials, access, network) into a
    one-line :class:`RemoteError` naming ``url``."""
    try:
        yield
    except LongctxError:
        raise
    except FileNotFoundError:
        raise RemoteError(f"{url}: no such bucket or key ({doing})") from None
    except PermissionError as err:
        raise RemoteError(f"{url}: access denied while {doing}; check the credentials ({err})") from None
    except ImportError as err:
        raise RemoteError(f"{url}: no file system for this scheme is installed ({err})") from None
    except Exception as err:  # botocore/aiohttp errors share no base class with OSError
        kind = type(err).__name__
        if "Credential" in kind:
            raise RemoteError(
                f"{url}: no credentials found while {doing}; set storage_options or AWS_ACCESS_KEY_ID/"
                "AWS_SECRET_ACCESS_KEY"
            ) from None
        backend = type(err).__module__.split(".")[0] in ("botocore", "aiobotocore", "aiohttp")
        if isinstance(err, OSError) or backend:
            raise RemoteError(f"{url}: {doing} failed: {kind}: {err}".splitlines()[0]) from None
        raise


def filesystem(url: str, storage_options: Mapping[str, Any] | None = None) -> tuple[AbstractFileSystem, str]:
    """The fsspec file system of ``url`` and the path inside it (``url_to_fs``)."""
    from fsspec.core import url_to_fs

    with remote_errors(url, "opening its file system"):
        try:
            return url_to_fs(url, **dict(storage_options or {}))
        except (ValueError, TypeError) as err:  # an unknown scheme, an option the backend does not take
            raise RemoteError(f"{url}: {err}") from None


def check_destination(url: str, storage_options: Mapping[str, Any] | None = None) -> None:
    """Refuse, before any work, a destination ``url`` whose bucket (first path component) does not
    exist or cannot be reached with the credentials at hand."""
    if not is_remote(url):
        return
    fs, path = filesystem(url, storage_options)
    bucket = path.strip("/").split("/")[0]
    found = True
    with remote_errors(url, "checking the destination"):
        try:
            fs.info(bucket)  # not exists(), which answers False when access is denied
        except FileNotFoundError:
            found = False
    if not found:
        raise RemoteError(f"{url}: no such bucket {bucket!r}; create it first")


def read_bytes(url: str, storage_options: Mapping[str, Any] | None = None) -> bytes:
    """The bytes of the remote file ``url``."""
    fs, path = filesystem(url, storage_options)
    with remote_errors(url, "reading"):
        return fs.cat_file(path)


PART_SIZE = 50 * 2**20
"""Bytes per part of a multipart upload (s3fs's default); files of two parts or more are sent in parts."""
MAX_PARTS = 10_000
"""S3's limit on the parts of one upload: larger files get larger parts."""


def part_size(size: int, preferred: int = PART_SIZE) -> int:
    """The part size :func:`publish_folder` uploads a file of ``size`` bytes with: ``preferred``,
    or larger when that would take more than :data:`MAX_PARTS` parts."""
    return max(preferred, math.ceil(size / MAX_PARTS))


def _md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def multipart_etag(path: Path, part: int) -> str:
    """The ETag S3 gives ``path`` uploaded in parts of ``part`` bytes: the MD5 of the parts' MD5s,
    then ``-`` and the number of parts."""
    digests, size = [], path.stat().st_size
    with open(path, "rb") as f:
        for start in range(0, size, part):
            digest, left = hashlib.md5(usedforsecurity=False), min(part, size - start)
            while left and (chunk := f.read(min(left, 1 << 22))):  # 4 MiB reads, not a part in memory
                digest.update(chunk)
                left -= len(chunk)
            digests.append(digest.digest())
    return f"{hashlib.md5(b''.join(digests), usedforsecurity=False).hexdigest()}-{len(digests)}"


def _uploaded(local: Path, info: Mapping[str, Any] | None, preferred_part: int = PART_SIZE) -> bool:
    """Whether the remote object described by ``info`` is a whole copy of ``local``: same size and
    the ETag S3 computed from the bytes it received, a single upload's MD5 or, for a multipart
    upload, the MD5 of the part MD5s with the part size :func:`publish_folder` uses. Without such an
    ETag (other stores, other part sizes) the file is sent again."""
    size = local.stat().st_size
    if info is None or info.get("size") != size:
        return False
    etag = str(info.get("ETag") or info.get("etag") or "").strip('"')
    if "-" in etag:
        return etag == multipart_etag(local, part_size(size, preferred_part))
    return len(etag) == 32 and etag == _md5(local)


def _put_file(fs: AbstractFileSystem, local: Path, path: str, preferred_part: int) -> None:
    """Upload ``local`` to ``path``; on S3 in parts of :func:`part_size` bytes (what
    :func:`_uploaded` expects of a multipart ETag)."""
    protocols = fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,)
    if any(p in ("s3", "s3a") for p in protocols):
        fs.put_file(str(local), path, chunksize=part_size(local.stat().st_size, preferred_part))
    else:
        fs.put_file(str(local), path)


def publish_folder(
    local: str | os.PathLike,
    url: str,
    *,
    last: str | None = None,
    storage_options: Mapping[str, Any] | None = None,
    preferred_part: int = PART_SIZE,
    files: Iterable[str] | None = None,
) -> list[str]:
    """Upload every file under the local folder ``local`` (or only the relative paths ``files``) to
    ``url`` (same relative paths), the file named ``last`` after all others; returns the relative
    paths sent (files already there whole are skipped, so an interrupted publish resumes). Files of
    two parts of ``preferred_part`` bytes or more go to S3 as multipart uploads (see :func:`part_size`)."""
    local = Path(local)
    if files is None:
        files = sorted(p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file())
    else:
        files = sorted(set(files) | ({last} if last is not None and (local / last).is_file() else set()))
    if last is not None and last not in files:
        raise RemoteError(f"{local}: no {last} to publish (the folder is not finished)")
    fs, root = filesystem(url, storage_options)
    with remote_errors(url, "listing"):
        fs.invalidate_cache(root)
        remote = fs.find(root, detail=True) if fs.exists(root) else {}
    base = PurePosixPath(root.rstrip("/"))
    remote = {PurePosixPath(p).relative_to(base).as_posix(): i for p, i in remote.items()}
    sent = []
    with remote_errors(url, "uploading"):
        if last is not None and last in remote and not _uploaded(local / last, remote[last], preferred_part):
            fs.rm_file(f"{root.rstrip('/')}/{last}")  # the folder reads as unfinished while it changes
            remote.pop(last)
        for name in [f for f in files if f != last] + ([last] if last else []):
            if _uploaded(local / name, remote.get(name), preferred_part):
                continue
            if not is_remote(url):
                fs.makedirs(f"{root.rstrip('/')}/{PurePosixPath(name).parent}", exist_ok=True)
            _put_file(fs, local / name, f"{root.rstrip('/')}/{name}", preferred_part)
            sent.append(name)
    return sent


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """An exclusive lock on ``folder`` (created if needed) for the block."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def fetch_files(
    url: str,
    dest: str | os.PathLike,
    files: Mapping[str, str],
    digest: Callable[[Path], str],
    *,
    last: tuple[str, bytes] | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> Path:
    """Make ``dest`` hold a checked copy of each file ``name`` of the remote folder ``url`` whose
    checksum ``digest(path)`` must be ``files[name]``; returns ``dest``.

    A cached file with the right checksum is kept; any other is downloaded under a temporary name,
    checked, and renamed into place. A downloaded file whose checksum differs is refused with a
    :class:`RemoteError` naming its URL (and not kept). Other files under ``dest`` are left alone.
    ``last`` is ``(name, bytes)`` of a file (the manifest, already read) written after all others; a
    cached one with other bytes is removed first, so the copy reads as unfinished while it changes.
    """
    dest = Path(dest)
    fs, root = filesystem(url, storage_options)
    with _locked(dest):
        if last is not None and (dest / last[0]).is_file() and (dest / last[0]).read_bytes() != last[1]:
            (dest / last[0]).unlink()
        for name, expected in files.items():
            target = dest / name
            if target.is_file() and digest(target) == expected:
                continue
            source = join(url, name)
            with atomic_path(target) as tmp:
                with remote_errors(source, "downloading"):
                    fs.get_file(f"{root.rstrip('/')}/{name}", str(tmp))
                if digest(tmp) != expected:
                    discard(tmp)
                    raise RemoteError(
                        f"{source}: checksum differs from the manifest's (the remote file was modified or "
                        "damaged); re-publish it"
                    )
        if last is not None:
            write_bytes(dest / last[0], last[1])
    return dest


def fetch_folder(
    url: str, dest: str | os.PathLike, *, storage_options: Mapping[str, Any] | None = None
) -> Path | None:
    """Make ``dest`` hold a copy of every file under the remote folder ``url`` (its relative paths
    kept); returns ``dest``, or None when ``url`` holds no file. For a folder published without a
    manifest (a curated ``documents`` folder): a cached file is kept when the remote object is a
    whole copy of it (same size and S3 ETag, as :func:`publish_folder` checks), any other is
    downloaded under a temporary name and renamed into place. Holds the folder's lock, as
    :func:`fetch_files` does."""
    dest = Path(dest)
    fs, root = filesystem(url, storage_options)
    root = root.rstrip("/")
    with remote_errors(url, "listing"):
        found = fs.find(root, detail=True)
    files = {path[len(root) + 1 :]: info for path, info in found.items() if info.get("type") != "directory"}
    if not files:
        return None
    with _locked(dest):
        for name, info in sorted(files.items()):
            target = dest / name
            if target.is_file() and _uploaded(target, info):
                continue
            with atomic_path(target) as tmp, remote_errors(join(url, name), "downloading"):
                fs.get_file(f"{root}/{name}", str(tmp))
    return dest
