"""Greedy decoding with a key/value cache, for evaluation.

The prompt is run once (causal attention by PyTorch's ``scaled_dot_product_attention``, whose
flash and memory-efficient kernels never build the tokens x tokens score matrix); every layer's keys
and values are kept, and each new token then attends to the cache alone: one token's worth of work
per layer instead of recomputing the whole prefix.

:class:`KVCache` plugs into :class:`~longctx.trainer.models.decoder.Transformer` (or a transformers model on
the ring attention path, ``hf.HFCausalLM``) as its attention (it is a ``BindableAttention``):
the decoder calls the bound attention in the same order on every pass, so the cache knows which
layer (which call) a call belongs to without the model knowing about caches.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from longctx.trainer.models.decoder import RowAttention

if TYPE_CHECKING:
    from longctx.trainer.models.interface import TrainedModel


class KVCache:
    """Keys and values of every attention call of a forward pass for one sequence (one document: there
    is no document mask), filled by the first forward pass and extended by each later one.

    A pass calls the attention once per layer, or more (DiffLlama's differential attention calls it
    twice): the first pass tells how many calls a pass makes, and each call keeps its own keys and
    values. Each pass's queries attend causally to the cached keys and their own. ``capacity`` bounds
    the sequence length; the buffers are allocated at a call's first use, in the keys' dtype.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.length = 0  # tokens cached for every call after a complete forward pass
        self._keys: list[Tensor] = []
        self._values: list[Tensor] = []
        self._calls: int | None = None  # attention calls per forward pass, once the first pass ended
        self._call = 0  # calls made by the current pass
        self._new = 0  # tokens added by the current pass

    def bind(self, q_index: Tensor, q_segment: Tensor) -> RowAttention:
        """Start one forward pass (the model calls this once per pass, then the result per layer)."""
        if q_segment.numel() and bool((q_segment != q_segment[0]).any()):
            raise ValueError("a KVCache holds one sequence: the tokens of a pass must share one segment id")
        if self._call:  # the previous pass
            if self._calls is None:
                self._calls = self._call
            if self._call != self._calls:
                raise RuntimeError(
                    f"a forward pass stopped after {self._call} of its {self._calls} attention calls"
                )
            self.length += self._new
        self._call = 0
        return self._attend

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, *, q_index: Tensor, q_segment: Tensor) -> Tensor:
        return self.bind(q_index, q_segment)(q, k, v)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, softmax_scale: float | None = None) -> Tensor:
        """``q`` ``[new, heads, dim]``, ``k``/``v`` ``[new, kv_heads, dim]`` of one attention call; the
        scores are scaled by ``softmax_scale`` (default ``1 / sqrt(dim)``)."""
        call, start, new = self._call, self.length, k.shape[0]
        if start + new > self.capacity:
            raise ValueError(
                f"the sequence ({start + new} tokens) exceeds the cache capacity {self.capacity}"
            )
        if call == len(self._keys):
            if self._calls is not None:
                raise RuntimeError(
                    f"a forward pass made more than the first pass's {self._calls} attention calls"
                )
            self._keys.append(k.new_empty((self.capacity, *k.shape[1:])))
            self._values.append(v.new_empty((self.capacity, *v.shape[1:])))
        keys, values = self._keys[call], self._values[call]
        keys[start : start + new] = k
        values[start : start + new] = v
        self._call, self._new = call + 1, new
        scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
        if start == 0:
            return _causal_attention(q, k, v, scale)
        return _attention_to_cache(q, keys[: start + new], values[: start + new], scale)


def _causal_attention(q: Tensor, k: Tensor, v: Tensor, scale: float) -> Tensor:
    """Causal attention of a whole sequence: PyTorch's fused kernels (flash / memory-efficient), which
    take 4-D inputs ``[1, heads, tokens, dim]`` with as many key as query heads."""
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    q4, k4, v4 = (t.transpose(0, 1)[None] for t in (q, k, v))
    return F.scaled_dot_product_attention(q4, k4, v4, is_causal=True, scale=scale)[0].transpose(0, 1)


def _attention_to_cache(q: Tensor, keys: Tensor, values: Tensor, scale: float) -> Tensor:
    """The last ``len(q)`` tokens attend to ``keys``/``values`` (which end with theirs), causally.

    A few queries against a long cache: plain matrix products over grouped-query heads, without
    copying the cache once per query head.
    """
    new, heads, dim = q.shape
    kv_heads = keys.shape[1]
    qg = q.reshape(new, kv_heads, heads // kv_heads, dim).to(keys.dtype)
    scores = torch.einsum("nkgd,tkd->kgnt", qg, keys) * scale
    if new > 1:  # query i sits at position start + i and sees keys 0 .. start + i
        start = keys.shape[0] - new
        positions = torch.arange(keys.shape[0], device=q.device)
        seen = positions[None, :] <= positions[start:, None]
        scores = scores.masked_fill(~seen, float("-inf"))
    weights = scores.softmax(
        -1, dtype=torch.promote_types(scores.dtype, torch.float32)
    )  # bf16 scores: fp32 softmax
    out = torch.einsum("kgnt,tkd->nkgd", weights.to(values.dtype), values)
    return out.reshape(new, heads, dim).to(q.dtype)


@contextlib.contextmanager
def cached_attention(model: TrainedModel, capacity: int) -> Iterator[KVCache]:
    """Swap ``model``'s attention for a :class:`KVCache` for the duration of the block."""
    original = model.attention
    cache = KVCache(capacity)
    model.attention = cache
    try:
        yield cache
    finally:
        model.attention = original


@torch.no_grad()
def greedy_generate(
    model: TrainedModel,
    prompt: Sequence[int],
    max_new_tokens: int,
    device: torch.device,
    stop: Callable[[list[int]], bool] = lambda generated: False,
) -> list[int]:
    """Greedy continuation of one prompt, until ``max_new_tokens`` or ``stop(generated)`` is true.

    One forward pass over the prompt, then one token per pass against the key/value cache. RoPE
    frequencies that depend on the sequence length (``dynamic``, ``longrope``) use the length at
    each pass, as without a cache; cached keys keep the frequencies they were computed with, as in
    transformers.
    """
    if not prompt or max_new_tokens <= 0:
        return []
    model.eval()
    n = len(prompt)
    out: list[int] = []
    with cached_attention(model, n + max_new_tokens):
        tokens = torch.tensor(list(prompt), device=device)
        positions = torch.arange(n, device=device)
        hidden = model(tokens, positions, positions, torch.zeros_like(positions), rope_seq_len=n)
        while True:
            out.append(int(model.logits(hidden[-1:]).argmax(-1)))
            if len(out) == max_new_tokens or stop(out):
                return out
            position = torch.tensor([n + len(out) - 1], device=device)
            token = torch.tensor([out[-1]], device=device)
            hidden = model(token, position, position, torch.zeros_like(position), rope_seq_len=n + len(out))
