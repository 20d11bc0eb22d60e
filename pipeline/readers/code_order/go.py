"""Go: imports under the module path of a ``go.mod`` in the repository depend on every non-test
``.go`` file of the imported package folder."""

from __future__ import annotations

import posixpath
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping

GO_SUFFIXES = (".go",)

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


def go_packages(files: Iterable[str]) -> dict[str, list[str]]:
    """Non-test ``.go`` files by folder."""
    packages: dict[str, list[str]] = defaultdict(list)
    for path in sorted(files):
        if path.endswith(".go") and not path.endswith("_test.go"):
            packages[posixpath.dirname(path)].append(path)
    return packages
