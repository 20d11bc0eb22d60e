"""Exact ring attention (context parallelism) over document-masked packed windows.

Each rank keeps its queries and passes key/value blocks around the ring (see ``plan.py`` for the
schedule). Step ``t`` posts the transfers for step ``t + 1`` before computing on the block it holds, so
communication overlaps computation. Partial results are merged in fp32 (``merge.py``); the backward
re-circulates the blocks, accumulates dq locally and sends dk/dv accumulators (fp32) along the ring and
back to the block owners. When one kernel call computes a rank's whole window (one rank, a varlen kernel),
its output and gradients are used as they are: merging one result into empty accumulators gives the same
values, bit for bit, at the cost of several window-sized fp32 passes, a large share of the time when the
window holds many short documents.

The autograd entry is the operator ``longctx::ring_attention`` (``torch.library``, :data:`RING_OP`):
one opaque op for ``torch.utils.checkpoint``'s selective policies (``longctx.trainer.models.checkpointing``
keeps its output instead of running the ring again). Its arguments are tensors and numbers, so the plan
travels as a key into a registry of live plans (``plan_key``).
"""

from __future__ import annotations

import itertools
import weakref

import torch
from torch import Tensor

from longctx.trainer.attention.comm import TAG_DKV, TAG_KV, StepExchange
from longctx.trainer.attention.kernels import (
    BlockKernel,
    accumulator_dtype,
    block_backward,
    block_forward,
    default_scale,
    kernel_calls,
    unit_stride,
)
from longctx.trainer.attention.masks import BlockMask
from longctx.trainer.attention.merge import merge_into
from longctx.trainer.attention.plan import RingPlan
from longctx.trainer.attention.select import select_kernels


def _describe_kv(source: int) -> str:
    return f"key/value block of rank {source}"


def _describe_dkv(source: int) -> str:
    return f"dk/dv accumulator of rank {source}"


def _post_kv(
    exchange: StepExchange, plan: RingPlan, kv: Tensor | None, step: int, template: Tensor
) -> Tensor | None:
    """Queue forwarding the held block and receiving the next one; returns the receive buffer."""
    world = plan.world_size
    source = plan.source(step)
    if kv is not None and plan.kv_forwarded(source, step):
        exchange.send(kv, plan.global_rank(plan.next_rank), TAG_KV, _describe_kv(source))
    incoming = plan.source(step + 1)
    if step + 1 < world and plan.kv_forwarded(incoming, step):
        buffer = torch.empty_like(template)
        exchange.recv(buffer, plan.global_rank(plan.prev_rank), TAG_KV, _describe_kv(incoming))
        return buffer
    return None


def _whole_window_call(
    plan: RingPlan, kernels: tuple[BlockKernel, ...], n_q: int, n_kv: int
) -> tuple[BlockKernel, BlockMask] | None:
    """The one kernel call that computes a single rank's whole window, when there is exactly one (one rank,
    a kernel without tiles or a window that is one tile, a rectangle that is every query and key)."""
    if plan.world_size != 1 or plan.blocks[0] is None:
        return None
    calls = kernel_calls(kernels, plan.blocks[0])
    if len(calls) != 1:
        return None
    kernel, block = calls[0]
    covers = (block.rows.start, block.rows.stop, block.cols.start, block.cols.stop) == (0, n_q, 0, n_kv)
    return (kernel, block) if covers else None


def ring_forward(
    q: Tensor, k: Tensor, v: Tensor, plan: RingPlan, scale: float, kernels: tuple[BlockKernel, ...]
) -> tuple[Tensor, Tensor]:
    """Merged output ``[tokens, heads, dim]`` and log-sum-exp ``[heads, tokens]`` (accumulator dtype)."""
    whole = _whole_window_call(plan, kernels, q.shape[0], k.shape[0])
    if whole is not None:
        out, lse = block_forward(whole[0], q, k, v, whole[1], scale)
        return out, lse
    acc = accumulator_dtype(q.dtype)
    out = torch.zeros(q.shape, dtype=acc, device=q.device)
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"), dtype=acc, device=q.device)
    kv: Tensor | None = torch.stack([k, v])
    template = kv
    for step in range(plan.world_size):
        exchange = StepExchange(plan.group, "forward", step, plan.world_size)
        next_kv = _post_kv(exchange, plan, kv, step, template)
        exchange.start()
        block = plan.blocks[plan.source(step)]
        if block is not None:
            assert kv is not None, "the plan computes a block this rank never received"
            for kernel, tile in kernel_calls(kernels, block):
                rows, cols = tile.rows, tile.cols
                tile_out, tile_lse = block_forward(kernel, q[rows], kv[0, cols], kv[1, cols], tile, scale)
                merge_into(out[rows], lse[:, rows], tile_out, tile_lse)
        exchange.wait()
        kv = next_kv
    return out, lse


def _post_dkv(
    exchange: StepExchange, plan: RingPlan, held: Tensor | None, step: int, template: Tensor
) -> tuple[Tensor | None, Tensor | None]:
    """Queue the dk/dv accumulator traffic of a backward step.

    Sends the accumulator finished in the previous step (to the next rank, or home after the last rank
    that needs it); returns the buffers for the accumulator of the block held in this step and for this
    rank's own accumulator coming home, where either arrives in this step.
    """
    if held is not None:
        source = plan.source(step - 1)
        destination = plan.acc_destination(source, step - 1)
        exchange.send(held, plan.global_rank(destination), TAG_DKV, _describe_dkv(source))
    incoming = returned = None
    if step < plan.world_size and plan.acc_arrives(plan.source(step), step):
        incoming = torch.empty_like(template)
        exchange.recv(incoming, plan.global_rank(plan.prev_rank), TAG_DKV, _describe_dkv(plan.source(step)))
    if plan.acc_return_step == step:
        returned = torch.empty_like(template)
        exchange.recv(returned, plan.global_rank(plan.acc_return_sender), TAG_DKV, _describe_dkv(plan.rank))
    return incoming, returned


def _block_grads(
    kernels: tuple[BlockKernel, ...],
    block: BlockMask,
    dout: Tensor,
    q: Tensor,
    kv: Tensor,
    out: Tensor,
    lse: Tensor,
    dq: Tensor,
    scale: float,
) -> Tensor:
    """Add the block's dq into ``dq``; return its dk/dv, stacked like ``kv``, in the dtype of ``dq``."""
    block_dkv = torch.zeros(kv.shape, dtype=dq.dtype, device=dq.device)
    for kernel, tile in kernel_calls(kernels, block):
        rows, cols = tile.rows, tile.cols
        tile_dq, tile_dk, tile_dv = block_backward(
            kernel, dout[rows], q[rows], kv[0, cols], kv[1, cols], out[rows], lse[:, rows], tile, scale
        )
        dq[rows] += tile_dq
        block_dkv[0, cols] += tile_dk
        block_dkv[1, cols] += tile_dv
    return block_dkv


def ring_backward(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    plan: RingPlan,
    scale: float,
    kernels: tuple[BlockKernel, ...],
) -> tuple[Tensor, Tensor, Tensor]:
    """dq, dk, dv (in the accumulator dtype, or the kernel's for one whole-window call), given the forward's
    output and log-sum-exp.

    Runs one step more than the forward: the accumulators finished in the last step still travel home.
    """
    acc = accumulator_dtype(q.dtype)
    world = plan.world_size
    # A query that saw no key at all (possible only when keys differ from queries) has lse = -inf and
    # zero output; +inf makes every kernel give it zero probabilities instead of exp(-inf + inf).
    lse = torch.where(torch.isneginf(lse), torch.full_like(lse, float("inf")), lse)
    whole = _whole_window_call(plan, kernels, q.shape[0], k.shape[0])
    if whole is not None:
        return block_backward(whole[0], dout, q, k, v, out, lse, whole[1], scale)
    dq = torch.zeros(q.shape, dtype=acc, device=q.device)
    kv: Tensor | None = torch.stack([k, v])
    template = kv
    dkv_own = torch.zeros(template.shape, dtype=acc, device=q.device)
    held: Tensor | None = None  # accumulator finished in the previous step, sent in this one
    for step in range(world + 1):
        exchange = StepExchange(plan.group, "backward", step, world)
        incoming, returned = _post_dkv(exchange, plan, held, step, dkv_own)
        next_kv = _post_kv(exchange, plan, kv, step, template) if step < world else None
        exchange.start()
        block = plan.blocks[plan.source(step)] if step < world else None
        block_dkv = None
        if block is not None:
            assert kv is not None, "the plan computes a block this rank never received"
            block_dkv = _block_grads(kernels, block, dout, q, kv, out, lse, dq, scale)
        exchange.wait()

        held = None
        if step == 0 and block_dkv is not None:
            dkv_own += block_dkv
        elif step < world and plan.acc_exists(plan.source(step), step):
            held = incoming if incoming is not None else torch.zeros_like(dkv_own)
            if block_dkv is not None:
                held += block_dkv
        if returned is not None:
            dkv_own += returned
        kv = next_kv
    return dq, dkv_own[0], dkv_own[1]


_PLANS: weakref.WeakValueDictionary[int, RingPlan] = weakref.WeakValueDictionary()
_PLAN_KEYS = itertools.count()


def plan_key(plan: RingPlan) -> int:
    """The key of ``plan`` in the registry the ring operator reads (assigned on first use). The registry
    holds plans weakly: a plan lives as long as the caller's bound attention or a pending backward."""
    key = plan.op_key
    if key is None:
        key = plan.op_key = next(_PLAN_KEYS)
        _PLANS[key] = plan
    return key


_LIBRARY = torch.library.Library("longctx", "DEF")
_LIBRARY.define(
    "ring_attention(Tensor q, Tensor k, Tensor v, int plan, float scale, str backend) -> (Tensor, Tensor)"
)


def _ring_op(q: Tensor, k: Tensor, v: Tensor, plan: int, scale: float, backend: str) -> tuple[Tensor, Tensor]:
    """Output ``[tokens, heads, dim]`` (q's dtype) and log-sum-exp ``[heads, tokens]`` of the ring.

    Registered with ``Library.impl`` rather than ``torch.library.custom_op``, whose wrapper imports
    ``torch._dynamo`` (seconds) at the first call of every process."""
    kernels = select_kernels(q.device, q.dtype, q.shape[2], q.shape[1], k.shape[1], backend)
    out, lse = ring_forward(q, k, v, _PLANS[plan], scale, kernels)
    return out.to(q.dtype), lse


def _ring_op_fake(
    q: Tensor, k: Tensor, v: Tensor, plan: int, scale: float, backend: str
) -> tuple[Tensor, Tensor]:
    return torch.empty_like(q), q.new_empty((q.shape[1], q.shape[0]), dtype=accumulator_dtype(q.dtype))


def _setup_context(ctx, inputs: tuple, output: tuple[Tensor, Tensor]) -> None:
    q, k, v, plan, scale, backend = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse)
    ctx.plan, ctx.scale, ctx.backend = _PLANS[plan], scale, backend  # the plan lives until backward


def _ring_op_backward(ctx, dout: Tensor, _dlse: Tensor | None) -> tuple[Tensor | None, ...]:
    q, k, v, out, lse = ctx.saved_tensors
    kernels = select_kernels(q.device, q.dtype, q.shape[2], q.shape[1], k.shape[1], ctx.backend)
    dq, dk, dv = ring_backward(dout.contiguous(), q, k, v, out, lse, ctx.plan, ctx.scale, kernels)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None, None


_LIBRARY.impl("ring_attention", _ring_op, "CompositeExplicitAutograd")
torch.library.register_fake("longctx::ring_attention", _ring_op_fake, lib=_LIBRARY)
torch.library.register_autograd(
    "longctx::ring_attention", _ring_op_backward, setup_context=_setup_context, lib=_LIBRARY
)
RING_OP = torch.ops.longctx.ring_attention.default
"""The operator (an ``OpOverload``), as selective checkpointing policies see it."""


def _check_inputs(q: Tensor, k: Tensor, v: Tensor, plan: RingPlan) -> None:
    if q.dim() != 3 or k.dim() != 3 or k.shape != v.shape:
        raise ValueError("q must be [tokens, heads, dim] and k, v [tokens, kv_heads, dim] of one shape")
    if q.shape[2] != k.shape[2] or q.shape[1] % k.shape[1]:
        raise ValueError(
            f"heads {q.shape[1]} must be a multiple of kv heads {k.shape[1]}, with equal head dims"
        )
    if q.dtype != k.dtype or q.dtype != v.dtype or q.device != k.device or q.device != v.device:
        raise ValueError("q, k and v must share dtype and device")
    if q.shape[0] != plan.n_q or k.shape[0] != plan.n_kv:
        raise ValueError(
            f"the plan covers {plan.n_q} query and {plan.n_kv} key tokens, got {q.shape[0]} and {k.shape[0]}"
        )


def ring_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    plan: RingPlan,
    *,
    softmax_scale: float | None = None,
    backend: str = "auto",
) -> Tensor:
    """Causal, document-masked attention of this rank's queries over the whole packed window.

    ``q`` is ``[tokens, heads, head_dim]`` (this rank's tokens of one packed row, in the order the plan
    was built with, e.g. zigzag); ``k`` and ``v`` are ``[tokens, kv_heads, head_dim]`` with ``heads`` a
    multiple of ``kv_heads`` (grouped-query attention; key/value heads travel unrepeated). ``plan``
    comes from ``build_ring_plan`` and can be shared by all layers of a micro-batch. Returns
    ``[tokens, heads, head_dim]`` in the dtype of ``q``; differentiable in ``q``, ``k`` and ``v``.
    Collective over ``plan.group``: every rank of the group must call it, in the same order.
    ``softmax_scale`` defaults to ``1 / sqrt(head_dim)``; ``backend`` pins a kernel (see ``kernels.py``).
    What the plan skips is reported by ``plan.stats`` (e.g. ``compute_fraction``).
    """
    _check_inputs(q, k, v, plan)
    q, k, v = unit_stride(q), unit_stride(k), unit_stride(v)  # once here, not once per tile
    scale = default_scale(q.shape[2]) if softmax_scale is None else softmax_scale
    select_kernels(q.device, q.dtype, q.shape[2], q.shape[1], k.shape[1], backend)  # bad settings fail here
    return RING_OP(q, k, v, plan_key(plan), scale, backend)[0]
