"""Shard folders on object storage: published by ``longctx pack`` (``pack.output``), read through a
local cache by the loader (``ShardSet``/``PackedDataset`` given a URL, ``train.shards``,
``eval.shards``) and by ``longctx inspect URL``.

A remote shard folder is the same files as a local one (``packer/FORMAT.md``); its ``manifest.json``
is uploaded after every shard, so a folder with a manifest is whole. Reading copies the folder into
a local cache (shards are memory-mapped, which object storage cannot do): every shard is checked
against the manifest's ``xxh3_128`` before it enters the cache, and cached shards whose checksum
still matches are not downloaded again.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from longctx.core import remote
from longctx.core.layout import SHARD_FOLDER_PREFIX
from longctx.packer.format import SHARD_SUFFIX, ShardError, file_checksum
from longctx.packer.manifest import MANIFEST_NAME, parse_manifest, read_manifest_bytes


def fetch_shards(
    url: str,
    cache: str | os.PathLike | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> Path:
    """A local, checked copy of the remote shard folder ``url`` under ``cache`` (default: the user's
    cache, :func:`longctx.core.remote.default_cache`); returns the local folder.

    Refuses (:class:`~longctx.packer.format.ShardError`) a folder without a manifest or with a
    malformed one, and (:class:`~longctx.core.remote.RemoteError`) a shard whose bytes differ from
    the manifest's checksum, naming its URL.
    """
    data, origin = read_manifest_bytes(url, storage_options)
    manifest = parse_manifest(data, origin)
    dest = remote.cache_folder(url, remote.default_cache() if cache is None else cache)
    files = {entry.file: entry.xxh3_128 for entry in manifest.shards}
    return remote.fetch_files(
        url, dest, files, file_checksum, last=(MANIFEST_NAME, data), storage_options=storage_options
    )


def fetch_shard(
    url: str,
    cache: str | os.PathLike | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> Path:
    """A local, checked copy of the one remote shard file ``url`` (``.../seq<N>/00000_00000.arrow``),
    checked against its folder's manifest like :func:`fetch_shards` but without downloading the
    folder's other shards; returns the local file. The copy's folder gets no manifest (it is not a
    whole shard folder). :class:`~longctx.packer.format.ShardError` when the folder has no manifest
    or the manifest does not list the file."""
    folder, _, name = url.rstrip("/").rpartition("/")
    data, origin = read_manifest_bytes(folder, storage_options)
    expected = {entry.file: entry.xxh3_128 for entry in parse_manifest(data, origin).shards}
    if name not in expected:
        raise ShardError(f"{url}: not a shard listed in {origin}")
    dest = remote.cache_folder(folder, remote.default_cache() if cache is None else cache)
    remote.fetch_files(folder, dest, {name: expected[name]}, file_checksum, storage_options=storage_options)
    return dest / name


def shard_folder_urls(url: str, storage_options: Mapping[str, Any] | None = None) -> list[str]:
    """The URLs of the finished ``seq<N>`` folders (those with a manifest) directly under the remote
    shards folder ``url``, by ascending ``N``; :class:`~longctx.core.remote.RemoteError` when ``url``
    does not exist."""
    fs, root = remote.filesystem(url, storage_options)
    with remote.remote_errors(url, "listing"):
        fs.invalidate_cache(root)
        names = [p.rstrip("/").rpartition("/")[2] for p in fs.ls(root, detail=False)]
        lengths = sorted(
            int(n[len(SHARD_FOLDER_PREFIX) :])
            for n in names
            if n.startswith(SHARD_FOLDER_PREFIX) and n[len(SHARD_FOLDER_PREFIX) :].isdigit()
        )
        return [
            folder
            for folder in (remote.join(url, f"{SHARD_FOLDER_PREFIX}{n}") for n in lengths)
            if fs.exists(f"{root.rstrip('/')}/{folder.rpartition('/')[2]}/{MANIFEST_NAME}")
        ]


def is_shard_file(url: str) -> bool:
    """Whether ``url`` names one shard file rather than a folder (by its ``.arrow`` suffix)."""
    return url.rstrip("/").endswith(SHARD_SUFFIX)


def publish_shards(
    folder: str | os.PathLike, url: str, storage_options: Mapping[str, Any] | None = None
) -> list[str]:
    """Upload the finished local shard folder ``folder`` (one ``seq<N>``) to ``url``, the manifest
    last; returns the files sent (none when the remote copy is already whole)."""
    return remote.publish_folder(folder, url, last=MANIFEST_NAME, storage_options=storage_options)
