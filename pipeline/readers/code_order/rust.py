"""Rust: ``mod foo;`` (honouring ``#[path = "..."]``) resolves to ``foo.rs`` or ``foo/mod.rs`` next to a
``mod.rs``-like file and under ``<stem>/`` for other files (the 2018 rule); ``use crate::a::b`` depends on
the file of the deepest module of the path."""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

from longctx.pipeline.readers.code_order.paths import join_in_repo

RUST_SUFFIXES = (".rs",)

# Files that are crate roots or ``mod.rs``: their ``mod foo;`` children live next to them.
RUST_MOD_RS_NAMES = frozenset({"mod.rs", "lib.rs", "main.rs", "build.rs"})
# Every ``.rs`` file directly in these folders is its own crate root (Cargo's auto-discovery).
RUST_CRATE_ROOT_DIRS = frozenset({"bin", "tests", "examples", "benches"})

_RUST_MOD = re.compile(
    r"^[ \t]*((?:#\[[^\]]*\][ \t\n]*)*)(?:pub(?:\([^)]*\))?[ \t]+)?mod[ \t]+(?:r#)?(\w+)[ \t]*;", re.MULTILINE
)
_RUST_PATH_ATTR = re.compile(r'#\[\s*path\s*=\s*"([^"]+)"\s*\]')
_RUST_USE_CRATE = re.compile(r"\buse\s+crate::([^;]*);")
_RUST_USE_ALIAS = re.compile(r"\s+as\s+\w+")


@dataclass(frozen=True)
class RustMod:
    """A ``mod name;`` declaration; ``path`` is its ``#[path = "..."]`` attribute, if any."""

    name: str
    path: str | None = None


def rust_mods(source: str) -> list[RustMod]:
    """Out-of-line module declarations (``mod foo;``, not ``mod foo { ... }``) of a Rust file."""
    mods = []
    for attrs, name in _RUST_MOD.findall(source):
        path_attr = _RUST_PATH_ATTR.search(attrs)
        mods.append(RustMod(name, path_attr.group(1) if path_attr else None))
    return mods


def _expand_use_tree(tree: str) -> list[str]:
    """``a::{b, c::{d}}`` → ``["a::b", "a::c::d"]`` (whitespace already removed)."""
    open_at = tree.find("{")
    if open_at < 0:
        return [tree]
    prefix, inner, depth, start, parts = tree[:open_at], tree[open_at + 1 :], 0, 0, []
    for i, char in enumerate(inner):
        if char == "{":
            depth += 1
        elif char == "}":
            if depth == 0:
                parts.append(inner[start:i])
                break
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(inner[start:i])
            start = i + 1
    return [prefix + leaf for part in parts if part for leaf in _expand_use_tree(part)]


def rust_crate_uses(source: str) -> list[list[str]]:
    """Paths of ``use crate::...`` items as segments: ``use crate::a::{b, c}`` → ``[[a, b], [a, c]]``."""
    paths = []
    for tree in _RUST_USE_CRATE.findall(source):
        flat = re.sub(r"\s+", "", _RUST_USE_ALIAS.sub("", tree))
        for path in _expand_use_tree(flat):
            segments = [s for s in path.split("::") if s and s not in ("self", "*")]
            if segments:
                paths.append(segments)
    return paths


def _rust_is_mod_rs(path: str) -> bool:
    name = posixpath.basename(path)
    return name in RUST_MOD_RS_NAMES or posixpath.basename(posixpath.dirname(path)) in RUST_CRATE_ROOT_DIRS


def resolve_rust_mod(importer: str, mod: RustMod, files: frozenset[str]) -> str | None:
    """The file of ``mod`` declared in ``importer`` (2018 rule first, then the other layout)."""
    folder = posixpath.dirname(importer)
    if mod.path is not None:
        candidate = join_in_repo(folder, mod.path)
        return candidate if candidate in files else None
    nested = "/".join(filter(None, [folder, posixpath.splitext(posixpath.basename(importer))[0]]))
    bases = [folder] if _rust_is_mod_rs(importer) else [nested, folder]
    for base in bases:
        prefix = f"{base}/" if base else ""
        for candidate in (f"{prefix}{mod.name}.rs", f"{prefix}{mod.name}/mod.rs"):
            if candidate in files:
                return candidate
    return None


def _rust_crate_root_dir(importer: str, files: frozenset[str]) -> str | None:
    """The nearest folder at or above ``importer`` holding ``lib.rs`` or ``main.rs``."""
    folder = posixpath.dirname(importer)
    while True:
        prefix = f"{folder}/" if folder else ""
        if f"{prefix}lib.rs" in files or f"{prefix}main.rs" in files:
            return folder
        if not folder:
            return None
        folder = posixpath.dirname(folder)


def resolve_rust_use(importer: str, segments: list[str], files: frozenset[str]) -> str | None:
    """The file of the deepest module named by ``crate::segments`` (never the crate root itself)."""
    root = _rust_crate_root_dir(importer, files)
    if root is None:
        return None
    for n in range(len(segments), 0, -1):
        base = "/".join(filter(None, [root, *segments[:n]]))
        for candidate in (f"{base}.rs", f"{base}/mod.rs"):
            if candidate in files:
                return candidate
    return None
