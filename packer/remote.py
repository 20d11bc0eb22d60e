"""Shard folders on object storage: published by ``longctx pack`` (``pack.output``), read through a
local cache by the loader (``ShardSet``/``PackedDataset`` given a URL, ``train.shards``).

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
from longctx.packer.format import file_checksum
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


def publish_shards(
    folder: str | os.PathLike, url: str, storage_options: Mapping[str, Any] | None = None
) -> list[str]:
    """Upload the finished local shard folder ``folder`` (one ``seq<N>``) to ``url``, the manifest
    last; returns the files sent (none when the remote copy is already whole)."""
    return remote.publish_folder(folder, url, last=MANIFEST_NAME, storage_options=storage_options)
