"""The short-context guard: does a long-context model still do what it did at its original length?

Long-only training mixes are known to regress short-context skills; the guard measures it as each
model's mean next-token loss on short windows of real text, and that loss's ratio to the baseline
model's (``eval.baseline``: the model training starts from). A ratio near 1 means short-context
quality held; above 1, it regressed.

**Where the windows come from.** The curated documents of one source (``eval.short_context.source``,
by default the short ``anchor`` source that mixes keep for this very reason), tokenized with the
run's tokenizer and framed as the packer frames documents (``[BOS] text EOS``,
``longctx.packer.tokens.framed``). Each document is cut into windows that start at multiples of
``length`` (default ``context.original``): a window never crosses documents, its first token sits
at position 0 as a pretraining window's would, and a document shorter than ``length`` is one window
(a trailing piece of one token, which has nothing to predict, is dropped). ``count`` windows are
drawn without replacement by ``seed`` from all of them, ordered by (document id, start), so the
draw does not depend on the order the documents are read in. Documents whose ids are in
``exclude`` (those that training windows hold, when the caller knows them) are left out, which
makes the windows held out; packed shards name each segment's document (``doc_id``), and
:func:`trained_documents` collects them from the rows training reads (every row but the held-out
ones, ``train.holdout_rows``) of every shard folder a run trains on. :func:`guard_windows` puts the
two together, and refuses (:class:`NoHeldOutDocuments`) when no document of the source is left.

**The loss.** Each window is run alone (one segment, positions from 0); its loss is the
cross-entropy of tokens ``1 .. n-1`` given the tokens before them in the window; the model's loss
is the token-weighted mean over all windows.
"""

from __future__ import annotations

import os
import random
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tokenizers import Tokenizer

from longctx.core.errors import ConfigError
from longctx.packer.dataset import PackedDataset
from longctx.packer.format import TokenizerInfo
from longctx.packer.reader import ShardSet
from longctx.packer.tokens import framed
from longctx.pipeline.documents import document_files, read_column, source_of
from longctx.trainer.config import ShortContextConfig
from longctx.trainer.metrics import token_losses

if TYPE_CHECKING:
    from longctx.trainer.models.interface import TrainedModel


@dataclass(frozen=True)
class ShortWindow:
    """Tokens ``ids`` of document ``doc_id`` from token ``start`` on (ids framed with BOS/EOS)."""

    doc_id: str
    start: int
    ids: tuple[int, ...]


def short_windows(
    documents: Iterable[tuple[str, Sequence[int]]],
    length: int,
    count: int,
    seed: int,
    exclude: Collection[str] = (),
) -> list[ShortWindow]:
    """``count`` windows of at most ``length`` tokens from ``(document id, token ids)`` pairs (see
    the module docstring), ordered by (document id, start); fewer when there are fewer. ``ValueError``
    for a length below 2, a negative count or a document id given twice."""
    if length < 2 or count < 0:
        raise ValueError(f"windows need length >= 2 and count >= 0, got length={length}, count={count}")
    docs: dict[str, Sequence[int]] = {}
    for doc_id, ids in documents:
        if doc_id in docs:
            raise ValueError(f"document {doc_id!r} is given twice")
        if doc_id not in exclude:
            docs[doc_id] = ids
    places = [
        (doc_id, start)
        for doc_id in sorted(docs)
        for start in range(0, len(docs[doc_id]), length)
        if len(docs[doc_id]) - start >= 2
    ]
    chosen = sorted(random.Random(seed).sample(range(len(places)), min(count, len(places))))
    return [
        ShortWindow(doc_id, start, tuple(int(i) for i in docs[doc_id][start : start + length]))
        for doc_id, start in (places[k] for k in chosen)
    ]


class NoHeldOutDocuments(ConfigError):
    """Every curated document of the guard's source is in the training windows: no window would be
    held out."""


def source_documents(
    documents: Path, source: str, tokenizer: Tokenizer, info: TokenizerInfo, exclude: Collection[str] = ()
) -> list[tuple[str, np.ndarray]]:
    """``(id, framed token ids)`` of every curated document of ``source`` under ``documents``, in
    file order, but those in ``exclude`` (not even tokenized). ``ConfigError`` naming the source
    when it has no documents (before exclusion)."""
    files = [f for f in document_files(documents) if source_of(documents, f) == source]
    pairs: list[tuple[str, np.ndarray]] = []
    found = 0
    for file in files:
        ids = read_column(file, "id").to_pylist()
        found += len(ids)
        kept = [k for k, i in enumerate(ids) if i not in exclude]
        if not kept:
            continue
        texts = read_column(file, "text").take(kept).to_pylist()
        encoded = tokenizer.encode_batch(texts, add_special_tokens=False)
        pairs += [(ids[k], framed(np.asarray(e.ids), info)) for k, e in zip(kept, encoded)]
    if not found:
        raise ConfigError(
            f"eval.short_context.source: no curated documents of source {source!r} under {documents}"
        )
    return pairs


def _row_documents(shards: ShardSet, rows: Sequence[int]) -> set[str]:
    """The document ids (``doc_id``) of the segments of ``rows`` (global indices, ascending)."""
    found: set[str] = set()
    wanted = np.asarray(rows, dtype=np.int64)
    start = 0
    for index, entry in enumerate(shards.manifest.shards):
        end = start + entry.rows
        local = wanted[(wanted >= start) & (wanted < end)] - start
        if len(local):
            column = shards.shard(index).table.column("doc_id").to_pylist()
            for row in local.tolist():
                found.update(doc for doc in column[row] if doc is not None)
        start = end
    return found


def trained_documents(
    folders: Iterable[str | os.PathLike],
    *,
    tokenizer: Path | None,
    seed: int,
    holdout_rows: int,
    cache: Path | None = None,
    storage_options: Mapping[str, Any] | None = None,
) -> set[str]:
    """Ids of the documents in the rows training reads from the shard ``folders``: all rows but the
    ``holdout_rows`` drawn by ``seed`` (``train.holdout_rows``, ``train.seed``), from each row's
    ``doc_id`` provenance."""
    found: set[str] = set()
    for folder in folders:
        dataset = PackedDataset(
            folder,
            tokenizer=tokenizer,
            seed=seed,
            holdout_rows=holdout_rows,
            cache=cache,
            storage_options=storage_options,
        )
        found |= _row_documents(dataset.shards, dataset.training_rows())
    return found


@dataclass(frozen=True)
class GuardWindows:
    """The guard's windows and where they come from: ``documents`` of ``source`` were curated,
    ``excluded`` of them are in training windows (None: not checked, no training shards known)."""

    source: str
    length: int
    windows: list[ShortWindow]
    documents: int
    excluded: int | None

    def as_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "length": self.length,
            "windows": len(self.windows),
            "documents": self.documents,
            "excluded_as_trained": self.excluded,
            "held_out": self.excluded is not None,
            "window_documents": [[w.doc_id, w.start] for w in self.windows],
        }


def guard_windows(
    config: ShortContextConfig,
    length: int,
    documents: Path,
    tokenizer: Tokenizer,
    info: TokenizerInfo,
    trained: Collection[str] | None,
) -> GuardWindows:
    """``config.windows`` windows of ``length`` tokens from the documents of ``config.source`` that
    are not in ``trained`` (the documents training windows hold; None: unknown, nothing excluded).
    :class:`NoHeldOutDocuments` when every document is excluded, saying what to do."""
    curated = [
        doc
        for f in document_files(documents)
        if source_of(documents, f) == config.source
        for doc in read_column(f, "id").to_pylist()
    ]
    excluded = [doc for doc in curated if doc in trained] if trained is not None else []
    if curated and len(excluded) == len(curated):
        raise NoHeldOutDocuments(
            f"eval.short_context: all {len(curated)} curated documents of source {config.source!r} are in "
            "the training windows, so no short window would be held out; set eval.short_context.source to a "
            "source that pack.mix uses only part of, or curate held-out documents as a source of their own "
            "and give it fraction 0 in pack.mix"
        )
    kept = source_documents(documents, config.source, tokenizer, info, exclude=set(excluded))
    windows = short_windows(kept, length, config.windows, config.seed)
    return GuardWindows(
        config.source, length, windows, len(curated), len(excluded) if trained is not None else None
    )


@torch.no_grad()
def window_loss(
    model: TrainedModel, windows: Iterable[ShortWindow], device: torch.device, bf16: bool = False
) -> dict[str, Any]:
    """``model``'s mean next-token loss over ``windows`` (token-weighted): ``{"mean_loss",
    "tokens", "windows"}``; ``mean_loss`` is None when no window has a token to predict."""
    model.eval()
    total, tokens, count = 0.0, 0, 0
    for window in windows:
        count += 1
        ids = torch.tensor(window.ids, device=device)
        n = ids.numel()
        positions = torch.arange(n, device=device)
        labels = torch.cat([ids[1:], ids.new_full((1,), -100)])
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            hidden = model(ids, positions, positions, torch.zeros_like(positions), rope_seq_len=n)
        total += float(token_losses(model, hidden, labels).double().sum())
        tokens += n - 1
    return {"mean_loss": total / tokens if tokens else None, "tokens": tokens, "windows": count}


def loss_ratios(losses: Mapping[str, float | None], baseline: str) -> dict[str, float | None]:
    """Each model's loss divided by ``baseline``'s (None where a loss is None). ``ValueError`` when
    the baseline model has no loss."""
    reference = losses.get(baseline)
    if reference is None:
        models = ", ".join(losses) or "none"
        raise ValueError(f"the baseline model {baseline!r} has no short-window loss (models: {models})")
    return {label: (loss / reference if loss is not None else None) for label, loss in losses.items()}
