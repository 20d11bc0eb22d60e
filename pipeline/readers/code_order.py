"""Dependency order for the files of one code repository.

A repository becomes one long document; a model reads it front to back, so every file should come
after the in-repository files it depends on (a module after the modules it imports, a ``.c`` file
after its headers). This module holds the pure part of that: finding the in-repository imports of a
file from its text, and ordering the files.

Nothing here touches the filesystem or runs repository code. Python is parsed with :mod:`ast` only;
the other languages are scanned with regular expressions. Paths are POSIX paths relative to the
repository root (``"pkg/mod.py"``), and an import counts only when it resolves to one of the files
that are part of the document, so imports of the standard library, of third-party packages or of
skipped files add no edge.

Supported languages and what makes an edge:

* Python (``.py``, ``.pyi``): ``import a.b`` and ``from a.b import c`` resolved against the repository
  root, ``src/``, the repository folder itself when it is a package named like the repository (a copy of
  the stdlib ``json`` package importing ``from json import scanner``), the importing file's own folder
  (scripts run from their folder), and finally a unique path-suffix match of at least two components
  (``python/pkg/x.py`` for ``pkg.x``). Relative imports resolve against the importing file's package.
  Only imports that run when the module loads count: not those inside functions or under
  ``if TYPE_CHECKING:``, which exist to avoid import cycles.
* C family: ``#include "x.h"`` (and Objective-C ``#import``) relative to the including file, then to the
  repository root and every folder named ``include`` or ``src``, then a unique path-suffix match;
  ``#include <x.h>`` only against the ``include`` folders.
* JavaScript / TypeScript: relative specifiers (``./x``, ``../x``) of ``import``/``export ... from``,
  side-effect ``import``, ``require()`` and dynamic ``import()``, with the usual extensions and
  ``index`` files; a ``.js`` specifier also finds the ``.ts`` source of ESM TypeScript projects.
* Go: imports under the module path of a ``go.mod`` in the repository depend on every non-test
  ``.go`` file of the imported package folder.
* Rust: ``mod foo;`` (honouring ``#[path = "..."]``) resolves to ``foo.rs`` or ``foo/mod.rs`` next to a
  ``mod.rs``-like file and under ``<stem>/`` for other files (the 2018 rule); ``use crate::a::b`` depends
  on the file of the deepest module of the path.

What is *not* an edge: a Python import of ``pkg.mod`` does not make ``pkg/__init__.py`` a dependency,
although Python runs it first. Package ``__init__`` files usually re-export their submodules, so they
are better read after them, and the extra edges would put most packages in a cycle.
"""

from __future__ import annotations

import ast
import gc
import heapq
import posixpath
import re
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

PYTHON_SUFFIXES = (".py", ".pyi")
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
JS_SUFFIXES = (".js", ".mjs", ".cjs", ".jsx", ".ts", ".tsx", ".mts", ".cts")
GO_SUFFIXES = (".go",)
RUST_SUFFIXES = (".rs",)

# Extensions tried, in this order, for an extensionless JS/TS specifier and for its ``index`` file.
JS_RESOLVE_SUFFIXES = (".js", ".ts", ".tsx", ".jsx", ".mjs", ".cjs", ".mts", ".cts")
# ESM TypeScript imports name the compiled file (``./x.js``) while the repository holds ``x.ts``.
JS_COMPILED_TO_SOURCE = {".js": (".ts", ".tsx"), ".mjs": (".mts",), ".cjs": (".cts",), ".jsx": (".tsx",)}

# Files that are crate roots or ``mod.rs``: their ``mod foo;`` children live next to them.
RUST_MOD_RS_NAMES = frozenset({"mod.rs", "lib.rs", "main.rs", "build.rs"})
# Every ``.rs`` file directly in these folders is its own crate root (Cargo's auto-discovery).
RUST_CRATE_ROOT_DIRS = frozenset({"bin", "tests", "examples", "benches"})


def _has_suffix(path: str, suffixes: tuple[str, ...]) -> bool:
    return path.lower().endswith(suffixes)


def _join(folder: str, relative: str) -> str | None:
    """``folder/relative`` normalized; ``None`` when it leaves the repository root."""
    joined = posixpath.normpath(posixpath.join(folder, relative)) if folder else posixpath.normpath(relative)
    if joined == ".":
        return ""
    if joined.startswith(("../", "/")) or joined == "..":
        return None
    return joined


def _suffix_index(files: Iterable[str]) -> dict[str, list[str]]:
    """Files by base name, each list sorted, for unique path-suffix lookups."""
    index: dict[str, list[str]] = defaultdict(list)
    for path in sorted(files):
        index[posixpath.basename(path)].append(path)
    return index


def _unique_suffix_match(suffix: str, index: Mapping[str, list[str]]) -> str | None:
    """The only file whose path ends with ``/suffix`` (or is ``suffix``), else ``None``."""
    matches = [
        p for p in index.get(posixpath.basename(suffix), ()) if p == suffix or p.endswith("/" + suffix)
    ]
    return matches[0] if len(matches) == 1 else None


# --------------------------------------------------------------------------------------------- Python


@dataclass(frozen=True)
class PythonImport:
    """One ``import`` statement target: ``from {'.' * level}{module} import {names}``.

    ``import a.b`` is ``PythonImport("a.b", 0, ())``; ``from . import x`` is ``PythonImport("", 1, ("x",))``.
    """

    module: str
    level: int
    names: tuple[str, ...]


# Nodes that can hold statements: statements themselves, ``except`` handlers and ``match`` cases.
_BLOCK_NODES = (ast.stmt, ast.excepthandler, ast.match_case)


def python_imports(source: str) -> list[PythonImport]:
    """The imports that run when the module is loaded, found by parsing ``source`` with :mod:`ast`.

    Imports inside function bodies and under ``if TYPE_CHECKING:`` are left out: authors put imports
    there precisely to avoid an import cycle, so they say nothing about load order, and counting them
    would turn many ordinary packages into one cycle. Imports under module-level ``if``/``try``/
    ``with`` and in class bodies do run at load time and count.

    Source that does not parse (Python 2, a syntax error, nesting too deep) has no imports: the file
    still goes into the document, only without ordering constraints. Nothing is ever executed.

    The whole file is parsed, function bodies included, because a syntax error anywhere means no
    imports; CPython's parser alone costs about 0.55x of ``ast.parse``, the rest is building the
    tree's objects (``tests/benchmarks/bench_code_order.py``). The cyclic garbage collector is paused
    while the tree is built: one object per node sets off collections that can free nothing (a tree
    holds no reference cycles), 5-10% of the parse's CPU.
    """
    try:
        with warnings.catch_warnings(), _gc_paused():
            warnings.simplefilter("ignore")  # invalid escape sequences etc. are not our concern
            tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return []
    return load_time_imports(tree)


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Cyclic garbage collection off inside the block, back on after it if it was on before."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def load_time_imports(tree: ast.Module) -> list[PythonImport]:
    """The imports of a parsed module outside function bodies and ``if TYPE_CHECKING:``, in source order."""
    found: list[PythonImport] = []
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import):
            found.extend(PythonImport(alias.name, 0, ()) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            found.append(PythonImport(node.module or "", node.level, tuple(a.name for a in node.names)))
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(reversed(node.orelse))
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            # Imports are statements: descend only into nested blocks (pushed reversed: popped in order).
            stack.extend(reversed([c for c in ast.iter_child_nodes(node) if isinstance(c, _BLOCK_NODES)]))
    return found


def _is_type_checking(test: ast.expr) -> bool:
    """``TYPE_CHECKING`` or ``<anything>.TYPE_CHECKING`` (``typing.TYPE_CHECKING``)."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _python_module_file(module_path: str, files: frozenset[str]) -> str | None:
    """The file of the module at ``module_path`` (``"a/b"``): ``a/b.py``, ``a/b/__init__.py`` or a stub.

    The empty path is the package at the repository root (its ``__init__.py``).
    """
    if not module_path:
        return next((c for c in ("__init__.py", "__init__.pyi") if c in files), None)
    candidates = (
        f"{module_path}.py",
        f"{module_path}/__init__.py",
        f"{module_path}.pyi",
        f"{module_path}/__init__.pyi",
    )
    return next((c for c in candidates if c in files), None)


def _python_longest_prefix(base: str, parts: list[str], files: frozenset[str], min_parts: int) -> str | None:
    """The file of the longest module prefix of ``parts`` (at least ``min_parts`` long) under ``base``."""
    for n in range(len(parts), min_parts - 1, -1):
        found = _python_module_file("/".join(filter(None, [base, *parts[:n]])), files)
        if found is not None:
            return found
    return None


def _python_targets(imp: PythonImport) -> list[list[str]]:
    """Dotted paths (as parts) an import may name: ``from a import b, c`` → ``[[a, b], [a, c]]``.

    A name may be a submodule or an attribute of the module; resolvers fall back from the former to
    the latter. ``import a.b`` and ``from a import *`` name only the module.
    """
    module = imp.module.split(".") if imp.module else []
    names = [name for name in imp.names if name != "*"]
    return [[*module, name] for name in names] if names else [module]


def resolve_python_import(
    importer: str,
    imp: PythonImport,
    files: frozenset[str],
    repo_package: str,
    suffix_index: Mapping[str, list[str]],
) -> set[str]:
    """In-repository files that ``imp``, found in file ``importer``, refers to (see the module docstring)."""
    importer_dir = posixpath.dirname(importer)
    resolved: set[str] = set()
    if imp.level:
        package = _join(importer_dir, "/".join([".."] * (imp.level - 1)) or ".")
        if package is None:  # beyond the repository root
            return resolved
        module_parts = imp.module.split(".") if imp.module else []
        for parts in _python_targets(imp):
            for candidate in (parts, module_parts):
                found = _python_module_file("/".join(filter(None, [package, *candidate])), files)
                if found is not None:
                    resolved.add(found)
                    break
        return resolved
    for parts in _python_targets(imp):
        found = _resolve_absolute_python(parts, importer_dir, files, repo_package, suffix_index)
        if found is not None:
            resolved.add(found)
    return resolved


def _resolve_absolute_python(
    parts: list[str],
    importer_dir: str,
    files: frozenset[str],
    repo_package: str,
    suffix_index: Mapping[str, list[str]],
) -> str | None:
    """The file of the longest in-repository prefix of module ``parts``; the first base that has one wins.

    Bases, in order: the repository root, ``src/``, the root as the package named like the repository,
    the importing file's folder; then a unique path-suffix match of at least two components.
    """
    if not parts:
        return None
    bases: list[tuple[str, list[str], int]] = [("", parts, 1), ("src", parts, 1)]
    if parts[0] == repo_package:
        bases.append(("", parts[1:], 0))
    if importer_dir:
        bases.append((importer_dir, parts, 1))
    for base, module_parts, min_parts in bases:
        found = _python_longest_prefix(base, module_parts, files, min_parts)
        if found is not None:
            return found
    for n in range(len(parts), 1, -1):
        stem = "/".join(parts[:n])
        for candidate in (f"{stem}.py", f"{stem}/__init__.py"):
            found = _unique_suffix_match(candidate, suffix_index)
            if found is not None:
                return found
    return None


# ------------------------------------------------------------------------------------------------ C

_C_INCLUDE = re.compile(r'^[ \t]*#[ \t]*(?:include|import)[ \t]*(?:"([^"\n]+)"|<([^>\n]+)>)', re.MULTILINE)


def c_includes(source: str) -> list[tuple[str, bool]]:
    """``(header, quoted)`` for every ``#include``/``#import`` line; ``quoted`` is False for ``<...>``."""
    return [(quoted, True) if quoted else (angled, False) for quoted, angled in _C_INCLUDE.findall(source)]


def _c_include_dirs(files: Iterable[str]) -> list[str]:
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
        candidate = _join(root, header)
        if candidate and candidate in files:
            return candidate
    if quoted and not header.startswith("../"):
        return _unique_suffix_match(posixpath.normpath(header), suffix_index)
    return None


# ------------------------------------------------------------------------------------ JavaScript / TS

_JS_SPECIFIER = re.compile(r"""\b(?:from|import|require)\s*(?:\(\s*)?(['"])(\.{1,2}(?:/[^'"\n]*)?)\1""")


def js_imports(source: str) -> list[str]:
    """Relative module specifiers (``./x``, ``../y/z``) of imports, re-exports and ``require`` calls."""
    return [spec for _, spec in _JS_SPECIFIER.findall(source)]


def resolve_js_import(importer: str, specifier: str, files: frozenset[str]) -> str | None:
    """The file a relative specifier loads: exact, with an extension, or the folder's ``index`` file."""
    base = _join(posixpath.dirname(importer), specifier)
    if base is None:
        return None
    candidates = [base] if base else []
    stem, ext = posixpath.splitext(base)
    candidates += [stem + source_ext for source_ext in JS_COMPILED_TO_SOURCE.get(ext, ())]
    candidates += [base + ext for ext in JS_RESOLVE_SUFFIXES]
    index = f"{base}/index" if base else "index"
    candidates += [index + ext for ext in JS_RESOLVE_SUFFIXES]
    return next((c for c in candidates if c in files), None)


# ---------------------------------------------------------------------------------------------- Go

_GO_MODULE = re.compile(r'^\s*module\s+"?([^\s"]+)"?', re.MULTILINE)
_GO_IMPORT_BLOCK = re.compile(r"^\s*import\s*\((.*?)\)", re.MULTILINE | re.DOTALL)
_GO_IMPORT_LINE = re.compile(r'^\s*import\s+(?:[\w.]+\s+)?(?:"([^"\n]+)"|`([^`\n]+)`)', re.MULTILINE)
_GO_QUOTED = re.compile(r'"([^"\n]+)"|`([^`\n]+)`')
_GO_LINE_COMMENT = re.compile(r"//[^\n]*")


def go_module_path(go_mod: str) -> str | None:
    """The ``module`` path declared in a ``go.mod`` file, if any."""
    match = _GO_MODULE.search(go_mod)
    return match.group(1) if match else None


def go_imports(source: str) -> list[str]:
    """Import paths of a Go file, from single ``import "x"`` lines and ``import ( ... )`` blocks."""
    found = [a or b for a, b in _GO_IMPORT_LINE.findall(source)]
    for block in _GO_IMPORT_BLOCK.findall(source):
        found.extend(a or b for a, b in _GO_QUOTED.findall(_GO_LINE_COMMENT.sub("", block)))
    return found


def go_modules(files: Mapping[str, str]) -> list[tuple[str, str]]:
    """``(module path, folder)`` of every ``go.mod`` among ``files``, longest module path first."""
    modules = []
    for path, text in files.items():
        if posixpath.basename(path) == "go.mod" and (module := go_module_path(text)):
            modules.append((module, posixpath.dirname(path)))
    return sorted(modules, key=lambda m: (-len(m[0]), m))


def resolve_go_import(
    import_path: str, modules: list[tuple[str, str]], go_packages: Mapping[str, list[str]]
) -> list[str]:
    """The non-test ``.go`` files of the in-repository package that ``import_path`` names."""
    for module, folder in modules:
        if import_path == module or import_path.startswith(module + "/"):
            rest = import_path[len(module) :].lstrip("/")
            package_dir = "/".join(filter(None, [folder, rest]))
            return go_packages.get(package_dir, [])
    return []


def _go_packages(files: Iterable[str]) -> dict[str, list[str]]:
    """Non-test ``.go`` files by folder."""
    packages: dict[str, list[str]] = defaultdict(list)
    for path in sorted(files):
        if path.endswith(".go") and not path.endswith("_test.go"):
            packages[posixpath.dirname(path)].append(path)
    return packages


# -------------------------------------------------------------------------------------------- Rust

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
        candidate = _join(folder, mod.path)
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


# ------------------------------------------------------------------------------------- dependencies


@dataclass(frozen=True)
class _RepoContext:
    """Per-repository lookup tables shared by the resolvers."""

    repo_package: str
    suffix_index: Mapping[str, list[str]]
    include_dirs: list[str]
    go_modules: list[tuple[str, str]]
    go_packages: Mapping[str, list[str]]


def _dependencies_of(path: str, text: str, files: frozenset[str], context: _RepoContext) -> set[str]:
    """The in-repository files that file ``path`` (with content ``text``) imports, itself excluded."""
    deps: set[str] = set()
    if _has_suffix(path, PYTHON_SUFFIXES):
        for imp in python_imports(text):
            deps |= resolve_python_import(path, imp, files, context.repo_package, context.suffix_index)
    elif _has_suffix(path, C_SUFFIXES):
        for header, quoted in c_includes(text):
            found = resolve_c_include(path, header, quoted, files, context.include_dirs, context.suffix_index)
            deps.update([found] if found else [])
    elif _has_suffix(path, JS_SUFFIXES):
        deps.update(found for spec in js_imports(text) if (found := resolve_js_import(path, spec, files)))
    elif _has_suffix(path, GO_SUFFIXES):
        for import_path in go_imports(text):
            deps.update(resolve_go_import(import_path, context.go_modules, context.go_packages))
    elif _has_suffix(path, RUST_SUFFIXES):
        deps.update(found for mod in rust_mods(text) if (found := resolve_rust_mod(path, mod, files)))
        deps.update(found for use in rust_crate_uses(text) if (found := resolve_rust_use(path, use, files)))
    deps.discard(path)
    return deps


def file_dependencies(files: Mapping[str, str], repo_name: str) -> dict[str, set[str]]:
    """For each file (relative path → text), the set of in-repository files it imports.

    ``repo_name`` is the repository folder's name; a Python import whose first component equals it
    (with ``-`` read as ``_``) may resolve against the repository root, for repositories that are
    themselves a package.
    """
    paths = frozenset(files)
    context = _RepoContext(
        repo_package=repo_name.replace("-", "_"),
        suffix_index=_suffix_index(paths),
        include_dirs=_c_include_dirs(paths),
        go_modules=go_modules(files),
        go_packages=_go_packages(paths),
    )
    return {path: _dependencies_of(path, files[path], paths, context) for path in sorted(files)}


# ------------------------------------------------------------------------------------------- ordering


def strongly_connected_components(deps: Mapping[str, Iterable[str]]) -> dict[str, int]:
    """Component number of every node of the graph ``node → dependencies`` (iterative Tarjan).

    Dependencies that are not keys of ``deps`` are ignored. Numbers are assigned in a deterministic
    order (nodes visited by sorted name).
    """
    graph = {node: sorted(d for d in set(targets) if d in deps) for node, targets in deps.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    component: dict[str, int] = {}
    counter = 0
    n_components = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, 0)]
        while work:
            node, child_i = work.pop()
            if child_i == 0:
                index[node] = low[node] = counter
                counter += 1
                stack.append(node)
                on_stack.add(node)
            children = graph[node]
            if child_i < len(children):
                work.append((node, child_i + 1))
                child = children[child_i]
                if child not in index:
                    work.append((child, 0))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            if low[node] == index[node]:
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component[member] = n_components
                    if member == node:
                        break
                n_components += 1
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
    return component


def order_files(deps: Mapping[str, Iterable[str]], key: Callable[[str], Any] | None = None) -> list[str]:
    """All keys of ``deps`` (file → files it depends on), each after its dependencies where possible.

    Kahn's algorithm on the edges dependency → dependent: of the files whose dependencies have all been
    emitted, the smallest by ``key`` (default: the path) comes next. When none is ready, the graph has a
    cycle; then, among the files of the dependency cycles that nothing outside them still blocks, the
    file with the fewest unemitted dependencies comes next, ties broken by ``key``. Restricting the choice
    to those cycles means an edge between two files that are not in one cycle is always respected.
    Self-dependencies and dependencies that are not keys are ignored. The result is deterministic: it
    depends only on ``deps`` and ``key``, not on iteration order.
    """
    sort_key: Callable[[str], Any] = key or (lambda path: path)
    nodes = sorted(deps, key=lambda n: (sort_key(n), n))
    rank = {node: i for i, node in enumerate(nodes)}  # key order, with the path as the final tie-break
    dependencies = {node: {d for d in deps[node] if d in deps and d != node} for node in nodes}
    dependents: dict[str, list[str]] = defaultdict(list)
    for node in nodes:
        for dep in dependencies[node]:
            dependents[dep].append(node)
    pending = {node: len(dependencies[node]) for node in nodes}
    component = strongly_connected_components(dependencies)
    # Unemitted dependencies from outside the component, per component: a component is free at zero.
    blocked: dict[int, int] = defaultdict(int)
    members: dict[int, list[str]] = defaultdict(list)
    for node in nodes:
        members[component[node]].append(node)
        blocked[component[node]] += sum(1 for d in dependencies[node] if component[d] != component[node])

    ready = [rank[n] for n in nodes if pending[n] == 0]
    heapq.heapify(ready)
    # (pending, rank) of the nodes of free cycles; an entry is stale once the node's pending count drops.
    # Acyclic nodes never need breaking: a free one has no pending dependency and is ready.
    cyclic = {comp for comp, group in members.items() if len(group) > 1}
    breakable = [(pending[n], rank[n]) for c in cyclic if blocked[c] == 0 for n in members[c]]
    heapq.heapify(breakable)

    emitted: set[str] = set()
    order: list[str] = []
    while len(order) < len(nodes):
        if ready:
            node = nodes[heapq.heappop(ready)]
            if node in emitted:
                continue
        else:
            count, r = heapq.heappop(breakable)
            node = nodes[r]
            if node in emitted or count != pending[node]:
                continue
        emitted.add(node)
        order.append(node)
        for dependent in dependents[node]:
            pending[dependent] -= 1
            comp = component[dependent]
            if pending[dependent] == 0:
                heapq.heappush(ready, rank[dependent])
            if comp != component[node]:
                blocked[comp] -= 1
                if blocked[comp] == 0 and comp in cyclic:
                    for member in members[comp]:
                        heapq.heappush(breakable, (pending[member], rank[member]))
            elif blocked[comp] == 0 and comp in cyclic:
                heapq.heappush(breakable, (pending[dependent], rank[dependent]))
    return order
