"""Local attention of one block pair: forward returns output and log-sum-exp, backward uses global ones.

Ring attention computes each (query block, key block) pair separately, so a kernel here must

* in forward, return the block output ``[rows, heads, dim]`` normalised over that block's keys only,
  together with its log-sum-exp ``[heads, rows]`` (fp32, fp64 for fp64 inputs), so that blocks can be
  merged exactly (``merge.py``);
* in backward, take the *merged* output and log-sum-exp of the whole window, so that
  ``P = exp(S - lse)`` are the true attention probabilities restricted to the block and the block's
  dq/dk/dv are exact contributions to the full gradients.

Tensors are tokens-first (``[tokens, heads, dim]``) and keys may have fewer heads than queries
(grouped-query attention: query head ``h`` reads key head ``h // (heads // kv_heads)``). Kernels
receive the rectangle of a ``BlockMask``; which masks they can express decides the kernel per block:
the first kernel of the selected chain that accepts the block computes it, and every chain ends in one
that accepts any block.

Dense-mask kernels are called per non-empty tile of a block, so that they skip masked-out work too.

Which kernels run on which device is decided in ``select.py`` (``select_kernels``).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import ClassVar

import torch
from torch import Tensor

from longctx.trainer.attention.masks import BlockMask
from longctx.trainer.attention.merge import normalize_empty_rows


def accumulator_dtype(dtype: torch.dtype) -> torch.dtype:
    """Dtype of merged outputs, log-sum-exps and gradient accumulators: fp32, or fp64 for fp64 inputs."""
    return torch.promote_types(dtype, torch.float32)


def heads_first(x: Tensor) -> Tensor:
    """``[tokens, heads, dim]`` -> ``[1, heads, tokens, dim]`` view, the layout of PyTorch's SDPA ops."""
    return x.transpose(0, 1).unsqueeze(0)


def tokens_first(x: Tensor) -> Tensor:
    """Inverse of ``heads_first``."""
    return x.squeeze(0).transpose(0, 1)


class BlockKernel(ABC):
    """Attention forward/backward on the rectangle of one ``BlockMask``.

    ``tile`` is None for kernels that skip masked work themselves (varlen kernels); dense-mask kernels
    set a tile size and are called once per non-empty tile of a block.
    """

    name: ClassVar[str]
    tile: ClassVar[int | None] = None

    def accepts(self, block: BlockMask) -> bool:
        """Whether this kernel can express the block's mask."""
        return True

    @abstractmethod
    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, block: BlockMask, scale: float
    ) -> tuple[Tensor, Tensor]:
        """``(out [rows, heads, dim] in q.dtype, lse [heads, rows])``; rows without keys are unspecified."""

    @abstractmethod
    def backward(
        self,
        dout: Tensor,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        out: Tensor,
        lse: Tensor,
        block: BlockMask,
        scale: float,
    ) -> tuple[Tensor, Tensor, Tensor]:
        """``(dq, dk, dv)`` of the block, given the window's output ``out`` and log-sum-exp ``lse``."""


class MathKernel(BlockKernel):
    """Matmul-softmax in fp32 (fp64 for fp64 inputs) with a dense mask: any device, any dtype, exact.

    Memory is ``heads * rows * cols``; it is the reference for the other kernels and the last resort.
    """

    name = "math"
    tile = 256

    @staticmethod
    def _grouped(x: Tensor, n_kv_heads: int) -> Tensor:
        """``[rows, heads, dim]`` -> ``[kv_heads, group, rows, dim]`` in the accumulator dtype."""
        rows, heads, dim = x.shape
        x = x.to(accumulator_dtype(x.dtype)).view(rows, n_kv_heads, heads // n_kv_heads, dim)
        return x.permute(1, 2, 0, 3)

    @staticmethod
    def _ungrouped(x: Tensor) -> Tensor:
        n_kv_heads, group, rows, dim = x.shape
        return x.permute(2, 0, 1, 3).reshape(rows, n_kv_heads * group, dim)

    def _scores(self, q: Tensor, k: Tensor, block: BlockMask, scale: float) -> Tensor:
        acc = accumulator_dtype(q.dtype)
        scores = self._grouped(q, k.shape[1]) @ k.to(acc).permute(1, 2, 0).unsqueeze(1) * scale
        mask = block.additive(acc)
        return scores if mask is None else scores + mask

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, block: BlockMask, scale: float
    ) -> tuple[Tensor, Tensor]:
        scores = self._scores(q, k, block, scale)
        lse = torch.logsumexp(scores, dim=-1)
        shift = torch.where(torch.isneginf(lse), torch.zeros_like(lse), lse)
        probs = torch.exp(scores - shift.unsqueeze(-1))
        out = probs @ v.to(probs.dtype).transpose(0, 1).unsqueeze(1)
        return self._ungrouped(out).to(q.dtype), lse.flatten(0, 1)

    def backward(
        self,
        dout: Tensor,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        out: Tensor,
        lse: Tensor,
        block: BlockMask,
        scale: float,
    ) -> tuple[Tensor, Tensor, Tensor]:
        n_kv_heads = k.shape[1]
        scores = self._scores(q, k, block, scale)
        lse = lse.to(scores.dtype).view(n_kv_heads, -1, lse.shape[-1])
        # A row whose lse is not finite saw no key anywhere: its probabilities are all zero.
        lse = torch.where(torch.isfinite(lse), lse, torch.full_like(lse, float("inf")))
        probs = torch.exp(scores - lse.unsqueeze(-1))
        k_acc = k.to(scores.dtype).transpose(0, 1).unsqueeze(1)
        v_acc = v.to(scores.dtype).transpose(0, 1).unsqueeze(1)
        dout_g, out_g = self._grouped(dout, n_kv_heads), self._grouped(out, n_kv_heads)
        dprobs = dout_g @ v_acc.transpose(-1, -2)
        dscores = probs * (dprobs - (dout_g * out_g).sum(-1, keepdim=True))
        dq = self._ungrouped(dscores @ k_acc * scale)
        dk = (dscores.transpose(-1, -2) @ self._grouped(q, n_kv_heads) * scale).sum(1).transpose(0, 1)
        dv = (probs.transpose(-1, -2) @ dout_g).sum(1).transpose(0, 1)
        return dq, dk, dv


class CpuFlashKernel(BlockKernel):
    """PyTorch's fused flash kernel for CPU (``aten._scaled_dot_product_flash_attention_for_cpu``).

    Takes an additive mask of the query dtype (omitted for full blocks), returns the log-sum-exp (fp32,
    fp64 for fp64 inputs), supports grouped-query attention natively, and its backward accepts any
    ``(out, lse)`` pair, which is what the ring needs. Fully masked rows come back as ``lse = 0`` with
    a zero output, which the caller rewrites to "nothing seen".
    """

    name = "cpu_flash"
    tile = 256

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, block: BlockMask, scale: float
    ) -> tuple[Tensor, Tensor]:
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            heads_first(q),
            heads_first(k),
            heads_first(v),
            0.0,
            False,
            attn_mask=block.additive(q.dtype),
            scale=scale,
        )
        return tokens_first(out), lse.squeeze(0)

    def backward(
        self,
        dout: Tensor,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        out: Tensor,
        lse: Tensor,
        block: BlockMask,
        scale: float,
    ) -> tuple[Tensor, Tensor, Tensor]:
        grads = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
            heads_first(dout),
            heads_first(q),
            heads_first(k),
            heads_first(v),
            heads_first(out),
            lse.to(accumulator_dtype(q.dtype)).contiguous().unsqueeze(0),
            0.0,
            False,
            attn_mask=block.additive(q.dtype),
            scale=scale,
        )
        dq, dk, dv = (tokens_first(g) for g in grads)
        return dq, dk, dv


def kernel_calls(kernels: tuple[BlockKernel, ...], block: BlockMask) -> list[tuple[BlockKernel, BlockMask]]:
    """The kernel calls that compute ``block``: the first kernel that accepts it, on each non-empty tile
    of the block, or on the whole block for kernels without tiles and for the untrimmed baseline.
    Forward and backward use the same calls."""
    kernel = next(kernel for kernel in kernels if kernel.accepts(block))
    if kernel.tile is None or not block.trimmed:
        return [(kernel, block)]
    return [(kernel, tile) for tile in block.tiles(kernel.tile)]


def unit_stride(x: Tensor) -> Tensor:
    """``x`` itself when its last axis (head_dim) is contiguous, else a contiguous copy.

    Fused kernels (PyTorch's CPU flash kernel among them) read each head vector as contiguous
    memory and return wrong results, silently, for views such as ``buf[..., ::2]`` or a
    ``[dim, tokens, heads]`` buffer permuted to tokens-first. Every tensor goes through this on its way
    into a kernel (:func:`block_forward`, :func:`block_backward`); other strides are handled by the kernels.
    """
    return x if x.stride(-1) == 1 or x.shape[-1] == 1 else x.contiguous()


def block_forward(
    kernel: BlockKernel, q: Tensor, k: Tensor, v: Tensor, block: BlockMask, scale: float
) -> tuple[Tensor, Tensor]:
    """Forward of one block (or tile); rows without keys normalised to ``out = 0, lse = -inf``."""
    q, k, v = unit_stride(q), unit_stride(k), unit_stride(v)
    out, lse = kernel.forward(q, k, v, block, scale)
    return normalize_empty_rows(out, lse.to(accumulator_dtype(q.dtype)), block.row_has_key)


def block_backward(
    kernel: BlockKernel,
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    block: BlockMask,
    scale: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """Backward of one block (or tile): dq, dk, dv given the window's output and log-sum-exp."""
    dout, q, k, v, out = (unit_stride(x) for x in (dout, q, k, v, out))
    return kernel.backward(dout, q, k, v, out, lse, block, scale)


def default_scale(head_dim: int) -> float:
    """The usual softmax scale ``1 / sqrt(head_dim)``."""
    return 1.0 / math.sqrt(head_dim)
