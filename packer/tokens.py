"""Documents to token ids with the run's ``tokenizer.json``: ``[BOS] text EOS`` for every document.

Special tokens are added here rather than by the tokenizer's post-processor, so the layout is the
same for every tokenizer a user brings, and it is recorded in each shard's header.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from longctx.core.errors import ConfigError
from longctx.core.tokenizer import load_tokenizer, tokenizer_fingerprint
from longctx.packer.config import PackConfig
from longctx.packer.format import TokenizerInfo


def _token_id(tokenizer: Tokenizer, token: str, key: str, path: Path) -> int:
    token_id = tokenizer.token_to_id(token)
    if token_id is None:
        specials = sorted(t.content for t in tokenizer.get_added_tokens_decoder().values())
        raise ConfigError(
            f"pack.{key}: {token!r} is not in the vocabulary of {path}; "
            f"its special tokens are: {', '.join(specials) or '(none)'}"
        )
    return token_id


def tokenizer_info(path: Path, cfg: PackConfig) -> TokenizerInfo:
    """Fingerprint, vocabulary size and special token ids of ``path`` under ``cfg``; a
    :class:`ConfigError` naming the setting when a configured special token is not in the vocabulary."""
    tokenizer = load_tokenizer(path)
    eos_id = _token_id(tokenizer, cfg.eos_token, "eos_token", path)
    return TokenizerInfo(
        sha256=tokenizer_fingerprint(path),
        vocab_size=tokenizer.get_vocab_size(with_added_tokens=True),
        eos_id=eos_id,
        bos_id=_token_id(tokenizer, cfg.bos_token, "bos_token", path) if cfg.bos_token is not None else None,
        pad_id=_token_id(tokenizer, cfg.pad_token, "pad_token", path)
        if cfg.pad_token is not None
        else eos_id,
    )


def encode_documents(tokenizer: Tokenizer, texts: list[str], info: TokenizerInfo) -> list[np.ndarray]:
    """Token ids (int32) of each text with BOS (when configured) and EOS, encoded in one parallel batch."""
    prefix = [info.bos_id] if info.bos_id is not None else []
    return [
        np.array(prefix + encoding.ids + [info.eos_id], dtype=np.int32)
        for encoding in tokenizer.encode_batch_fast(texts, add_special_tokens=False)
    ]
