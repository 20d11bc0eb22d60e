"""The tokenizer that measures document length (and later packs): load a ``tokenizer.json`` or,
for the demo, train a small byte-level BPE on a sample of the input."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

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


def train_bpe(texts: Iterable[str], vocab_size: int, out_path: str | os.PathLike) -> Tokenizer:
    """Train a byte-level BPE (GPT-2 style pre-tokenization) and save it atomically to ``out_path``.

    The special tokens are ``<|endoftext|>`` (EOS), ``<|bos|>`` and ``<|pad|>``. Byte-level means
    every input, code and non-English text included, is encodable without unknown tokens.
    """
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN, BOS_TOKEN, PAD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_path.with_name(out_path.name + ".tmp")
    tokenizer.save(str(tmp))
    os.replace(tmp, out_path)
    return tokenizer


def count_tokens(tokenizer: Tokenizer, texts: list[str]) -> list[int]:
    """Token counts without special tokens, encoded in one parallel batch."""
    return [len(enc.ids) for enc in tokenizer.encode_batch(texts, add_special_tokens=False)]
