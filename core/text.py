"""Counts in messages people read: ``"1 sample"``, ``"3 samples"``, never ``"1 samples"``."""

from __future__ import annotations


def plural(count: int, noun: str, many: str | None = None) -> str:
    """``count`` (with thousands separators) and ``noun``, in the plural (``many``, default ``noun``
    + "s") unless the count is exactly 1."""
    return f"{count:,} {noun if count == 1 else many or noun + 's'}"
