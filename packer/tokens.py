"""Documents to token ids with the run's ``tokenizer.json``: ``[BOS] text EOS`` for every document.

Special tokens are added here rather than by the tokenizer's post-processor, so the layout is the
same for every tokenizer a user brings, and it is recorded in each shard's header. Curation stores
each kept document's ids (without special tokens) beside its text; :func:`document_ids` reuses them
when the document's file records this tokenizer, and tokenizes the text otherwise, as curation does:
long documents in bounded parallel pieces, on the task's share of the cores (:func:`task_encoder`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from longctx.core.errors import ConfigError
from longctx.core.layout import RunLayout
from longctx.core.tokenizer import TokenizerFiles, document_specials, load_tokenizer, tokenizer_fingerprint
from longctx.packer.config import PackConfig
from longctx.packer.format import TokenizerInfo
from longctx.pipeline.documents import FILE_TOKENIZER
from longctx.pipeline.tokens import TokenEncoder, limit_tokenizer_threads, tokenizer_threads

if TYPE_CHECKING:  # an annotation only: the trainer's evaluation frames documents without datatrove
    from datatrove.data import Document


def tokenizer_info(path: Path, cfg: PackConfig) -> TokenizerInfo:
    """Fingerprint, vocabulary size and special token ids of ``path`` under ``cfg``: the configured
    special tokens, else those the tokenizer declares (:func:`~longctx.core.tokenizer.document_specials`);
    padding is the EOS token unless ``pack.pad_token`` is set. A :class:`ConfigError` naming the
    setting when a token is not in the vocabulary."""
    tokenizer = load_tokenizer(path)
    specials = document_specials(
        path, eos=cfg.eos_token, bos=cfg.bos_token, pad=cfg.pad_token, tokenizer=tokenizer
    )
    return TokenizerInfo(
        sha256=tokenizer_fingerprint(path),
        vocab_size=tokenizer.get_vocab_size(with_added_tokens=True),
        eos_id=specials.eos_id,
        bos_id=specials.bos_id,
        pad_id=specials.pad_id if cfg.pad_token is not None else specials.eos_id,
    )


def check_configured_tokenizer(configured: TokenizerFiles | None, run: RunLayout) -> None:
    """Refuse a configured ``tokenizer.path`` (``configured``: its files) other than the run's
    tokenizer, the one its documents were curated with and pack frames them with: a changed setting
    would otherwise be ignored without a word. Nothing to check without one, or before curation."""
    if configured is None or not run.tokenizer.is_file():
        return
    pairs = [(configured.tokenizer, run.tokenizer)]
    if configured.config is not None:
        pairs.append((configured.config, run.tokenizer_config))
    for mine, theirs in pairs:
        if not theirs.is_file() or tokenizer_fingerprint(mine) != tokenizer_fingerprint(theirs):
            raise ConfigError(
                f"tokenizer.path: {configured.origin} is not this run's tokenizer ({mine.name} differs from "
                f"{theirs}, with which its documents were curated); point tokenizer.path at the run's or "
                "leave it unset, or curate again with the new tokenizer"
            )


def task_encoder(path: Path, concurrent_tasks: int) -> TokenEncoder:
    """The tokenizer at ``path`` for one of ``concurrent_tasks`` pack tasks running at once: its
    threads limited to the task's share of the cores (tasks x threads never exceed them; a task
    alone keeps every core), long texts encoded in bounded pieces (:class:`TokenEncoder`). Call it
    before the process's first encode: the thread pool is sized then."""
    if concurrent_tasks > 1:
        limit_tokenizer_threads(tokenizer_threads(concurrent_tasks))
    return TokenEncoder(load_tokenizer(path))


def framed(ids: np.ndarray, info: TokenizerInfo) -> np.ndarray:
    """A document's ids (without special tokens) as int32 with BOS (when configured) and EOS, written
    once into the result (no int32 copy to concatenate)."""
    first = int(info.bos_id is not None)
    out = np.empty(len(ids) + first + 1, dtype=np.int32)
    if first:
        out[0] = info.bos_id
    out[first:-1] = ids  # the values as astype(np.int32) gives them
    out[-1] = info.eos_id
    return out


def encode_documents(encoder: TokenEncoder, texts: list[str], info: TokenizerInfo) -> list[np.ndarray]:
    """Token ids of each text, :func:`framed`."""
    return [framed(ids, info) for ids in encoder.encode(texts)]


def document_ids(
    encoder: Callable[[], TokenEncoder],
    docs: Sequence[Document],
    info: TokenizerInfo,
    retokenized: Counter[str],
) -> list[np.ndarray]:
    """Token ids of each document, :func:`framed`: the ids curation stored (``metadata["token_ids"]``)
    where the document's file records ``info``'s tokenizer, else its text encoded
    (:func:`encode_documents`). Adds to ``retokenized`` the number of documents tokenized again, by
    reason. ``encoder`` gives the tokenizer (:func:`task_encoder`); it is called only when a document
    is tokenized (loading one costs 10-30 ms)."""
    out: list[np.ndarray | None] = [None] * len(docs)
    to_encode: list[int] = []
    for i, doc in enumerate(docs):
        stored = doc.metadata.get("token_ids")
        recorded = doc.metadata.get(FILE_TOKENIZER)
        if stored is not None and recorded == info.sha256:
            out[i] = framed(stored, info)
            continue
        retokenized["no stored ids" if stored is None else "stored ids are of another tokenizer"] += 1
        to_encode.append(i)
    if to_encode:
        for i, ids in zip(to_encode, encode_documents(encoder(), [docs[i].text for i in to_encode], info)):
            out[i] = ids
    return out  # type: ignore[return-value]
