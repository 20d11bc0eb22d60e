"""A small byte-level BPE trained on a sample of the input, for runs that bring no tokenizer (the
demo); a real run sets ``tokenizer.path`` to its model's ``tokenizer.json``."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

from longctx.core.atomic import atomic_path, write_json
from longctx.core.tokenizer import BOS_TOKEN, EOS_TOKEN, PAD_TOKEN, TOKENIZER_CONFIG_FILE

# What the trained tokenizer declares about its special tokens (read by longctx.core.tokenizer's
# document_specials, and by transformers): documents end with EOS and start with nothing.
TRAINED_CONFIG = {
    "tokenizer_class": "PreTrainedTokenizerFast",
    "eos_token": EOS_TOKEN,
    "bos_token": BOS_TOKEN,
    "pad_token": PAD_TOKEN,
    "add_bos_token": False,
}


def train_bpe(texts: Iterable[str], vocab_size: int, out_path: str | os.PathLike) -> Tokenizer:
    """Train a byte-level BPE (GPT-2 style pre-tokenization) and save it atomically to ``out_path``,
    with a ``tokenizer_config.json`` beside it that declares its special tokens.

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
    write_json(Path(out_path).with_name(TOKENIZER_CONFIG_FILE), TRAINED_CONFIG)
    with atomic_path(Path(out_path)) as tmp:
        tokenizer.save(str(tmp))
    return tokenizer
