"""Python (``.py``, ``.pyi``): ``import a.b`` and ``from a.b import c``, found with :mod:`ast` only.

An import resolves against the repository root, ``src/``, the repository folder itself when it is a
package named like the repository (a copy of the stdlib ``json`` package importing ``from json import
scanner``), the importing file's own folder (scripts run from their folder), and finally a unique
path-suffix match of at least two components (``python/pkg/x.py`` for ``pkg.x``). Relative imports
resolve against the importing file's package. Only imports that run when the module loads count: not
those inside functions or under ``if TYPE_CHECKING:``, which exist to avoid import cycles.

A Python import of ``pkg.mod`` does not make ``pkg/__init__.py`` a dependency, although Python runs it
first. Package ``__init__`` files usually re-export their submodules, so they are better read after
them, and the extra edges would put most packages in a cycle.
"""

from __future__ import annotations

import ast
import gc
import posixpath
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

from longctx.pipeline.readers.code_order.paths import join_in_repo, unique_suffix_match

PYTHON_SUFFIXES = (".py", ".pyi")


@dataclass(frozen=True)
class PythonImport:
    """One ``import`` statement target: ``from {'.' * level}{module} import {names}``.

    ``import a.b`` is ``PythonImport("a.b", 0, ())``; ``from . import x`` is ``PythonImport("", 1, ("x",))``.
    """

    module: str
    level: int
    names: tuple[str, ...]


_BLOCK_FIELDS = ("body", "handlers", "orelse", "finalbody", "cases")
"""The fields of a node that hold statements, ``except`` handlers or ``match`` cases (an expression
never holds a statement)."""
_NODE_BLOCKS: dict[type, tuple[str, ...]] = {}
"""Per node type, its :data:`_BLOCK_FIELDS` in the type's field order (filled as types are met)."""


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
    while the tree is built, read and freed: one object per node sets off collections that can free
    nothing (a tree holds no reference cycles), and freeing the tree by reference counting before the
    collector is back on takes its objects off the collector's count, so that no collection walks
    them afterwards either (that deferred collection cost ~15% of this function's CPU).
    """
    with _gc_paused():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # invalid escape sequences etc. are not our concern
                tree = ast.parse(source)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return []
        found = load_time_imports(tree)
        del tree
    return found


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
            # Imports are statements: descend only into nested blocks (pushed reversed: popped in order),
            # read from the fields that hold them rather than by visiting every child expression.
            kind = type(node)
            fields = _NODE_BLOCKS.get(kind)
            if fields is None:
                fields = _NODE_BLOCKS[kind] = tuple(f for f in kind._fields if f in _BLOCK_FIELDS)
            for field in reversed(fields):
                stack.extend(reversed(getattr(node, field)))
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
        package = join_in_repo(importer_dir, "/".join([".."] * (imp.level - 1)) or ".")
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
            found = unique_suffix_match(candidate, suffix_index)
            if found is not None:
                return found
    return None
