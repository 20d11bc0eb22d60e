"""Static flattening of LaTeX sources: main-file detection, comment removal and include inlining.

A paper is usually a folder of ``.tex`` files. To turn it into one training document we pick the
main file, drop ``%`` comments (they hold notes, dead drafts and sometimes private remarks that
were never part of the paper) and inline ``\\input``/``\\include``/``\\subfile`` in document order,
as TeX would. Nothing is ever executed, and nothing outside the paper's folder is ever read:
every include that cannot be inlined safely is left as written and recorded as a *problem*
(a plain dict ``{"kind", "path", "detail"}``, so that it can be stored in Parquet metadata).

Problem kinds: ``missing_include``, ``include_outside`` (absolute path, ``..`` escape or a
symlink resolving outside the paper), ``include_cycle``, ``include_too_deep``,
``include_unreadable`` (binary or non-UTF-8) and ``too_many_includes`` (guard against a small
source expanding exponentially through repeated includes).

Papers are read through a :class:`~longctx.pipeline.readers.listing.Tree` (a listed folder, local
or remote); paths are ``/``-separated and relative to the tree. On a local folder, a symbolic
link whose target lies inside the paper is followed; any other link is refused.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field
from itertools import groupby
from typing import TypedDict

from longctx.pipeline.readers.base import UnreadableInput, read_text
from longctx.pipeline.readers.listing import Tree, is_hidden

MAX_INCLUDE_DEPTH = 32
MAX_INCLUDES = 2000
MAX_FILE_BYTES = 32 * 1024 * 1024
PREFERRED_MAIN_NAMES = ("main.tex", "paper.tex", "ms.tex")

# Environments whose body TeX reads verbatim: a ``%`` or ``\input`` inside them is plain text.
VERBATIM_ENVS = (
    "verbatim",
    "verbatim*",
    "Verbatim",
    "Verbatim*",
    "BVerbatim",
    "LVerbatim",
    "lstlisting",
    "minted",
)

_BEGIN_VERBATIM_RE = re.compile(r"\\begin\s*\{(" + "|".join(re.escape(env) for env in VERBATIM_ENVS) + r")\}")
_INLINE_VERBATIM_RE = re.compile(r"\\(verb\*?|lstinline)(?![A-Za-z@])")
_SPECIAL_RE = re.compile(r"[%\\]")  # where a line of code can change state: a comment, a control sequence
_DOCUMENTCLASS_RE = re.compile(r"\\documentclass(?![A-Za-z@])")
# \input{x}, \include{x}, \subfile{x}, and the primitive form ``\input x`` (name ends at a space).
_INCLUDE_RE = re.compile(
    r"\\(?P<cmd>input|include|subfile)(?![A-Za-z@])"
    r"(?:[ \t]*\n?[ \t]*\{(?P<braced>[^{}\n]*)\}|[ \t]+(?P<bare>[\w./+-]+))"
)
_BEGIN_DOCUMENT_RE = re.compile(r"\\begin\s*\{document\}")
_END_DOCUMENT_RE = re.compile(r"\\end\s*\{document\}")
_BLANK_RUN_RE = re.compile(r"\n(?:[ \t]*\n){2,}")
_LEADING_BLANK_LINES_RE = re.compile(r"\A(?:[ \t]*\n)+")


class Problem(TypedDict):
    """An include that was left as written, with why. Same keys and types in every record."""

    kind: str
    path: str
    detail: str


@dataclass(frozen=True)
class Segment:
    """A run of source text; ``verbatim`` runs are copied untouched (no comments, no includes)."""

    text: str
    verbatim: bool = False


@dataclass(frozen=True)
class MainFileChoice:
    """The main ``.tex`` file of a paper folder (relative to its tree) and the rule that picked it."""

    path: str
    # "only_candidate" | "preferred_name" | "not_included" | "first_by_path"; readers add
    # "single_file" for a paper that is one file.
    reason: str


@dataclass
class FlattenResult:
    """Flattened LaTeX text, the problems met on the way and the files inlined (relative, in order)."""

    text: str
    problems: list[Problem] = field(default_factory=list)
    included: list[str] = field(default_factory=list)


# --------------------------------------------------------------------------------------------
# Comments and verbatim
# --------------------------------------------------------------------------------------------


def _skip_inline_verbatim(line: str, start: int, options: bool) -> int:
    """Index just past a ``\\verb|...|`` / ``\\lstinline|...|`` argument beginning at ``start``.

    ``start`` points just after the command name; ``options`` says whether an optional
    ``[...]`` may come first (``\\lstinline``). Without a closing delimiter on the same line
    (TeX would report an error) the rest of the line is taken as the argument.
    """
    pos = start
    if options and line.startswith("[", pos):
        close = line.find("]", pos)
        pos = close + 1 if close >= 0 else len(line)
    if pos >= len(line):
        return len(line)
    delim = line[pos]
    closing = "}" if delim == "{" else delim
    end = line.find(closing, pos + 1)
    return len(line) if end < 0 else end + 1


def _scan_code_line(line: str) -> tuple[int | None, re.Match[str] | None]:
    """Find where a comment or a verbatim environment starts in one line of ordinary TeX code.

    Returns ``(comment_start, begin_verbatim_match)``; at most one is set, whichever comes first.
    A backslash always consumes the next character, so ``\\%`` is a literal percent while in
    ``\\\\%`` the pair ``\\\\`` is a line break and the ``%`` starts a comment.
    """
    i = 0
    while (special := _SPECIAL_RE.search(line, i)) is not None:  # other characters change nothing
        i = special.start()
        if line[i] == "%":
            return i, None
        begin = _BEGIN_VERBATIM_RE.match(line, i)
        if begin:
            return None, begin
        inline = _INLINE_VERBATIM_RE.match(line, i)
        if inline:
            i = _skip_inline_verbatim(line, inline.end(), options=inline.group(1) == "lstinline")
            continue
        i += 2
    return None, None


def _rstrip_code(code: str) -> str:
    """Drop trailing blanks before a removed comment, keeping a control space (``\\ ``) intact."""
    stripped = code.rstrip(" \t")
    backslashes = len(stripped) - len(stripped.rstrip("\\"))
    if backslashes % 2 == 1 and len(stripped) < len(code):
        return stripped + " "
    return stripped


def split_code_and_verbatim(text: str) -> list[Segment]:
    """Remove ``%`` comments from LaTeX ``text`` and split it into code and verbatim segments.

    A comment runs from an unescaped ``%`` to the end of the line. Lines that hold only a
    comment disappear with their line break; elsewhere the comment and the blanks before it go
    and the line break stays (TeX would also drop that line break; keeping it keeps prose lines
    intact and only matters inside macro definitions). Bodies of verbatim environments
    (:data:`VERBATIM_ENVS`) and ``\\verb`` arguments are kept byte for byte. A
    ``\\begin{verbatim}`` inside a comment does not open an environment.
    """
    pieces: list[tuple[bool, str]] = []  # (verbatim?, text)
    verbatim_env: str | None = None
    lines = text.split("\n")
    for index, rest in enumerate(lines):
        newline = "\n" if index < len(lines) - 1 else ""
        emitted = False  # part of this physical line is already out (so its line break must stay)
        while True:
            if verbatim_env is not None:
                marker = f"\\end{{{verbatim_env}}}"
                end = rest.find(marker)
                if end < 0:
                    pieces.append((True, rest + newline))
                    break
                end += len(marker)
                pieces.append((True, rest[:end]))
                verbatim_env, rest, emitted = None, rest[end:], True
                continue
            comment_at, begin = _scan_code_line(rest)
            if begin is not None:
                pieces.append((False, rest[: begin.end()]))
                verbatim_env, rest, emitted = begin.group(1), rest[begin.end() :], True
                continue
            if comment_at is None:
                pieces.append((False, rest + newline))
            else:
                kept = _rstrip_code(rest[:comment_at])
                if kept.strip() or emitted:
                    pieces.append((False, kept + newline))
            break
    segments = [
        Segment("".join(text for _, text in group), verbatim)
        for verbatim, group in groupby(pieces, key=lambda piece: piece[0])
    ]
    return [segment for segment in segments if segment.text]


def collapse_blank_lines(text: str) -> str:
    """Reduce runs of blank lines to one (one blank line and several mean the same to TeX)."""
    return _BLANK_RUN_RE.sub("\n\n", text)


def trim_blank_lines(text: str) -> str:
    """``text`` without leading blank lines and trailing whitespace, ending in one line break."""
    text = _LEADING_BLANK_LINES_RE.sub("", text).rstrip()
    return text + "\n" if text else ""


def join_segments(segments: list[Segment]) -> str:
    """Join segments, collapsing blank-line runs in code (runs across segment borders included)."""
    parts: list[str] = []
    pending: list[str] = []
    for segment in segments:
        if segment.verbatim:
            parts.append(collapse_blank_lines("".join(pending)))
            pending.clear()
            parts.append(segment.text)
        else:
            pending.append(segment.text)
    parts.append(collapse_blank_lines("".join(pending)))
    return "".join(parts)


def strip_comments(text: str) -> str:
    """LaTeX ``text`` without ``%`` comments, verbatim bodies untouched.

    See :func:`split_code_and_verbatim` for the exact rules.
    """
    return join_segments(split_code_and_verbatim(text))


def has_documentclass(text: str) -> bool:
    """Whether ``\\documentclass`` occurs in ``text`` outside comments and verbatim bodies."""
    return any(
        _DOCUMENTCLASS_RE.search(segment.text)
        for segment in split_code_and_verbatim(text)
        if not segment.verbatim
    )


def include_targets(code: str) -> list[str]:
    """Static include arguments (``\\input``/``\\include``/``\\subfile``) in comment-free ``code``, in order.

    Arguments built from macros or parameters (``\\input{\\jobname.aux}``, ``\\input{#1}``)
    cannot be resolved without running TeX and are not reported.
    """
    return [name for match in _INCLUDE_RE.finditer(code) if (name := _include_name(match))]


def _include_name(match: re.Match[str]) -> str:
    """The file name of an include match, or ``""`` when it is dynamic, empty or not an include.

    Only ``\\input`` has the brace-less primitive form; ``\\include x`` is not a file include.
    """
    if match.group("braced") is None:
        if match.group("cmd") != "input":
            return ""
        name = match.group("bare")
    else:
        name = match.group("braced").strip().strip('"').strip()
    if not name or "\\" in name or "#" in name:
        return ""
    return name


def subfile_body(text: str) -> str:
    """The part of a ``subfiles`` document between ``\\begin{document}`` and ``\\end{document}``.

    ``\\subfile`` inlines only that body (the preamble belongs to the stand-alone build); text
    without a document environment is returned whole.
    """
    begin = _BEGIN_DOCUMENT_RE.search(text)
    if begin is None:
        return text
    end = _END_DOCUMENT_RE.search(text, begin.end())
    return text[begin.end() : end.start() if end else len(text)].strip("\n") + "\n"


# --------------------------------------------------------------------------------------------
# Include resolution
# --------------------------------------------------------------------------------------------


def _candidate_names(name: str) -> list[str]:
    """File names TeX tries for an include argument: ``x`` -> ``x.tex`` then ``x``."""
    if posixpath.splitext(name)[1]:
        return [name, f"{name}.tex"]
    return [f"{name}.tex", name]


def resolve_include(tree: Tree, name: str, bases: list[str]) -> tuple[str | None, str]:
    """Locate include ``name`` inside ``tree`` without reading anything.

    ``bases`` are the folders tried in order (the main file's folder, as TeX's working directory,
    then the including file's folder), relative to the tree. Returns ``(path, "")`` for a regular
    file inside the tree, else ``(None, kind)`` with kind ``include_outside`` or ``missing_include``.
    """
    if name.startswith(("/", "~")) or re.match(r"^[A-Za-z]:", name):
        return None, "include_outside"
    outside = False
    for base in bases:
        for candidate in _candidate_names(name):
            rel = tree.normalize(posixpath.join(base, candidate))
            if rel is None:
                outside = True
                continue
            if tree.kind(rel) == "file":
                return rel, ""
            target, escapes = tree.follow_local(rel)
            outside = outside or escapes
            if target is not None:
                return target, ""
    return None, "include_outside" if outside else "missing_include"


@dataclass
class _Flattener:
    """State of one flattening run: the paper root, limits, problems and inlined files."""

    tree: Tree
    main_dir: str
    max_depth: int
    max_includes: int
    problems: list[Problem] = field(default_factory=list)
    included: list[str] = field(default_factory=list)

    def record(self, kind: str, path: str, detail: str) -> None:
        self.problems.append({"kind": kind, "path": path, "detail": detail})

    def expand(self, text: str, current: str, stack: tuple[str, ...]) -> list[Segment]:
        """Comment-free segments of ``text`` (the content of ``current``) with includes inlined."""
        result: list[Segment] = []
        for segment in split_code_and_verbatim(text):
            if segment.verbatim:
                result.append(segment)
                continue
            pos = 0
            for match in _INCLUDE_RE.finditer(segment.text):
                name = _include_name(match)
                if not name:
                    continue
                inlined = self.inline(match.group("cmd"), name, current, stack)
                if inlined is None:
                    continue
                result.append(Segment(segment.text[pos : match.start()]))
                result.extend(inlined)
                pos = match.end()
            result.append(Segment(segment.text[pos:]))
        return [segment for segment in result if segment.text]

    def inline(self, cmd: str, name: str, current: str, stack: tuple[str, ...]) -> list[Segment] | None:
        """Segments replacing one include command, or ``None`` to leave the command as written."""
        where = f"\\{cmd}{{{name}}} in {current}"
        if len(stack) > self.max_depth:
            self.record("include_too_deep", name, f"{where}: deeper than {self.max_depth} levels")
            return None
        target, kind = resolve_include(self.tree, name, [self.main_dir, posixpath.dirname(current)])
        if target is None:
            reason = "outside the paper folder" if kind == "include_outside" else "no such file"
            self.record(kind, name, f"{where}: {reason}")
            return None
        if target in stack:
            self.record("include_cycle", name, f"{where}: {target} is already being included")
            return None
        if len(self.included) >= self.max_includes:
            self.record("too_many_includes", name, f"{where}: more than {self.max_includes} includes")
            return None
        try:
            content = read_text(self.tree, target, max_bytes=MAX_FILE_BYTES)
        except UnreadableInput as err:
            if err.reason != "empty":
                self.record("include_unreadable", name, f"{where}: {err}")
                return None
            content = ""
        self.included.append(target)
        if cmd == "subfile":
            content = subfile_body(content)
        segments = self.expand(content, target, (*stack, target))
        return _drop_final_newline(segments)


def _drop_final_newline(segments: list[Segment]) -> list[Segment]:
    """Drop the included file's last line break: the one after the include command takes its place."""
    if segments and not segments[-1].verbatim and segments[-1].text.endswith("\n"):
        return [*segments[:-1], Segment(segments[-1].text[:-1])]
    return segments


def flatten_latex(
    tree: Tree,
    main: str,
    max_depth: int = MAX_INCLUDE_DEPTH,
    max_includes: int = MAX_INCLUDES,
) -> FlattenResult:
    """Flatten the LaTeX file ``main`` of ``tree`` into one comment-free text, never reading
    outside the tree.

    Includes are resolved against the main file's folder first (TeX's working directory), then
    against the including file's folder. Includes that cannot be inlined stay as written and are
    reported in :attr:`FlattenResult.problems`. Raises :class:`UnreadableInput` only when
    ``main`` itself cannot be read as text.
    """
    if tree.kind(main) != "file":
        raise UnreadableInput("outside_root", f"{main} is not a regular file inside {tree.url()}")
    flattener = _Flattener(
        tree=tree, main_dir=posixpath.dirname(main), max_depth=max_depth, max_includes=max_includes
    )
    segments = flattener.expand(read_text(tree, main, max_bytes=MAX_FILE_BYTES), main, (main,))
    return FlattenResult(trim_blank_lines(join_segments(segments)), flattener.problems, flattener.included)


# --------------------------------------------------------------------------------------------
# Main-file detection
# --------------------------------------------------------------------------------------------


def tex_files(tree: Tree) -> list[str]:
    """The regular ``.tex`` files of a paper outside hidden folders, shallowest first, then by path."""
    found = [
        e.path
        for e in tree.files()
        if e.kind == "file" and e.path.endswith(".tex") and not any(is_hidden(p) for p in e.path.split("/"))
    ]
    return sorted(found, key=lambda rel: (rel.count("/"), rel))


def find_main_file(tree: Tree) -> MainFileChoice | None:
    """The main ``.tex`` file of a paper folder, or ``None`` when no file has a ``\\documentclass``.

    Candidates are the regular ``.tex`` files (any depth, readable as text) with
    ``\\documentclass`` outside comments. With several, the first rule that leaves any wins:
    named ``main.tex``/``paper.tex``/``ms.tex``; not included by another candidate (stand-alone
    chapters with their own preamble are usually included by the real main file); otherwise all.
    Ties are broken by depth, then relative path, so the choice is deterministic.
    """
    candidates: dict[str, str] = {}
    for path in tex_files(tree):
        try:
            text = read_text(tree, path, max_bytes=MAX_FILE_BYTES)
        except UnreadableInput:
            continue
        if has_documentclass(text):
            candidates[path] = text
    if not candidates:
        return None
    paths = list(candidates)
    if len(paths) == 1:
        return MainFileChoice(paths[0], "only_candidate")
    preferred = [p for p in paths if posixpath.basename(p) in PREFERRED_MAIN_NAMES]
    if preferred:
        return MainFileChoice(preferred[0], "preferred_name")
    included: set[str] = set()
    for path, text in candidates.items():
        code = "".join(segment.text for segment in split_code_and_verbatim(text) if not segment.verbatim)
        for name in include_targets(code):
            target, _ = resolve_include(tree, name, [posixpath.dirname(path), ""])
            if target is not None:
                included.add(target)
    standalone = [p for p in paths if p not in included]
    if standalone and len(standalone) < len(paths):
        return MainFileChoice(standalone[0], "not_included")
    return MainFileChoice(paths[0], "first_by_path")
