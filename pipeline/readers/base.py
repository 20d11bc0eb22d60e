"""Common base of longctx's folder readers (books, papers, code), on datatrove's disk reader.

A source folder (a local path or an fsspec URL, read through datatrove's ``DataFolder``) is listed
once (:func:`~longctx.pipeline.readers.listing.list_tree`) and turned into *units*. Every file under
the folder is accounted for by exactly one unit, and every unit becomes exactly one ``Document``:

* a unit the reader reads: a book file, a paper file or folder, a repository folder; when it
  cannot be read (binary, not decodable, empty...) its document has empty text and
  ``metadata["skip_reason"]`` (the ledger records it as ``filtered`` with that reason);
* an entry the reader does not read at all: a symbolic link (never followed), a hidden file or
  folder, a FIFO or device, a file of a kind the source does not take, a loose file directly in a
  code folder, a folder that could not be listed. Its document also has ``metadata["skipped"]``
  set and the ledger records it as ``skipped`` with the reason.

``metadata["input_files"]`` is the number of input files the unit accounts for (1 for a file, every
file below it for a folder), so the ledger's file counts add up to the files under the input.
Units are shared among tasks by size (:func:`~longctx.pipeline.readers.listing.assign_by_size`).
"""

from __future__ import annotations

import codecs
import os
import posixpath
from abc import abstractmethod
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from datatrove.data import Document, DocumentsPipeline
from datatrove.io import DataFolderLike
from datatrove.pipeline.readers.base import BaseDiskReader

from longctx.core.errors import ConfigError
from longctx.pipeline.readers.listing import (
    Entry,
    Tree,
    assign_by_size,
    count_files,
    display_path,
    is_bad_name,
    is_hidden,
    list_tree,
)


class UnreadableInput(Exception):
    """Raised by ``read_unit`` when a unit cannot become a document; ``reason`` is a short slug."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Unit:
    """One input unit: ``path`` relative to the source folder, its ``size`` in bytes (what tasks are
    balanced on), the number of input ``files`` it accounts for, and, for an entry that is not read,
    why (``skip``)."""

    path: str
    size: int
    files: int
    is_dir: bool = False
    skip: str = ""
    detail: str = ""


class SourceReader(BaseDiskReader):
    """Lists the units of a source folder, shares them among tasks by size and reads each into one
    Document (see the module docstring).

    Documents carry ``metadata["source"]``, ``metadata["path"]`` (where the unit is: an absolute
    local path or a URL), ``metadata["input_files"]`` and a stable ``id`` of the form
    ``"{source}/{path relative to the source folder}"``, the same on every machine and in every run.
    ``limit`` (>= 0) reads only the first ``limit`` units; the others are recorded as skipped
    (``over_limit``). Subclasses implement :meth:`units` and :meth:`read_unit`.
    """

    type = "📖 - READER"

    def __init__(self, data_folder: DataFolderLike | os.PathLike, source: str, limit: int = -1) -> None:
        if isinstance(data_folder, os.PathLike):
            data_folder = str(data_folder)
        super().__init__(data_folder, default_metadata={"source": source}, add_file_path=False)
        self.source = source
        self.unit_limit = limit

    @abstractmethod
    def units(self, entries: list[Entry]) -> list[Unit]:
        """The units of a listing of the source folder, sorted by path."""

    @abstractmethod
    def read_unit(self, unit: Unit, tree: Tree) -> Document:
        """Read one unit (``tree`` holds the unit's entries when it is a folder, the whole listing
        when it is a file). Raise :class:`UnreadableInput` when it cannot become a document."""

    def doc_id(self, rel: str) -> str:
        return f"{self.source}/{display_path(rel)}"

    def list_units(self) -> tuple[list[Unit], list[Entry]]:
        """The source's units (after ``limit``) and the listing they come from."""
        if not self.data_folder.isdir(""):
            raise ConfigError(
                f"{self.source}: input folder {self.data_folder.resolve_paths('')} does not exist"
            )
        entries = list_tree(self.data_folder)
        units = self.units(entries)
        if self.unit_limit >= 0:
            units = units[: self.unit_limit] + [
                Unit(
                    u.path,
                    u.size,
                    u.files,
                    u.is_dir,
                    "over_limit",
                    f"only the first {self.unit_limit} units are read",
                )
                for u in units[self.unit_limit :]
            ]
        return units, entries

    def read_file(self, filepath: str) -> DocumentsPipeline:
        """datatrove's reader contract: the document of the unit at ``filepath``."""
        units, entries = self.list_units()
        for unit in units:
            if unit.path == filepath:
                yield self.document(unit, self._tree(unit, entries))

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        if data:
            yield from data
        units, entries = self.list_units()
        owners = assign_by_size([u.size for u in units], world_size)
        by_top = _group_by_top(entries)
        root = Tree(self.data_folder, "", entries)
        for unit, owner in zip(units, owners):
            if owner != rank:
                continue
            tree = Tree(self.data_folder, unit.path, by_top.get(unit.path, [])) if unit.is_dir else root
            yield self.document(unit, tree)

    def _tree(self, unit: Unit, entries: list[Entry]) -> Tree:
        if not unit.is_dir:
            return Tree(self.data_folder, "", entries)
        return Tree(self.data_folder, unit.path, [e for e in entries if e.path.startswith(unit.path + "/")])

    def document(self, unit: Unit, tree: Tree) -> Document:
        """The document of ``unit``: read, or a placeholder with the reason it was not."""
        with self.track_time():
            if unit.skip:
                doc = Document(
                    text="", id=self.doc_id(unit.path), metadata={"skip_reason": unit.skip, "skipped": True}
                )
                if unit.detail:
                    doc.metadata["skip_detail"] = unit.detail
                self.stat_update(f"skipped_{unit.skip}")
            else:
                try:
                    doc = self.read_unit(unit, tree)
                except UnreadableInput as err:
                    doc = Document(text="", id=self.doc_id(unit.path), metadata={"skip_reason": err.reason})
                    if err.detail:
                        doc.metadata["skip_detail"] = err.detail
                    self.stat_update(f"unreadable_{err.reason}")
        doc.id = doc.id or self.doc_id(unit.path)
        doc.metadata["source"] = self.source
        doc.metadata["path"] = display_path(self.data_folder.resolve_paths(unit.path))
        doc.metadata["input_files"] = unit.files
        self.stat_update("documents")
        self.update_doc_stats(doc)
        return doc


def _group_by_top(entries: list[Entry]) -> dict[str, list[Entry]]:
    """Entries below each top-level folder, keyed by that folder's path."""
    groups: dict[str, list[Entry]] = defaultdict(list)
    for entry in entries:
        top, sep, _ = entry.path.partition("/")
        if sep:
            groups[top].append(entry)
    return groups


def entry_skip_reason(entry: Entry) -> str:
    """Why an entry is never read whatever the source (``""`` when it may be)."""
    if entry.kind == "symlink":
        return "symlink"
    if entry.kind == "other":
        return "not_regular_file"
    if entry.kind == "unreadable":
        return "unreadable"
    if is_bad_name(entry.name):
        return "bad_filename"
    if is_hidden(entry.name):
        return "hidden"
    return ""


def top_level_units(entries: list[Entry], file_reason: Callable[[Entry], str]) -> list[Unit]:
    """Units of a source whose units are the entries directly in its folder (papers, code).

    A folder is a unit with every file below it (a hidden folder is skipped as ``hidden``);
    ``file_reason`` says why a top-level file is not a unit of this source (``""``: it is one).
    """
    below = _group_by_top(entries)
    units = []
    for entry in entries:
        if "/" in entry.path:
            continue
        inside = below.get(entry.path, [])
        if entry.kind == "dir":
            size = sum(e.size for e in inside if e.kind == "file")
            reason = "hidden" if is_hidden(entry.name) else ""
            units.append(Unit(entry.path, size, count_files(inside), is_dir=True, skip=reason))
            continue
        reason = entry_skip_reason(entry) or file_reason(entry)
        units.append(Unit(entry.path, entry.size, 1, skip=reason))
    return units


# ------------------------------------------------------------------------------------ text decoding

# Longest first: the UTF-32 little-endian mark begins with the UTF-16 one.
_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)


def decode_text(raw: bytes) -> str:
    """Decode a text file's bytes: UTF-8, or UTF-8/16/32 announced by a byte-order mark (dropped).

    Raises :class:`UnreadableInput` with reason ``empty`` (nothing but whitespace), ``binary``
    (a NUL character anywhere in the text, or NUL bytes in a file that is not valid UTF-8),
    ``not_utf8`` (no byte-order mark and not UTF-8: legacy encodings are refused rather than
    guessed, so no text is ever silently mis-decoded) or ``bad_encoding`` (a byte-order mark
    followed by bytes that are not valid in its encoding). Line endings become ``\\n``.
    """
    marks = [(bom, name) for bom, name in _BOMS if raw.startswith(bom)]
    if marks:
        text = None
        for bom, name in marks:  # FF FE 00 00 may also be UTF-16 text starting with a NUL
            try:
                text = raw[len(bom) :].decode(name)
                break
            except UnicodeDecodeError as err:
                problem = (
                    f"not valid {name.upper()} after its byte-order mark ({err.reason} "
                    f"at byte {err.start + len(bom)})"
                )
        if text is None:
            raise UnreadableInput("bad_encoding", problem)
    else:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            if b"\x00" in raw:
                raise UnreadableInput("binary", f"NUL byte at offset {raw.index(0)}") from err
            raise UnreadableInput("not_utf8", str(err)) from err
    nul = text.find("\x00")
    if nul >= 0:
        raise UnreadableInput("binary", f"NUL character at offset {nul}")
    if not text.strip():
        raise UnreadableInput("empty")
    return normalize_newlines(text)


def read_text(tree: Tree, rel: str, max_bytes: int | None = None) -> str:
    """The decoded text of file ``rel`` of ``tree`` (see :func:`decode_text`); reason ``too_large``
    when it is over ``max_bytes`` (judged by its listed size before anything is read, and again by
    what was read), ``unreadable`` when it cannot be opened."""
    entry = tree.entries.get(rel)
    size = entry.size if entry else 0
    if max_bytes is not None and size > max_bytes:
        raise UnreadableInput("too_large", f"{size} bytes > {max_bytes}")
    try:
        raw = tree.read_bytes(rel, max_bytes)
    except OSError as err:
        raise UnreadableInput("unreadable", str(err)) from err
    if max_bytes is not None and len(raw) > max_bytes:
        raise UnreadableInput("too_large", f"more than {max_bytes} bytes")
    return decode_text(raw)


def read_text_file(path: Path, max_bytes: int | None = None) -> str:
    """The decoded text of one local file named by the caller (see :func:`decode_text`), for code
    outside the readers; reasons ``unreadable`` and ``too_large`` as :func:`read_text`."""
    try:
        size = os.stat(path).st_size
        if max_bytes is not None and size > max_bytes:
            raise UnreadableInput("too_large", f"{size} bytes > {max_bytes}")
        with open(path, "rb") as f:
            raw = f.read(-1 if max_bytes is None else max_bytes + 1)
    except OSError as err:
        raise UnreadableInput("unreadable", str(err)) from err
    if max_bytes is not None and len(raw) > max_bytes:
        raise UnreadableInput("too_large", f"more than {max_bytes} bytes")
    return decode_text(raw)


def normalize_newlines(text: str) -> str:
    """CRLF and lone CR to LF."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def suffix_of(name: str) -> str:
    """The lower-cased extension of a file name (``""`` when it has none)."""
    return posixpath.splitext(name)[1].lower()
