"""Dependency order for the files of one code repository.

A repository becomes one long document; a model reads it front to back, so every file should come
after the in-repository files it depends on (a module after the modules it imports, a ``.c`` file
after its headers). This package holds the pure part of that: finding the in-repository imports of a
file from its text, and ordering the files.

Nothing here touches the filesystem or runs repository code. Python is parsed with :mod:`ast` only;
the other languages are scanned with regular expressions. Paths are POSIX paths relative to the
repository root (``"pkg/mod.py"``), and an import counts only when it resolves to one of the files
that are part of the document, so imports of the standard library, of third-party packages or of
skipped files add no edge.

One module per language says what makes an edge there: :mod:`.python`, :mod:`.c` (C, C++, CUDA,
Objective-C), :mod:`.javascript` (JavaScript, TypeScript), :mod:`.go`, :mod:`.rust`.
:mod:`.dependencies` picks the language of each file by its suffix; :mod:`.ordering` orders the files.
"""

from longctx.pipeline.readers.code_order.c import c_includes, resolve_c_include
from longctx.pipeline.readers.code_order.dependencies import file_dependencies
from longctx.pipeline.readers.code_order.go import go_imports, go_module_path, go_modules, resolve_go_import
from longctx.pipeline.readers.code_order.javascript import js_imports, resolve_js_import
from longctx.pipeline.readers.code_order.ordering import order_files, strongly_connected_components
from longctx.pipeline.readers.code_order.python import (
    PythonImport,
    load_time_imports,
    python_imports,
    resolve_python_import,
)
from longctx.pipeline.readers.code_order.rust import (
    RustMod,
    resolve_rust_mod,
    resolve_rust_use,
    rust_crate_uses,
    rust_mods,
)

__all__ = [
    "PythonImport",
    "RustMod",
    "c_includes",
    "file_dependencies",
    "go_imports",
    "go_module_path",
    "go_modules",
    "js_imports",
    "load_time_imports",
    "order_files",
    "python_imports",
    "resolve_c_include",
    "resolve_go_import",
    "resolve_js_import",
    "resolve_python_import",
    "resolve_rust_mod",
    "resolve_rust_use",
    "rust_crate_uses",
    "rust_mods",
    "strongly_connected_components",
]
