"""The code blocks of the README and the documentation pages, so that tests run the snippets users
copy (holds no tests; ``tests/docs/test_code_blocks.py`` checks that every block is run somewhere or
marked with what it needs)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"


def pages() -> list[Path]:
    """Every page whose blocks are checked: the README, CONTRIBUTING, ``docs/*.md`` and the shard
    format that ships with the packer."""
    return [
        README,
        REPO / "CONTRIBUTING.md",
        *sorted((REPO / "docs").glob("*.md")),
        REPO / "packer" / "FORMAT.md",
    ]


@dataclass(frozen=True)
class Block:
    """One fenced block: its page, the line of its opening fence, its language and code, and the
    marker comment right above it (``needs: ...`` or ``tested-by: ...``; empty when there is none)."""

    page: Path
    line: int
    language: str
    code: str
    marker: str

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


_FENCE = re.compile(r"^```([^\n`]*)\n(.*?)^```[ \t]*$", re.MULTILINE | re.DOTALL)
_MARKER = re.compile(r"<!--\s*(.*?)\s*-->\s*\Z", re.DOTALL)


def blocks(page: Path, text: str | None = None) -> list[Block]:
    """The fenced blocks of ``page`` (or of ``text``, read as that page), in order."""
    text = page.read_text(encoding="utf-8") if text is None else text
    found = []
    for match in _FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n")
        last_paragraph = before.rsplit("\n\n", 1)[-1]
        marker = _MARKER.search(last_paragraph)
        found.append(
            Block(
                page,
                text.count("\n", 0, match.start()) + 1,
                match.group(1).strip(),
                match.group(2),
                marker.group(1) if marker else "",
            )
        )
    return found


def section(text: str, heading: str) -> str | None:
    """The text of the section titled ``heading`` (up to the next heading of the same or a higher
    level), or None."""
    match = re.search(rf"^(#+) {re.escape(heading)}\n", text, re.MULTILINE)
    if not match:
        return None
    level = len(match.group(1))
    end = re.search(rf"^#{{1,{level}}} ", text[match.end() :], re.MULTILINE)
    return text[match.end() : match.end() + end.start() if end else len(text)]


def code_blocks(heading: str, language: str) -> list[str]:
    """The ``language`` fenced blocks of the section titled ``heading``, in whichever page holds it
    (the heading must be unique across the README and the docs)."""
    found = [(page, part) for page in pages() if (part := section(page.read_text("utf-8"), heading))]
    assert len(found) == 1, f"section {heading!r} found in {[str(p) for p, _ in found] or 'no page'}"
    page, part = found[0]
    return [b.code for b in blocks(page, part) if b.language == language]
