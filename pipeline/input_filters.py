"""Filters that settle, before anything is tokenized, the units a reader did not turn into text:
entries it never read (``skipped`` in the ledger) and repositories whose every file is a copy of
another repository's files (``duplicate`` of that repository). Units that were read but could not
be decoded are :class:`~longctx.pipeline.filters.ReadableFilter`'s."""

from __future__ import annotations

from datatrove.data import Document
from datatrove.pipeline.filters.base_filter import BaseFilter


class SkippedInputFilter(BaseFilter):
    """Drops the placeholder documents of entries the reader did not read (a symbolic link, a
    hidden file, a file of another kind...); the reason is the reader's."""

    name = "⏭️ Skipped inputs"

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        if doc.metadata.get("skipped"):
            return False, str(doc.metadata.get("skip_reason", "skipped"))
        return True


class RepositoryCopyFilter(BaseFilter):
    """Drops a repository left with nothing of its own once file-level deduplication removed the
    files another repository has; ``duplicate_of`` names the repository most of them come from."""

    name = "🪞 Repository copies"

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        origin = doc.metadata.get("copy_of")
        if not origin:
            return True
        doc.metadata["duplicate_of"] = origin
        return False, "repository_copy"
