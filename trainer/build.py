"""Building the training model: on the meta device, sharded, then filled shard by shard.

The model is created on the meta device (no memory), sharded with FSDP2 when the job has more than
one rank (``longctx.trainer.parallel.sharding``), materialized with ``to_empty`` (only this rank's shards are
allocated, on its device) and then filled: from a Hugging Face checkpoint by reading this rank's
slices of the safetensors files (``weights.load_weights``), or, for the tiny random model, from the
seeded initialization, one parameter at a time. No rank ever holds the whole model.

The base model, the one training starts from and ``longctx eval`` calls ``base``, is defined here:
the config of ``train.model`` with the run's RoPE settings (:func:`model_config`) and its weights
(:func:`fill_base_weights`), run by the implementation ``train.model.implementation`` picks
(``longctx.trainer.models.interface``, through which every model is built and loaded).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from longctx.core.config import ContextConfig
from longctx.core.errors import ConfigError
from longctx.trainer.attention.modes import cp_attention
from longctx.trainer.config import KernelsConfig, TrainConfig
from longctx.trainer.models import interface
from longctx.trainer.models.decoder import initial_value
from longctx.trainer.models.files import config_json
from longctx.trainer.models.interface import AnyModelConfig, TrainedModel
from longctx.trainer.models.kernels import KernelChoice, apply_kernels
from longctx.trainer.models.weights import load_weights, local_region, materialize
from longctx.trainer.parallel.mesh import CpChoice, MeshShape
from longctx.trainer.parallel.sharding import shard_model
from longctx.trainer.parallel.state import ParallelState, cp_subgroups
from longctx.trainer.planning.cp_modes import mode_costs, recommend_mode
from longctx.trainer.planning.plan import RunSettings
from longctx.trainer.planning.report import human_seconds


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
    cp: CpChoice | None = None,
) -> BuiltModel:
    """The model of ``config`` on ``state.device``, sharded over the mesh when there is one, with
    uninitialized weights: fill them with ``weights.load_weights``, :func:`fill_random` or a checkpoint.
    Buffers (a transformers model's RoPE frequencies) keep the values they were built with.

    ``kernels`` (``train.kernels``) picks the attention kernel, fused ops and compiled blocks
    (``kernels.apply_kernels``, compile caches in ``compile_cache``; a transformers model takes the
    attention kernel only); rank 0 prints a line for each choice that falls back. ``cp`` is how the
    context-parallel group attends (:func:`cp_choice`; the ring by default)."""
    cp = cp or CpChoice()
    ring_group, ulysses_group = cp_subgroups(state, cp.ulysses)
    attention = cp_attention(
        cp.mode,
        cp_group=state.cp_group,
        ring_group=ring_group,
        ulysses_group=ulysses_group,
        kv_copies=MeshShape.kv_head_copies(config.shape.num_kv_heads, cp.ulysses),
    )
    model = interface.build(config, attention=attention, activation_checkpointing=activation_checkpointing)
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


def model_config(tcfg: TrainConfig, context: ContextConfig, vocab_size: int) -> AnyModelConfig:
    """The model of ``train.model`` with the run's RoPE settings (``max_position_embeddings`` = target),
    for the implementation ``train.model.implementation`` picks (``interface.choose``)."""
    section = tcfg.model
    if section.hf_path is not None:
        config = interface.from_hf(config_json(section.hf_path), section.implementation)
    else:
        config = interface.tiny(section.tiny.model_dump(), vocab_size, section.implementation)
    return config.with_rope(
        rope_scaling=section.rope_scaling,
        rope_theta=section.rope_theta,
        max_position_embeddings=context.target,
    )


def cp_choice(tcfg: TrainConfig, config: AnyModelConfig, seq_len: int) -> CpChoice:
    """``train.cp_mode`` for this model and window, ``auto`` resolved to ``longctx plan``'s
    recommendation (``longctx.trainer.planning.cp_modes.recommend_mode``, under the plan's default
    links); :class:`ConfigError` naming the setting when the model's heads do not split over the mode's
    all-to-all group. One rank (``train.cp`` 1) is always the ring's local call."""
    if tcfg.cp == 1:
        return CpChoice("ring", 1, tcfg.cp_layout)
    mode, ulysses = tcfg.cp_mode, tcfg.ulysses
    shape = config.shape
    if mode == "auto":
        best = recommend_mode(shape, seq_len, tcfg.cp, RunSettings(cp=tcfg.cp))
        mode, ulysses = best.mode, best.ulysses
    degree = MeshShape.ulysses_degree(mode, tcfg.cp, ulysses)
    key = "train.ulysses" if mode == "hybrid" else f"train.cp (the all-to-all degree of train.cp_mode {mode})"
    MeshShape.check_heads(shape.num_heads, shape.num_kv_heads, degree, degree_key=key)
    return CpChoice(mode, degree, tcfg.cp_layout)


def cp_mode_warning(tcfg: TrainConfig, config: AnyModelConfig, seq_len: int, cp: CpChoice) -> str | None:
    """One line when ``cp``, chosen by hand, is one that ``longctx plan`` prices slower than the ring
    (more communication left exposed per layer and step, under the plan's default links); else None."""
    if tcfg.cp_mode in ("auto", "ring") or tcfg.cp == 1:
        return None
    costs = {c.mode: c for c in mode_costs(config.shape, seq_len, tcfg.cp, RunSettings(cp=tcfg.cp))}
    chosen, ring = costs[cp.mode], costs["ring"]
    if chosen.refused is not None or chosen.exposed_s <= ring.exposed_s * 1.05 + 1e-7:
        return None
    best = recommend_mode(config.shape, seq_len, tcfg.cp, RunSettings(cp=tcfg.cp)).mode
    return (
        f"warning (train.cp_mode {cp.mode}): longctx plan estimates {human_seconds(chosen.exposed_s)} of "
        f"communication per layer and step not hidden by compute, against the ring's "
        f"{human_seconds(ring.exposed_s)}; cp_mode auto would choose {best}"
    )


def check_training_model(tcfg: TrainConfig, context: ContextConfig, seq_len: int, vocab_size: int) -> None:
    """Refuse (:class:`ConfigError`, one line naming ``train.model``) a model this run cannot train at
    ``seq_len``-token windows: a checkpoint the chosen implementation cannot read, the own decoder's
    config checks, the transformers model's (``interface.check``), or heads that ``train.cp_mode``'s
    all-to-all cannot split (:func:`cp_choice`)."""
    section = tcfg.model
    where = f"train.model ({section.hf_path or 'the tiny model'}, implementation {section.implementation})"
    try:
        config = model_config(tcfg, context, vocab_size)
        interface.check(config, seq_len)
    except ValueError as err:  # ConfigError too
        raise ConfigError(f"{where}: {err}") from None
    cp_choice(tcfg, config, seq_len)


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


def base_model(
    tcfg: TrainConfig, context: ContextConfig, vocab_size: int, device: torch.device
) -> TrainedModel:
    """The model training starts from (``longctx eval``'s ``base``), unsharded on ``device``: the config
    of :func:`model_config` with the weights of :func:`fill_base_weights`."""
    config = model_config(tcfg, context, vocab_size)
    model = build_model(
        config, ParallelState.single(device), activation_checkpointing="none", bf16=False
    ).model
    fill_base_weights(model, tcfg)
    return model
