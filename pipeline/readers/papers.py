"""Reader for scientific papers: LaTeX sources (single files or folders) and Markdown/plain text.

Units, directly under the input folder (sorted, hidden entries and symlinks skipped):

* ``*.tex`` file: one paper; includes resolve against the file's folder and may not leave it;
* sub-folder: one paper; its main ``.tex`` file is found with :func:`longctx.pipeline.readers.latex.find_main_file`,
  or, for a folder without any ``.tex`` file, its main Markdown file (:func:`find_main_markdown`);
* ``*.md`` / ``*.markdown`` / ``*.txt`` file: one paper, passed through with newlines normalized.

LaTeX papers are flattened statically (comments dropped, includes inlined; nothing is executed).
Every document carries the same metadata keys with the same types:

* ``format`` (str): ``"latex"``, ``"markdown"`` or ``"text"``;
* ``main_file`` (str): the file the text comes from, relative to the unit's folder;
* ``main_choice`` (str): how it was chosen (``"single_file"``, ``"only_candidate"``,
  ``"preferred_name"``, ``"not_included"``, ``"first_by_path"``);
* ``problems`` (list of ``{"kind": str, "path": str, "detail": str}``): includes left as written;
* ``included_count`` (int): number of files inlined.
"""

from __future__ import annotations

import os
from pathlib import Path

from datatrove.data import Document

from longctx.pipeline.readers.base import SourceReader, UnreadableInput, read_text_file
from longctx.pipeline.readers.latex import (
    MAX_FILE_BYTES,
    MainFileChoice,
    Problem,
    find_main_file,
    flatten_latex,
    is_within,
)

LATEX_SUFFIXES = frozenset({".tex"})
MARKDOWN_SUFFIXES = frozenset({".md", ".markdown"})
TEXT_SUFFIXES = frozenset({".txt"})
# Stems, in order of preference, of the Markdown file that holds a Markdown-only paper folder.
PREFERRED_MARKDOWN_STEMS = ("paper", "main", "manuscript", "ms", "index", "readme")


def unit_format(path: Path) -> str | None:
    """``"latex"``, ``"markdown"`` or ``"text"`` for a paper file, ``None`` for other files."""
    suffix = path.suffix.lower()
    if suffix in LATEX_SUFFIXES:
        return "latex"
    if suffix in MARKDOWN_SUFFIXES:
        return "markdown"
    if suffix in TEXT_SUFFIXES:
        return "text"
    return None


def find_main_markdown(folder: Path) -> MainFileChoice | None:
    """The Markdown file holding a folder paper that has no LaTeX source, or ``None``.

    Only files directly in the folder count (sub-folders of a Markdown paper usually hold
    figures or notes). Preferred stems, in order: :data:`PREFERRED_MARKDOWN_STEMS` (case
    ignored); otherwise a lone Markdown file. Several unnamed Markdown files are ambiguous and
    give ``None`` rather than a guess or a concatenation of unrelated notes.
    """
    root = folder.resolve()
    files = sorted(
        path
        for path in folder.iterdir()
        if not path.name.startswith(".")
        and path.suffix.lower() in MARKDOWN_SUFFIXES
        and path.is_file()
        and is_within(path.resolve(), root)
    )
    by_stem = {path.stem.lower(): path for path in reversed(files)}
    for stem in PREFERRED_MARKDOWN_STEMS:
        if stem in by_stem:
            return MainFileChoice(by_stem[stem], "preferred_name")
    if len(files) == 1:
        return MainFileChoice(files[0], "only_candidate")
    return None


def _has_tex_file(folder: Path) -> bool:
    """Whether any non-hidden ``.tex`` file lies under ``folder`` (symlinked folders not entered)."""
    for _dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        dirnames[:] = [d for d in dirnames if not d.startswith(".")]
        if any(f.lower().endswith(".tex") and not f.startswith(".") for f in filenames):
            return True
    return False


class PaperReader(SourceReader):
    """Datatrove reader stage: one document per paper unit under ``path`` (see the module doc)."""

    name = "📄 Papers"

    def __init__(self, path: str | os.PathLike, source: str = "papers", limit: int = -1) -> None:
        super().__init__(path, source=source, limit=limit)

    def list_units(self) -> list[Path]:
        """Paper files and folders directly under the root, sorted by name."""
        units = []
        for entry in sorted(self.root.iterdir(), key=lambda p: p.name):
            if entry.name.startswith(".") or entry.is_symlink():
                continue
            if entry.is_dir() or (entry.is_file() and unit_format(entry) is not None):
                units.append(entry)
        return units

    def read_unit(self, unit: Path) -> Document:
        """Read one paper file or folder; raises :class:`UnreadableInput` when there is no paper."""
        if unit.is_dir():
            return self._read_folder(unit)
        fmt = unit_format(unit)
        if fmt == "latex":
            return self._read_latex(unit, unit.parent, MainFileChoice(unit, "single_file"))
        return self._document(unit, read_text_file(unit, max_bytes=MAX_FILE_BYTES), fmt or "text",
                              unit.name, "single_file")

    def _read_folder(self, folder: Path) -> Document:
        main = find_main_file(folder)
        if main is not None:
            return self._read_latex(folder, folder, main)
        if _has_tex_file(folder):
            raise UnreadableInput("no_main_tex", "no .tex file with \\documentclass outside comments")
        markdown = find_main_markdown(folder)
        if markdown is None:
            raise UnreadableInput("no_main_tex", "neither a main .tex file nor a main Markdown file")
        text = read_text_file(markdown.path, max_bytes=MAX_FILE_BYTES)
        return self._document(folder, text, "markdown", markdown.path.relative_to(folder).as_posix(),
                              markdown.reason)

    def _read_latex(self, unit: Path, root: Path, main: MainFileChoice) -> Document:
        result = flatten_latex(main.path, root)
        if not result.text.strip():
            raise UnreadableInput("empty", "nothing left after removing comments")
        for problem in result.problems:
            self.stat_update(f"problem_{problem['kind']}")
        main_file = main.path.relative_to(root).as_posix()
        return self._document(unit, result.text, "latex", main_file, main.reason,
                              problems=result.problems, included_count=len(result.included))

    def _document(
        self,
        unit: Path,
        text: str,
        fmt: str,
        main_file: str,
        main_choice: str,
        problems: list[Problem] | None = None,
        included_count: int = 0,
    ) -> Document:
        metadata = {
            "format": fmt,
            "main_file": main_file,
            "main_choice": main_choice,
            "problems": [dict(problem) for problem in problems or []],
            "included_count": included_count,
        }
        return Document(text=text, id=self.doc_id(unit), metadata=metadata)
