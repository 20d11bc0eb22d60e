"""The memory model of a training rank, shared by ``longctx plan`` and ``longctx train``.

Before anything is loaded, ``longctx train`` computes this estimate for its own settings and, on a
GPU, refuses to start when it exceeds the device's memory (:func:`check_fits`); ``longctx plan``
prints the same figures and whether they fit a given ``--gpu-memory``. Nothing here imports torch.

What one rank holds at the peak of a step (symbols as in ``longctx.trainer.flops``; ``b = L / cp``
tokens per rank, ``S`` ranks the model state is sharded over, ``c`` bytes per element of the compute
dtype, 2 for bf16):

* model states ``16 P / S``: float32 master weights, gradients and AdamW moments (FSDP2 shards all four);
* gathered parameters, FSDP2's unsharded working copies (0 when ``S = 1``): two decoder blocks (the
  running one and the prefetched one) with their unsharded gradients and float32 reduce buffers,
  ``2 P_block (2c + 4)``, and the root's output projection, gathered from the end of forward to its
  gradient's reduction, ``V h (2c + 4)``;
* activations of ``b`` tokens (:func:`activation_bytes`, by activation-checkpointing mode);
* one chunk of the loss's logits: ``min(b, LOGITS_CHUNK_ELEMENTS / V) x V x (4 + 4 + c)`` bytes (float32
  logits, their gradient and the compute-dtype product);
* ring buffers, the backward peak of one layer (``longctx.trainer.attention.ring``): the held and the
  arriving K/V block in bf16 plus the held and the arriving dK/dV accumulator in fp32.

A device also needs room for the CUDA context, communication buffers, kernel workspaces and allocator
fragmentation, which this model does not derive: a setting fits when the estimate stays below
``(1 - HEADROOM_FRACTION) x memory - RESERVED_BYTES``.
"""

from __future__ import annotations

from dataclasses import dataclass

from longctx.core.errors import ConfigError
from longctx.trainer.flops import ModelShape, param_count

ACTIVATION_BYTES = 2
"""Bytes per element of activations and of the key/value blocks sent around the ring (bf16)."""

GRAD_ACCUM_BYTES = 4
"""Bytes per element of the dK/dV accumulators riding the ring in backward (fp32, see ``ring.py``)."""

MODEL_STATE_BYTES_PER_PARAM = 16
"""Weights, gradients and AdamW moments per parameter: fp32 weight 4 + fp32 gradient 4 + fp32 m 4 + fp32 v 4.

``longctx train`` keeps fp32 parameters (FSDP2 gathers them in bf16 for compute), which is exactly this;
the other common layout (bf16 weight 2 + bf16 gradient 2 + fp32 master 4 + m 4 + v 4) is also 16.
"""


LOGITS_CHUNK_ELEMENTS = 2**27
"""Largest ``tokens x vocab`` block of logits the loss materializes at once (512 MiB in float32):
longer inputs are cut into chunks of :func:`logits_chunk_tokens` tokens, each recomputed in backward."""

RESERVED_BYTES = 2 * 1024**3
"""Device memory kept for the CUDA context, communication buffers and kernel workspaces."""

HEADROOM_FRACTION = 0.10
"""Share of device memory kept free for allocator fragmentation and transient buffers."""

ACTIVATION_CHECKPOINTING = ("none", "full", "selective")


def logits_chunk_tokens(vocab_size: int) -> int:
    """Tokens per chunk of the loss's logits (see :data:`LOGITS_CHUNK_ELEMENTS`)."""
    return max(1, LOGITS_CHUNK_ELEMENTS // vocab_size)


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



def selective_bytes_per_token(model: ModelShape) -> float:
    """Bytes a block keeps per token with selective checkpointing: its input ``2h``, the rotated
    queries, keys and values and the attention output ``2(2q + 2k)``, and the fp32 log-sum-exp ``4a``."""
    return ACTIVATION_BYTES * (model.hidden_size + 2 * model.q_dim + 2 * model.kv_dim) + 4.0 * model.num_heads


def activation_bytes(model: ModelShape, tokens: int, length: int, mode: str) -> float:
    """Activations one rank keeps for backward for ``tokens`` tokens of a window of ``length``.

    ``none``: every layer's activations ``n b A`` (:func:`activation_bytes_per_token`, FlashAttention-style
    blocks: ring attention never materializes scores); ``full``: every layer's input ``n b 2h`` plus one
    layer's activations ``b A`` while it is recomputed; ``selective``: ``n b S``
    (:func:`selective_bytes_per_token`) plus one layer's ``b A``.
    """
    per_token = activation_bytes_per_token(model, length, flash=True)
    if mode == "none":
        return float(model.num_layers * tokens * per_token)
    if mode == "full":
        return float(model.num_layers * tokens * ACTIVATION_BYTES * model.hidden_size + tokens * per_token)
    if mode == "selective":
        return float(model.num_layers * tokens * selective_bytes_per_token(model) + tokens * per_token)
    raise ConfigError(f"activation checkpointing must be one of {', '.join(ACTIVATION_CHECKPOINTING)}, got {mode!r}")


@dataclass(frozen=True)
class RankMemory:
    """Memory one rank holds at the peak of a training step, in bytes (see the module docstring)."""

    model_states: float
    gathered_params: float
    activations: float
    logits: float
    ring_buffers: float

    @property
    def total(self) -> float:
        """The sum of every part."""
        return self.model_states + self.gathered_params + self.activations + self.logits + self.ring_buffers

    def parts(self) -> dict[str, float]:
        """Label -> bytes, in the order they are printed."""
        return {
            "model states (weights, gradients, AdamW)": self.model_states,
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
) -> RankMemory:
    """Per-rank memory for one window of ``length`` tokens split over ``cp`` ranks (``b = L / cp``),
    with the model state sharded over ``state_shards`` ranks (FSDP2 over ``dp_shard x cp``; 1 for a
    single process). ``activation_checkpointing`` is ``none``/``full``/``selective`` (``True``/``False``
    mean full/none); ``compute_bytes`` is 2 for bf16 compute and 4 for float32, which doubles activations.
    """
    if isinstance(activation_checkpointing, bool):
        activation_checkpointing = "full" if activation_checkpointing else "none"
    block = length // cp
    scale = compute_bytes / ACTIVATION_BYTES
    projection = model.vocab_size * model.hidden_size
    gathered = 0.0
    if state_shards > 1:
        gathered = (2 * block_param_count(model) + projection) * (2 * compute_bytes + 4)
    buffers = (
        2 * (kv_block_bytes(model, block) + kv_block_bytes(model, block, GRAD_ACCUM_BYTES)) if cp > 1 else 0.0
    )
    chunk = min(block, logits_chunk_tokens(model.vocab_size))
    return RankMemory(
        model_states=MODEL_STATE_BYTES_PER_PARAM * param_count(model) / state_shards,
        gathered_params=float(gathered),
        activations=scale * activation_bytes(model, block, length, activation_checkpointing),
        logits=float(chunk * model.vocab_size * (8 + compute_bytes)),
        ring_buffers=buffers,
    )


def usable_bytes(device_bytes: float) -> float:
    """What the estimate may use of a device of ``device_bytes``."""
    return (1 - HEADROOM_FRACTION) * device_bytes - RESERVED_BYTES


def fits(memory: RankMemory, device_bytes: float) -> bool:
    """Whether ``memory`` fits a device of ``device_bytes`` with the headroom of the module docstring."""
    return memory.total <= usable_bytes(device_bytes)


def gib(value: float) -> str:
    return f"{value / 1024**3:.1f} GiB"


def check_fits(memory: RankMemory, device_bytes: float, *, where: str, settings: str) -> None:
    """Raise :class:`ConfigError` with the per-rank breakdown and what to change when ``memory``
    does not fit a device of ``device_bytes``."""
    if fits(memory, device_bytes):
        return
    breakdown = ", ".join(f"{label} {gib(value)}" for label, value in memory.parts().items())
    raise ConfigError(
        f"the run does not fit {where}: about {gib(memory.total)} per rank ({breakdown}) against "
        f"{gib(usable_bytes(device_bytes))} usable of {gib(device_bytes)}, with {settings}. "
        "Shard the state over more ranks (more processes), raise train.cp (fewer tokens per rank), or set "
        "train.activation_checkpointing to selective or full; check with longctx plan --gpu-memory"
    )
