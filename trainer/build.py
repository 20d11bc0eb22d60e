"""Building the training model: on the meta device, sharded, then filled shard by shard.

The model is created on the meta device (no memory), sharded with FSDP2 when the job has more than
one rank (``longctx.trainer.sharding``), materialized with ``to_empty`` (only this rank's shards are
allocated, on its device) and then filled: from a Hugging Face checkpoint by reading this rank's
slices of the safetensors files (``hf_io.load_weights``), or, for the tiny random model, from the
seeded initialization, one parameter at a time. No rank ever holds the whole model.

The base model, the one training starts from and ``longctx eval`` calls ``base``, is defined here:
the config of ``train.model`` with the run's RoPE settings (:func:`model_config`) and its weights
(:func:`fill_base_weights`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from longctx.core.config import ContextConfig
from longctx.trainer.config import KernelsConfig, TrainConfig
from longctx.trainer.hf_io import load_config as load_hf_config
from longctx.trainer.hf_io import load_weights, local_region
from longctx.trainer.kernel_choice import KernelChoice, apply_kernels
from longctx.trainer.model import ModelConfig, RingAttention, Transformer, initial_value
from longctx.trainer.parallel import ParallelState
from longctx.trainer.sharding import shard_model


@dataclass(frozen=True)
class BuiltModel:
    model: Transformer
    loss_multiplier: float
    """What each rank's loss is multiplied by so that gradients are exact sums (``sharding``)."""
    kernels: KernelChoice | None = None
    """The attention kernel, fused ops and compiled blocks chosen by ``train.kernels`` (None: the plain
    model, PyTorch's ops and the automatic attention chain, as evaluation and export use)."""


@torch.no_grad()
def fill_random(model: Transformer, seed: int, std: float = 0.02) -> None:
    """The weights :meth:`Transformer.init_weights` gives with a generator seeded by ``seed``, written
    into this rank's part of each parameter (each full tensor is drawn, one at a time)."""
    generator = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        value = initial_value(name, param.shape, std, generator)
        local = param.to_local() if hasattr(param, "to_local") else param
        if local.numel():
            local.copy_(value[local_region(param)])


def build_model(
    config: ModelConfig,
    state: ParallelState,
    *,
    activation_checkpointing: str,
    bf16: bool,
    kernels: KernelsConfig | None = None,
    compile_cache: Path | None = None,
) -> BuiltModel:
    """The model of ``config`` on ``state.device``, sharded over the mesh when there is one, with
    uninitialized weights: fill them with ``hf_io.load_weights``, :func:`fill_random` or a checkpoint.

    ``kernels`` (``train.kernels``) picks the attention kernel, fused ops and compiled blocks
    (``kernel_choice.apply_kernels``, compile caches in ``compile_cache``); rank 0 prints a line for each
    choice that falls back."""
    with torch.device("meta"):
        model = Transformer(
            config,
            attention=RingAttention(group=state.cp_group),
            activation_checkpointing=activation_checkpointing,
        )
    multiplier = shard_model(model, state, bf16=bf16) if state.sharded else 1.0
    model.to_empty(device=state.device)
    if list(model.buffers()):  # to_empty leaves buffers uninitialized; this model computes RoPE per call
        raise RuntimeError("the model has buffers, which to_empty leaves uninitialized: recompute them here")
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


def model_config(tcfg: TrainConfig, context: ContextConfig, vocab_size: int) -> ModelConfig:
    """The model of ``train.model`` with the run's RoPE settings (``max_position_embeddings`` = target)."""
    section = tcfg.model
    if section.hf_path is not None:
        config = load_hf_config(section.hf_path)
    else:
        config = ModelConfig.tiny(vocab_size=vocab_size, **section.tiny.model_dump())
    return config.with_rope(
        rope_scaling=section.rope_scaling,
        rope_theta=section.rope_theta,
        max_position_embeddings=context.target,
    )


def fill_base_weights(model: Transformer, tcfg: TrainConfig) -> None:
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
