"""JavaScript / TypeScript: relative specifiers (``./x``, ``../x``) of ``import``/``export ... from``,
side-effect ``import``, ``require()`` and dynamic ``import()``, with the usual extensions and ``index``
files; a ``.js`` specifier also finds the ``.ts`` source of ESM TypeScript projects."""

from __future__ import annotations

import posixpath
import re

from longctx.pipeline.readers.code_order.paths import join_in_repo

JS_SUFFIXES = (".js", ".mjs", ".cjs", ".jsx", ".ts", ".tsx", ".mts", ".cts")

# Extensions tried, in this order, for an extensionless JS/TS specifier and for its ``index`` file.
JS_RESOLVE_SUFFIXES = (".js", ".ts", ".tsx", ".jsx", ".mjs", ".cjs", ".mts", ".cts")
# ESM TypeScript imports name the compiled file (``./x.js``) while the repository holds ``x.ts``.
JS_COMPILED_TO_SOURCE = {".js": (".ts", ".tsx"), ".mjs": (".mts",), ".cjs": (".cts",), ".jsx": (".tsx",)}

_JS_SPECIFIER = re.compile(r"""\b(?:from|import|require)\s*(?:\(\s*)?(['"])(\.{1,2}(?:/[^'"\n]*)?)\1""")


def js_imports(source: str) -> list[str]:
    """Relative module specifiers (``./x``, ``../y/z``) of imports, re-exports and ``require`` calls."""
    return [spec for _, spec in _JS_SPECIFIER.findall(source)]


def resolve_js_import(importer: str, specifier: str, files: frozenset[str]) -> str | None:
    """The file a relative specifier loads: exact, with an extension, or the folder's ``index`` file."""
    base = join_in_repo(posixpath.dirname(importer), specifier)
    if base is None:
        return None
    candidates = [base] if base else []
    stem, ext = posixpath.splitext(base)
    candidates += [stem + source_ext for source_ext in JS_COMPILED_TO_SOURCE.get(ext, ())]
    candidates += [base + ext for ext in JS_RESOLVE_SUFFIXES]
    index = f"{base}/index" if base else "index"
    candidates += [index + ext for ext in JS_RESOLVE_SUFFIXES]
    return next((c for c in candidates if c in files), None)
