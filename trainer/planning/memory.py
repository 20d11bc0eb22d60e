"""The memory model of a training rank, shared by ``longctx plan`` and ``longctx train``.

Before anything is loaded, ``longctx train`` computes this estimate for its own settings and, on a
GPU, refuses to start when it exceeds the device's memory (:func:`check_fits`); ``longctx plan``
prints the same figures and whether they fit a given ``--gpu-memory``. Nothing here imports torch.

Symbols as in ``longctx.trainer.planning.flops``; ``b = L / cp`` tokens per rank, ``S`` ranks the model
state is
sharded over, ``c`` bytes per element of the compute dtype (2 for bf16), ``r`` bytes per element of the
residual stream: ``c`` under FSDP2 (parameters gathered in the compute dtype), 4 for one unsharded
process, which keeps float32 parameters and computes under bf16 autocast, so the hidden states between
blocks, the checkpointed block inputs and the RMSNorms stay float32.

A step has two peaks, and the estimate is the larger (:attr:`RankMemory.total`):

* **backward**, the sum of
  * model states: float32 weights and AdamW moments ``12 P / S``, plus the gradients present at the
    peak (``4 P / S`` in all, produced block by block as backward runs);
  * gathered parameters, FSDP2's unsharded working copies (0 when ``S = 1``): two decoder blocks (the
    running one and the prefetched one) with their unsharded gradients and float32 reduce buffers,
    ``2 P_block (2c + 4)``, and the root's output projection, gathered from the end of forward to its
    gradient's reduction, ``V h (2c + 4)``;
  * activations: what every block keeps for backward (by activation-checkpointing mode,
    :func:`held_bytes_per_token`) plus the working set of the one block being recomputed and
    backpropagated (:func:`working_bytes_per_token`). Backward frees a block's held activations as it
    adds that block's gradients, so the peak is at its start (every block's activations, the output
    projection's gradient) or at its end (one block's activations, every gradient), whichever holds more;
  * one chunk of the loss's logits: ``min(b, shape.LOGITS_CHUNK_ELEMENTS / V) x V x (4 + 4 + c)`` bytes
    (float32 logits, their gradient and the compute-dtype product);
  * ring buffers, the backward peak of one layer (``longctx.trainer.attention.ring``): the held and the
    arriving K/V block in bf16 plus the held and the arriving dK/dV accumulator in fp32;
* **optimizer step**: weights, gradients, moments and the temporary AdamW's multi-tensor update makes of
  the second moments' square roots, ``20 P / S``.

What a block keeps is counted tensor by tensor, and on the CPU the count equals, byte for byte, the
storages a block's forward leaves alive for its backward, in every mode and for the three precisions
(float32; bf16 autocast over float32 weights; bf16 weights), tests/trainer/test_checkpointing.py.
Measured on one H200 (``tests/benchmarks/gpu_suite.py``, a 1.1B Llama-shaped model, one unsharded process,
reports under ``tests/benchmarks/results/``, 2026-11-30, before selective checkpointing became the per-op
policy of ``longctx.trainer.models.checkpointing``): the peak allocated memory was 0.92x this estimate with
full
checkpointing at 32K-256K tokens (1.00x at 16K, where the optimizer step is the peak) and 1.04-1.06x
without checkpointing at 8K-16K. The earlier model, which kept the residual stream in bf16 and every
gradient at the peak, was exceeded by up to 1.57x (256K).

``auto`` (:func:`choose_checkpointing`) takes the cheapest mode whose estimate fits: none (nothing
recomputed), then selective (pointwise work recomputed), then full (the whole block recomputed).

A device also needs room for the CUDA context, communication buffers, kernel workspaces and allocator
fragmentation, which this model does not derive: a setting fits when the estimate stays below
``(1 - HEADROOM_FRACTION) x memory - RESERVED_BYTES``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from longctx.core.errors import ConfigError
from longctx.trainer.models.shape import ACTIVATION_CHECKPOINTING, ModelShape, logits_chunk_tokens
from longctx.trainer.planning.flops import param_count

ACTIVATION_BYTES = 2
"""Bytes per element of activations and of the key/value blocks sent around the ring (bf16)."""

GRAD_ACCUM_BYTES = 4
"""Bytes per element of the dK/dV accumulators riding the ring in backward (fp32, see ``ring.py``)."""

WEIGHT_AND_MOMENT_BYTES_PER_PARAM = 12
"""float32 weight 4 + AdamW's float32 moments 4 + 4, held all the time (gradients are counted apart).

``longctx train`` keeps float32 parameters (FSDP2 gathers them in bf16 for compute); the other common
layout (bf16 weight 2 + fp32 master 4 + m 4 + v 4, bf16 gradients) holds the same 16 bytes with gradients.
"""

GRAD_BYTES = 4
"""Bytes per parameter of a gradient (float32, like the parameters)."""

OPTIMIZER_TEMP_BYTES_PER_PARAM = 4
"""The temporary AdamW's multi-tensor (``foreach``) update allocates: the square roots of the second
moments of a whole parameter group at once."""

RESERVED_BYTES = 2 * 1024**3
"""Device memory kept for the CUDA context, communication buffers and kernel workspaces."""

HEADROOM_FRACTION = 0.10
"""Share of device memory kept free for allocator fragmentation and transient buffers."""

CHECKPOINTING_SETTINGS = ("auto", *ACTIVATION_CHECKPOINTING)
"""Values of ``train.activation_checkpointing``: a mode, or ``auto`` (:func:`choose_checkpointing`)."""


def block_param_count(model: ModelShape) -> int:
    """Parameters of one decoder block: ``h(2q + 2k) + 3hi + 2h``."""
    h = model.hidden_size
    return h * (2 * model.q_dim + 2 * model.kv_dim) + 3 * h * model.intermediate_size + 2 * h


def activation_bytes_per_token(model: ModelShape, length: int, *, flash: bool) -> float:
    """Bytes one layer keeps for backward per token of a sequence of ``length`` tokens (bf16, no recompute).

    Follows Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"
    (section 4.1), whose GPT layer (dropout, 4h GeLU MLP) keeps ``s b h (34 + 5 a s / h)`` bytes. For a
    Llama layer (no dropout, GQA, SwiGLU) the same accounting gives, per token:

    * ``8h``: inputs of both RMSNorms and both normed outputs (the inputs of the q/k/v and MLP matmuls);
    * ``4q + 4k``: Q and K (after RoPE), V, and the attention output (input of the o projection);
    * ``8i``: gate and up outputs, SiLU(gate), and their product (input of the down projection);
    * with FlashAttention, ``4a``: one fp32 log-sum-exp per head (scores are recomputed in backward);
    * without it, ``2 a L``: each head's row of ``L`` softmax probabilities in bf16, kept for both the
      softmax and the ``P V`` backward -- the ``O(L^2)`` term per sequence (Korthikanti's ``5as/h`` is
      this plus a dropout mask and dropout output; an implementation that keeps fp32 softmax outputs
      as well stores ``6 a L``).
    """
    common = ACTIVATION_BYTES * (
        4 * model.hidden_size + 2 * model.q_dim + 2 * model.kv_dim + 4 * model.intermediate_size
    )
    if flash:
        return common + 4.0 * model.num_heads
    return common + ACTIVATION_BYTES * model.num_heads * length


def kv_block_bytes(
    model: ModelShape, block_tokens: float, bytes_per_element: float = ACTIVATION_BYTES
) -> float:
    """One layer's keys and values for ``block_tokens`` tokens: ``2 x b x g x d x bytes``."""
    return 2.0 * block_tokens * model.kv_dim * bytes_per_element


def held_bytes_per_token(
    model: ModelShape,
    mode: str,
    compute_bytes: int = ACTIVATION_BYTES,
    residual_bytes: int = ACTIVATION_BYTES,
) -> float:
    """Bytes one decoder block keeps per token from its forward until its backward, by checkpointing mode
    (``longctx.trainer.models.checkpointing``).

    ``full``: its input, ``r h``; ``selective``: its input and the outputs of its matmuls and of its
    attention: q, k, v ``c(q + 2k)``, the attention output ``cq`` and fp32 log-sum-exp ``4a``, the output
    projection ``ch``, gate and up ``2ci``, down ``ch``; in all ``r h + c(2q + 2k + 2h + 2i) + 4a``;
    ``none``: everything its backward reads (:func:`saved_bytes_per_token`).
    """
    h = model.hidden_size
    if mode == "none":
        return saved_bytes_per_token(model, compute_bytes, residual_bytes)
    if mode == "full":
        return float(residual_bytes * h)
    if mode == "selective":
        matmuls_and_attention = 2 * model.q_dim + 2 * model.kv_dim + 2 * h + 2 * model.intermediate_size
        return residual_bytes * h + compute_bytes * matmuls_and_attention + 4.0 * model.num_heads
    raise ConfigError(
        f"activation checkpointing must be one of {', '.join(ACTIVATION_CHECKPOINTING)}, got {mode!r}"
    )


def saved_bytes_per_token(
    model: ModelShape, compute_bytes: int = ACTIVATION_BYTES, residual_bytes: int = ACTIVATION_BYTES
) -> float:
    """Bytes per token a block's forward saves for its backward (:func:`activation_bytes_per_token`'s
    accounting, tensor by tensor for this model):

    * each of the two RMSNorms: its input in float32 (``x.float()``, a copy when the residual stream is
      bf16), its normalized value in the residual dtype and a float32 statistic, ``4h + rh + 4``;
    * the inputs of the five input projections (q, k, v, gate, up): the two norms' outputs when the
      residual stream has the compute dtype (``2ch``), else the compute-dtype casts bf16 autocast makes
      for every matmul that reads them (``5ch``);
    * the rotated queries and keys, the values and the attention output ``c(2q + 2k)`` (the output
      projection's input is the attention output itself) and the fp32 log-sum-exp ``4a``;
    * the MLP's gate, up, SiLU and gated product ``4ci``.
    """
    h = model.hidden_size
    saved = compute_bytes * (2 * model.q_dim + 2 * model.kv_dim + 4 * model.intermediate_size)
    saved += 4.0 * model.num_heads + 2 * (4 * h + residual_bytes * h + 4)
    saved += compute_bytes * (5 if residual_bytes > compute_bytes else 2) * h
    return saved


def working_bytes_per_token(
    model: ModelShape,
    mode: str,
    compute_bytes: int = ACTIVATION_BYTES,
    residual_bytes: int = ACTIVATION_BYTES,
) -> float:
    """Bytes per token of the one block being backpropagated, beyond what it held since forward.

    With recomputation (``full``, ``selective``) its forward runs again, so it holds everything
    :func:`saved_bytes_per_token` counts; in every mode its backward adds gradients that live beside
    those activations: of the MLP's gate, up and gated product ``3ci`` and of the block's input and
    output ``2rh``.
    """
    transient = compute_bytes * 3 * model.intermediate_size + residual_bytes * 2 * model.hidden_size
    if mode == "none":
        return float(transient)
    return saved_bytes_per_token(model, compute_bytes, residual_bytes) + transient


@dataclass(frozen=True)
class RankMemory:
    """Memory one rank holds at the peaks of a training step, in bytes (see the module docstring)."""

    model_states: float
    gathered_params: float
    activations: float
    logits: float
    ring_buffers: float
    optimizer_step: float

    @property
    def backward(self) -> float:
        """The backward peak: the sum of every part but the optimizer step."""
        return self.model_states + self.gathered_params + self.activations + self.logits + self.ring_buffers

    @property
    def total(self) -> float:
        """The larger of the two peaks, backward and optimizer step."""
        return max(self.backward, self.optimizer_step)

    def parts(self) -> dict[str, float]:
        """Label -> bytes of the backward peak's parts, in the order they are printed."""
        return {
            "weights, AdamW moments and gradients": self.model_states,
            "gathered parameters (FSDP)": self.gathered_params,
            "activations": self.activations,
            "loss logits chunk": self.logits,
            "ring buffers": self.ring_buffers,
        }


def rank_memory(
    model: ModelShape,
    length: int,
    cp: int,
    *,
    state_shards: int = 1,
    activation_checkpointing: str | bool = "none",
    compute_bytes: int = ACTIVATION_BYTES,
    residual_bytes: int | None = None,
) -> RankMemory:
    """Per-rank memory for one window of ``length`` tokens split over ``cp`` ranks (``b = L / cp``),
    with the model state sharded over ``state_shards`` ranks (FSDP2 over ``dp_shard x cp``; 1 for a
    single process). ``activation_checkpointing`` is ``none``/``full``/``selective`` (``True``/``False``
    mean full/none); ``compute_bytes`` is 2 for bf16 compute and 4 for float32. ``residual_bytes`` is the
    residual stream's width, by default ``compute_bytes`` when the state is sharded (FSDP2) and 4 for
    one unsharded process (float32 parameters under bf16 autocast).
    """
    if isinstance(activation_checkpointing, bool):
        activation_checkpointing = "full" if activation_checkpointing else "none"
    if residual_bytes is None:
        residual_bytes = compute_bytes if state_shards > 1 else 4
    widths = (compute_bytes, residual_bytes)
    block = length // cp
    params = param_count(model)
    projection = model.vocab_size * model.hidden_size
    gathered = 0.0
    if state_shards > 1:
        gathered = (2 * block_param_count(model) + projection) * (2 * compute_bytes + 4)
    buffers = (
        2 * (kv_block_bytes(model, block) + kv_block_bytes(model, block, GRAD_ACCUM_BYTES)) if cp > 1 else 0.0
    )
    held = block * held_bytes_per_token(model, activation_checkpointing, *widths)
    gradients = GRAD_BYTES * params / state_shards
    # backward's start: every block's activations, the output projection's gradient; its end: one
    # block's activations, every gradient (a block's activations go as its gradients come)
    at_start = model.num_layers * held + GRAD_BYTES * projection / state_shards
    at_end = held + gradients
    held_part, gradient_part = (held * model.num_layers, at_start - held * model.num_layers)
    if at_end > at_start:
        held_part, gradient_part = held, gradients
    chunk = min(block, logits_chunk_tokens(model.vocab_size))
    return RankMemory(
        model_states=WEIGHT_AND_MOMENT_BYTES_PER_PARAM * params / state_shards + gradient_part,
        gathered_params=float(gathered),
        activations=held_part + block * working_bytes_per_token(model, activation_checkpointing, *widths),
        logits=float(chunk * model.vocab_size * (8 + compute_bytes)),
        ring_buffers=buffers,
        optimizer_step=(WEIGHT_AND_MOMENT_BYTES_PER_PARAM + GRAD_BYTES + OPTIMIZER_TEMP_BYTES_PER_PARAM)
        * params
        / state_shards,
    )


def usable_bytes(device_bytes: float) -> float:
    """What the estimate may use of a device of ``device_bytes``."""
    return (1 - HEADROOM_FRACTION) * device_bytes - RESERVED_BYTES


def fits(memory: RankMemory, device_bytes: float) -> bool:
    """Whether ``memory`` fits a device of ``device_bytes`` with the headroom of the module docstring."""
    return memory.total <= usable_bytes(device_bytes)


def gib(value: float) -> str:
    return f"{value / 1024**3:.1f} GiB"


def choose_checkpointing(
    model: ModelShape,
    length: int,
    cp: int,
    device_bytes: float | None,
    *,
    state_shards: int = 1,
    compute_bytes: int = ACTIVATION_BYTES,
    residual_bytes: int | None = None,
) -> str:
    """``auto``: the first of :data:`ACTIVATION_CHECKPOINTING` (none, selective, full) whose estimate
    (:func:`rank_memory`, same arguments) fits a device of ``device_bytes``. ``full`` when none fits (then
    :func:`check_fits` refuses with the breakdown) or when the device's memory is unknown (None)."""
    if device_bytes is None:
        return "full"
    for mode in ACTIVATION_CHECKPOINTING:
        memory = rank_memory(
            model,
            length,
            cp,
            state_shards=state_shards,
            activation_checkpointing=mode,
            compute_bytes=compute_bytes,
            residual_bytes=residual_bytes,
        )
        if fits(memory, device_bytes):
            return mode
    return "full"


def describe_choice(mode: str, memory: RankMemory, device_bytes: float | None) -> str:
    """What ``auto`` chose and why: ``selective (estimate 57.3 GiB of 124.0 GiB usable)``."""
    if device_bytes is None:
        return f"{mode} (the device's memory is unknown; estimate {gib(memory.total)})"
    return f"{mode} (estimate {gib(memory.total)} of {gib(usable_bytes(device_bytes))} usable)"


def checkpointing_that_fits(
    setting: str,
    model: ModelShape,
    length: int,
    cp: int,
    device_bytes: float | None,
    *,
    state_shards: int,
    compute_bytes: int,
    residual_bytes: int,
    where: str,
    settings: str,
    report: Callable[[str], None] | None = None,
) -> str:
    """The mode ``train.activation_checkpointing`` asks for (``auto``: :func:`choose_checkpointing`, and
    ``report`` is given one line saying what it chose); raises :class:`ConfigError` (:func:`check_fits`)
    when its estimate does not fit a device of ``device_bytes`` (None: unknown, nothing checked)."""
    widths = {"state_shards": state_shards, "compute_bytes": compute_bytes, "residual_bytes": residual_bytes}
    mode = setting
    if setting == "auto":
        mode = choose_checkpointing(model, length, cp, device_bytes, **widths)
    memory = rank_memory(model, length, cp, activation_checkpointing=mode, **widths)
    if setting == "auto" and report is not None:
        report(f"activation checkpointing auto: {describe_choice(mode, memory, device_bytes)}")
    if device_bytes is not None:
        check_fits(memory, device_bytes, where=where, settings=f"{settings}, activation checkpointing {mode}")
    return mode


def check_fits(memory: RankMemory, device_bytes: float, *, where: str, settings: str) -> None:
    """Raise :class:`ConfigError` with the per-rank breakdown and what to change when ``memory``
    does not fit a device of ``device_bytes``."""
    if fits(memory, device_bytes):
        return
    breakdown = ", ".join(f"{label} {gib(value)}" for label, value in memory.parts().items())
    breakdown += f"; the optimizer step {gib(memory.optimizer_step)}"
    raise ConfigError(
        f"the run does not fit {where}: about {gib(memory.total)} per rank ({breakdown}) against "
        f"{gib(usable_bytes(device_bytes))} usable of {gib(device_bytes)}, with {settings}. "
        "Shard the state over more ranks (more processes), raise train.cp (fewer tokens per rank), or set "
        "train.activation_checkpointing to auto, selective or full; check with longctx plan --gpu-memory"
    )
