"""Where ``longctx pack`` reads curated documents from: the run folder's own ``documents/``, or a
curation published elsewhere (``pack.input``, written by ``curate.output``; see
:mod:`longctx.pipeline.publish`).

A published curation given by URL is copied into ``<output>/cache/<scheme>/<bucket>/<path>/``
through :func:`longctx.core.remote.fetch_files`: every file is checked against the xxh3-128 that its
``curation.json`` lists before it enters the cache, intact cached files are not downloaded again, and
a remote file that differs is refused in one line naming its URL. A local ``pack.input`` folder is
read where it is. Either way its tokenizer files (``tokenizer.json``, ``tokenizer_config.json``,
``chat_template.jinja``) become the run's once the pack run is accepted, so that training, evaluation
and the export find the tokenizer the shards were packed with.

Refusals come before anything is written to the run folder: a run folder that holds documents of
its own, or a tokenizer other than the published one, is left as it is.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from longctx.core import remote
from longctx.core.atomic import atomic_path
from longctx.core.errors import ConfigError
from longctx.core.layout import RunLayout
from longctx.packer.config import PackConfig
from longctx.pipeline.documents import document_files
from longctx.pipeline.publish import CURATION_MANIFEST, CurationManifest, file_xxh3, parse_curation_manifest


def read_curation(
    location: str, storage_options: Mapping[str, Any] | None = None
) -> tuple[bytes, CurationManifest]:
    """The bytes and contents of the ``curation.json`` published at ``location`` (a URL or a folder);
    a one-line :class:`~longctx.core.remote.RemoteError` naming it when there is none."""
    if remote.is_remote(location):
        url = remote.join(location, CURATION_MANIFEST)
        fs, path = remote.filesystem(url, storage_options)
        with remote.remote_errors(url, "reading"):
            fs.invalidate_cache(path)
            found = fs.exists(path)
        data = remote.read_bytes(url, storage_options) if found else None
        origin = url
    else:
        local = Path(location.removeprefix("file://")) / CURATION_MANIFEST
        data = local.read_bytes() if local.is_file() else None
        origin = str(local)
    if data is None:
        raise remote.RemoteError(
            f"{origin}: not found; pack.input must be a finished curation published by curate.output (its "
            f"{CURATION_MANIFEST} is uploaded last)"
        )
    return data, parse_curation_manifest(data, origin)


def _refuse_conflicts(layout: RunLayout, manifest: CurationManifest, location: str) -> None:
    """Refuse a run folder whose own documents or tokenizer files would be mixed with the input's."""
    if layout.documents.is_dir() and document_files(layout.documents):
        raise ConfigError(
            f"pack.input: {layout.documents} holds curated documents of this run; pack them without "
            f"pack.input, or pack {location} into another output folder"
        )
    published = manifest.checksums()
    for path in layout.tokenizer_files:
        if path.is_file() and published.get(path.name) != file_xxh3(path):
            raise ConfigError(
                f"pack.input: {path} differs from the {path.name} published at {location}; pack into another "
                "output folder"
            )


def adopt_tokenizer(source: RunLayout, layout: RunLayout) -> None:
    """Make the tokenizer files of the curated run ``source`` the run's (atomic copies; nothing to do
    when ``source`` is the run itself or the files are already there, checked by
    :func:`curated_source`). Called once the pack run is accepted, so a refused run writes nothing."""
    for found, target in zip(source.tokenizer_files, layout.tokenizer_files, strict=True):
        if found != target and found.is_file() and not target.is_file():
            with atomic_path(target) as tmp:
                shutil.copyfile(found, tmp)


def source_layout(pack: PackConfig, layout: RunLayout) -> RunLayout:
    """Where the curated run that ``pack`` packs lies (or will, once pack has copied it): the run
    folder, the cached copy of a ``pack.input`` URL, or a local ``pack.input`` folder. Reads nothing."""
    if pack.input is None:
        return layout
    if remote.is_remote(pack.input):
        return RunLayout(remote.cache_folder(pack.input, layout.cache))
    return RunLayout(Path(pack.input.removeprefix("file://")))


def curated_source(pack: PackConfig, layout: RunLayout) -> RunLayout:
    """The curated run to pack: the run folder itself, or with ``pack.input`` a checked copy of that
    published curation (in ``<output>/cache``; a local folder as it is)."""
    if pack.input is None:
        return layout
    data, manifest = read_curation(pack.input, pack.storage_options)
    if layout.tokenizer.name not in manifest.checksums():
        raise ConfigError(f"pack.input: {pack.input} publishes no {layout.tokenizer.name}")
    _refuse_conflicts(layout, manifest, pack.input)
    source = source_layout(pack, layout)
    if remote.is_remote(pack.input):
        remote.fetch_files(
            pack.input,
            source.root,
            manifest.checksums(),
            file_xxh3,
            last=(CURATION_MANIFEST, data),
            storage_options=pack.storage_options,
        )
    return source
