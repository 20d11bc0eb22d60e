"""Books: a folder of plain-text files, one book per file."""

from __future__ import annotations

import os
from pathlib import Path

from datatrove.data import Document

from longctx.pipeline.readers.base import SourceReader, read_text_file, walk_files
from longctx.pipeline.readers.gutenberg import strip_gutenberg

BOOK_SUFFIXES = (".txt",)


class BookFolderReader(SourceReader):
    """Reads every ``.txt`` file under ``path`` (recursively, sorted, no symlinks) as one book.

    Text is decoded as UTF-8 (a BOM is dropped; other encodings are refused with a recorded reason),
    line endings are normalized to LF, and Project Gutenberg headers, footers and licence text are
    removed when ``strip_gutenberg`` is set. Files over ``max_bytes`` are refused (``too_large``)
    rather than read whole into memory.
    """

    name = "📚 Books"

    def __init__(
        self,
        path: str | os.PathLike,
        source: str = "books",
        strip_gutenberg: bool = True,
        max_bytes: int = 64 * 2**20,
        limit: int = -1,
    ) -> None:
        super().__init__(path, source, limit)
        self.strip_gutenberg = strip_gutenberg
        self.max_bytes = max_bytes

    def list_units(self) -> list[Path]:
        return walk_files(self.root, BOOK_SUFFIXES)

    def read_unit(self, unit: Path) -> Document:
        text = read_text_file(unit, max_bytes=self.max_bytes)
        metadata: dict = {"gutenberg_stripped": False, "gutenberg_removed_chars": 0}
        if self.strip_gutenberg:
            text, info = strip_gutenberg(text)
            metadata["gutenberg_stripped"] = int(info["chars_removed"]) > 0
            metadata["gutenberg_removed_chars"] = int(info["chars_removed"])
        return Document(text=text, id=self.doc_id(unit), metadata=metadata)
