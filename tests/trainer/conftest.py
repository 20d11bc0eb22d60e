"""Fixtures shared by the trainer's tests: the windows of staged runs, and a random Llama saved by
transformers (beside the session's packed windows, ``tests/conftest.packed``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.packer.test_pack_helpers import pack_staged


def save_random_llama(
    folder: Path, vocab_size: int, *, tie: bool = False, dtype: torch.dtype = torch.float32
) -> Path:
    """A small random ``LlamaForCausalLM`` saved by transformers (``save_pretrained``) into ``folder``."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
        tie_word_embeddings=tie,
    )
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(config).to(dtype).save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def base_llama(packed: Path) -> Path:
    """The random Llama training starts from, with the shards' vocabulary (320)."""
    return save_random_llama(packed.parent / "base_llama", 320)


@pytest.fixture(scope="session")
def staged_packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Curated documents packed into windows of 256 and 512 tokens (``pack_staged``), read by every
    staged run of the session: each trains in a copy."""
    return pack_staged(tmp_path_factory.mktemp("staged"))
