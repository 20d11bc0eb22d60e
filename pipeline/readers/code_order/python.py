"""Python (``.py``, ``.pyi``): ``import a.b`` and ``from a.b import c``, found with :mod:`ast`.

An import resolves against the repository root, ``src/``, the repository folder itself when it is a
package named like the repository (a copy of the stdlib ``json`` package importing ``from json import
scanner``), the importing file's own folder (scripts run from their folder), and finally a unique
path-suffix match of at least two components (``python/pkg/x.py`` for ``pkg.x``). Relative imports
resolve against the importing file's package. Only imports that run when the module loads count: not
those inside functions or under ``if TYPE_CHECKING:``, which exist to avoid import cycles.

A Python import of ``pkg.mod`` does not make ``pkg/__init__.py`` a dependency, although Python runs it
first. Package ``__init__`` files usually re-export their submodules, so they are better read after
them, and the extra edges would put most packages in a cycle.

Function bodies hold no load-time import, and they are most of a module: parsing them is most of the
cost. :func:`python_imports` therefore parses the module's *outline*, its text with string literals
and comments emptied and every function body made ``pass`` (:func:`outline`), and parses the whole
file only when the outline does not parse. On the Python files of the standard library and of this
project's installed dependencies (33,876 files) the imports are those of parsing the whole file,
except in the 2 files whose only syntax errors are inside function bodies, where the outline finds
the module's imports and the whole parse none (``tests/pipeline/test_python_imports.py`` checks
the standard library against an independent reading of the whole parse). It costs 0.43-0.48x of
the whole parse's CPU (``tests/benchmarks/bench_code_order.py``, and over those 33,876 files).
"""

from __future__ import annotations

import ast
import gc
import posixpath
import re
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
    """The imports that run when the module is loaded: those of module-level code, class bodies and
    module-level ``if``/``try``/``with`` blocks, in source order.

    Imports inside function bodies and under ``if TYPE_CHECKING:`` are left out: authors put imports
    there precisely to avoid an import cycle, so they say nothing about load order, and counting them
    would turn many ordinary packages into one cycle.

    The module's :func:`outline` is parsed (function bodies cannot hold a load-time import); when it
    does not parse, the whole file is (:func:`parsed_imports`). A file whose code outside function
    bodies does not parse (Python 2, a syntax error, nesting too deep) has no imports: it still goes
    into the document, only without ordering constraints. Nothing is ever executed.
    """
    skeleton = outline(source)
    if skeleton is not None:
        found = _imports_of(skeleton)
        if found is not None:
            return found
    return parsed_imports(source)


def parsed_imports(source: str) -> list[PythonImport]:
    """:func:`python_imports` by parsing the whole of ``source`` with :mod:`ast`: none when any of it
    does not parse."""
    return _imports_of(source) or []


def _imports_of(source: str) -> list[PythonImport] | None:
    """The load-time imports of ``source`` parsed with :mod:`ast`, or None when it does not parse.

    The cyclic garbage collector is paused while the tree is built, read and freed: one object per
    node sets off collections that can free nothing (a tree holds no reference cycles), and freeing
    the tree by reference counting before the collector is back on takes its objects off the
    collector's count, so that no collection walks them afterwards either.
    """
    with _gc_paused():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # invalid escape sequences etc. are not our concern
                tree = ast.parse(source)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            return None
        found = load_time_imports(tree)
        del tree
    return found


_TRIPLE = r"{q}{q}{q}[^{q}\\]*(?:(?:\\.|{q}(?!{q}{q}))[^{q}\\]*)*{q}{q}{q}"
_SINGLE = r"{q}[^{q}\\\n]*(?:\\.[^{q}\\\n]*)*{q}"
_LITERAL_OR_COMMENT = re.compile(
    "|".join(form.format(q=q) for form in (_TRIPLE, _SINGLE) for q in "\"'") + r"|#[^\n]*",
    re.DOTALL,
)
"""A string literal from its opening quote (triple or not, escapes included; a prefix such as ``rb``
stays in front of the emptied literal) or a comment, whichever starts first."""
_SURROGATE = re.compile("[\ud800-\udfff]")
"""A lone surrogate: such a text is not valid source anywhere (it cannot be encoded), which only the
whole parse says when the surrogate is in a literal or a function body."""
_DEF = re.compile(r"\n([ \t]*)(?:async[ \t]+)?def\b")
_BODY_END: dict[str, re.Pattern[str]] = {}
"""Per indentation of a ``def``: the next line that is not blank and not indented deeper."""
_MAX_TRIES = 64
"""Continuation lines (inside brackets, after a backslash) passed over while looking for the end of
one function, before the outline gives up and the whole file is parsed."""


def _emptied(match: re.Match[str]) -> str:
    """A comment removed, a literal made ``""`` (a callback costs less than a template here)."""
    return "" if match.group()[0] == "#" else '""'


def outline(source: str) -> str | None:
    """``source`` with string literals made ``""``, comments removed and each function's body made
    ``pass``: the same module-level statements, class bodies and function headers, in the same order.
    None when the text holds what the scan does not follow (form feeds, carriage returns, lone
    surrogates), or a function's end is not found within :data:`_MAX_TRIES` continuation lines, or its
    header has no colon.

    A function ends before the first line after its ``def`` that is neither blank nor indented deeper,
    unless that line continues a bracket or a backslash (then the search goes on). Literals go first,
    so that no quote, bracket or ``def`` inside one is seen. A text that this misreads gives an outline
    that does not parse (an unexpected indent, an unclosed bracket), and the caller parses the file.
    """
    if "\f" in source or "\r" in source or _SURROGATE.search(source):
        return None
    text = "\n" + _LITERAL_OR_COMMENT.sub(_emptied, source)  # every line starts after a newline
    parts: list[str] = []
    done = 1
    for match in _DEF.finditer(text):
        start = match.start() + 1
        if start < done:  # nested in a function already replaced
            continue
        indent = match.group(1)
        end = _function_end(text, start, indent)
        header = None if end is None else _header_end(text, start, end)
        if end is None or header is None:
            return None
        parts.append(text[done:header])
        parts.append(" pass\n")
        done = end
    parts.append(text[done:])
    return "".join(parts)


def _function_end(text: str, start: int, indent: str) -> int | None:
    """Where the function whose ``def`` line starts at ``start`` ends (the start of the line after it,
    or the end of the text); None when not found within :data:`_MAX_TRIES` continuation lines."""
    pattern = _BODY_END.get(indent)
    if pattern is None:
        pattern = _BODY_END[indent] = re.compile(rf"\n(?!{re.escape(indent)}[ \t])(?=[ \t]*\S)")
    at = text.find("\n", start)
    if at < 0:
        return len(text)
    for _ in range(_MAX_TRIES):
        found = pattern.search(text, at)
        if found is None:
            return len(text)
        end = found.start() + 1
        if _open_brackets(text, start, end) == 0 and not _continued(text, start, end):
            return end
        at = text.find("\n", end)
        if at < 0:
            return len(text)
    return None


def _header_end(text: str, start: int, end: int) -> int | None:
    """Just after the colon that ends the header of the function at ``text[start:end]`` (the first
    one outside brackets: annotations, defaults and lambdas hold others), or None without one."""
    colon = text.find(":", start, end)
    while colon >= 0:
        if _open_brackets(text, start, colon) == 0:
            return colon + 1
        colon = text.find(":", colon + 1, end)
    return None


def _open_brackets(text: str, start: int, end: int) -> int:
    """Opening brackets less closing ones in ``text[start:end]`` (literals and comments emptied)."""
    return (
        text.count("(", start, end)
        + text.count("[", start, end)
        + text.count("{", start, end)
        - text.count(")", start, end)
        - text.count("]", start, end)
        - text.count("}", start, end)
    )


def _continued(text: str, start: int, end: int) -> bool:
    """Whether the last line of ``text[start:end]`` that holds anything ends with a backslash."""
    k = end - 1
    while k > start and text[k] in " \t\n":
        k -= 1
    return text[k] == "\\"


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
