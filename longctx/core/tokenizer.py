"""Loading the run's tokenizer and naming it by its bytes.

Every part reads the same ``tokenizer.json``: curation counts tokens with it, the packer encodes with
it and records its fingerprint in every shard, and the trainer refuses shards made with another one.
(Training a small BPE for the demo is curation's job: ``longctx.pipeline.bpe``.)
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from tokenizers import Tokenizer

EOS_TOKEN = "<|endoftext|>"
BOS_TOKEN = "<|bos|>"
PAD_TOKEN = "<|pad|>"


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """Load a Hugging Face ``tokenizer.json``; a clear error when it is missing or not a tokenizer."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"tokenizer file not found: {path}")
    try:
        return Tokenizer.from_file(str(path))
    except Exception as err:  # tokenizers raises a bare Exception on malformed JSON
        raise ValueError(f"{path} is not a valid tokenizer.json: {err}") from err


def tokenizer_fingerprint(path: str | os.PathLike) -> str:
    """sha256 of the ``tokenizer.json`` bytes: shards and curated counts name the tokenizer by it."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def count_tokens(tokenizer: Tokenizer, texts: list[str]) -> list[int]:
    """Token counts without special tokens, encoded in one parallel batch."""
    return [len(enc.ids) for enc in tokenizer.encode_batch_fast(texts, add_special_tokens=False)]
