"""Reader for scientific papers: LaTeX sources (single files or folders) and Markdown/plain text.

Units, directly under the input folder (a local path or an fsspec URL), sorted; hidden entries,
symbolic links and other files are recorded as skipped units:

* ``*.tex`` file: one paper; includes resolve against the file's folder and may not leave it;
* sub-folder: one paper; its main ``.tex`` file is found with
  :func:`longctx.pipeline.readers.latex.find_main_file`, or, for a folder without any ``.tex`` file, its main
  Markdown file (:func:`find_main_markdown`); the folder's other files (figures, bibliographies) are accounted
  for by the paper's unit;
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

from datatrove.data import Document
from datatrove.io import DataFolderLike

from longctx.pipeline.readers.base import (
    SourceReader,
    Unit,
    UnreadableInput,
    read_text,
    suffix_of,
    top_level_units,
)
from longctx.pipeline.readers.latex import (
    MAX_FILE_BYTES,
    MainFileChoice,
    Problem,
    find_main_file,
    flatten_latex,
    tex_files,
)
from longctx.pipeline.readers.listing import Entry, Tree

LATEX_SUFFIXES = frozenset({".tex"})
MARKDOWN_SUFFIXES = frozenset({".md", ".markdown"})
TEXT_SUFFIXES = frozenset({".txt"})
# Stems, in order of preference, of the Markdown file that holds a Markdown-only paper folder.
PREFERRED_MARKDOWN_STEMS = ("paper", "main", "manuscript", "ms", "index", "readme")


def unit_format(name: str) -> str | None:
    """``"latex"``, ``"markdown"`` or ``"text"`` for a paper file name, ``None`` for other files."""
    suffix = suffix_of(name)
    if suffix in LATEX_SUFFIXES:
        return "latex"
    if suffix in MARKDOWN_SUFFIXES:
        return "markdown"
    if suffix in TEXT_SUFFIXES:
        return "text"
    return None


def find_main_markdown(tree: Tree) -> MainFileChoice | None:
    """The Markdown file holding a folder paper that has no LaTeX source, or ``None``.

    Only regular files directly in the folder count (sub-folders of a Markdown paper usually hold
    figures or notes). Preferred stems, in order: :data:`PREFERRED_MARKDOWN_STEMS` (case
    ignored); otherwise a lone Markdown file. Several unnamed Markdown files are ambiguous and
    give ``None`` rather than a guess or a concatenation of unrelated notes.
    """
    files = sorted(
        e.path
        for e in tree.files()
        if e.kind == "file"
        and "/" not in e.path
        and not e.path.startswith(".")
        and suffix_of(e.path) in MARKDOWN_SUFFIXES
    )
    by_stem = {name.rsplit(".", 1)[0].lower(): name for name in reversed(files)}
    for stem in PREFERRED_MARKDOWN_STEMS:
        if stem in by_stem:
            return MainFileChoice(by_stem[stem], "preferred_name")
    if len(files) == 1:
        return MainFileChoice(files[0], "only_candidate")
    return None


class PaperReader(SourceReader):
    """Datatrove reader stage: one document per paper unit of the folder (see the module doc).

    A folder unit accounts for every file below it; a top-level file that is not a paper
    (``figure.pdf``) is recorded as skipped (``unsupported_extension``).
    """

    name = "📄 Papers"

    def __init__(self, data_folder: DataFolderLike, source: str = "papers", limit: int = -1) -> None:
        super().__init__(data_folder, source=source, limit=limit)

    def units(self, entries: list[Entry]) -> list[Unit]:
        return top_level_units(entries, lambda e: "" if unit_format(e.name) else "unsupported_extension")

    def read_unit(self, unit: Unit, tree: Tree) -> Document:
        """Read one paper file or folder; raises :class:`UnreadableInput` when there is no paper."""
        if unit.is_dir:
            return self._read_folder(unit, tree)
        fmt = unit_format(unit.path)
        if fmt == "latex":
            return self._read_latex(unit, tree, MainFileChoice(unit.path, "single_file"))
        text = read_text(tree, unit.path, max_bytes=MAX_FILE_BYTES)
        return self._document(unit, text, fmt or "text", unit.path, "single_file")

    def _read_folder(self, unit: Unit, tree: Tree) -> Document:
        main = find_main_file(tree)
        if main is not None:
            return self._read_latex(unit, tree, main)
        if tex_files(tree):
            raise UnreadableInput("no_main_tex", "no .tex file with \\documentclass outside comments")
        markdown = find_main_markdown(tree)
        if markdown is None:
            raise UnreadableInput("no_main_tex", "neither a main .tex file nor a main Markdown file")
        text = read_text(tree, markdown.path, max_bytes=MAX_FILE_BYTES)
        return self._document(unit, text, "markdown", markdown.path, markdown.reason)

    def _read_latex(self, unit: Unit, tree: Tree, main: MainFileChoice) -> Document:
        result = flatten_latex(tree, main.path)
        if not result.text.strip():
            raise UnreadableInput("empty", "nothing left after removing comments")
        for problem in result.problems:
            self.stat_update(f"problem_{problem['kind']}")
        return self._document(
            unit,
            result.text,
            "latex",
            main.path,
            main.reason,
            problems=result.problems,
            included_count=len(result.included),
        )

    def _document(
        self,
        unit: Unit,
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
        return Document(text=text, id=self.doc_id(unit.path), metadata=metadata)
