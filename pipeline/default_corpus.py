"""The embedded default corpus: text that every Python installation ships.

With no internet, the demo cannot download books or repositories. Instead it lays out, in the
same ``books/``, ``code/`` layout that ``longctx curate --input DIR`` reads:
- ``code/<package>/``: the running interpreter's standard-library packages, one repository each
  (copied as files; never imported or run);
- ``books/python_language_reference.txt``: the language reference bundled for ``pydoc``
  (``pydoc_data.topics``), one long document, and the interpreter's ``LICENSE.txt``;
- ``anchor/topics.jsonl``: the same reference topics one per row, as a short-document
  "anchor" source (long-only mixes regress short-context skills).
"""

from __future__ import annotations

import json
import os
import shutil
import sysconfig
from pathlib import Path

from longctx.core.atomic import atomic_path
from longctx.pipeline.config import SourceConfig

# Packages left out: the test suite (120 MB), bundled wheels, and trees that are mostly data or
# legacy copies. What remains is about 5 MB of code in ~30 repositories.
EXCLUDED_PACKAGES = frozenset(
    {
        "test",
        "idlelib",
        "ensurepip",
        "lib2to3",
        "distutils",
        "encodings",
        "site-packages",
        "pydoc_data",
        "__phello__",
    }
)
ANCHOR_BOUNDS = (32, 1024)  # tokens: the anchor source's own length bounds


def stdlib_dir() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _copy_package(src: Path, dest: Path) -> None:
    def ignore(folder: str, names: list[str]) -> set[str]:
        return {n for n in names if n == "__pycache__" or os.path.islink(os.path.join(folder, n))}

    shutil.copytree(src, dest, symlinks=True, ignore=ignore)


def _write_corpus(folder: Path) -> None:
    (folder / "books").mkdir(parents=True)
    (folder / "code").mkdir()
    (folder / "anchor").mkdir()
    root = stdlib_dir()
    for package in sorted(root.iterdir()):
        if (
            package.is_dir()
            and not package.is_symlink()
            and (package / "__init__.py").is_file()
            and package.name not in EXCLUDED_PACKAGES
        ):
            _copy_package(package, folder / "code" / package.name)
    from pydoc_data.topics import topics

    reference = "\n\n".join(
        f"{name}\n{'=' * len(name)}\n\n{text.strip()}" for name, text in sorted(topics.items())
    )
    (folder / "books" / "python_language_reference.txt").write_text(
        "The Python Language Reference (as bundled for pydoc)\n\n" + reference + "\n", encoding="utf-8"
    )
    license_file = root / "LICENSE.txt"
    if license_file.is_file():
        shutil.copyfile(license_file, folder / "books" / "python_license.txt")
    with open(folder / "anchor" / "topics.jsonl", "w", encoding="utf-8") as f:
        for name, text in sorted(topics.items()):
            f.write(json.dumps({"id": name, "text": text.strip()}) + "\n")
    (folder / ".complete").write_text("ok\n")


def default_corpus_sources(dest: str | os.PathLike) -> list[SourceConfig]:
    """The sources of the default corpus under ``dest`` (``books``, ``code`` and a short ``anchor``
    source with its own bounds), before it is written: a run checks its identity first."""
    dest = Path(dest)
    low, high = ANCHOR_BOUNDS
    # Built without validation: the folders exist only once build_default_corpus has run.
    return [
        SourceConfig.model_construct(**fields)
        for fields in (
            {"name": "books", "kind": "books", "path": str(dest / "books")},
            {"name": "code", "kind": "code", "path": str(dest / "code")},
            {
                "name": "anchor",
                "kind": "jsonl",
                "path": str(dest / "anchor"),
                "min_tokens": low,
                "max_tokens": high,
            },
        )
    ]


def build_default_corpus(dest: str | os.PathLike) -> None:
    """Materialize the default corpus under ``dest`` (once; a complete copy is reused)."""
    dest = Path(dest)
    if not (dest / ".complete").exists():
        with atomic_path(dest) as tmp:
            _write_corpus(tmp)
