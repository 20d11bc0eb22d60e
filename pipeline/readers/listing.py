"""Listing and reading input folders through datatrove's data folders (fsspec): local paths and
URLs (``s3://``, ``gs://``, ``hf://``...) alike.

A source folder is listed once, recursively and without following symbolic links, into
:class:`Entry` records (path relative to the folder, kind, size). Readers turn the listing into
input *units* (a book file, a paper file or folder, a repository folder) and read the files of a
unit through a :class:`Tree`, which never follows a link out of the unit and never runs anything
it reads. Units are shared among tasks by size (:func:`assign_by_size`), so that tasks get about
the same number of bytes to read, not the same number of units.
"""

from __future__ import annotations

import heapq
import os
import posixpath
import re
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Literal

from datatrove.io import DataFolder, DataFolderLike, get_datafolder

EntryKind = Literal["file", "dir", "symlink", "other", "unreadable"]


@dataclass(frozen=True)
class Entry:
    """One entry of a listing: ``path`` relative to the listed folder (``/``-separated), its kind
    (``file``: a regular file; ``dir``; ``symlink``: a link to anything, never followed; ``other``:
    FIFOs, sockets, devices; ``unreadable``: a folder that could not be listed), its size, and what
    the file system said of its modification time and content (a run's record of its inputs)."""

    path: str
    kind: EntryKind
    size: int = 0
    mtime: str = ""  # the modification time the listing gave, as text ("" when it gave none)
    etag: str = ""  # a content tag the store gave (S3's ETag, GCS's md5Hash), "" when none

    @property
    def name(self) -> str:
        return posixpath.basename(self.path)


def is_url(location: str | os.PathLike) -> bool:
    """Whether ``location`` names a remote or fsspec location (``s3://...``) rather than a local path."""
    return "://" in str(location) and not str(location).startswith("file://")


def open_folder(location: str | os.PathLike, storage_options: dict | None = None) -> DataFolder:
    """The datatrove data folder at ``location`` (a local path or an fsspec URL)."""
    location = str(location)
    return get_datafolder((location, dict(storage_options)) if storage_options else location)


def _kind(info: dict) -> EntryKind:
    if info.get("islink"):
        return "symlink"
    return {"file": "file", "directory": "dir"}.get(info.get("type", ""), "other")


def _mtime(info: dict) -> str:
    """The modification time in a file system's ``info`` (local ``mtime``, S3 ``LastModified``, GCS
    ``updated``...), as text."""
    for key in ("mtime", "LastModified", "last_modified", "updated", "modified"):
        if info.get(key) is not None:
            value = info[key]
            return value.isoformat() if hasattr(value, "isoformat") else repr(value)
    return ""


def _etag(info: dict) -> str:
    for key in ("ETag", "etag", "md5Hash", "content_md5"):
        if info.get(key):
            return str(info[key]).strip('"')
    return ""


def list_tree(folder: DataFolder, sub: str = "") -> list[Entry]:
    """Every entry under ``sub`` of ``folder`` (recursively, sorted by path, ``sub`` excluded).

    Symbolic links are listed as ``symlink`` entries and never entered. A folder that cannot be
    listed appears once as an ``unreadable`` entry, so nothing under it is lost without a trace.
    """
    found: dict[str, Entry] = {}
    root = folder._join(sub) if sub else folder.path

    def unreadable(err: OSError) -> None:
        where = str(err.filename or root)
        rel = posixpath.relpath(where, folder.path) if where.startswith(folder.path) else where
        found[rel] = Entry(rel, "unreadable")

    for dirpath, dirs, files in folder.walk(sub, detail=True, on_error=unreadable):
        for name, info in list(dirs.items()) + list(files.items()):
            rel = posixpath.join(dirpath, name) if dirpath else name
            if found.get(rel, Entry(rel, "file")).kind != "unreadable":
                found[rel] = Entry(rel, _kind(info), int(info.get("size") or 0), _mtime(info), _etag(info))
    prefix = f"{sub.rstrip('/')}/" if sub else ""
    return sorted(
        (e for e in found.values() if e.path.startswith(prefix) and e.path != "."), key=lambda e: e.path
    )


_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")


def display_path(rel: str) -> str:
    """``rel`` made safe to store: undecodable bytes and control characters escaped as ``\\xNN``."""
    text = rel.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return _CONTROL_CHARS.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def is_bad_name(name: str) -> bool:
    """Whether a file name holds control characters or undecodable bytes (it would break a header
    line or the Parquet metadata; such files are recorded, under :func:`display_path`, not read)."""
    return display_path(name) != name


def is_hidden(name: str) -> bool:
    return name.startswith(".")


def count_files(entries: Iterable[Entry]) -> int:
    """Entries that are input files: everything but folders (links and special files count)."""
    return sum(1 for e in entries if e.kind != "dir")


class Tree:
    """The entries under one folder of a data folder (a repository, a paper), read safely.

    Entries and paths are relative to the tree's folder. Only regular files are read; a symbolic link is
    never opened (on a local folder the file is opened with ``O_NOFOLLOW`` and checked to be a
    regular file, so a file swapped for a link after listing is refused too).
    """

    def __init__(self, folder: DataFolder, base: str, entries: Iterable[Entry]) -> None:
        self.folder = folder
        self.base = base.strip("/")
        cut = len(self.base) + 1 if self.base else 0
        self.entries = {e.path[cut:]: Entry(e.path[cut:], e.kind, e.size) for e in entries if e.path[cut:]}

    @classmethod
    def of(cls, location: DataFolderLike, sub: str = "") -> Tree:
        """The tree of ``sub`` under ``location`` (a path, URL or data folder), listed now."""
        folder = get_datafolder(location)
        return cls(folder, sub, list_tree(folder, sub))

    def full(self, rel: str) -> str:
        """``rel`` relative to the data folder."""
        return posixpath.join(self.base, rel) if self.base else rel

    def url(self, rel: str = "") -> str:
        """Where ``rel`` is: an absolute local path or a URL."""
        return self.folder.resolve_paths(self.full(rel) if rel else (self.base or ""))

    def files(self) -> list[Entry]:
        """The entries that are input files (not folders), sorted by path."""
        return [e for e in self.entries.values() if e.kind != "dir"]

    def kind(self, rel: str) -> EntryKind | None:
        entry = self.entries.get(rel)
        return entry.kind if entry else None

    def walk(self) -> Iterator[tuple[str, list[Entry], list[Entry]]]:
        """Like ``os.walk`` (top-down, sorted; prune by editing the folder list): each folder's
        relative path (``""`` for the top) with its sub-folders and its other entries."""
        children: dict[str, tuple[list[Entry], list[Entry]]] = {"": ([], [])}
        for rel, entry in sorted(self.entries.items()):
            parent = posixpath.dirname(rel)
            children.setdefault(parent, ([], []))
            if entry.kind == "dir":
                children.setdefault(rel, ([], []))
                children[parent][0].append(entry)
            else:
                children[parent][1].append(entry)
        stack = [""]
        while stack:
            current = stack.pop()
            dirs, files = children.get(current, ([], []))
            dirs = list(dirs)
            yield current, dirs, files
            stack.extend(reversed([d.path for d in dirs]))

    def under(self, rel_dir: str) -> list[Entry]:
        """Every entry below ``rel_dir``."""
        prefix = rel_dir.rstrip("/") + "/"
        return [e for e in self.entries.values() if e.path.startswith(prefix)]

    def read_bytes(self, rel: str, max_bytes: int | None = None) -> bytes:
        """The bytes of regular file ``rel`` (at most ``max_bytes + 1`` of them, so the caller can
        tell a file that grew past its limit). Raises ``OSError`` for anything but a regular file."""
        entry = self.entries.get(rel)
        if entry is None or entry.kind != "file":
            raise OSError(f"not a regular file: {self.url(rel)}")
        limit = -1 if max_bytes is None else max_bytes + 1
        if self.folder.is_local():
            return _read_local_no_follow(self.url(rel), limit)
        with self.folder.open(self.full(rel), "rb") as f:
            return f.read(limit)

    @property
    def top(self) -> str:
        """The tree's folder as a normalized path of its file system (no protocol)."""
        return posixpath.normpath(posixpath.join(self.folder.path, self.base))

    def normalize(self, rel: str) -> str | None:
        """``rel`` with ``.`` and ``..`` resolved, or None when it leaves the tree."""
        full = posixpath.normpath(posixpath.join(self.top, rel))
        if not full.startswith(self.top.rstrip("/") + "/"):
            return None
        return full[len(self.top.rstrip("/")) + 1 :]

    def follow_local(self, rel: str) -> tuple[str | None, bool]:
        """Where a path through symbolic links of a local tree ends: ``(path, False)`` for a regular
        file inside the tree, ``(None, True)`` when it leads outside the tree, ``(None, False)`` when
        it leads nowhere. Remote trees have no links: always ``(None, False)``."""
        if not self.folder.is_local():
            return None, False
        path = os.path.join(self.top, rel)
        if not os.path.lexists(path):
            return None, False
        top = os.path.realpath(self.top)
        real = os.path.realpath(path)
        if os.path.commonpath([top, real]) != top:
            return None, True
        target = os.path.relpath(real, top).replace(os.sep, "/")
        return (target, False) if self.kind(target) == "file" else (None, False)


def _read_local_no_follow(path: str, limit: int) -> bytes:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"not a regular file: {path}")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(limit)
    finally:
        os.close(fd)


def assign_by_size(sizes: list[int], world_size: int) -> list[int]:
    """The task of each unit, so that every task gets about the same number of bytes.

    Greedy longest-processing-time: units from the largest down each go to the task with the fewest
    bytes so far (ties: the lowest task), which keeps the largest task within 4/3 of the best
    possible split. Deterministic for the same sizes, so every task computes the same assignment.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be at least 1, got {world_size}")
    heap = [(0, rank) for rank in range(world_size)]
    owner = [0] * len(sizes)
    for index in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        load, rank = heapq.heappop(heap)
        owner[index] = rank
        heapq.heappush(heap, (load + max(0, sizes[index]), rank))
    return owner
