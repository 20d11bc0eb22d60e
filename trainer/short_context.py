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
makes the windows held out; packed shards name each segment's document (``doc_id``).

**The loss.** Each window is run alone (one segment, positions from 0); its loss is the
cross-entropy of tokens ``1 .. n-1`` given the tokens before them in the window; the model's loss
is the token-weighted mean over all windows.
"""

from __future__ import annotations

import random
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer

from longctx.core.errors import ConfigError
from longctx.packer.format import TokenizerInfo
from longctx.packer.tokens import framed
from longctx.pipeline.documents import document_files, read_column, source_of
from longctx.trainer.metrics import token_losses
from longctx.trainer.model import Transformer


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


def source_documents(
    documents: Path, source: str, tokenizer: Tokenizer, info: TokenizerInfo
) -> list[tuple[str, np.ndarray]]:
    """``(id, framed token ids)`` of every curated document of ``source`` under ``documents``, in
    file order. ``ConfigError`` naming the source when it has no documents."""
    files = [f for f in document_files(documents) if source_of(documents, f) == source]
    pairs: list[tuple[str, np.ndarray]] = []
    for file in files:
        ids = read_column(file, "id").to_pylist()
        texts = read_column(file, "text").to_pylist()
        encoded = tokenizer.encode_batch(texts, add_special_tokens=False)
        pairs += [(i, framed(np.asarray(e.ids), info)) for i, e in zip(ids, encoded)]
    if not pairs:
        raise ConfigError(
            f"eval.short_context.source: no curated documents of source {source!r} under {documents}"
        )
    return pairs


@torch.no_grad()
def window_loss(
    model: Transformer, windows: Sequence[ShortWindow], device: torch.device, bf16: bool = False
) -> dict[str, Any]:
    """``model``'s mean next-token loss over ``windows`` (token-weighted): ``{"mean_loss",
    "tokens", "windows"}``; ``mean_loss`` is None when no window has a token to predict."""
    model.eval()
    total, tokens = 0.0, 0
    for window in windows:
        ids = torch.tensor(window.ids, device=device)
        n = ids.numel()
        positions = torch.arange(n, device=device)
        labels = torch.cat([ids[1:], ids.new_full((1,), -100)])
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
            hidden = model(ids, positions, positions, torch.zeros_like(positions), rope_seq_len=n)
        total += float(token_losses(model, hidden, labels).double().sum())
        tokens += n - 1
    return {"mean_loss": total / tokens if tokens else None, "tokens": tokens, "windows": len(windows)}


def loss_ratios(losses: Mapping[str, float | None], baseline: str) -> dict[str, float | None]:
    """Each model's loss divided by ``baseline``'s (None where a loss is None). ``ValueError`` when
    the baseline model has no loss."""
    reference = losses.get(baseline)
    if reference is None:
        models = ", ".join(losses) or "none"
        raise ValueError(f"the baseline model {baseline!r} has no short-window loss (models: {models})")
    return {label: (loss / reference if loss is not None else None) for label, loss in losses.items()}
