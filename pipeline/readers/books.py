"""Books: a folder (local or an fsspec URL) of plain-text files, one book per file."""

from __future__ import annotations

from datatrove.data import Document
from datatrove.io import DataFolderLike

from longctx.pipeline.readers.base import SourceReader, Unit, entry_skip_reason, read_text, suffix_of
from longctx.pipeline.readers.gutenberg import strip_gutenberg
from longctx.pipeline.readers.listing import Entry, Tree, count_files, is_hidden

BOOK_SUFFIXES = (".txt",)


class BookFolderReader(SourceReader):
    """Reads every ``.txt`` file under the folder (recursively, sorted) as one book.

    Text is decoded as UTF-8, or UTF-16/32 with a byte-order mark (other encodings are refused with
    a recorded reason, see :func:`~longctx.pipeline.readers.base.decode_text`), line endings are
    normalized to LF, and Project Gutenberg headers, footers and licence text are removed when
    ``strip_gutenberg`` is set. When the markers are there but cannot be used safely the book is
    kept whole and ``metadata["gutenberg_unsafe"]`` says why. Files over ``max_bytes`` are refused
    (``too_large``) by their listed size, before they are read.

    Every other file under the folder gets its own skipped document: symbolic links (never
    followed), hidden files, other extensions (``unsupported_extension``), FIFOs and devices; a
    hidden folder is one skipped document that accounts for every file below it.
    """

    name = "📚 Books"

    def __init__(
        self,
        data_folder: DataFolderLike,
        source: str = "books",
        strip_gutenberg: bool = True,
        max_bytes: int = 64 * 2**20,
        limit: int = -1,
    ) -> None:
        super().__init__(data_folder, source, limit)
        self.strip_gutenberg = strip_gutenberg
        self.max_bytes = max_bytes

    def units(self, entries: list[Entry]) -> list[Unit]:
        hidden_dirs: dict[str, list[Entry]] = {}
        units = []
        for entry in entries:
            parts = entry.path.split("/")
            hidden_parent = next((i for i, part in enumerate(parts[:-1]) if is_hidden(part)), None)
            if hidden_parent is not None:
                hidden_dirs.setdefault("/".join(parts[: hidden_parent + 1]), []).append(entry)
            elif entry.kind == "dir":
                if is_hidden(entry.name):
                    hidden_dirs.setdefault(entry.path, [])
            else:
                reason = entry_skip_reason(entry)
                if not reason and suffix_of(entry.name) not in BOOK_SUFFIXES:
                    reason = "unsupported_extension"
                units.append(Unit(entry.path, entry.size, 1, skip=reason))
        for path, inside in hidden_dirs.items():
            size = sum(e.size for e in inside if e.kind == "file")
            units.append(Unit(path, size, count_files(inside), is_dir=True, skip="hidden"))
        return sorted(units, key=lambda u: u.path)

    def read_unit(self, unit: Unit, tree: Tree) -> Document:
        text = read_text(tree, unit.path, max_bytes=self.max_bytes)
        metadata: dict = {"gutenberg_stripped": False, "gutenberg_removed_chars": 0, "gutenberg_unsafe": ""}
        if self.strip_gutenberg:
            text, info = strip_gutenberg(text)
            metadata["gutenberg_stripped"] = int(info["chars_removed"]) > 0
            metadata["gutenberg_removed_chars"] = int(info["chars_removed"])
            metadata["gutenberg_unsafe"] = str(info["unsafe"])
            if info["unsafe"]:
                self.stat_update("gutenberg_kept_unstripped")
        return Document(text=text, id=self.doc_id(unit.path), metadata=metadata)
