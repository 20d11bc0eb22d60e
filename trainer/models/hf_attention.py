"""longctx's ring attention as a transformers attention implementation, and activation checkpointing
of a transformers model's decoder layers.

:func:`register` adds ``attn_implementation="longctx_ring"`` to transformers' ``AttentionInterface``.
A model built with it runs its own modeling code (projections, q/k norms, biases, RoPE) and calls
:func:`ring_attention_forward` where it would call SDPA or FlashAttention. transformers builds no mask
for an implementation it has no mask function for, and forwards the keyword arguments of the model's
``forward`` to the attention function: the caller passes one :class:`PackedRows` as
``longctx_rows=...``, the bound ring attention of every batch row (``model.RingAttention.bind``: the
row's ring plan, built once per forward and shared by all layers), which carry the document masks
(same segment id, causal in the window's token order).

:func:`checkpoint_layers` makes each decoder layer keep less for backward, by the same modes and
mechanism as the own model's blocks (``longctx.trainer.models.checkpointing.run_block``): ``full`` keeps the
layer's input only; ``selective`` keeps the outputs of its matrix multiplications and of the ring
attention operator, and recomputes the rest (norms, RoPE, activations), so the ring does not run again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from torch import Tensor, nn

from longctx.trainer.models.checkpointing import run_block
from longctx.trainer.models.decoder import RowAttention

ATTENTION_NAME = "longctx_ring"
PROBE_NAME = "longctx_probe"
ROWS_KWARG = "longctx_rows"
"""The keyword argument of the model's ``forward`` that carries the :class:`PackedRows`."""
# Keyword arguments transformers passes to every attention function that the ring needs no action for.
_ROUTINE_KWARGS = (ROWS_KWARG, "position_ids", "use_cache", "cache_position", "output_attentions")


@dataclass(frozen=True)
class PackedRows:
    """What the attention of every layer needs about the batch: one bound attention per row, called
    ``(q, k, v, softmax_scale=...)``: the ring's (``RingAttention.bind``) or, in evaluation, a key/value
    cache's (``generate.KVCache``); and the window length, the largest span a document can have (a
    sliding window at least this long never cuts a document)."""

    rows: Sequence[RowAttention]
    window: int


def ring_attention_forward(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """transformers' attention-function signature: ``query`` ``[B, heads, T, d]``, ``key``/``value``
    ``[B, kv_heads, T, d]`` -> ``([B, T, heads, d], None)``, by longctx's ring attention row by row.

    ``attention_mask`` is ignored (transformers builds none for this implementation; the rows carry
    the document masks). Features the ring does not compute raise ``ValueError``: attention dropout,
    logit soft-capping, attention sinks, and a sliding window shorter than the window length (the
    architecture check of ``hf_arch`` refuses such models before training starts).
    """
    packed = kwargs.get(ROWS_KWARG)
    if not isinstance(packed, PackedRows):
        raise ValueError(
            f"attn_implementation {ATTENTION_NAME!r} needs the rows' ring attention as "
            f"{ROWS_KWARG}=PackedRows(...) in the model's forward (hf.HFCausalLM passes it)"
        )
    if attention_mask is not None:
        raise ValueError(
            f"{type(module).__name__} passes an attention mask of its own; ring attention applies document "
            "masks only"
        )
    if dropout:
        raise ValueError(f"ring attention has no attention dropout (got {dropout})")
    for name in ("softcap", "s_aux", "sinks"):
        if kwargs.get(name) is not None:
            raise ValueError(f"ring attention does not compute {name}")
    window = kwargs.get("sliding_window")
    if window is not None and window < packed.window:
        raise ValueError(
            f"sliding window of {window} tokens is shorter than the {packed.window}-token windows"
        )
    if len(packed.rows) != query.shape[0]:
        raise ValueError(f"{len(packed.rows)} row attentions for a batch of {query.shape[0]} rows")
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    out = [attend(q[b], k[b], v[b], softmax_scale=scaling) for b, attend in enumerate(packed.rows)]
    return torch.stack(out), None


@dataclass(frozen=True)
class AttentionCall:
    """What a model hands its attention function, as :func:`attention_calls` saw it: the attention
    module's class, whether the packed rows arrived, whether the model built an attention mask of its
    own, the dropout, and every other keyword argument that has a value (``sliding_window``,
    ``s_aux``, ``softcap``...)."""

    module: str
    rows: bool
    mask: bool
    dropout: float
    extras: dict[str, Any]


_PROBED: list[AttentionCall] = []
"""The calls the probe saw during :func:`attention_calls` (a check runs in one thread)."""


def _probe_forward(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """Record the call and give the output's shape (meta tensors: nothing is computed)."""
    extras = {k: v for k, v in kwargs.items() if v is not None and k not in _ROUTINE_KWARGS}
    rows = ROWS_KWARG in kwargs
    _PROBED.append(AttentionCall(type(module).__name__, rows, attention_mask is not None, dropout, extras))
    return torch.empty_like(query).transpose(1, 2).contiguous(), None


def attention_calls(decoder: nn.Module, length: int) -> tuple[list[AttentionCall], Exception | None]:
    """Run ``decoder`` (of a model built with ``attn_implementation=PROBE_NAME``, on the meta device: no
    memory, no compute) on one meta row of ``length`` tokens, as ``HFCausalLM.forward`` calls it, and
    return every call of its attention interface, in order, with the exception that stopped the forward
    early (None when it finished): mixture-of-experts layers, for one, cannot route meta tensors, so
    what is seen then is the calls of the layers before the first such layer."""
    with torch.device("meta"):
        ids = torch.zeros(1, length, dtype=torch.long)
        positions = torch.arange(length)[None]
    _PROBED.clear()
    stopped = None
    try:
        with torch.no_grad():
            decoder(input_ids=ids, position_ids=positions, use_cache=False, **{ROWS_KWARG: "probe"})
    except Exception as err:
        stopped = err
    calls, _PROBED[:] = list(_PROBED), []
    return calls, stopped


def register() -> None:
    """Make ``attn_implementation="longctx_ring"`` (and the probe's) known to transformers (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, ring_attention_forward)
    AttentionInterface.register(PROBE_NAME, _probe_forward)


def _checkpointed(forward: Callable[..., Any], mode: str) -> Callable[..., Any]:
    """``forward`` keeping for backward what ``mode`` says (``run_block``; keyword arguments, the
    rotary tables and the packed rows among them, are bound before the checkpoint)."""

    def run(*args: Any, **kwargs: Any) -> Any:
        return run_block(partial(forward, **kwargs), mode, *args)

    return run


def checkpoint_layers(layers: Sequence[nn.Module], mode: str) -> None:
    """Apply activation checkpointing mode ``mode`` (``none``, ``full``, ``selective``) to ``layers``.

    The layer's ``forward`` is replaced on the instance, so that module hooks (FSDP2's all-gathers)
    stay outside the recomputed part, as transformers' own gradient checkpointing does.
    """
    if mode == "none":
        return
    for layer in layers:
        layer.forward = _checkpointed(layer.forward, mode)
