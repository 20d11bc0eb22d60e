"""A finished curation on object storage (``curate.output``, ``longctx curate --publish URL``).

Curation works in its local run folder (its resume state, locks and intermediate files stay there)
and, once every stage has run, uploads what the next job needs to ``<url>/``, under the same paths
as in the run folder::

    documents/<source>/*.parquet   the curated documents
    tokenizer.json                 the run's tokenizer (and tokenizer_config.json, chat_template.jinja)
    ledger.parquet, stats.json, stats.png
    curation.json                  the list of those files with their size and xxh3-128, uploaded last

A folder with a ``curation.json`` is whole: ``longctx pack`` with ``pack.input: <url>`` copies the
listed files into its cache, each checked against its checksum (``longctx.packer.remote``).
Publishing again sends only what is not already there whole, so an interrupted publish resumes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import xxhash
from pydantic import BaseModel, Field, ValidationError

from longctx.core import remote
from longctx.core.atomic import write_json
from longctx.core.errors import ConfigError
from longctx.core.layout import RunLayout

CURATION_MANIFEST = RunLayout(Path()).curation_manifest.name
"""The name of the list of published files, in the run folder and at the published URL."""
FORMAT_VERSION = 1


class PublishedFile(BaseModel):
    """One file of a published curation: its path under the run folder, size and checksum."""

    file: str
    bytes: int
    xxh3_128: str


class CurationManifest(BaseModel):
    """``curation.json``: every published file of a finished curation."""

    format_version: int = FORMAT_VERSION
    files: list[PublishedFile] = Field(default_factory=list)

    def checksums(self) -> dict[str, str]:
        """Relative path -> xxh3-128 of every listed file."""
        return {f.file: f.xxh3_128 for f in self.files}


def file_xxh3(path: Path) -> str:
    """xxh3-128 (hex) of a file's bytes, read in pieces."""
    digest = xxhash.xxh3_128()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def curated_files(layout: RunLayout) -> list[Path]:
    """The files of a finished curation that are published: documents, tokenizer files, ledger and
    stats (not the input corpus, intermediate files, or what later jobs wrote)."""
    singles = [*layout.tokenizer_files, layout.ledger, layout.stats, layout.plot]
    documents = (
        sorted(p for p in layout.documents.rglob("*") if p.is_file()) if layout.documents.is_dir() else []
    )
    return [p for p in singles if p.is_file()] + documents


def write_curation_manifest(layout: RunLayout) -> CurationManifest:
    """List the run's curated files in ``<output>/curation.json`` (written atomically) and return it."""
    if not layout.stats.is_file():
        raise ConfigError(
            f"{layout.root}: no {layout.stats.name}; the curation has not finished, nothing to publish"
        )
    manifest = CurationManifest(
        files=[
            PublishedFile(
                file=p.relative_to(layout.root).as_posix(), bytes=p.stat().st_size, xxh3_128=file_xxh3(p)
            )
            for p in curated_files(layout)
        ]
    )
    write_json(layout.curation_manifest, manifest.model_dump(mode="json"), indent=1)
    return manifest


def publish_curation(
    layout: RunLayout, url: str, storage_options: Mapping[str, Any] | None = None
) -> list[str]:
    """Upload the finished curation of ``layout`` to ``url``, ``curation.json`` last; returns the
    relative paths sent (none when the remote copy is already whole)."""
    manifest = write_curation_manifest(layout)
    return remote.publish_folder(
        layout.root,
        url,
        last=CURATION_MANIFEST,
        storage_options=storage_options,
        files=[f.file for f in manifest.files],
    )


def parse_curation_manifest(data: bytes, origin: str | os.PathLike) -> CurationManifest:
    """A ``curation.json`` from its bytes; :class:`~longctx.core.remote.RemoteError` naming ``origin``
    when it is malformed or lists a path outside the folder."""
    try:
        manifest = CurationManifest.model_validate_json(data)
    except ValidationError as err:
        raise remote.RemoteError(
            f"{origin}: malformed {CURATION_MANIFEST}: {err.errors()[0]['msg']}"
        ) from None
    if manifest.format_version != FORMAT_VERSION:
        raise remote.RemoteError(
            f"{origin}: {CURATION_MANIFEST} format version {manifest.format_version}, this longctx reads "
            f"{FORMAT_VERSION}"
        )
    for entry in manifest.files:
        parts = entry.file.split("/")
        if entry.file.startswith("/") or any(p in ("", ".", "..") for p in parts):
            raise remote.RemoteError(
                f"{origin}: {CURATION_MANIFEST} lists {entry.file!r}, not a path inside the folder"
            )
    return manifest
