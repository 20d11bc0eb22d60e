"""Building the training model: on the meta device, sharded, then filled shard by shard.

The model is created on the meta device (no memory), sharded with FSDP2 when the job has more than
one rank (``longctx.trainer.parallel.sharding``), materialized with ``to_empty`` (only this rank's shards are
allocated, on its device) and then filled: from a Hugging Face checkpoint by reading this rank's
slices of the safetensors files (``folder.load_weights``), or, for the tiny random model, from the
seeded initialization, one parameter at a time. No rank ever holds the whole model.

The base model, the one training starts from and ``longctx eval`` calls ``base``, is defined here:
the config of ``train.model`` with the run's RoPE settings (:func:`model_config`) and its weights
(:func:`fill_base_weights`), run by the implementation :func:`choose_implementation` picks: the own
decoder (``model.Transformer``) or the model's transformers code (``hf.HFCausalLM``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from longctx.core.config import ContextConfig
from longctx.core.errors import ConfigError
from longctx.trainer.config import KernelsConfig, TrainConfig
from longctx.trainer.models.decoder import ModelConfig, RingAttention, Transformer, initial_value
from longctx.trainer.models.folder import config_json, load_weights, local_region, materialize
from longctx.trainer.models.hf import HFCausalLM, HFModelConfig, check_model
from longctx.trainer.models.kernels import KernelChoice, apply_kernels
from longctx.trainer.parallel.sharding import shard_model
from longctx.trainer.parallel.state import ParallelState

TrainedModel = Transformer | HFCausalLM
AnyModelConfig = ModelConfig | HFModelConfig


@dataclass(frozen=True)
class BuiltModel:
    model: TrainedModel
    loss_multiplier: float
    """What each rank's loss is multiplied by so that gradients are exact sums (``sharding``)."""
    kernels: KernelChoice | None = None
    """The attention kernel, fused ops and compiled blocks chosen by ``train.kernels`` (None: the plain
    model, PyTorch's ops and the automatic attention chain, as evaluation and export use)."""


@torch.no_grad()
def fill_random(model: TrainedModel, seed: int, std: float = 0.02) -> None:
    """The weights :meth:`Transformer.init_weights` gives with a generator seeded by ``seed``, written
    into this rank's part of each parameter (each full tensor is drawn, one at a time)."""
    generator = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        value = initial_value(name, param.shape, std, generator)
        local = param.to_local() if hasattr(param, "to_local") else param
        if local.numel():
            local.copy_(value[local_region(param)])


def build_model(
    config: AnyModelConfig,
    state: ParallelState,
    *,
    activation_checkpointing: str,
    bf16: bool,
    kernels: KernelsConfig | None = None,
    compile_cache: Path | None = None,
) -> BuiltModel:
    """The model of ``config`` on ``state.device``, sharded over the mesh when there is one, with
    uninitialized weights: fill them with ``folder.load_weights``, :func:`fill_random` or a checkpoint.
    Buffers (a transformers model's RoPE frequencies) keep the values they were built with.

    ``kernels`` (``train.kernels``) picks the attention kernel, fused ops and compiled blocks
    (``kernels.apply_kernels``, compile caches in ``compile_cache``; a transformers model takes the
    attention kernel only); rank 0 prints a line for each choice that falls back."""
    attention = RingAttention(group=state.cp_group)
    if isinstance(config, HFModelConfig):
        model: TrainedModel = HFCausalLM(
            config, attention=attention, activation_checkpointing=activation_checkpointing
        )
    else:
        with torch.device("meta"):
            model = Transformer(
                config, attention=attention, activation_checkpointing=activation_checkpointing
            )
    multiplier = shard_model(model, state, bf16=bf16) if state.sharded else 1.0
    materialize(model, state.device)
    choice = None
    if kernels is not None:
        choice = apply_kernels(
            model,
            attention=kernels.attention,
            fused=kernels.fused,
            compile_blocks=kernels.compile,
            device=state.device,
            dtype=torch.bfloat16 if bf16 else torch.float32,
            compile_cache=compile_cache,
        )
        if state.is_main:
            for note in choice.notes:
                print(note, flush=True)
    return BuiltModel(model, multiplier, choice)


def choose_implementation(setting: str, hf_config: Mapping[str, Any] | None) -> str:
    """``train.model.implementation`` resolved: ``auto`` is the own decoder for the tiny model and
    for the checkpoints it reads (Llama, Mistral and Qwen2 layouts), the model's transformers code
    otherwise."""
    if setting != "auto":
        return setting
    if hf_config is None:
        return "longctx"
    try:
        ModelConfig.from_hf(hf_config)
    except ValueError:
        return "transformers"
    return "longctx"


def saved_model_config(
    hf: Mapping[str, Any] | None,
    implementation: str,
    *,
    tiny: Mapping[str, Any] | None = None,
    vocab_size: int = 0,
) -> AnyModelConfig:
    """The config of a ``config.json`` dict (``None``: the tiny model of ``tiny`` and ``vocab_size``)
    for ``train.model.implementation`` ``implementation``; a config the own decoder cannot read is a
    :class:`ConfigError` naming the setting."""
    chosen = choose_implementation(implementation, hf)
    if hf is None:
        tiny_config = ModelConfig.tiny(vocab_size=vocab_size, **(tiny or {}))
        return tiny_config if chosen == "longctx" else HFModelConfig.from_hf(tiny_config.to_hf())
    if chosen == "transformers":
        return HFModelConfig.from_hf(hf)
    try:
        return ModelConfig.from_hf(hf)
    except ValueError as err:
        raise ConfigError(
            f"{err}; implementation auto or transformers trains it with its transformers code"
        ) from None


def model_config(tcfg: TrainConfig, context: ContextConfig, vocab_size: int) -> AnyModelConfig:
    """The model of ``train.model`` with the run's RoPE settings (``max_position_embeddings`` = target),
    for the implementation that runs it (:func:`choose_implementation`)."""
    section = tcfg.model
    hf = config_json(section.hf_path) if section.hf_path is not None else None
    tiny = section.tiny.model_dump()
    config = saved_model_config(hf, section.implementation, tiny=tiny, vocab_size=vocab_size)
    return config.with_rope(
        rope_scaling=section.rope_scaling,
        rope_theta=section.rope_theta,
        max_position_embeddings=context.target,
    )


def check_training_model(tcfg: TrainConfig, context: ContextConfig, seq_len: int, vocab_size: int) -> None:
    """Refuse (:class:`ConfigError`, one line naming ``train.model``) a model this run cannot train at
    ``seq_len``-token windows: a checkpoint the chosen implementation cannot read, the own decoder's
    config checks, or the transformers model's (``hf.check_model``)."""
    section = tcfg.model
    where = f"train.model ({section.hf_path or 'the tiny model'}, implementation {section.implementation})"
    try:
        config = model_config(tcfg, context, vocab_size)
        config.check_context_length(seq_len)
        if isinstance(config, HFModelConfig):
            check_model(config, seq_len)
    except ValueError as err:  # ConfigError too
        raise ConfigError(f"{where}: {err}") from None


def fill_base_weights(model: TrainedModel, tcfg: TrainConfig) -> None:
    """The base model's weights: the checkpoint of ``train.model.hf_path``, else the tiny model's
    random initialization seeded by ``train.seed``."""
    if tcfg.model.hf_path is not None:
        load_weights(model, tcfg.model.hf_path)
    else:
        fill_random(model, tcfg.seed)


def use_bf16(precision: str, device: torch.device) -> bool:
    """Whether ``precision`` (``train.precision``, ``eval.precision``) computes in bf16: ``bf16``, or
    ``auto`` on a GPU."""
    return precision == "bf16" or (precision == "auto" and device.type == "cuda")
