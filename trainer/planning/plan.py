"""Capacity planning for a long-context run: FLOPs, memory, ring communication and wall-clock.

Every figure is a closed-form function of the model's shape (a Hugging Face ``config.json`` or a
preset) and the run's settings, so a team can size a run before touching a GPU. Nothing here imports
torch; ``longctx plan`` prints these figures and writes them as CSV (``longctx.trainer.planning.report``).

Conventions used throughout (symbols as in the docstrings below):

* The model's shape, parameter counts and FLOPs are ``longctx.trainer.planning.flops`` (the FLOP model the
  training metrics use too), with its symbols: ``h`` hidden size, ``i`` MLP intermediate size, ``n``
  layers, ``a``/``g`` query/key-value heads, ``d`` head dimension, ``q = a*d``, ``k = g*d``, ``V``
  vocabulary. FLOPs are *forward* unless named ``train``; training is 3x forward. Causal attention
  counts ``L / 2`` keys per query, as FlashAttention's FLOP counts do.
* Activations and ring transfers are bf16 (2 bytes per element); optimizer and gradient accumulators
  are fp32 (4 bytes).
* Attention is full (whole-window) causal attention: longctx trains no sliding-window layers.
* Linear-layer biases (Qwen2's q/k/v biases, under 0.01% of its parameters) are not counted.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from longctx.core.errors import ConfigError
from longctx.trainer.models.files import CONFIG_NAME
from longctx.trainer.models.shape import ACTIVATION_CHECKPOINTING, ModelShape  # noqa: F401
from longctx.trainer.parallel.mesh import MeshShape
from longctx.trainer.planning.fit import Change, Layout, smallest_changes
from longctx.trainer.planning.flops import (  # noqa: F401
    LayerFlops,
    layer_flops,
    param_count,
    train_flops_per_token,
)
from longctx.trainer.planning.memory import (  # noqa: F401 - the memory model, re-exported for the plan's readers
    ACTIVATION_BYTES,
    CHECKPOINTING_SETTINGS,
    GRAD_ACCUM_BYTES,
    WEIGHT_AND_MOMENT_BYTES_PER_PARAM,
    RankMemory,
    activation_bytes_per_token,
    choose_checkpointing,
    fits,
    kv_block_bytes,
    rank_memory,
    usable_bytes,
)

ATTENTION_BACKWARD_FACTOR = 2.5
"""Backward attention FLOPs over forward: FlashAttention's backward does 5 ``b x b x d`` matmuls per head
(recomputed scores, dV, dP, dQ, dK) against the forward's 2 (scores, probabilities x values)."""

KV_CACHE_FORMATS: dict[str, float] = {"fp16": 2.0, "fp8": 1.0, "fp4": 0.5}
"""Bytes per cached key or value element for each KV-cache storage format."""

PRESETS: dict[str, dict[str, Any]] = {
    "llama-2-7b": {
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 32,
        "vocab_size": 32000,
        "tie_word_embeddings": False,
    },
    "llama-3-8b": {
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "tie_word_embeddings": False,
    },
    "llama-3-70b": {
        "model_type": "llama",
        "hidden_size": 8192,
        "intermediate_size": 28672,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "tie_word_embeddings": False,
    },
    "llama-3.1-405b": {
        "model_type": "llama",
        "hidden_size": 16384,
        "intermediate_size": 53248,
        "num_hidden_layers": 126,
        "num_attention_heads": 128,
        "num_key_value_heads": 8,
        "vocab_size": 128256,
        "tie_word_embeddings": False,
    },
    "qwen2-7b": {
        "model_type": "qwen2",
        "hidden_size": 3584,
        "intermediate_size": 18944,
        "num_hidden_layers": 28,
        "num_attention_heads": 28,
        "num_key_value_heads": 4,
        "vocab_size": 152064,
        "tie_word_embeddings": False,
    },
    "mistral-7b-v0.3": {
        "model_type": "mistral",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 32768,
        "tie_word_embeddings": False,
    },
}
"""Public ``config.json`` dimensions of common models: the keys the planner reads, plus ``model_type``."""


def load_model_shape(spec: str) -> ModelShape:
    """The shape named by ``spec``: a preset (case-insensitive), a model folder, or a ``config.json`` path.

    Raises :class:`ConfigError` naming the presets when ``spec`` is neither a preset nor an existing
    path, and when the file is not a JSON object.
    """
    preset = PRESETS.get(spec.lower())
    if preset is not None:
        return ModelShape.from_hf(preset, spec.lower())
    path = Path(spec)
    if path.is_dir():
        path = path / CONFIG_NAME
    if not path.is_file():
        raise ConfigError(
            f"unknown model {spec!r}: not a preset ({', '.join(PRESETS)}) nor a folder or file "
            f"holding {CONFIG_NAME}"
        )
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConfigError(f"cannot read {path}: {err}") from err
    if not isinstance(config, dict):
        raise ConfigError(f"{path} is not a JSON object")
    return ModelShape.from_hf(config, str(spec))


def crossover_length(model: ModelShape, *, causal: bool = False) -> float:
    """Context length at which a layer's attention FLOPs equal its projection + MLP FLOPs.

    Setting ``4 L q = 2h(2q + 2k) + 6hi`` (full attention) gives ``L* = (h(q + k) + 1.5 h i) / q``. With
    the standard ``q = h`` and ``k = h / r`` (``r`` query heads per key/value head),
    ``L* = h (1 + 1/r + 1.5 i/h)``; with Llama's ``i ~ 3.5h`` the MLP term ``5.25`` dominates, giving the
    "about 6 x hidden size" rule: Llama-3-8B (``i = 3.5h``, ``r = 4``) ``6.5 h``, Llama-3-70B
    (``i = 3.5h``, ``r = 8``) ``6.375 h``, Llama-3.1-405B (``i = 3.25h``, ``r = 16``) ``5.94 h``. Counting
    causal attention (half the scores, ``causal=True``) doubles it: ``12.75 h`` for Llama-3-70B, i.e.
    about 104K tokens.
    """
    flops = layer_flops(model, 1, causal=causal)
    return flops.dense / flops.attention


def kv_cache_bytes_per_token(model: ModelShape, bytes_per_element: float) -> float:
    """KV cache per token: ``2 (K and V) x n x g x d x bytes``; Llama-3-70B in fp16: 327,680 B = 320 KiB."""
    return 2.0 * model.num_layers * model.kv_dim * bytes_per_element


def ring_step_flops(model: ModelShape, block_tokens: float, *, causal: bool = True) -> float:
    """Forward FLOPs of one ring step of one layer: ``b`` queries against one block of ``b`` keys.

    Per head, ``QK^T`` and ``PV`` are each ``2 b^2 d``, so the full block pair is ``4 b^2 q``. With
    causal attention in longctx's zigzag layout (``longctx.trainer.parallel.zigzag.zigzag_indices``) every
    step computes about half of the pair's scores, so ``2 b^2 q``.
    """
    return 4.0 * block_tokens**2 * model.q_dim * (0.5 if causal else 1.0)


def overlap_min_block(
    model: ModelShape,
    *,
    link_bytes_per_s: float,
    achieved_flops: float,
    backward: bool,
    causal: bool = True,
) -> float:
    """Smallest tokens per rank ``b`` at which a ring step's transfer hides behind its computation.

    A step computes ``c * k * 4 b^2 q`` FLOPs at ``F`` FLOP/s while sending ``2 b K_dim beta`` bytes at
    ``B`` bytes/s, where ``c`` is 1/2 causal (1 full), ``k`` is 1 forward and
    :data:`ATTENTION_BACKWARD_FACTOR` backward, and ``beta`` bytes per element are moved: 2 (the bf16
    K/V block) forward, 2 + 4 backward (the block again plus its fp32 dK/dV accumulator). Compute
    time >= transfer time gives::

        b >= (K_dim * beta * F) / (2 * c * k * q * B)

    Forward and causal this is ``(g / a) * 2 * F / B``: with GQA the threshold falls by the group
    ratio (for MHA, full attention and bf16 it is Ring Attention's ``F / B``, Liu et al. 2023).
    """
    compute_factor = ATTENTION_BACKWARD_FACTOR if backward else 1.0
    moved = ACTIVATION_BYTES + (GRAD_ACCUM_BYTES if backward else 0)
    share = 0.5 if causal else 1.0
    return (
        model.kv_dim
        * moved
        * achieved_flops
        / (2.0 * share * compute_factor * model.q_dim * link_bytes_per_s)
    )


@dataclass(frozen=True)
class RingStep:
    """One layer's ring step for ``block_tokens`` tokens per rank, forward and backward."""

    block_tokens: int
    send_bytes: float
    """Bytes each rank sends per forward step (its held K/V block); 0 with a single rank."""
    forward_flops: float
    forward_compute_s: float
    forward_comm_s: float
    backward_compute_s: float
    backward_comm_s: float
    min_block_tokens: float
    """The larger of the forward and backward :func:`overlap_min_block` thresholds."""

    @property
    def hidden(self) -> bool:
        """Whether communication hides behind computation in both passes."""
        return self.block_tokens >= self.min_block_tokens or self.send_bytes == 0


def ring_step(
    model: ModelShape, length: int, cp: int, *, link_bytes_per_s: float, achieved_flops: float
) -> RingStep:
    """Times and bytes of one causal ring step at context ``length`` over ``cp`` ranks (``b = L / cp``).

    Backward moves the K/V block and its fp32 dK/dV accumulator (``longctx.trainer.attention.ring``) and
    computes :data:`ATTENTION_BACKWARD_FACTOR` x the forward FLOPs.
    """
    block = length // cp
    send = kv_block_bytes(model, block) if cp > 1 else 0.0
    backward_send = send * (ACTIVATION_BYTES + GRAD_ACCUM_BYTES) / ACTIVATION_BYTES
    flops = ring_step_flops(model, block)
    thresholds = (
        overlap_min_block(
            model, link_bytes_per_s=link_bytes_per_s, achieved_flops=achieved_flops, backward=backward
        )
        for backward in (False, True)
    )
    return RingStep(
        block_tokens=block,
        send_bytes=send,
        forward_flops=flops,
        forward_compute_s=flops / achieved_flops,
        forward_comm_s=send / link_bytes_per_s,
        backward_compute_s=ATTENTION_BACKWARD_FACTOR * flops / achieved_flops,
        backward_comm_s=backward_send / link_bytes_per_s,
        min_block_tokens=max(thresholds),
    )


def train_seconds(
    model: ModelShape, length: int, *, tokens: float, gpus: int, peak_flops: float, mfu: float
) -> float:
    """Seconds to train ``tokens`` tokens in windows of ``length``: ``T * train_flops(L) / (N * peak * MFU)``.

    ``train_flops(L)`` is :func:`train_flops_per_token` (``6 N_matmul + 6 n q L``); ``peak_flops`` is one
    GPU's dense bf16 peak and ``mfu`` the fraction of it the run achieves on model FLOPs.
    """
    return tokens * train_flops_per_token(model, length) / (gpus * peak_flops * mfu)


@dataclass(frozen=True)
class RunSettings:
    """What the plan assumes about the run besides the model and the lengths.

    Bandwidth is bytes per second per rank in one direction; FLOP rates are per GPU. ``tokens`` and
    ``gpus`` are both set (a wall-clock is wanted) or both None.
    """

    cp: int = 1
    link_bytes_per_s: float = 50e9
    achieved_flops: float = 400e12
    state_shards: int = 1
    activation_checkpointing: str = "none"
    tokens: float | None = None
    gpus: int | None = None
    peak_flops: float = 989e12
    mfu: float = 0.4
    gpu_memory_bytes: float | None = None
    """Device memory each setting is checked against (``longctx.trainer.planning.memory.fits``); None: no
    check."""
    dp_replicate: int = 1
    """Replicas of the sharded state (HSDP): the GPUs a larger cp or more GPUs need come in multiples
    of ``cp x dp_replicate`` (:mod:`longctx.trainer.planning.fit`)."""
    gpus_per_node: int = 8
    """GPUs of one node: a group of ranks this large or smaller talks over :attr:`node_link_bytes_per_s`
    (``longctx.trainer.planning.cp_modes``; the ring rows of :func:`plan_length` keep
    :attr:`link_bytes_per_s`)."""
    node_link_bytes_per_s: float = 450e9
    """Bandwidth within a node, bytes per second per rank in one direction (NVLink 4 on H100/H200)."""

    def __post_init__(self) -> None:
        positive = {
            "cp": self.cp,
            "link bandwidth": self.link_bytes_per_s,
            "achieved FLOP/s": self.achieved_flops,
            "state shards": self.state_shards,
            "peak FLOP/s": self.peak_flops,
            "replicas": self.dp_replicate,
            "GPUs per node": self.gpus_per_node,
            "node link bandwidth": self.node_link_bytes_per_s,
        }
        if self.gpu_memory_bytes is not None:
            positive["GPU memory"] = self.gpu_memory_bytes
        bad = [f"{name} ({value})" for name, value in positive.items() if not value > 0]
        if bad:
            raise ConfigError(f"must be positive: {', '.join(bad)}")
        if not 0 < self.mfu <= 1:
            raise ConfigError(f"MFU must be in (0, 1], got {self.mfu}")
        if self.tokens is not None and self.gpus is None:
            raise ConfigError("a wall-clock estimate needs both a token budget and a GPU count")
        if self.gpus is not None and not self.gpus > 0:
            raise ConfigError(f"GPU count must be positive, got {self.gpus}")
        if self.tokens is not None and not self.tokens > 0:
            raise ConfigError(
                f"token budget and GPU count must be positive, got {self.tokens} and {self.gpus}"
            )
        if self.gpu_memory_bytes is not None and usable_bytes(self.gpu_memory_bytes) <= 0:
            raise ConfigError(
                f"GPU memory of {self.gpu_memory_bytes / 1e9:g} GB leaves nothing for training once the "
                "reserve for the CUDA context and the headroom are set aside (a bare number is GB)"
            )
        if self.activation_checkpointing not in CHECKPOINTING_SETTINGS:
            raise ConfigError(
                f"activation checkpointing must be one of {', '.join(CHECKPOINTING_SETTINGS)}, "
                f"got {self.activation_checkpointing!r}"
            )


@dataclass(frozen=True)
class LengthPlan:
    """Every figure of the plan at one context length."""

    length: int
    layer: LayerFlops
    activation_flash_bytes: float
    """One layer's activations for one sequence, with FlashAttention."""
    activation_noflash_bytes: float
    """The same, materializing the ``L x L`` probabilities."""
    kv_cache_bytes: dict[str, float]
    """KV cache for one sequence, per :data:`KV_CACHE_FORMATS` format."""
    ring: RingStep
    activation_checkpointing: str
    """The mode :attr:`memory` is for: the setting's, or what ``auto`` chose (``memory.choose_checkpointing``:
    the cheapest that fits ``RunSettings.gpu_memory_bytes``; full without a memory to check against)."""
    memory: RankMemory
    train_flops_per_token: float
    train_seconds: float | None
    fits: bool | None
    """Whether :attr:`memory` fits ``RunSettings.gpu_memory_bytes`` (None when no memory was given)."""
    changes: list[Change]
    """When it does not fit: the smallest change of each kind that would
    (``longctx.trainer.planning.fit``)."""


def layout_of(settings: RunSettings) -> Layout:
    """The settings a change may touch: the GPUs are ``settings.gpus``, else one ring per replica."""
    return Layout(
        cp=settings.cp,
        gpus=settings.gpus or settings.cp * settings.dp_replicate,
        dp_replicate=settings.dp_replicate,
        activation_checkpointing=settings.activation_checkpointing,
        shards=settings.state_shards,
    )


def checkpointing_at(model: ModelShape, length: int, cp: int, settings: RunSettings) -> str:
    """``settings.activation_checkpointing`` at ``length`` over ``cp`` ranks, ``auto`` resolved as
    training resolves it (``choose_checkpointing``)."""
    mode = settings.activation_checkpointing
    if mode == "auto":
        mode = choose_checkpointing(
            model, length, cp, settings.gpu_memory_bytes, state_shards=settings.state_shards
        )
    return mode


def _checkpointing(model: ModelShape, length: int, settings: RunSettings) -> str:
    """``settings.activation_checkpointing`` at ``length`` over ``settings.cp`` ranks."""
    return checkpointing_at(model, length, settings.cp, settings)


def plan_length(model: ModelShape, length: int, settings: RunSettings) -> LengthPlan:
    """All figures at context ``length`` under ``settings`` (causal attention throughout)."""
    MeshShape.check_window(length, settings.cp, length_key="length", cp_key="cp")
    wall = None
    mode = _checkpointing(model, length, settings)
    memory = rank_memory(
        model, length, settings.cp, state_shards=settings.state_shards, activation_checkpointing=mode
    )
    if settings.tokens is not None and settings.gpus is not None:
        wall = train_seconds(
            model,
            length,
            tokens=settings.tokens,
            gpus=settings.gpus,
            peak_flops=settings.peak_flops,
            mfu=settings.mfu,
        )
    fit = fits(memory, settings.gpu_memory_bytes) if settings.gpu_memory_bytes is not None else None
    changes = []
    if fit is False and settings.gpu_memory_bytes is not None:
        changes = smallest_changes(model, length, layout_of(settings), settings.gpu_memory_bytes)
    return LengthPlan(
        length=length,
        layer=layer_flops(model, length),
        activation_flash_bytes=length * activation_bytes_per_token(model, length, flash=True),
        activation_noflash_bytes=length * activation_bytes_per_token(model, length, flash=False),
        kv_cache_bytes={
            fmt: length * kv_cache_bytes_per_token(model, size) for fmt, size in KV_CACHE_FORMATS.items()
        },
        ring=ring_step(
            model,
            length,
            settings.cp,
            link_bytes_per_s=settings.link_bytes_per_s,
            achieved_flops=settings.achieved_flops,
        ),
        activation_checkpointing=mode,
        memory=memory,
        train_flops_per_token=train_flops_per_token(model, length),
        train_seconds=wall,
        fits=fit,
        changes=changes,
    )


@dataclass(frozen=True)
class StagePlan:
    """One stage of a staged run (``train.stages``): its length, RoPE, steps and rows per step, the
    memory per rank at its length and the wall-clock of one step and of the stage."""

    number: int
    length: int
    rope: str
    steps: int
    rows: int
    """Packed rows per optimizer step over all data-parallel ranks."""
    memory: RankMemory
    fits: bool | None
    step_seconds: float

    @property
    def tokens_per_step(self) -> int:
        return self.rows * self.length

    @property
    def tokens(self) -> int:
        return self.steps * self.tokens_per_step

    @property
    def seconds(self) -> float:
        return self.steps * self.step_seconds


def plan_stage(
    model: ModelShape,
    *,
    number: int,
    length: int,
    rope: str,
    steps: int,
    rows: int,
    gpus: int,
    settings: RunSettings,
) -> StagePlan:
    """A stage's memory per rank (as :func:`plan_length`) and its step time on ``gpus`` GPUs: the
    step's ``rows x length`` tokens at :func:`train_seconds`' rate."""
    MeshShape.check_window(length, settings.cp, length_key=f"stage {number}'s length", cp_key="cp")
    memory = rank_memory(
        model,
        length,
        settings.cp,
        state_shards=settings.state_shards,
        activation_checkpointing=_checkpointing(model, length, settings),
    )
    step = train_seconds(
        model, length, tokens=rows * length, gpus=gpus, peak_flops=settings.peak_flops, mfu=settings.mfu
    )
    fit = fits(memory, settings.gpu_memory_bytes) if settings.gpu_memory_bytes is not None else None
    return StagePlan(number, length, rope, steps, rows, memory, fit, step)


_LENGTH_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}
_COUNT_UNITS = {"": 1.0, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}


def _split_suffix(text: str, units: Mapping[str, float], what: str) -> tuple[float, float]:
    stripped = text.strip()
    suffix = stripped[-1:].upper() if stripped[-1:].isalpha() else ""
    try:
        number = float(stripped[: len(stripped) - len(suffix)])
    except ValueError:
        number = math.nan
    if suffix not in units or not math.isfinite(number) or number <= 0:
        raise ConfigError(
            f"bad {what} {text!r}: expected a positive number with an optional suffix "
            f"({', '.join(k for k in units if k)})"
        )
    return number, units[suffix]


def parse_length(text: str) -> int:
    """A context length in tokens: ``8192``, ``8K`` (x1024), ``1M`` (x1024^2) or ``0.5K``; binary units."""
    number, scale = _split_suffix(text, _LENGTH_UNITS, "length")
    value = number * scale
    if value != int(value):
        raise ConfigError(f"bad length {text!r}: {value:g} is not a whole number of tokens")
    return int(value)


def parse_lengths(text: str) -> list[int]:
    """Comma-separated context lengths (see :func:`parse_length`), kept in the given order."""
    items = [item for item in text.split(",") if item.strip()]
    if not items:
        raise ConfigError("no context lengths given")
    return [parse_length(item) for item in items]


_BYTE_UNITS = {
    "": 1e9,  # a bare number is GB
    "B": 1.0,
    "K": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "KI": 2.0**10,
    "MI": 2.0**20,
    "GI": 2.0**30,
    "TI": 2.0**40,
}
_MEMORY_SIZE = re.compile(
    r"^\s*(\d+\.?\d*(?:e[+-]?\d+)?|\.\d+(?:e[+-]?\d+)?)\s*([kmgt]i?)?(b?)\s*$", re.IGNORECASE
)
MAX_GPU_MEMORY_BYTES = 2e12
"""Larger than any accelerator's memory (2 TB; the largest hold under 300 GB): a bigger
``--gpu-memory`` is a typo (``80TB`` for ``80GB``), or bytes meant as GB."""


def parse_bytes(text: str) -> float:
    """A GPU's memory: ``80GB`` or ``80G`` = 80e9 bytes, ``80GiB`` = 80 x 2^30, ``81559MiB`` (as
    ``nvidia-smi`` reports it), ``8e10B`` in bytes; a bare number is GB (1e9 bytes), as GPUs are sold
    (an "80 GB" card holds at least 80e9 bytes, so a setting that fits 80 fits it).

    Raises :class:`ConfigError` for anything else, for a size that is not positive, and for one
    above :data:`MAX_GPU_MEMORY_BYTES`.
    """
    match = _MEMORY_SIZE.match(text)
    number = float(match.group(1)) if match else 0.0
    if match is None or number <= 0:
        raise ConfigError(
            f"bad memory size {text!r}: expected a positive number of GB (80, 80GB or 141G: 1e9 bytes), "
            "or one with a unit: 80GiB (2^30 bytes), 81559MiB, 8e10B (bytes)"
        )
    unit = (match.group(2) or "").upper() or match.group(3).upper()
    value = number * _BYTE_UNITS[unit]
    if value > MAX_GPU_MEMORY_BYTES:
        raise ConfigError(
            f"memory size {text!r} is {value:.3g} bytes, more than any GPU holds (at most "
            f"{MAX_GPU_MEMORY_BYTES / 1e12:g} TB here); a bare number is GB (write 80 or 80GB for 80e9 bytes)"
        )
    return value


def parse_count(text: str) -> float:
    """A token budget: ``20B`` = 2e10; decimal suffixes K=1e3, M=1e6, B or G=1e9, T=1e12."""
    number, scale = _split_suffix(text, _COUNT_UNITS, "token count")
    return number * scale
