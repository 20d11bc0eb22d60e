"""Path helpers shared by the language scanners: POSIX paths relative to the repository root."""

from __future__ import annotations

import posixpath
from collections import defaultdict
from collections.abc import Iterable, Mapping


def has_suffix(path: str, suffixes: tuple[str, ...]) -> bool:
    """Whether ``path`` ends with one of ``suffixes``, ignoring case."""
    return path.lower().endswith(suffixes)


def join_in_repo(folder: str, relative: str) -> str | None:
    """``folder/relative`` normalized; ``None`` when it leaves the repository root."""
    joined = posixpath.normpath(posixpath.join(folder, relative)) if folder else posixpath.normpath(relative)
    if joined == ".":
        return ""
    if joined.startswith(("../", "/")) or joined == "..":
        return None
    return joined


def suffix_index(files: Iterable[str]) -> dict[str, list[str]]:
    """Files by base name, each list sorted, for unique path-suffix lookups."""
    index: dict[str, list[str]] = defaultdict(list)
    for path in sorted(files):
        index[posixpath.basename(path)].append(path)
    return index


def unique_suffix_match(suffix: str, index: Mapping[str, list[str]]) -> str | None:
    """The only file whose path ends with ``/suffix`` (or is ``suffix``), else ``None``."""
    matches = [
        p for p in index.get(posixpath.basename(suffix), ()) if p == suffix or p.endswith("/" + suffix)
    ]
    return matches[0] if len(matches) == 1 else None
