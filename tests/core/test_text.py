"""Counts in messages: the singular for exactly one, the plural otherwise."""

from __future__ import annotations

from longctx.core.text import plural


def test_plural() -> None:
    assert [plural(n, "row") for n in (0, 1, 2, 1234)] == ["0 rows", "1 row", "2 rows", "1,234 rows"]
    assert plural(1, "entry", "entries") == "1 entry" and plural(3, "entry", "entries") == "3 entries"
    assert plural(-1, "step") == "-1 steps"
