"""Which copy to keep among duplicates: the keep policy, shared by document- and file-level dedup.

A policy is an ordered list of rules; copies are ranked by the first rule, ties by the next, and
the remaining ties by id, so the choice is deterministic and documented:

* ``longest``: the most complete copy, the one with the most characters after cleaning;
* ``not_vendored``: the copy whose path has fewer vendored or forked folders (``vendor/``,
  ``_vendor/``, ``third_party/``, ``node_modules/``, ``forks/``, ``mirror/``, a folder named
  ``*-fork``...), i.e. the original rather than a copy kept inside another project;
* ``shallowest`` (files only): the file fewer folders deep inside its repository, where a project
  keeps its own code (``requests/api.py`` rather than ``src/pip/_vendor/requests/api.py``);
* ``upstream`` (files only): the copy in the repository that declares the file's package
  (``pyproject.toml``, ``setup.cfg`` or a literal ``name=`` in ``setup.py``, read, never run;
  ``go.mod``, ``Cargo.toml``), then one held at its repository's import root, and last a copy whose
  imports were rewritten under a vendor prefix (``pip._vendor.urllib3``): a vendored copy even where
  its path does not say so (:mod:`longctx.pipeline.provenance`).

Documents default to ``longest, not_vendored`` (``curate.dedup.keep``); code files default to
``upstream, not_vendored, longest, shallowest`` (``curate.dedup.files.keep``): for files, where a
copy comes from and where it lives say more than a few lines more or less (a vendored copy is often
the longer and shallower one, its imports rewritten, its package at the top of its folder).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from longctx.pipeline.readers.code import DEPENDENCY_DIRS, VENDORED_DIRS

FORK_DIRS = frozenset({"fork", "forks", "forked", "mirror", "mirrors"})
_FORK_NAME = re.compile(r"[-_.](?:fork|forked)$", re.IGNORECASE)
_SEPARATORS = re.compile(r"[/\\]")


def vendored_depth(path: str) -> int:
    """How many folders of ``path`` name a vendored or forked copy (see the module docstring).

    Comparing two copies' counts is what matters: folders both paths share count for both."""
    parts = _SEPARATORS.split(path)
    return sum(
        1
        for part in parts[:-1]
        if part in VENDORED_DIRS
        or part in DEPENDENCY_DIRS
        or part.lower() in FORK_DIRS
        or _FORK_NAME.search(part)
    ) + (1 if parts and _FORK_NAME.search(parts[-1].rsplit(".", 1)[0]) else 0)


def document_rank(rules: Sequence[str], *, doc_id: str, path: str, chars: int) -> tuple:
    """Sort key of a document among its duplicates: the smallest is kept."""
    key: list = []
    for rule in rules:
        if rule == "longest":
            key.append(-chars)
        elif rule == "not_vendored":
            key.append(vendored_depth(path))
        else:
            raise ValueError(f"unknown document keep rule {rule!r}")
    return (*key, doc_id)


def file_rank(
    rules: Sequence[str], *, repo: str, rel: str, location: str, chars: int, provenance: int = 2
) -> tuple:
    """Sort key of a code file among its copies: the smallest is kept. ``location`` is the file's
    full path or URL (vendored folders above the repository count too), ``rel`` its path inside
    the repository, ``provenance`` its level (:func:`longctx.pipeline.provenance.provenance`: 0 for
    the declared upstream, 3 for a copy with rewritten imports)."""
    key: list = []
    for rule in rules:
        if rule == "upstream":
            key.append(provenance)
        elif rule == "longest":
            key.append(-chars)
        elif rule == "not_vendored":
            key.append(vendored_depth(location))
        elif rule == "shallowest":
            key.append(rel.count("/"))
        else:
            raise ValueError(f"unknown file keep rule {rule!r}")
    return (*key, repo, rel)
