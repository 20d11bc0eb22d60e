"""Documents to token ids with the run's ``tokenizer.json``: ``[BOS] text EOS`` for every document.

Special tokens are added here rather than by the tokenizer's post-processor, so the layout is the
same for every tokenizer a user brings, and it is recorded in each shard's header.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from longctx.core.tokenizer import document_specials, load_tokenizer, tokenizer_fingerprint
from longctx.packer.config import PackConfig
from longctx.packer.format import TokenizerInfo


def tokenizer_info(path: Path, cfg: PackConfig) -> TokenizerInfo:
    """Fingerprint, vocabulary size and special token ids of ``path`` under ``cfg``: the configured
    special tokens, else those the tokenizer declares (:func:`~longctx.core.tokenizer.document_specials`);
    padding is the EOS token unless ``pack.pad_token`` is set. A :class:`ConfigError` naming the
    setting when a token is not in the vocabulary."""
    tokenizer = load_tokenizer(path)
    specials = document_specials(path, eos=cfg.eos_token, bos=cfg.bos_token, pad=cfg.pad_token)
    return TokenizerInfo(
        sha256=tokenizer_fingerprint(path),
        vocab_size=tokenizer.get_vocab_size(with_added_tokens=True),
        eos_id=specials.eos_id,
        bos_id=specials.bos_id,
        pad_id=specials.pad_id if cfg.pad_token is not None else specials.eos_id,
    )


def encode_documents(tokenizer: Tokenizer, texts: list[str], info: TokenizerInfo) -> list[np.ndarray]:
    """Token ids (int32) of each text with BOS (when configured) and EOS, encoded in one parallel batch."""
    prefix = [info.bos_id] if info.bos_id is not None else []
    return [
        np.array(prefix + encoding.ids + [info.eos_id], dtype=np.int32)
        for encoding in tokenizer.encode_batch_fast(texts, add_special_tokens=False)
    ]
