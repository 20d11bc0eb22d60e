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

:func:`checkpoint_layers` makes each decoder layer keep less for backward (``full``: its input only;
``selective``: its input and its attention's output, see ``attention.RingCache``), the same modes as
the own model's (``model.checkpointing_mode``).
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from longctx.trainer.attention import RingCache
from longctx.trainer.model import RowAttention

ATTENTION_NAME = "longctx_ring"
ROWS_KWARG = "longctx_rows"
"""The keyword argument of the model's ``forward`` that carries the :class:`PackedRows`."""


@dataclass(frozen=True)
class PackedRows:
    """What the attention of every layer needs about the batch: one bound attention per row, called
    ``(q, k, v, softmax_scale=...)`` (and ``cache=`` under selective checkpointing): the ring's
    (``RingAttention.bind``) or, in evaluation, a key/value cache's (``generate.KVCache``); and the
    window length, the largest span a document can have (a sliding window at least this long never
    cuts a document)."""

    rows: Sequence[RowAttention]
    window: int


@dataclass
class _LayerCaches:
    """The :class:`RingCache` of each attention call of one checkpointed layer call, in call order."""

    caches: list[RingCache] = field(default_factory=list)
    calls: int = 0

    def next_cache(self) -> RingCache:
        if self.calls == len(self.caches):
            self.caches.append(RingCache())
        self.calls += 1
        return self.caches[self.calls - 1]


_CACHES: contextvars.ContextVar[_LayerCaches | None] = contextvars.ContextVar(
    "longctx_ring_caches", default=None
)


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
            f"{ROWS_KWARG}=PackedRows(...) in the model's forward (hf_model.HFCausalLM passes it)"
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
    caches = _CACHES.get()
    out = [
        attend(q[b], k[b], v[b], softmax_scale=scaling, **({"cache": caches.next_cache()} if caches else {}))
        for b, attend in enumerate(packed.rows)
    ]
    return torch.stack(out), None


def register() -> None:
    """Make ``attn_implementation="longctx_ring"`` known to transformers (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, ring_attention_forward)


@contextmanager
def _replaying(caches: _LayerCaches) -> Iterator[None]:
    caches.calls = 0
    token = _CACHES.set(caches)
    try:
        yield
    finally:
        _CACHES.reset(token)


def _checkpointed(forward: Callable[..., Any], selective: bool) -> Callable[..., Any]:
    """``forward`` recomputed in backward (non-reentrant ``torch.utils.checkpoint``); with
    ``selective``, its ring attention calls keep their outputs and are not run again."""

    def run(*args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return forward(*args, **kwargs)
        caches = _LayerCaches() if selective else None

        def body(*inner_args: Any, **inner_kwargs: Any) -> Any:
            if caches is None:
                return forward(*inner_args, **inner_kwargs)
            with _replaying(caches):
                return forward(*inner_args, **inner_kwargs)

        return checkpoint(body, *args, use_reentrant=False, **kwargs)

    return run


def checkpoint_layers(layers: Sequence[nn.Module], mode: str) -> None:
    """Apply activation checkpointing mode ``mode`` (``none``, ``full``, ``selective``) to ``layers``.

    The layer's ``forward`` is replaced on the instance, so that module hooks (FSDP2's all-gathers)
    stay outside the recomputed part, as transformers' own gradient checkpointing does.
    """
    if mode == "none":
        return
    for layer in layers:
        layer.forward = _checkpointed(layer.forward, selective=mode == "selective")
