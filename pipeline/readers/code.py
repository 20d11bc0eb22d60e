"""Code repositories: each repository folder becomes one document, its files in dependency order.

The document is every kept file of the repository, each preceded by a header line with its path
(:data:`FILE_HEADER`), files separated by one blank line, in the order of
:func:`longctx.pipeline.readers.code_order.order_files`: a file comes after the in-repository files it
imports, so a model reading the document front to back has seen a definition before its use. The repository's
top-level README comes first, as an overview.

Only hand-written source and documentation is kept. Every other file is recorded, with a reason, in
``metadata["skipped_files"]`` (a skipped folder is recorded once, its path ending in ``/``, with the
number of files below it):

* ``symlink``: never followed, wherever it points, so nothing outside the repository is ever read.
* ``not_regular_file`` (FIFOs, sockets, devices: reading them could block or leak), ``hidden`` (dot
  files and folders such as ``.git`` or a ``.env`` with secrets), ``bad_filename`` (control characters
  or undecodable bytes, which would break the header line or the Parquet metadata).
* ``dependency_tree`` (installed dependencies: ``node_modules/``, ``site-packages/``, ``venv/``...) and
  ``build_output`` (``dist/``, ``build/``, ``__pycache__/``...): not this repository's own work.
  Vendored copies of other projects (``vendor/``, ``_vendor/``, ``third_party/``...) are read by
  default, so that file-level deduplication (:mod:`longctx.pipeline.filededup`) removes the files
  another repository of the corpus also has and keeps the ones found nowhere else; with
  ``vendored="skip"`` they are left out as ``vendored``.
* ``lock_file``, ``generated`` (by name such as ``*_pb2.py``, or by a conventional marker in the first
  lines: ``@generated``, ``Code generated ... DO NOT EDIT``, ``DO NOT EDIT`` in a comment, or a known
  generator's header comment; a word such as "generated" in a docstring is not a marker), ``minified``
  (by name or a mean line length over :data:`MINIFIED_MEAN_LINE_CHARS`): machine-written text a model
  should not learn from.
* ``unsupported_extension``: not in the source/documentation allow-list (:data:`SOURCE_EXTENSIONS`,
  :data:`SOURCE_FILENAMES`).
* ``too_large`` (over ``max_file_bytes``), ``large_data_file`` (a JSON/YAML/TOML file over
  :data:`DATA_FILE_MAX_BYTES`: small ones are manifests and configuration, large ones are data),
  ``binary``, ``not_utf8``, ``bad_encoding``, ``empty``, ``unreadable``.

Repositories are read through datatrove's data folders, locally or from object storage. Repository
code is never executed or imported: Python files are only parsed with :mod:`ast`.
"""

from __future__ import annotations

import os
import posixpath
import re
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Literal

from datatrove.data import Document
from datatrove.io import DataFolderLike

from longctx.pipeline.file_decisions import load_file_decisions
from longctx.pipeline.readers.base import SourceReader, Unit, UnreadableInput, read_text, top_level_units
from longctx.pipeline.readers.code_order import file_dependencies, order_files
from longctx.pipeline.readers.listing import Tree, count_files, display_path, is_bad_name

# Each file starts with this line; ``path`` is relative to the repository root, with ``/`` separators.
FILE_HEADER = "# ===== {path} =====\n"
# Between two files (each file's text ends with a newline, so this makes one blank line).
FILE_SEPARATOR = "\n"

DEFAULT_MAX_FILE_BYTES = 1_000_000
# JSON/YAML/TOML files above this size are data, not configuration.
DATA_FILE_MAX_BYTES = 64 * 1024
DATA_EXTENSIONS = frozenset({".json", ".jsonc", ".yaml", ".yml", ".toml"})
# A code file of at least MINIFIED_MIN_CHARS with longer lines than this on average is minified.
MINIFIED_MEAN_LINE_CHARS = 200
MINIFIED_MIN_CHARS = 2000
# Prose may legitimately have one long line per paragraph: never judged minified.
PROSE_EXTENSIONS = frozenset({".md", ".markdown", ".rst", ".txt", ".adoc", ".org", ".tex"})
GENERATED_HEAD_LINES = 10

SOURCE_EXTENSIONS = frozenset(
    {
        # Python, C family, JVM, .NET
        ".py", ".pyi", ".pyx", ".pxd",
        ".c", ".h", ".cc", ".cpp", ".cxx", ".hpp", ".hh", ".hxx", ".ipp", ".inl", ".cu", ".cuh", ".m", ".mm",
        ".java", ".kt", ".kts", ".scala", ".groovy", ".gradle", ".clj", ".cs", ".fs",
        # Web
        ".js", ".mjs", ".cjs", ".jsx", ".ts", ".tsx", ".mts", ".cts", ".vue", ".svelte",
        ".css", ".scss", ".less",
        # Other languages
        ".go", ".rs", ".rb", ".php", ".swift", ".dart", ".lua", ".r", ".jl", ".hs", ".ml", ".mli", ".ex",
        ".exs", ".erl", ".hrl", ".elm", ".pl", ".pm", ".zig", ".nim", ".sol", ".sql", ".proto", ".graphql",
        # Shell and build
        ".sh", ".bash", ".zsh", ".fish", ".ps1", ".cmake", ".mk", ".bzl", ".nix", ".tf",
        # Documentation
        ".md", ".markdown", ".rst", ".txt", ".adoc", ".org", ".tex",
        # Configuration (JSON/YAML/TOML only while small: DATA_FILE_MAX_BYTES)
        ".toml", ".yaml", ".yml", ".json", ".jsonc", ".cfg", ".ini",
    }
)  # fmt: skip
# Extensionless (or otherwise named) files that are source or build definitions.
SOURCE_FILENAMES = frozenset(
    {
        "Makefile", "GNUmakefile", "makefile", "Dockerfile", "Containerfile", "Rakefile", "Gemfile",
        "Justfile", "justfile", "BUILD", "WORKSPACE", "Vagrantfile", "README", "go.mod", "go.work",
    }
)  # fmt: skip
LOCK_FILENAMES = frozenset(
    {
        "package-lock.json", "npm-shrinkwrap.json", "yarn.lock", "pnpm-lock.yaml", "bun.lockb", "deno.lock",
        "Cargo.lock", "poetry.lock", "Pipfile.lock", "pdm.lock", "uv.lock", "go.sum", "go.work.sum",
        "composer.lock", "Gemfile.lock", "Podfile.lock", "mix.lock", "flake.lock", "pubspec.lock",
        "packages.lock.json", "gradle.lockfile", "conda-lock.yml",
    }
)  # fmt: skip
LOCK_SUFFIXES = (".lock", ".lockfile")
GENERATED_NAME_SUFFIXES = (
    "_pb2.py", "_pb2.pyi", "_pb2_grpc.py", ".pb.go", ".pb.gw.go", ".pb.cc", ".pb.h", "_pb.js", "_pb.d.ts",
    "_grpc_pb.js", ".g.dart", ".freezed.dart",
)  # fmt: skip
MINIFIED_NAME_SUFFIXES = (".min.js", ".min.mjs", ".min.css", "-min.js", ".bundle.js")
# Copies of other projects kept inside a repository.
VENDORED_DIRS = frozenset(
    {
        "vendor",
        "_vendor",
        "vendored",
        "third_party",
        "third-party",
        "thirdparty",
        "3rdparty",
        "external",
        "extern",
    }
)
# Installed dependencies: never this repository's own work, and often larger than it.
DEPENDENCY_DIRS = frozenset(
    {"node_modules", "bower_components", "site-packages", "dist-packages", "venv", "Pods", "Carthage"}
)
VendoredPolicy = Literal["read", "skip"]
# Always build output.
BUILD_OUTPUT_DIRS = frozenset({"__pycache__", "htmlcov"})
# Build output unless the folder is a Python package of that name (``pip/_internal/build/``).
BUILD_OUTPUT_DIRS_UNLESS_PACKAGE = frozenset({"build", "dist", "target", "out"})

# Markers that count on any of the first lines, in a comment or a docstring.
_GENERATED_TAG = re.compile(r"@generated\b|^\W*Code generated .* DO NOT EDIT\b")
# Markers that count only on a comment line of the head: the upper-case DO NOT EDIT/MODIFY banner,
# and the headers known generators write (protoc, Thrift, SWIG, Cython, Django, "This file is
# auto-generated", "Automatically generated by ...").
_GENERATED_COMMENT = re.compile(
    r"\bDO NOT (?:EDIT|MODIFY)\b"
    r"|(?i:\bthis (?:file|module|code) (?:is|was|has been) (?:auto-?|automatically )?generated\b"
    r"|\b(?:auto-?generated|automatically generated|machine generated) (?:file|code|by)\b"
    r"|\bgenerated by (?:the )?(?:protocol buffer compiler|protoc|thrift|swig|cython|django|"
    r"flatc|the grpc|grpc|capnp|bindgen|cbindgen|sqlc|mockgen|stringer|wire|ent|ragel|bison|yacc|lex|flex)\b)"
)
_COMMENT_STARTS = ("#", "//", "/*", "*", "--", "<!--", ";", "%", "(*", "{-", "!", "REM ")


@dataclass(frozen=True)
class FileSpan:
    """Where a file is in the document: ``text[offset : offset + length]`` is its header and content."""

    path: str
    offset: int
    length: int


@dataclass(frozen=True)
class SkippedFile:
    """A file (or, with a trailing ``/``, a folder: ``files`` counts the files below it) left out of
    the document, and why."""

    path: str
    reason: str
    files: int = 1


@dataclass(frozen=True)
class RepoDocument:
    """One repository as a document: the text, the kept files' spans (in order), the skipped files."""

    text: str
    files: list[FileSpan]
    skipped: list[SkippedFile]
    n_import_edges: int


def dir_skip_reason(name: str, is_python_package: bool, vendored: VendoredPolicy = "read") -> str | None:
    """Why a (non-symlink) folder named ``name`` is left out, or ``None`` to descend into it."""
    if is_bad_name(name):
        return "bad_filename"
    if name.startswith("."):
        return "hidden"
    if name in DEPENDENCY_DIRS:
        return "dependency_tree"
    if vendored == "skip" and name in VENDORED_DIRS:
        return "vendored"
    if name in BUILD_OUTPUT_DIRS or name.endswith(".egg-info"):
        return "build_output"
    if name in BUILD_OUTPUT_DIRS_UNLESS_PACKAGE and not is_python_package:
        return "build_output"
    return None


def name_skip_reason(rel: str) -> str | None:
    """Why the file at relative path ``rel`` is left out judging by its name alone, or ``None``."""
    name = posixpath.basename(rel)
    lower = name.lower()
    if is_bad_name(rel):
        return "bad_filename"
    if name.startswith("."):
        return "hidden"
    if name in LOCK_FILENAMES or lower.endswith(LOCK_SUFFIXES):
        return "lock_file"
    if lower.endswith(MINIFIED_NAME_SUFFIXES):
        return "minified"
    if lower.endswith(GENERATED_NAME_SUFFIXES):
        return "generated"
    if not _is_source_name(name):
        return "unsupported_extension"
    return None


def _is_source_name(name: str) -> bool:
    suffix = posixpath.splitext(name)[1].lower()
    return name in SOURCE_FILENAMES or name.startswith("Dockerfile.") or suffix in SOURCE_EXTENSIONS


def is_generated(text: str) -> bool:
    """Whether the first :data:`GENERATED_HEAD_LINES` lines carry a conventional generated-file marker
    (see the module docstring). Words in a docstring ("AST nodes generated by the parser") are not."""
    head = text.split("\n", GENERATED_HEAD_LINES)[:GENERATED_HEAD_LINES]
    for line in head:
        stripped = line.lstrip()
        if _GENERATED_TAG.search(stripped):
            return True
        if stripped.startswith(_COMMENT_STARTS) and _GENERATED_COMMENT.search(stripped):
            return True
    return False


def content_skip_reason(rel: str, text: str) -> str | None:
    """Why a file is left out judging by its text (``generated`` or ``minified``), or ``None``."""
    if is_generated(text):
        return "generated"
    suffix = posixpath.splitext(rel)[1].lower()
    long_lines = len(text) / (text.count("\n") + 1) > MINIFIED_MEAN_LINE_CHARS
    if suffix not in PROSE_EXTENSIONS and len(text) >= MINIFIED_MIN_CHARS and long_lines:
        return "minified"
    return None


def size_skip_reason(rel: str, size: int, max_file_bytes: int) -> str | None:
    """``too_large`` or ``large_data_file`` for a file of ``size`` bytes, or ``None``."""
    if size > max_file_bytes:
        return "too_large"
    if posixpath.splitext(rel)[1].lower() in DATA_EXTENSIONS and size > DATA_FILE_MAX_BYTES:
        return "large_data_file"
    return None


def reading_key(path: str) -> tuple[int, str]:
    """Order among files that are ready at the same time: the top-level README first, then by path."""
    is_readme = "/" not in path and posixpath.splitext(path)[0].lower() == "readme"
    return (0 if is_readme else 1, path)


def _read_file(tree: Tree, rel: str, max_file_bytes: int) -> str:
    """The text of a file to keep; raises :class:`UnreadableInput` with the reason to skip it.

    The listing says what the entry is before anything is opened, so a link is never followed.
    """
    kind = tree.kind(rel)
    if kind == "symlink":
        raise UnreadableInput("symlink")
    if kind != "file":
        raise UnreadableInput("unreadable" if kind == "unreadable" else "not_regular_file")
    reason = name_skip_reason(rel) or size_skip_reason(rel, tree.entries[rel].size, max_file_bytes)
    if reason:
        raise UnreadableInput(reason)
    text = read_text(tree, rel, max_file_bytes)
    reason = content_skip_reason(rel, text)
    if reason:
        raise UnreadableInput(reason)
    return text


def scan_repo(
    tree: Tree, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES, vendored: VendoredPolicy = "read"
) -> tuple[dict[str, str], list[SkippedFile]]:
    """The kept files of a repository (relative POSIX path → text) and the skipped ones, both by path.

    Skipped folders are not read, and count the files below them. Every file of the tree is either
    kept or accounted for by one skipped entry.
    """
    kept: dict[str, str] = {}
    skipped: list[SkippedFile] = []
    for _rel_dir, dirs, files in tree.walk():
        descend = []
        for entry in dirs:
            reason = dir_skip_reason(entry.name, tree.kind(f"{entry.path}/__init__.py") == "file", vendored)
            if reason:
                skipped.append(
                    SkippedFile(display_path(entry.path) + "/", reason, count_files(tree.under(entry.path)))
                )
            else:
                descend.append(entry)
        dirs[:] = descend
        for entry in files:
            if entry.kind == "unreadable":
                skipped.append(SkippedFile(display_path(entry.path) + "/", "unreadable"))
                continue
            try:
                kept[entry.path] = _read_file(tree, entry.path, max_file_bytes)
            except UnreadableInput as err:
                reason = "symlink" if entry.kind == "symlink" else err.reason
                skipped.append(
                    SkippedFile(
                        display_path(entry.path)
                        + ("/" if reason == "symlink" and _is_dir_link(tree, entry.path) else ""),
                        reason,
                    )
                )
    return dict(sorted(kept.items())), sorted(skipped, key=lambda s: s.path)


def _is_dir_link(tree: Tree, rel: str) -> bool:
    """Whether a local symbolic link points at a folder (recorded with a trailing ``/``)."""
    return tree.folder.is_local() and os.path.isdir(tree.url(rel))


def render(order: list[str], texts: dict[str, str]) -> tuple[str, list[FileSpan]]:
    """The document text for files in ``order`` and each file's span in it."""
    parts: list[str] = []
    spans: list[FileSpan] = []
    offset = 0
    for path in order:
        if parts:
            parts.append(FILE_SEPARATOR)
            offset += len(FILE_SEPARATOR)
        content = texts[path]
        block = FILE_HEADER.format(path=path) + content + ("" if content.endswith("\n") else "\n")
        spans.append(FileSpan(path, offset, len(block)))
        parts.append(block)
        offset += len(block)
    return "".join(parts), spans


def build_repo_text(
    tree: Tree,
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
    vendored: VendoredPolicy = "read",
    drop: frozenset[str] = frozenset(),
) -> RepoDocument:
    """Read the repository in ``tree`` into one document, files in dependency order, leaving out the
    kept files named in ``drop`` (file-level duplicates of another repository's files).

    Usable without datatrove's pipeline (``Tree.of(path)``). An empty ``files`` list means the
    repository has no usable file.
    """
    texts, skipped = scan_repo(tree, max_file_bytes, vendored)
    texts = {path: text for path, text in texts.items() if path not in drop}
    deps = file_dependencies(texts, posixpath.basename(tree.top))
    text, spans = render(order_files(deps, key=reading_key), texts)
    return RepoDocument(text, spans, skipped, sum(len(d) for d in deps.values()))


class CodeRepoReader(SourceReader):
    """Reads every folder directly in the code folder as one repository (see the module docstring).

    Repositories are taken sorted by name. The document id is ``"{source}/{folder name}"``. Metadata:
    ``files`` (``path``, ``offset``, ``length`` of each kept file, in document order),
    ``skipped_files`` (``path``, ``reason``, ``files``), ``n_files``, ``n_skipped_files`` and
    ``n_import_edges`` (in-repository dependencies found); with file-level deduplication also
    ``duplicate_files`` (``path``, ``duplicate_of``: the repository keeping the file, ``of_path``,
    ``kind``). A repository with no usable file becomes a document with ``skip_reason``
    ``no_source_files``; one whose every usable file duplicates another repository's becomes a
    copy (``metadata["copy_of"]``: the repository most of them come from). A file directly in the
    code folder is not a repository and is recorded as skipped (``not_a_repository``), as are hidden
    folders and links.
    """

    name = "💻 Code repositories"

    def __init__(
        self,
        data_folder: DataFolderLike,
        source: str = "code",
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        limit: int = -1,
        vendored: VendoredPolicy = "read",
        file_decisions: str | os.PathLike | None = None,
    ) -> None:
        super().__init__(data_folder, source, limit)
        if max_file_bytes <= 0:
            raise ValueError(f"max_file_bytes must be positive, got {max_file_bytes}")
        self.max_file_bytes = max_file_bytes
        self.vendored = vendored
        self.file_decisions = file_decisions
        self._duplicates: dict[str, list[dict]] | None = None

    def units(self, entries) -> list[Unit]:
        return top_level_units(entries, lambda entry: "not_a_repository")

    def duplicates_of(self, repo_id: str) -> list[dict]:
        """This repository's files that file-level deduplication removed (empty without it)."""
        if self.file_decisions is None:
            return []
        if self._duplicates is None:
            self._duplicates = load_file_decisions(self.file_decisions)
        return self._duplicates.get(repo_id, [])

    def read_unit(self, unit: Unit, tree: Tree) -> Document:
        repo_id = self.doc_id(unit.path)
        duplicates = self.duplicates_of(repo_id)
        repo = build_repo_text(
            tree, self.max_file_bytes, self.vendored, frozenset(d["path"] for d in duplicates)
        )
        reasons = Counter(s.reason for s in repo.skipped)
        for reason, count in sorted(reasons.items()):
            self.stat_update(f"skipped_file_{reason}", value=count)
        self.stat_update("duplicate_files", value=len(duplicates))
        metadata = {
            "files": [asdict(span) for span in repo.files],
            "skipped_files": [asdict(skip) for skip in repo.skipped],
            "duplicate_files": duplicates,
            "n_files": len(repo.files),
            "n_skipped_files": len(repo.skipped),
            "n_import_edges": repo.n_import_edges,
        }
        if not repo.files and duplicates:
            origin = Counter(d["duplicate_of"] for d in duplicates).most_common(1)[0][0]
            metadata["copy_of"] = origin
            return Document(text="", id=repo_id, metadata=metadata)
        if not repo.files:
            detail = ", ".join(f"{reason}: {count}" for reason, count in sorted(reasons.items()))
            raise UnreadableInput("no_source_files", f"skipped {detail}" if detail else "no files")
        self.stat_update("repo_files", value=len(repo.files))
        return Document(text=repo.text, id=repo_id, metadata=metadata)
