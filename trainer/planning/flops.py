"""The FLOP model of a dense Llama-family decoder, shared by ``longctx plan`` and the training metrics.

Symbols: ``h`` hidden size, ``i`` MLP (SwiGLU) intermediate size, ``n`` layers, ``a`` query heads,
``g`` key/value heads, ``d`` head dimension, ``q = a*d`` and ``k = g*d`` the query and key/value
widths, ``V`` vocabulary. A multiply-add counts as 2 FLOPs. Per token, the forward pass costs
``2 N_matmul`` in its matmuls (:func:`matmul_param_count`) plus ``4 q`` per layer for every key the
token's query attends to (``QK^T`` and ``PV``, each ``2 d`` per head). Training is 3x the forward (the
backward computes gradients of both inputs and weights), without recomputation. Causal attention over
a window of ``L`` sees ``(L + 1) / 2`` keys per query on average; the planner uses ``L / 2``, as
FlashAttention's FLOP counts do, and the training metrics count the (query, key) pairs a
document-masked batch really has. Nothing here imports torch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from longctx.trainer.models.shape import ModelShape

TRAIN_FACTOR = 3.0
"""Training FLOPs over forward FLOPs: the backward pass costs twice the forward."""


def param_count(model: ModelShape) -> int:
    """All parameters: ``n * (h(2q + 2k) + 3hi + 2h) + h + V*h * (1 if tied else 2)``.

    Per layer: the q, k, v, o projections ``h*q + 2*h*k + q*h``, the SwiGLU gate/up/down ``3*h*i`` and two
    RMSNorm weights; then the final norm, the input embedding and (unless tied) the output projection.
    Llama-3-8B: 8,030,261,248.
    """
    h = model.hidden_size
    per_layer = h * (2 * model.q_dim + 2 * model.kv_dim) + 3 * h * model.intermediate_size + 2 * h
    embeddings = model.vocab_size * h * (1 if model.tie_word_embeddings else 2)
    return model.num_layers * per_layer + h + embeddings


def matmul_param_count(model: ModelShape) -> int:
    """Parameters that take part in a matmul for every token: ``n * (h(2q + 2k) + 3hi) + V*h``.

    The input embedding is a lookup (no FLOPs) and norms are elementwise; the output projection ``V*h``
    counts once whether or not it is tied to the embedding. Forward FLOPs of the dense part are ``2x``
    this, which is where the usual "6 x parameters x tokens" for training comes from.
    """
    h = model.hidden_size
    per_layer = h * (2 * model.q_dim + 2 * model.kv_dim) + 3 * h * model.intermediate_size
    return model.num_layers * per_layer + model.vocab_size * h


@dataclass(frozen=True)
class LayerFlops:
    """Forward FLOPs of one layer for one token at a given context length."""

    projections: float
    mlp: float
    attention: float

    @property
    def dense(self) -> float:
        """Projections plus MLP: the part that does not grow with context length."""
        return self.projections + self.mlp

    @property
    def attention_ratio(self) -> float:
        """Attention FLOPs over dense FLOPs; above 1 attention dominates the layer."""
        return self.attention / self.dense


def layer_flops(model: ModelShape, length: int, *, causal: bool = True) -> LayerFlops:
    """Per-layer, per-token forward FLOPs at context length ``length`` (``L``).

    * projections ``2h(q + 2k + q)``: q, k, v and o, each ``2 x inputs x outputs``;
    * MLP ``2 * 3hi``: gate, up and down projections of SwiGLU (the elementwise SiLU and product are
      negligible);
    * attention ``2 * 2 * L' * q``: scores ``QK^T`` and ``P V``, each ``2 * L' * d`` per head, where
      ``L' = L / 2`` for causal attention (the average number of visible keys) and ``L' = L`` for full.
    """
    h = model.hidden_size
    keys = length / 2 if causal else length
    return LayerFlops(
        projections=2.0 * h * (2 * model.q_dim + 2 * model.kv_dim),
        mlp=6.0 * h * model.intermediate_size,
        attention=4.0 * keys * model.q_dim,
    )


def forward_flops_per_token(model: ModelShape, length: int, *, causal: bool = True) -> float:
    """Whole-model forward FLOPs per token: ``n * (projections + MLP + attention(L)) + 2hV`` (logits)."""
    per_layer = layer_flops(model, length, causal=causal)
    return (
        model.num_layers * (per_layer.dense + per_layer.attention)
        + 2.0 * model.hidden_size * model.vocab_size
    )


def train_flops_per_token(model: ModelShape, length: int) -> float:
    """Training FLOPs per token (forward + backward, causal): ``3 x forward = 6 N_matmul + 6 n q L``.

    ``N_matmul`` is :func:`matmul_param_count`. The attention term is PaLM's ``12 n q L`` (Chowdhery
    et al. 2022, appendix B) halved for causal masking; MFU figures quoted with the full ``12 n q L``
    read correspondingly higher at long context.
    """
    return TRAIN_FACTOR * forward_flops_per_token(model, length, causal=True)


def causal_pair_count(lengths: Iterable[int]) -> int:
    """(query, key) pairs that causal attention within each document computes: ``sum n (n + 1) / 2``
    over the documents' lengths ``n`` (a packed window's segments, padding included)."""
    return sum(n * (n + 1) // 2 for n in lengths)


def attention_flops(q_dim: int, pairs: float) -> float:
    """Forward FLOPs of one layer's attention over ``pairs`` (query, key) pairs: ``4 q x pairs``
    (``QK^T`` and ``PV``, each ``2 d`` per head and pair). Forward plus backward is
    :data:`TRAIN_FACTOR` times this."""
    return 4.0 * q_dim * pairs


def training_flops(model: ModelShape, tokens: float, causal_pairs: float) -> float:
    """FLOPs of forward plus backward over ``tokens`` tokens whose queries attend to ``causal_pairs``
    keys in all (for document-masked causal attention, the sum over segments of ``len * (len + 1) / 2``,
    :func:`causal_pair_count`): ``3 x (2 N_matmul x tokens + 4 n q x pairs)``."""
    attention = model.num_layers * attention_flops(model.q_dim, causal_pairs)
    forward = 2.0 * matmul_param_count(model) * tokens + attention
    return TRAIN_FACTOR * forward
