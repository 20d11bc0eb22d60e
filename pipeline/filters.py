"""Filters of the curation pipeline. Each drops documents with a reason that the ledger records."""

from __future__ import annotations

import os
from pathlib import Path

from datatrove.data import Document
from datatrove.pipeline.filters.base_filter import BaseFilter
from datatrove.pipeline.writers.disk_base import DiskWriter

from longctx.core.tokenizer import load_tokenizer
from longctx.pipeline.tokens import TokenEncoder, limit_tokenizer_threads, tokenizer_threads


class ReadableFilter(BaseFilter):
    """Drops the placeholder documents that readers emit for inputs they could not read
    (binary, not UTF-8, empty, no main .tex file, ...); the reason is the reader's."""

    name = "🚫 Unreadable"

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        reason = doc.metadata.get("skip_reason")
        return (False, str(reason)) if reason else True


class TokenLengthFilter(BaseFilter):
    """Tokenizes documents with the run's tokenizer and keeps those within their source's bounds.

    ``bounds`` maps a source name to ``(min_tokens, max_tokens)`` (``max_tokens`` may be None).
    The count is stored as ``metadata["token_count"]`` for every document, dropped or kept; a kept
    document also carries its ids (uint32, no special tokens) as ``metadata["token_ids"]``, which the
    document writer stores beside the text so that nothing tokenizes it again. Long documents are
    encoded in parallel pieces (:class:`~longctx.pipeline.tokens.TokenEncoder`), on the cores of
    this task's process divided by ``concurrent_tasks`` (the tasks that run at once beside it).
    """

    name = "📏 Token length"

    def __init__(
        self,
        tokenizer_path: str | os.PathLike,
        bounds: dict[str, tuple[int, int | None]],
        exclusion_writer: DiskWriter | None = None,
        batch_size: int = 16,
        concurrent_tasks: int = 1,
    ) -> None:
        super().__init__(exclusion_writer=exclusion_writer, batch_size=batch_size)
        self.tokenizer_path = Path(tokenizer_path)
        self.bounds = dict(bounds)
        self.concurrent_tasks = concurrent_tasks
        self._encoder: TokenEncoder | None = None

    def filter(self, doc: Document) -> bool | tuple[bool, str]:
        return self.filter_batch([doc])[0]

    def filter_batch(self, batch: list[Document]) -> list[bool | tuple[bool, str]]:
        if self._encoder is None:
            if self.concurrent_tasks > 1:  # alone, a task keeps the tokenizer's default: every core it has
                limit_tokenizer_threads(tokenizer_threads(self.concurrent_tasks))
            self._encoder = TokenEncoder(load_tokenizer(self.tokenizer_path))
        results: list[bool | tuple[bool, str]] = []
        for doc, ids in zip(batch, self._encoder.encode([doc.text for doc in batch])):
            n_tokens = len(ids)
            doc.metadata["token_count"] = n_tokens
            self.stat_update("tokens", value=n_tokens)
            low, high = self.bounds[doc.metadata["source"]]
            if n_tokens < low:
                results.append((False, "too_short"))
            elif high is not None and n_tokens > high:
                results.append((False, "too_long"))
            else:
                doc.metadata["token_ids"] = ids
                results.append(True)
        return results
