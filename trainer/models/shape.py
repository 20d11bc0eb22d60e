"""What the planners read of a model, without torch: its dimensions (:class:`ModelShape`), the
activation checkpointing modes its blocks implement, and how its loss cuts the logits into chunks.

``longctx.trainer.planning`` (FLOPs, memory, ``longctx plan``) computes from these; the models
(``decoder``, ``hf``) give their shape and use the same modes and chunks, so the estimate and the model
cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from longctx.core.errors import ConfigError

ACTIVATION_CHECKPOINTING = ("none", "selective", "full")
"""What a decoder block keeps for backward, from the most memory (and least recomputation) to the least."""

LOGITS_CHUNK_ELEMENTS = 2**27
"""Largest ``tokens x vocab`` block of logits the loss materializes at once (512 MiB in float32):
longer inputs are cut into chunks of :func:`logits_chunk_tokens` tokens, each recomputed in backward."""

_REQUIRED_KEYS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "vocab_size",
)
_MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts")


@dataclass(frozen=True)
class ModelShape:
    """The dimensions of a dense Llama-family decoder (RMSNorm, GQA attention with RoPE, SwiGLU MLP)."""

    name: str
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool

    @property
    def q_dim(self) -> int:
        """Width of the queries (and of the attention output): heads x head_dim."""
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        """Width of the keys (and of the values): key/value heads x head_dim."""
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_hf(cls, config: Mapping[str, Any], name: str) -> ModelShape:
        """Read the dimensions from a Hugging Face ``config.json`` dict.

        ``num_key_value_heads`` defaults to ``num_attention_heads`` (multi-head attention) and
        ``head_dim`` to ``hidden_size // num_attention_heads``, as transformers does. Raises
        :class:`ConfigError` for missing or non-positive dimensions, query heads that the key/value
        heads do not divide, and mixture-of-experts configs (whose MLP these formulas do not describe).
        """
        missing = [key for key in _REQUIRED_KEYS if config.get(key) is None]
        if missing:
            raise ConfigError(f"{name}: config.json lacks {', '.join(missing)}")
        moe = [key for key in _MOE_KEYS if config.get(key)]
        if moe:
            raise ConfigError(f"{name}: mixture-of-experts configs ({', '.join(moe)}) are not supported")
        heads = config["num_attention_heads"]
        values = {
            "hidden_size": config["hidden_size"],
            "intermediate_size": config["intermediate_size"],
            "num_layers": config["num_hidden_layers"],
            "num_heads": heads,
            "num_kv_heads": config.get("num_key_value_heads") or heads,
            "head_dim": config.get("head_dim") or config["hidden_size"] // heads,
            "vocab_size": config["vocab_size"],
        }
        bad = [
            f"{key}={value!r}" for key, value in values.items() if not isinstance(value, int) or value <= 0
        ]
        if bad:
            raise ConfigError(f"{name}: dimensions must be positive integers, got {', '.join(bad)}")
        if values["num_heads"] % values["num_kv_heads"]:
            raise ConfigError(
                f"{name}: {values['num_heads']} query heads are not a multiple of "
                f"{values['num_kv_heads']} key/value heads"
            )
        return cls(name=name, tie_word_embeddings=bool(config.get("tie_word_embeddings", False)), **values)


def logits_chunk_tokens(vocab_size: int) -> int:
    """Tokens per chunk of the loss's logits (see :data:`LOGITS_CHUNK_ELEMENTS`)."""
    return max(1, LOGITS_CHUNK_ELEMENTS // vocab_size)
