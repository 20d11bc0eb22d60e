"""The README's code blocks, so that tests run the snippets users copy (holds no tests)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def code_blocks(heading: str, language: str) -> list[str]:
    """The ``language`` fenced blocks of the README section titled ``heading`` (up to the next
    heading of the same or a higher level)."""
    text = README.read_text(encoding="utf-8")
    match = re.search(rf"^(#+) {re.escape(heading)}\n", text, re.MULTILINE)
    assert match, f"README has no section {heading!r}"
    level = len(match.group(1))
    end = re.search(rf"^#{{1,{level}}} ", text[match.end() :], re.MULTILINE)
    section = text[match.end() : match.end() + end.start() if end else len(text)]
    return re.findall(rf"^```{language}\n(.*?)^```", section, re.MULTILINE | re.DOTALL)
