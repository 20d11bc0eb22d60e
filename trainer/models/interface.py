"""One interface to the two implementations of a model; everything that builds or loads one uses it.

``train.model.implementation`` picks the code that runs a model:

* ``longctx``: the own Llama-family decoder (:class:`~longctx.trainer.models.decoder.Transformer`, its
  config :class:`~longctx.trainer.models.decoder_config.ModelConfig`), for Llama, Mistral and Qwen2
  layouts and the tiny model;
* ``transformers``: the model's own transformers code with ring attention
  (:class:`~longctx.trainer.models.hf.HFCausalLM`, its config
  :class:`~longctx.trainer.models.hf.HFModelConfig`), for any RoPE decoder of the installed
  transformers that the ring can train (``hf_arch``);
* ``auto``: the own decoder where it reads the checkpoint, transformers otherwise.

Both configs answer the same questions (``model_type``, ``vocab_size``, ``max_position_embeddings``,
``shape``, ``to_hf``, ``with_rope``, ``check``) and both models take the same calls (``forward(input_ids,
position_ids, token_index, segment_ids, rope_seq_len=, labels=)``, ``logits``, ``decoder_layers``,
``checkpoint_transforms``, ``checkpoint_tensors``). Training (``build``), its stage gates, ``longctx
eval`` and the export reach models only through the functions here, with the run's
``train.model.implementation``, so a trained model is measured and exported by the code that trained it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from longctx.core.errors import ConfigError
from longctx.trainer.models.decoder import Attention, ModelConfig, Transformer
from longctx.trainer.models.files import config_json
from longctx.trainer.models.hf import HFCausalLM, HFModelConfig
from longctx.trainer.models.weights import load_weights, materialize

AnyModelConfig = ModelConfig | HFModelConfig
TrainedModel = Transformer | HFCausalLM


def choose(setting: str, hf: Mapping[str, Any] | None) -> str:
    """``train.model.implementation`` resolved for a ``config.json`` dict (``None``: the tiny model):
    ``auto`` is the own decoder for the tiny model and for the checkpoints it reads, the model's
    transformers code otherwise."""
    if setting != "auto":
        return setting
    if hf is None:
        return "longctx"
    try:
        ModelConfig.from_hf(hf)
    except ValueError:
        return "transformers"
    return "longctx"


def from_hf(hf: Mapping[str, Any], implementation: str = "auto") -> AnyModelConfig:
    """The config of a ``config.json`` dict for ``implementation`` (``train.model.implementation``); a
    config the chosen code cannot read is a :class:`ConfigError`, one line."""
    if choose(implementation, hf) == "transformers":
        return HFModelConfig.from_hf(hf)
    try:
        return ModelConfig.from_hf(hf)
    except ValueError as err:
        raise ConfigError(
            f"{err}; implementation auto or transformers trains it with its transformers code"
        ) from None


def tiny(settings: Mapping[str, Any], vocab_size: int, implementation: str = "auto") -> AnyModelConfig:
    """The tiny random Llama (``train.model.tiny``) over ``vocab_size`` tokens, for ``implementation``."""
    config = ModelConfig.tiny(vocab_size=vocab_size, **settings)
    return config if choose(implementation, None) == "longctx" else HFModelConfig.from_hf(config.to_hf())


def check(config: AnyModelConfig, seq_len: int) -> None:
    """Refuse (:class:`ConfigError`, one line) a model its implementation cannot train on windows of
    ``seq_len`` tokens: sliding windows shorter than them, and for a transformers model anything the
    ring would change (``hf_arch``), found on the model built on the meta device."""
    try:
        config.check(seq_len)
    except ConfigError:
        raise
    except ValueError as err:
        raise ConfigError(str(err)) from None


def build(
    config: AnyModelConfig,
    *,
    attention: Attention | None = None,
    activation_checkpointing: str | bool = "none",
) -> TrainedModel:
    """The model of ``config``, its parameters on the meta device (no memory; buffers such as RoPE
    frequencies computed): shard it, ``materialize`` it, then fill it (``weights.load_weights``, a
    seeded initialization or a checkpoint)."""
    if isinstance(config, HFModelConfig):
        return HFCausalLM(config, attention=attention, activation_checkpointing=activation_checkpointing)
    with torch.device("meta"):
        return Transformer(config, attention=attention, activation_checkpointing=activation_checkpointing)


def load_folder(
    directory: str | os.PathLike[str],
    *,
    implementation: str = "auto",
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    attention: Attention | None = None,
    activation_checkpointing: str | bool = "none",
) -> TrainedModel:
    """The model of a Hugging Face folder, run by ``implementation`` (``train.model.implementation``),
    unsharded, its weights loaded in ``dtype`` on ``device`` (``ValueError`` naming what does not match)."""
    config = from_hf(config_json(Path(directory)), implementation)
    model = build(config, attention=attention, activation_checkpointing=activation_checkpointing)
    materialize(model, device, dtype)
    load_weights(model, directory)
    return model
