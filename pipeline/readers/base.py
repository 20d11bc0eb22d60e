"""Common base for longctx's source readers.

Every input *unit* (a book file, a paper folder or file, a repository folder) becomes exactly one
``Document``, even when it cannot be read: such a document has empty text and
``metadata["skip_reason"]`` set, and the curation pipeline's ledger records it as filtered with that
reason. Nothing is dropped silently.
"""

from __future__ import annotations

import os
from abc import abstractmethod
from pathlib import Path

from datatrove.data import Document, DocumentsPipeline
from datatrove.pipeline.base import PipelineStep


class UnreadableInput(Exception):
    """Raised by ``read_unit`` when a unit cannot become a document; ``reason`` is a short slug."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason
        self.detail = detail


class SourceReader(PipelineStep):
    """Lists the units under ``path``, shards them by task rank and reads each into one Document.

    Documents carry ``metadata["source"]`` (the source name), ``metadata["path"]`` (the origin path)
    and a stable ``id`` of the form ``"{source}/{path relative to the source root}"``, so the same
    input gets the same id on every machine and in every run.

    Subclasses implement :meth:`list_units` and :meth:`read_unit`.
    """

    type = "📖 - READER"

    def __init__(self, path: str | os.PathLike, source: str, limit: int = -1) -> None:
        super().__init__()
        self.root = Path(path)
        self.source = source
        self.limit = limit

    @abstractmethod
    def list_units(self) -> list[Path]:
        """All units under ``self.root``, in a deterministic (sorted) order."""

    @abstractmethod
    def read_unit(self, unit: Path) -> Document:
        """Read one unit. Raise :class:`UnreadableInput` when it cannot be turned into a document."""

    def doc_id(self, unit: Path) -> str:
        """Stable id: the source name and the unit's path relative to the source root."""
        try:
            rel = unit.relative_to(self.root).as_posix()
        except ValueError:
            rel = unit.name
        return f"{self.source}/{rel}" if rel not in ("", ".") else f"{self.source}/{unit.name}"

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        if data:
            yield from data
        if not self.root.exists():
            raise FileNotFoundError(f"{self.source}: input path {self.root} does not exist")
        units = self.list_units()
        if self.limit >= 0:
            units = units[: self.limit]
        for unit in units[rank::world_size]:
            with self.track_time():
                try:
                    doc = self.read_unit(unit)
                except UnreadableInput as err:
                    doc = Document(text="", id=self.doc_id(unit), metadata={"skip_reason": err.reason})
                    if err.detail:
                        doc.metadata["skip_detail"] = err.detail
                    self.stat_update(f"unreadable_{err.reason}")
            doc.id = doc.id or self.doc_id(unit)
            doc.metadata["source"] = self.source
            doc.metadata.setdefault("path", str(unit))
            self.stat_update("documents")
            self.update_doc_stats(doc)
            yield doc


def read_text_file(path: Path, max_bytes: int | None = None) -> str:
    """Read a text file as UTF-8 (BOM removed), refusing binary and non-UTF-8 content.

    Raises :class:`UnreadableInput` with reason ``empty``, ``too_large``, ``binary`` or
    ``not_utf8``. Latin-1 or other legacy encodings are refused rather than guessed, so no text
    is ever silently mis-decoded.
    """
    try:
        size = path.stat().st_size
    except OSError as err:
        raise UnreadableInput("unreadable", str(err)) from err
    if max_bytes is not None and size > max_bytes:
        raise UnreadableInput("too_large", f"{size} bytes > {max_bytes}")
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise UnreadableInput("unreadable", str(err)) from err
    if not raw.strip():
        raise UnreadableInput("empty")
    if b"\x00" in raw[:8192]:
        raise UnreadableInput("binary", "NUL byte in the first 8 KiB")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise UnreadableInput("not_utf8", str(err)) from err
    return normalize_newlines(text)


def normalize_newlines(text: str) -> str:
    """CRLF and lone CR to LF."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def walk_files(root: Path, suffixes: tuple[str, ...]) -> list[Path]:
    """Regular files under ``root`` with one of ``suffixes``, sorted, never through a symlink.

    Symlinked files and folders are left out altogether, so nothing outside ``root`` is reached.
    Hidden files and folders (name starting with a dot) are left out too.
    """
    found: list[Path] = []
    for folder, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and not os.path.islink(os.path.join(folder, d)))
        for name in filenames:
            path = Path(folder, name)
            if name.startswith(".") or path.is_symlink() or not name.lower().endswith(suffixes):
                continue
            found.append(path)
    return sorted(found)
