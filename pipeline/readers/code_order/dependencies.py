"""The in-repository files each file of a repository imports: every language's scanner and
resolver, chosen by the file's suffix."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from longctx.pipeline.readers.code_order.c import C_SUFFIXES, c_include_dirs, c_includes, resolve_c_include
from longctx.pipeline.readers.code_order.go import (
    GO_SUFFIXES,
    go_imports,
    go_modules,
    go_packages,
    resolve_go_import,
)
from longctx.pipeline.readers.code_order.javascript import JS_SUFFIXES, js_imports, resolve_js_import
from longctx.pipeline.readers.code_order.paths import has_suffix, suffix_index
from longctx.pipeline.readers.code_order.python import PYTHON_SUFFIXES, python_imports, resolve_python_import
from longctx.pipeline.readers.code_order.rust import (
    RUST_SUFFIXES,
    resolve_rust_mod,
    resolve_rust_use,
    rust_crate_uses,
    rust_mods,
)


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
    if has_suffix(path, PYTHON_SUFFIXES):
        for imp in python_imports(text):
            deps |= resolve_python_import(path, imp, files, context.repo_package, context.suffix_index)
    elif has_suffix(path, C_SUFFIXES):
        for header, quoted in c_includes(text):
            found = resolve_c_include(path, header, quoted, files, context.include_dirs, context.suffix_index)
            deps.update([found] if found else [])
    elif has_suffix(path, JS_SUFFIXES):
        deps.update(found for spec in js_imports(text) if (found := resolve_js_import(path, spec, files)))
    elif has_suffix(path, GO_SUFFIXES):
        for import_path in go_imports(text):
            deps.update(resolve_go_import(import_path, context.go_modules, context.go_packages))
    elif has_suffix(path, RUST_SUFFIXES):
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
        suffix_index=suffix_index(paths),
        include_dirs=c_include_dirs(paths),
        go_modules=go_modules(files),
        go_packages=go_packages(paths),
    )
    return {path: _dependencies_of(path, files[path], paths, context) for path in sorted(files)}
