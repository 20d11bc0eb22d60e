"""A Llama-family decoder (Llama, Mistral, Qwen2) for packed, context-parallel training rows.

Architecture: token embedding, ``num_hidden_layers`` pre-norm blocks (RMSNorm, grouped-query
self-attention with RoPE, RMSNorm, SwiGLU MLP), final RMSNorm, and an output projection that is
either its own matrix or the transposed embedding (``tie_word_embeddings``). Module and parameter
names are Hugging Face's (``model.layers.0.self_attn.q_proj.weight``, ``lm_head.weight``, ...) so a
checkpoint maps onto :meth:`Transformer.state_dict` by identity (see ``longctx.trainer.models.weights``). The
model's configuration and its ``config.json`` form are
:class:`~longctx.trainer.models.decoder_config.ModelConfig`
(imported here, so ``from longctx.trainer.models.decoder import ModelConfig`` works too).

A row is a packed training window: several documents back to back, each token carrying its position
in its own document (``position_ids``, for RoPE), its global index in the window (``token_index``,
which under context parallelism is a zigzag subset rather than ``0..T-1``) and its document id
(``segment_ids``). Attention is causal within a document and masked across documents; it is
pluggable (:data:`Attention`), and the default is ``longctx.trainer.attention.ring_attention``.

:meth:`Transformer.forward` returns final hidden states rather than logits: at long context the
``[tokens, vocab]`` logits are the largest activation of the model, so the loss is computed in token
chunks (``forward(..., labels=...)``, :meth:`Transformer.token_cross_entropy`); :meth:`Transformer.logits`
gives full logits of an unsharded model when wanted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from longctx.trainer.attention.modes import RingAttention, RowAttention
from longctx.trainer.models.checkpointing import run_block
from longctx.trainer.models.decoder_config import ModelConfig
from longctx.trainer.models.fused import EAGER, EagerOps
from longctx.trainer.models.rope import inverse_frequencies, rotary_cos_sin
from longctx.trainer.models.shape import ACTIVATION_CHECKPOINTING, logits_chunk_tokens

# Attention interface ---------------------------------------------------------------------------------------

Attention = Callable[..., Tensor]
"""``attention(q, k, v, *, q_index, q_segment) -> out`` for one packed row.

``q`` is ``[tokens, n_heads, head_dim]``, ``k`` and ``v`` are ``[tokens, n_kv_heads, head_dim]``
(grouped-query heads are not repeated), ``q_index`` (int64 ``[tokens]``) are the tokens' global
indices in the window and ``q_segment`` (int ``[tokens]``) their document ids. Query ``i`` attends to
key ``j`` iff ``q_segment[j] == q_segment[i]`` and ``q_index[j] <= q_index[i]``, with softmax scale
``1 / sqrt(head_dim)``; the output is ``[tokens, n_heads, head_dim]``. An attention that also has a
``bind`` method (:class:`BindableAttention`) is bound once per row and forward pass instead.
"""


@runtime_checkable
class BindableAttention(Protocol):
    """An :data:`Attention` whose per-row preparation (masks, ring plan) is shared by all layers."""

    def bind(self, q_index: Tensor, q_segment: Tensor) -> RowAttention:
        """Prepare attention for one row's token indices and segment ids."""
        ...

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, *, q_index: Tensor, q_segment: Tensor) -> Tensor: ...


def bind_row(attention: Attention, q_index: Tensor, q_segment: Tensor) -> RowAttention:
    """The row attention for one row: ``attention.bind`` when available, else a partial call."""
    if isinstance(attention, BindableAttention):
        return attention.bind(q_index, q_segment)
    return partial(attention, q_index=q_index, q_segment=q_segment)


# Modules ---------------------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    """Root-mean-square layer norm (Zhang & Sennrich, arXiv:1910.07467), normalized in float32."""

    ops: EagerOps = EAGER
    """Its implementation (``longctx.trainer.models.fused``), set for the whole model by
    ``Transformer.use_ops``."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        """Normalize the last dimension; the result has ``x``'s dtype, scaled by ``weight``."""
        return self.ops.rms_norm(x, self.weight, self.eps)


class SwiGLU(nn.Module):
    """The gated MLP ``down(silu(gate(x)) * up(x))`` (Shazeer, arXiv:2002.05202)."""

    ops: EagerOps = EAGER

    def __init__(self, hidden_size: int, intermediate_size: int, bias: bool) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        """Apply the MLP to ``[..., hidden]``."""
        return self.down_proj(self.ops.silu_mul(self.gate_proj(x), self.up_proj(x)))


class SelfAttention(nn.Module):
    """Grouped-query self-attention with RoPE; the attention itself is delegated per row."""

    ops: EagerOps = EAGER

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.n_heads = config.num_attention_heads
        self.n_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        q_dim, kv_dim = self.n_heads * self.head_dim, self.n_kv_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, q_dim, bias=config.qkv_bias)
        self.k_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.qkv_bias)
        self.v_proj = nn.Linear(config.hidden_size, kv_dim, bias=config.qkv_bias)
        self.o_proj = nn.Linear(q_dim, config.hidden_size, bias=config.attention_bias)

    def project(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Rotated queries and keys, and values: ``[B, T, heads, head_dim]`` each."""
        batch, tokens, _ = x.shape
        q = self.q_proj(x).view(batch, tokens, self.n_heads, self.head_dim)
        k = self.k_proj(x).view(batch, tokens, self.n_kv_heads, self.head_dim)
        v = self.v_proj(x).view(batch, tokens, self.n_kv_heads, self.head_dim)
        return *self.ops.rotary(q, k, cos, sin), v

    @staticmethod
    def attend(q: Tensor, k: Tensor, v: Tensor, rows: Sequence[RowAttention]) -> Tensor:
        """Row-by-row attention; the output is ``[B, T, heads * head_dim]``. For one row (the trainer's
        micro-batch) it is a view of the attention's output, so that the output projection keeps the
        tensor the attention keeps for its backward rather than a copy of it."""
        if len(rows) == 1:
            return rows[0](q[0], k[0], v[0]).unsqueeze(0).flatten(-2)
        out = torch.stack([attend(q[b], k[b], v[b]) for b, attend in enumerate(rows)])
        return out.flatten(-2)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, rows: Sequence[RowAttention]) -> Tensor:
        """``x`` ``[B, T, hidden]``, RoPE tables ``[B, T, head_dim]``, one row attention per batch row."""
        return self.o_proj(self.attend(*self.project(x, cos, sin), rows))


class DecoderLayer(nn.Module):
    """Pre-norm block: ``x + attn(norm(x))``, then ``x + mlp(norm(x))``.

    ``checkpointing`` (``none``, ``selective`` or ``full``) is what the block keeps for backward; see
    ``longctx.trainer.models.checkpointing``.
    """

    def __init__(self, config: ModelConfig, *, checkpointing: str = "none") -> None:
        super().__init__()
        self.self_attn = SelfAttention(config)
        self.mlp = SwiGLU(config.hidden_size, config.intermediate_size, config.mlp_bias)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.checkpointing = checkpointing_mode(checkpointing)

    def attention_inputs(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The block before its attention: rotated queries and keys, and values."""
        return self.self_attn.project(self.input_layernorm(x), cos, sin)

    def after_attention(self, x: Tensor, attended: Tensor) -> Tensor:
        """The block after its attention: output projection, residual, MLP, residual."""
        x = x + self.self_attn.o_proj(attended)
        return x + self.mlp(self.post_attention_layernorm(x))

    def compile_halves(self, backend: str = "inductor") -> None:
        """Run :meth:`attention_inputs` and :meth:`after_attention` compiled (``torch.compile`` with
        ``backend``); the attention between them (the ring's exchanges and plan) stays out of every graph.
        The graphs are shared by every layer (the same code; parameters are graph inputs)."""
        self.attention_inputs = torch.compile(self.attention_inputs, backend=backend)
        self.after_attention = torch.compile(self.after_attention, backend=backend)

    def block(self, x: Tensor, cos: Tensor, sin: Tensor, rows: Sequence[RowAttention]) -> Tensor:
        """The whole block, without checkpointing."""
        return self.after_attention(x, SelfAttention.attend(*self.attention_inputs(x, cos, sin), rows))

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, rows: Sequence[RowAttention]) -> Tensor:
        """Apply the block to ``[B, T, hidden]``, keeping for backward what :attr:`checkpointing` says."""
        return run_block(self.block, self.checkpointing, x, cos, sin, rows)


def checkpointing_mode(value: str | bool) -> str:
    """What a decoder block keeps for backward (``longctx.trainer.models.checkpointing``): ``none``,
    ``selective``
    or ``full``. ``True``/``False`` (the old switch) mean full/none."""
    if isinstance(value, bool):
        return "full" if value else "none"
    if value not in ACTIVATION_CHECKPOINTING:
        raise ValueError(
            f"activation checkpointing must be one of {', '.join(ACTIVATION_CHECKPOINTING)}, got {value!r}"
        )
    return value


class Decoder(nn.Module):
    """Embedding, decoder layers and final norm (Hugging Face's ``model.*`` submodule)."""

    def __init__(self, config: ModelConfig, *, activation_checkpointing: str | bool = "none") -> None:
        super().__init__()
        self.activation_checkpointing = checkpointing_mode(activation_checkpointing)
        weight = torch.empty(config.vocab_size, config.hidden_size)
        if not weight.is_meta:  # nn.Embedding's own init on the meta device would import torch._dynamo
            nn.init.normal_(weight)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size, _weight=weight)
        self.layers = nn.ModuleList(
            DecoderLayer(config, checkpointing=self.activation_checkpointing)
            for _ in range(config.num_hidden_layers)
        )
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, input_ids: Tensor, cos: Tensor, sin: Tensor, rows: Sequence[RowAttention]) -> Tensor:
        """Final normalized hidden states ``[B, T, hidden]``; checkpointed layers recompute in backward."""
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x, cos, sin, rows)
        return self.norm(x)


def initial_value(name: str, shape: Sequence[int], std: float, generator: torch.Generator | None) -> Tensor:
    """The initial float32 value of parameter ``name``: ones for norm weights, zeros for biases,
    Normal(0, ``std``) for matrices and embeddings (drawn from ``generator``)."""
    if name.endswith("norm.weight"):
        return torch.ones(shape)
    if name.endswith(".bias"):
        return torch.zeros(shape)
    return torch.empty(shape).normal_(0.0, std, generator=generator)


class Transformer(nn.Module):
    """A Llama-family causal language model over packed rows (Hugging Face's ``*ForCausalLM``).

    ``attention`` defaults to :class:`RingAttention` with no group (local).
    ``activation_checkpointing`` is a mode of :func:`checkpointing_mode`; recomputation uses
    ``torch.utils.checkpoint``, non-reentrant (``longctx.trainer.models.checkpointing``).
    Parameters are created with PyTorch's default initialization; call :meth:`init_weights` for the
    usual normal init.

    The loss is part of :meth:`forward` (pass ``labels``) rather than a separate call, so that a
    model sharded with FSDP2 gathers its output projection once, in the forward it hooks.
    """

    ops: EagerOps = EAGER
    checkpoint_transforms: list = []  # noqa: RUF012 - read only
    """How checkpoint names map to parameters (``weights.load_weights``): none, they are Hugging Face's."""
    base_model_prefix = "model"

    def __init__(
        self,
        config: ModelConfig,
        *,
        attention: Attention | None = None,
        activation_checkpointing: str | bool = "none",
    ) -> None:
        super().__init__()
        self.config = config
        self.attention: Attention = attention if attention is not None else RingAttention()
        self.model = Decoder(config, activation_checkpointing=activation_checkpointing)
        self.lm_head = (
            None
            if config.tie_word_embeddings
            else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        )

    def checkpoint_tensors(self, tensors: dict[str, Tensor]) -> dict[str, Tensor]:
        """Full tensors under this model's names, as a checkpoint stores them: the same names."""
        return tensors

    def use_ops(self, ops: EagerOps) -> None:
        """Compute norms, SwiGLU, RoPE and the loss with ``ops`` (``longctx.trainer.models.fused``)
        everywhere."""
        for module in self.modules():
            if isinstance(module, (Transformer, RMSNorm, SwiGLU, SelfAttention)):
                module.ops = ops

    @property
    def decoder_layers(self) -> list[nn.Module]:
        """The decoder blocks, in order (FSDP2 shards each)."""
        return list(self.model.layers)

    @property
    def input_embedding(self) -> nn.Module:
        return self.model.embed_tokens

    @property
    def tied(self) -> bool:
        """Whether the output projection is the input embedding."""
        return self.lm_head is None

    @property
    def output_weight(self) -> Tensor:
        """The ``[vocab, hidden]`` output projection (the embedding when tied)."""
        return self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    @torch.no_grad()
    def init_weights(self, std: float = 0.02, generator: torch.Generator | None = None) -> None:
        """Normal(0, ``std``) linear and embedding weights, zero biases, unit norm weights.

        Values are drawn parameter by parameter in ``named_parameters`` order
        (:func:`initial_value`), so a sharded model filled the same way gets the same weights.
        """
        for name, param in self.named_parameters():
            param.copy_(initial_value(name, param.shape, std, generator))

    def rope_tables(self, position_ids: Tensor, rope_seq_len: int | None = None) -> tuple[Tensor, Tensor]:
        """RoPE ``cos``/``sin`` ``[..., head_dim]`` for ``position_ids`` (float32).

        Length-dependent scalings (``dynamic``, ``longrope``) use ``rope_seq_len``, defaulting to
        ``max(position_ids) + 1`` (one device sync). Under context parallelism pass the value of the
        whole window so every rank uses the same frequencies.
        """
        rope = self.config.rope
        if rope.depends_on_seq_len and rope_seq_len is None:
            rope_seq_len = int(position_ids.max()) + 1
        inv_freq, scaling = inverse_frequencies(rope, rope_seq_len, device=position_ids.device)
        return rotary_cos_sin(position_ids, inv_freq, scaling)

    def forward(
        self,
        input_ids: Tensor,
        position_ids: Tensor,
        token_index: Tensor,
        segment_ids: Tensor,
        *,
        rope_seq_len: int | None = None,
        labels: Tensor | None = None,
    ) -> Tensor:
        """Final hidden states ``[B, T, hidden]`` (``[T, hidden]`` for 1-D inputs) of packed rows,
        or, with ``labels``, each token's cross-entropy (see :meth:`token_cross_entropy`).

        All inputs are ``[B, T]`` (or ``[T]`` for one row) integer tensors: token ids, per-document
        positions (restarting at 0 in every document), global indices of the tokens in their window
        and document ids. Attention runs row by row. ``rope_seq_len``: see :meth:`rope_tables`.
        """
        shapes = {t.shape for t in (input_ids, position_ids, token_index, segment_ids)}
        if len(shapes) != 1 or input_ids.dim() not in (1, 2):
            raise ValueError(f"inputs must share one [B, T] or [T] shape, got {sorted(map(tuple, shapes))}")
        single = input_ids.dim() == 1
        if single:
            input_ids, position_ids, token_index, segment_ids = (
                t[None] for t in (input_ids, position_ids, token_index, segment_ids)
            )
        cos, sin = self.rope_tables(position_ids, rope_seq_len)
        rows = [bind_row(self.attention, token_index[b], segment_ids[b]) for b in range(input_ids.shape[0])]
        hidden = self.model(input_ids, cos, sin, rows)
        hidden = hidden[0] if single else hidden
        if labels is None:
            return hidden
        losses = self.token_cross_entropy(hidden, labels)
        # FSDP2 hooks the output for backward; an output that is a view could lose that hook
        return losses.clone() if losses._base is not None else losses

    def logits(self, hidden: Tensor) -> Tensor:
        """Vocabulary logits ``[..., vocab]`` of hidden states, in their dtype (unsharded models)."""
        return F.linear(hidden, self.output_weight)

    def token_cross_entropy(
        self, hidden: Tensor, labels: Tensor, *, chunk_tokens: int | None = None, ignore_index: int = -100
    ) -> Tensor:
        """Next-token cross-entropy of every token (float32, ``labels``' shape, 0 where ``labels`` is
        ``ignore_index``), differentiable; see :func:`chunked_cross_entropy`. With liger-kernel's ops
        (:meth:`use_ops`) its fused linear cross-entropy computes it instead."""
        flat_hidden, flat_labels = _flat_tokens(hidden, labels)
        weight = self.output_weight
        fused = self.ops.linear_cross_entropy(flat_hidden, weight, flat_labels, ignore_index)
        if fused is not None:
            return fused if labels.dim() == 1 else fused.view(labels.shape)
        return chunked_cross_entropy(
            hidden,
            labels,
            partial(F.linear, weight=weight),
            vocab_size=weight.shape[0],
            chunk_tokens=chunk_tokens,
            ignore_index=ignore_index,
        )

    def cross_entropy_sum(
        self, hidden: Tensor, labels: Tensor, *, chunk_tokens: int | None = None, ignore_index: int = -100
    ) -> Tensor:
        """Summed next-token cross-entropy (float32 scalar); see :meth:`token_cross_entropy`."""
        return self.token_cross_entropy(
            hidden, labels, chunk_tokens=chunk_tokens, ignore_index=ignore_index
        ).sum()


def chunked_cross_entropy(
    hidden: Tensor,
    labels: Tensor,
    logits_of: Callable[[Tensor], Tensor],
    *,
    vocab_size: int,
    chunk_tokens: int | None = None,
    ignore_index: int = -100,
) -> Tensor:
    """Next-token cross-entropy of every token (float32, or float64 for float64 logits; ``labels``'
    shape, 0 where ``labels`` is ``ignore_index``), differentiable, for hidden states whose logits
    ``logits_of`` computes.

    Logits are computed in float32 (float64 stays) at most ``chunk_tokens`` tokens at a time (default
    ``longctx.trainer.models.shape.logits_chunk_tokens`` of ``vocab_size``); when the input takes more
    than one
    chunk, each chunk is recomputed in backward, so at most one chunk of ``[chunk_tokens, vocab]``
    logits is alive. Summing gives the loss of this rank's tokens, which the caller normalizes by the
    token count of the whole (data- and context-parallel) batch.
    """
    flat_hidden, flat_labels = _flat_tokens(hidden, labels)
    chunk = chunk_tokens or logits_chunk_tokens(vocab_size)
    if flat_labels.numel() <= chunk:
        losses = _chunk_cross_entropy(flat_hidden, flat_labels, logits_of, ignore_index)
        return losses if labels.dim() == 1 else losses.view(labels.shape)
    parts = [
        checkpoint(
            _chunk_cross_entropy,
            flat_hidden[start : start + chunk],
            flat_labels[start : start + chunk],
            logits_of,
            ignore_index,
            use_reentrant=False,
        )
        for start in range(0, flat_labels.numel(), chunk)
    ]
    losses = torch.cat(parts)
    return losses if labels.dim() == 1 else losses.view(labels.shape)


def _flat_tokens(hidden: Tensor, labels: Tensor) -> tuple[Tensor, Tensor]:
    """``[tokens, hidden]`` hidden states and ``[tokens]`` labels (``ValueError`` when the counts differ)."""
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    flat_labels = labels.reshape(-1)
    if flat_labels.numel() != flat_hidden.shape[0]:
        raise ValueError(f"labels {tuple(labels.shape)} do not match hidden states {tuple(hidden.shape)}")
    return flat_hidden, flat_labels


def _chunk_cross_entropy(
    hidden: Tensor, labels: Tensor, logits_of: Callable[[Tensor], Tensor], ignore_index: int
) -> Tensor:
    logits = logits_of(hidden)
    logits = logits if logits.dtype == torch.float64 else logits.float()
    return F.cross_entropy(logits, labels, ignore_index=ignore_index, reduction="none")
