"""C family (C, C++, CUDA, Objective-C): ``#include "x.h"`` (and Objective-C ``#import``) relative to
the including file, then to the repository root and every folder named ``include`` or ``src``, then a
unique path-suffix match; ``#include <x.h>`` only against the ``include`` folders."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable, Mapping

from longctx.pipeline.readers.code_order.paths import join_in_repo, unique_suffix_match

C_SUFFIXES = (
    ".c",
    ".h",
    ".cc",
    ".cpp",
    ".cxx",
    ".hpp",
    ".hh",
    ".hxx",
    ".ipp",
    ".inl",
    ".cu",
    ".cuh",
    ".m",
    ".mm",
)

_C_INCLUDE = re.compile(r'^[ \t]*#[ \t]*(?:include|import)[ \t]*(?:"([^"\n]+)"|<([^>\n]+)>)', re.MULTILINE)


def c_includes(source: str) -> list[tuple[str, bool]]:
    """``(header, quoted)`` for every ``#include``/``#import`` line; ``quoted`` is False for ``<...>``."""
    return [(quoted, True) if quoted else (angled, False) for quoted, angled in _C_INCLUDE.findall(source)]


def c_include_dirs(files: Iterable[str]) -> list[str]:
    """Every folder named ``include`` or ``src`` that holds (directly or below) one of ``files``, sorted."""
    dirs: set[str] = set()
    for path in files:
        folder = posixpath.dirname(path)
        while folder:
            if posixpath.basename(folder) in ("include", "src"):
                dirs.add(folder)
            folder = posixpath.dirname(folder)
    return sorted(dirs)


def resolve_c_include(
    importer: str,
    header: str,
    quoted: bool,
    files: frozenset[str],
    include_dirs: list[str],
    suffix_index: Mapping[str, list[str]],
) -> str | None:
    """The in-repository file an include names, searched like a compiler with ``-I`` on ``include_dirs``."""
    if quoted:
        roots = [posixpath.dirname(importer), "", *include_dirs]
    else:
        roots = [d for d in include_dirs if posixpath.basename(d) == "include"]
    for root in roots:
        candidate = join_in_repo(root, header)
        if candidate and candidate in files:
            return candidate
    if quoted and not header.startswith("../"):
        return unique_suffix_match(posixpath.normpath(header), suffix_index)
    return None
