"""Which repository a code file comes from: its upstream, or a copy kept inside another project.

File-level deduplication keeps one of a file's copies (:func:`~longctx.pipeline.keep.file_rank`);
where a copy lives is not always visible in its path. pip vendors requests as ``pip/_vendor/requests``,
but a corpus may hold that package folder alone, as its own repository, shallower than upstream's
``src/requests`` and longer, since its imports were rewritten to ``pip._vendor.urllib3``. Two signals
tell the upstream from such a copy, each read from the repository's own files, never by running them:

* **A declaration.** A repository that declares the package is its upstream: a ``pyproject.toml``
  (``[project] name`` or ``[tool.poetry] name``), a ``setup.cfg`` (``[metadata] name``) or a
  ``setup.py`` (a literal ``name=`` of its ``setup(...)`` call, read with :mod:`ast`; the file is
  never executed, and a name computed at run time declares nothing) naming the Python package a file
  belongs to (its first folder below the manifest's folder or its ``src/``); a ``go.mod`` (its
  ``module``) or a ``Cargo.toml`` (``[package] name``) for every file below it. Files inside a
  vendored folder of the repository are never declared by it.
* **Rewritten imports.** A file whose imports go through a vendor prefix (``pip._vendor.urllib3``,
  ``from pip._vendor import chardet``, Go's ``.../vendor/...``, ``#include "third_party/..."``, a
  JavaScript ``require("./vendor/...")``) was adapted to live inside another project: it is the copy.

:func:`provenance` sums them up in one level, lower for the upstream (the ``upstream`` keep rule):
``0`` declared; ``1`` held at the repository's import root (not inside a vendored folder and, for
Python, in a package whose folders all hold an ``__init__.py`` up to the repository's root or
``src/``); ``2`` anything else; ``3`` imports rewritten under a vendor prefix.
"""

from __future__ import annotations

import ast
import configparser
import posixpath
import re
from dataclasses import dataclass
from types import ModuleType

from longctx.pipeline.readers.code import VENDORED_DIRS
from longctx.pipeline.readers.listing import Tree

MANIFEST_BYTES = 1 << 20
"""Manifests larger than this are not read (a real one is a few KB)."""
PYTHON_MANIFESTS = ("pyproject.toml", "setup.cfg", "setup.py")
MODULE_MANIFESTS = ("go.mod", "Cargo.toml")
IMPORT_ROOTS = ("", "src")
"""Where a repository keeps its Python packages, relative to a manifest's folder."""

DECLARED, AT_IMPORT_ROOT, ELSEWHERE, REWRITTEN = range(4)


def _toml_parser() -> ModuleType | None:
    """The standard library's TOML parser (Python 3.11+), else ``tomli`` where installed, else None
    (TOML manifests are then not read)."""
    for name in ("tomllib", "tomli"):
        try:
            return __import__(name)
        except ModuleNotFoundError:
            continue
    return None


_TOML = _toml_parser()


@dataclass(frozen=True)
class Declaration:
    """A manifest's claim: ``folder`` (inside the repository, ``""`` for its root) declares the
    Python package ``name`` (normalized), or, with ``name`` None, every file below it (a Go module or
    a Rust crate)."""

    folder: str
    name: str | None


def normalize(name: str) -> str:
    """A Python distribution or package name as a package folder would be named (``Foo-Bar`` ->
    ``foo_bar``)."""
    return re.sub(r"[-_.]+", "_", name).lower()


def _in_vendored_folder(rel: str) -> bool:
    return any(part in VENDORED_DIRS for part in rel.split("/")[:-1])


def _toml_name(text: str, *tables: tuple[str, ...]) -> str | None:
    if _TOML is None:
        return None
    try:
        data = _TOML.loads(text)
    except ValueError:  # TOMLDecodeError is a ValueError
        return None
    for path in tables:
        value = data
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, str) and value.strip():
            return value.strip()
    return None


def _setup_cfg_name(text: str) -> str | None:
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read_string(text)
    except configparser.Error:
        return None
    name = parser.get("metadata", "name", fallback="").strip()
    return name or None


def setup_py_name(text: str) -> str | None:
    """The literal ``name=`` of a ``setup(...)`` call in a ``setup.py``, read with :mod:`ast` (never
    executed); None when there is none or it is computed."""
    try:
        module = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    for node in ast.walk(module):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        called = (
            func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
        )
        if called != "setup":
            continue
        for keyword in node.keywords:
            if keyword.arg == "name" and isinstance(keyword.value, ast.Constant):
                value = keyword.value.value
                if isinstance(value, str) and value.strip():
                    return value.strip()
    return None


def manifest_name(filename: str, text: str) -> str | None:
    """The package a manifest file declares (see the module docstring), or None."""
    if filename == "pyproject.toml":
        return _toml_name(text, ("project", "name"), ("tool", "poetry", "name"))
    if filename == "setup.cfg":
        return _setup_cfg_name(text)
    if filename == "setup.py":
        return setup_py_name(text)
    if filename == "go.mod":
        found = re.search(r"^\s*module\s+(\S+)", text, re.MULTILINE)
        return found.group(1).strip('"') if found else None
    if filename == "Cargo.toml":
        return _toml_name(text, ("package", "name"))
    return None


def declarations(tree: Tree) -> list[Declaration]:
    """What the repository's manifests declare (manifests inside vendored folders are another
    project's, and are left out)."""
    found = []
    for entry in tree.files():
        name = posixpath.basename(entry.path)
        if name not in PYTHON_MANIFESTS + MODULE_MANIFESTS or entry.kind != "file":
            continue
        if _in_vendored_folder(entry.path) or entry.size > MANIFEST_BYTES:
            continue
        try:
            text = tree.read_bytes(entry.path, MANIFEST_BYTES).decode("utf-8", "replace")
        except OSError:
            continue
        declared = manifest_name(name, text)
        if declared is None:
            continue
        folder = posixpath.dirname(entry.path)
        found.append(Declaration(folder, None if name in MODULE_MANIFESTS else normalize(declared)))
    return found


def _below(folder: str, rel: str) -> str | None:
    """``rel`` relative to ``folder``, or None when it is not below it."""
    if not folder:
        return rel
    return rel[len(folder) + 1 :] if rel.startswith(folder + "/") else None


def is_declared(rel: str, found: list[Declaration]) -> bool:
    """Whether a declaration of the repository covers the file ``rel`` (see the module docstring)."""
    if _in_vendored_folder(rel):
        return False
    for declaration in found:
        inside = _below(declaration.folder, rel)
        if inside is None:
            continue
        if declaration.name is None:
            return True
        for root in IMPORT_ROOTS:
            below = _below(root, inside)
            if below is None:
                continue
            package = below.split("/", 1)[0] if "/" in below else below.removesuffix(".py")
            if normalize(package) == declaration.name:
                return True
    return False


def at_import_root(rel: str, tree: Tree) -> bool:
    """Whether the repository holds the file at its import root: outside vendored folders and, for a
    Python file in a package, every folder from the file up to the repository's root or ``src/``
    holds an ``__init__.py``."""
    if _in_vendored_folder(rel):
        return False
    if not rel.endswith(".py"):
        return True
    folders = rel.split("/")[:-1]
    start = 1 if folders and folders[0] in IMPORT_ROOTS else 0
    return all(
        tree.kind("/".join(folders[: n + 1]) + "/__init__.py") == "file" for n in range(start, len(folders))
    )


_PYTHON_IMPORT = re.compile(
    r"^\s*(?:from\s+([\w.]+)\s+import\b|import\s+([\w.]+(?:\s*,\s*[\w.]+)*))", re.MULTILINE
)
_C_INCLUDE = re.compile(r"^\s*#\s*include\s*[<\"]([^>\"\n]+)[>\"]", re.MULTILINE)
_JS_IMPORT = re.compile(r"""(?:\bfrom|\brequire\s*\(|^\s*import)\s*['"]([^'"\n]+)['"]""", re.MULTILINE)
_GO_IMPORT = re.compile(r"^\s*import\s+(?:[\w.]+\s+)?\"([^\"\n]+)\"", re.MULTILINE)
_GO_IMPORT_BLOCK = re.compile(r"^\s*import\s*\(([^)]*)\)", re.MULTILINE)
_GO_BLOCK_LINE = re.compile(r"^\s*(?:[\w.]+\s+)?\"([^\"\n]+)\"", re.MULTILINE)
C_SUFFIXES = (".c", ".h", ".cc", ".cpp", ".cxx", ".hh", ".hpp", ".hxx")
JS_SUFFIXES = (".js", ".mjs", ".cjs", ".jsx", ".ts", ".tsx", ".mts", ".cts")


def imported_paths(rel: str, text: str) -> list[list[str]]:
    """The modules or paths a source file imports, each split into its parts (Python's dotted
    modules, Go import paths, C/C++ includes, JavaScript/TypeScript imports); none for other files."""
    if rel.endswith((".py", ".pyi")):
        modules = [m.strip() for a, b in _PYTHON_IMPORT.findall(text) for m in (a or b).split(",")]
        return [m.split(".") for m in modules]
    if rel.endswith(".go"):
        paths = _GO_IMPORT.findall(text)
        paths += [p for block in _GO_IMPORT_BLOCK.findall(text) for p in _GO_BLOCK_LINE.findall(block)]
    elif rel.endswith(C_SUFFIXES):
        paths = _C_INCLUDE.findall(text)
    elif rel.endswith(JS_SUFFIXES):
        paths = _JS_IMPORT.findall(text)
    else:
        return []
    return [p.split("/") for p in paths]


def rewritten_imports(rel: str, text: str) -> bool:
    """Whether the file imports through a vendor prefix: a module or path with a vendored folder's
    name (``_vendor``, ``vendor``, ``third_party``...) in it."""
    return any(set(parts) & VENDORED_DIRS for parts in imported_paths(rel, text))


def provenance(rel: str, text: str, tree: Tree, found: list[Declaration]) -> int:
    """The file's provenance level (the module docstring): 0 for its declared upstream, up to 3 for a
    copy whose imports were rewritten under a vendor prefix."""
    if is_declared(rel, found):
        return DECLARED
    if rewritten_imports(rel, text):
        return REWRITTEN
    return AT_IMPORT_ROOT if at_import_root(rel, tree) else ELSEWHERE
