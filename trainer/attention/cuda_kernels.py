"""CUDA block kernels and their automatic selection.

Preference order, per block:

1. A variable-length flash kernel, for blocks whose mask is a set of independent (causal or full)
   sequences, which is every block of a zigzag ring over contiguous documents (``BlockMask.varlen``):
   FlashAttention-4's CuTe DSL kernels (``flash_attn.cute``, the ``flash-attn-4`` package, Hopper and
   Blackwell) where installed, else FlashAttention-2's ``_flash_attn_varlen_forward/_backward``
   (flash-attn >= 2.7) where installed, otherwise PyTorch's own ``aten._flash_attention_forward/_backward``
   with ``cum_seq``. fp16/bf16 only; no dense mask is ever built.
2. PyTorch's memory-efficient kernel (``aten._scaled_dot_product_efficient_attention``) with an
   additive mask, for any block (fp16/bf16/fp32); builds a ``rows x cols`` mask.
3. The math kernel (``kernels.MathKernel``), appended by the caller.

cuDNN's attention through SDPA (``aten._scaled_dot_product_cudnn_attention``, tiles with an additive
mask like the memory-efficient kernel) is offered when pinned (``backend="torch_cudnn"``), not in the
automatic chain until a GPU report shows it faster.

Private kernel entry points change between releases, so a kernel joins the chain only after a probe on
this device, dtype and head shape (forward and backward of a causal two-document block and a full
off-diagonal block) matches the math kernel; a kernel that raises or disagrees is skipped with a
warning. Nothing here runs or imports CUDA code on a CPU-only machine.
"""

from __future__ import annotations

import functools
import logging
import math

import torch
from torch import Tensor

from longctx.trainer.attention.kernels import (
    BlockKernel,
    MathKernel,
    accumulator_dtype,
    heads_first,
    tokens_first,
)
from longctx.trainer.attention.masks import BlockMask, VarlenLayout, block_mask
from longctx.trainer.attention.merge import normalize_empty_rows

logger = logging.getLogger(__name__)

_HALF_DTYPES = (torch.float16, torch.bfloat16)
_PROBE_TOLERANCE = {torch.float16: 2e-2, torch.bfloat16: 5e-2, torch.float32: 1e-3}


def _unused_rng_state() -> tuple[Tensor, Tensor]:
    """RNG-state arguments of the fused backwards: read only with dropout, which is off here.

    These are the CPU scalar placeholders PyTorch's own forwards return when dropout is off.
    """
    return torch.empty((), dtype=torch.int64), torch.empty((), dtype=torch.int64)


def _flash_head_dim_ok(head_dim: int) -> bool:
    return head_dim % 8 == 0 and head_dim <= 256


class _VarlenKernel(BlockKernel):
    """Shared ``accepts`` of the variable-length flash kernels."""

    def accepts(self, block: BlockMask) -> bool:
        layout = block.varlen
        return layout is not None and layout.max_seqlen_q > 0 and layout.max_seqlen_k > 0

    @staticmethod
    def layout(block: BlockMask) -> VarlenLayout:
        layout = block.varlen
        assert layout is not None, "varlen kernel called on a block it does not accept"
        return layout

    @staticmethod
    def check_lse(lse: Tensor, n_heads: int, n_rows: int) -> Tensor:
        if lse.shape != (n_heads, n_rows):
            raise RuntimeError(
                f"varlen kernel returned lse of shape {tuple(lse.shape)}, expected (heads, rows)"
            )
        return lse


@functools.cache
def _flash_attn_varlen_ops() -> tuple | None:
    """flash-attn's private varlen forward/backward, or None when the package is absent or broken."""
    try:
        from flash_attn import flash_attn_interface
    except (ImportError, OSError, RuntimeError):
        return None
    forward = getattr(flash_attn_interface, "_flash_attn_varlen_forward", None)
    backward = getattr(flash_attn_interface, "_flash_attn_varlen_backward", None)
    return None if forward is None or backward is None else (forward, backward)


class FlashAttnVarlenKernel(_VarlenKernel):
    """FlashAttention-2 varlen (flash-attn >= 2.7 call convention); GQA native; lse ``[heads, rows]``."""

    name = "flash_attn_varlen"

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, block: BlockMask, scale: float
    ) -> tuple[Tensor, Tensor]:
        forward, _ = _flash_attn_varlen_ops()
        layout = self.layout(block)
        out, lse, _, _ = forward(
            q,
            k,
            v,
            layout.cu_seqlens_q,
            layout.cu_seqlens_k,
            layout.max_seqlen_q,
            layout.max_seqlen_k,
            dropout_p=0.0,
            softmax_scale=scale,
            causal=layout.causal,
            window_size_left=-1,
            window_size_right=-1,
            softcap=0.0,
            alibi_slopes=None,
            return_softmax=False,
        )
        return out, self.check_lse(lse, q.shape[1], q.shape[0])

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
        _, backward = _flash_attn_varlen_ops()
        layout = self.layout(block)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        backward(
            dout,
            q,
            k,
            v,
            out,
            lse.float().contiguous(),
            dq,
            dk,
            dv,
            layout.cu_seqlens_q,
            layout.cu_seqlens_k,
            layout.max_seqlen_q,
            layout.max_seqlen_k,
            dropout_p=0.0,
            softmax_scale=scale,
            causal=layout.causal,
            window_size_left=-1,
            window_size_right=-1,
            softcap=0.0,
            alibi_slopes=None,
            deterministic=False,
            rng_state=None,
        )
        return dq, dk, dv


@functools.cache
def _flash_attn4_ops() -> tuple | None:
    """FlashAttention-4's forward/backward (``flash_attn.cute.interface``), or None when absent or broken."""
    try:
        from flash_attn.cute import interface
    except Exception:  # absent, or its CuTe DSL / CUDA stack does not import here
        return None
    forward = getattr(interface, "_flash_attn_fwd", None)
    backward = getattr(interface, "_flash_attn_bwd", None)
    return None if forward is None or backward is None else (forward, backward)


class FlashAttn4VarlenKernel(_VarlenKernel):
    """FlashAttention-4 varlen (CuTe DSL; ``flash-attn-4``); GQA native; lse ``[heads, rows]``."""

    name = "flash_attn4_varlen"

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, block: BlockMask, scale: float
    ) -> tuple[Tensor, Tensor]:
        forward, _ = _flash_attn4_ops()
        layout = self.layout(block)
        out, lse, *_ = forward(
            q,
            k,
            v,
            cu_seqlens_q=layout.cu_seqlens_q,
            cu_seqlens_k=layout.cu_seqlens_k,
            max_seqlen_q=layout.max_seqlen_q,
            max_seqlen_k=layout.max_seqlen_k,
            softmax_scale=scale,
            causal=layout.causal,
            return_lse=True,
        )
        return out, self.check_lse(lse, q.shape[1], q.shape[0])

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
        _, backward = _flash_attn4_ops()
        layout = self.layout(block)
        dq, dk, dv = backward(
            q,
            k,
            v,
            out,
            dout,
            lse.float().contiguous(),
            scale,
            layout.causal,
            cu_seqlens_q=layout.cu_seqlens_q,
            cu_seqlens_k=layout.cu_seqlens_k,
            max_seqlen_q=layout.max_seqlen_q,
            max_seqlen_k=layout.max_seqlen_k,
        )[:3]
        return dq, dk, dv


class TorchFlashVarlenKernel(_VarlenKernel):
    """PyTorch's bundled FlashAttention-2 (``aten._flash_attention_forward`` with ``cum_seq``)."""

    name = "torch_flash_varlen"

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, block: BlockMask, scale: float
    ) -> tuple[Tensor, Tensor]:
        layout = self.layout(block)
        out, lse, *_ = torch.ops.aten._flash_attention_forward(
            q,
            k,
            v,
            layout.cu_seqlens_q,
            layout.cu_seqlens_k,
            layout.max_seqlen_q,
            layout.max_seqlen_k,
            0.0,
            layout.causal,
            False,
            scale=scale,
        )
        return out, self.check_lse(lse, q.shape[1], q.shape[0])

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
        layout = self.layout(block)
        dq, dk, dv = torch.ops.aten._flash_attention_backward(
            dout,
            q,
            k,
            v,
            out,
            lse.float().contiguous(),
            layout.cu_seqlens_q,
            layout.cu_seqlens_k,
            layout.max_seqlen_q,
            layout.max_seqlen_k,
            0.0,
            layout.causal,
            *_unused_rng_state(),
            scale=scale,
        )
        return dq, dk, dv


class TorchEfficientKernel(BlockKernel):
    """PyTorch's memory-efficient kernel with an additive mask; keys are repeated to the query heads."""

    name = "torch_efficient"
    tile = 2048  # bounds the dense mask; large enough to keep the GPU busy
    _BIAS_ALIGNMENT = 16  # the kernel reads the mask with aligned rows, as SDPA's own front end pads it
    _LSE_ALIGNMENT = 32  # its log-sum-exp rows are padded to this many queries

    def _bias(self, block: BlockMask, dtype: torch.dtype, n_heads: int) -> Tensor:
        rows, cols = block.shape
        width = math.ceil(cols / self._BIAS_ALIGNMENT) * self._BIAS_ALIGNMENT
        padded = torch.zeros(rows, width, dtype=dtype, device=block.q_index.device)
        mask = block.additive(dtype)
        if mask is not None:
            padded[:, :cols] = mask
        return padded[:, :cols].expand(1, n_heads, rows, cols)

    @staticmethod
    def _repeat_heads(x: Tensor, n_heads: int) -> Tensor:
        return x.repeat_interleave(n_heads // x.shape[1], dim=1)

    @staticmethod
    def _sum_groups(x: Tensor, n_kv_heads: int) -> Tensor:
        tokens, heads, dim = x.shape
        return x.view(tokens, n_kv_heads, heads // n_kv_heads, dim).sum(2)

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, block: BlockMask, scale: float
    ) -> tuple[Tensor, Tensor]:
        n_heads = q.shape[1]
        out, lse, _, _ = torch.ops.aten._scaled_dot_product_efficient_attention(
            heads_first(q),
            heads_first(self._repeat_heads(k, n_heads)),
            heads_first(self._repeat_heads(v, n_heads)),
            self._bias(block, q.dtype, n_heads),
            True,
            0.0,
            False,
            scale=scale,
        )
        return tokens_first(out), lse[0, :, : q.shape[0]]

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
        n_heads, n_kv_heads, rows = q.shape[1], k.shape[1], q.shape[0]
        # Given an output laid out heads-first (as the math kernel returns it), this backward returns wrong
        # gradients (relative errors of 1-2, or NaN, on an H200): it is handed tokens-first contiguous
        # tensors, the layout PyTorch's own forward returns, so inside the ring nothing is copied.
        out, dout = out.contiguous(), dout.contiguous()
        width = math.ceil(rows / self._LSE_ALIGNMENT) * self._LSE_ALIGNMENT
        lse_padded = torch.zeros(1, n_heads, width, dtype=torch.float32, device=q.device)
        lse_padded[0, :, :rows] = lse
        dq, dk, dv, _ = torch.ops.aten._scaled_dot_product_efficient_attention_backward(
            heads_first(dout),
            heads_first(q),
            heads_first(self._repeat_heads(k, n_heads)),
            heads_first(self._repeat_heads(v, n_heads)),
            self._bias(block, q.dtype, n_heads),
            heads_first(out),
            lse_padded,
            *_unused_rng_state(),
            0.0,
            [True, True, True, False],
            False,
            scale=scale,
        )
        return (
            tokens_first(dq),
            self._sum_groups(tokens_first(dk), n_kv_heads),
            self._sum_groups(tokens_first(dv), n_kv_heads),
        )


class TorchCudnnKernel(TorchEfficientKernel):
    """cuDNN's attention through SDPA (``aten._scaled_dot_product_cudnn_attention``) with an additive mask
    per tile, keys repeated to the query heads, as :class:`TorchEfficientKernel` calls its kernel."""

    name = "torch_cudnn"

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, block: BlockMask, scale: float
    ) -> tuple[Tensor, Tensor]:
        n_heads, rows = q.shape[1], q.shape[0]
        out, lse, *_ = torch.ops.aten._scaled_dot_product_cudnn_attention(
            heads_first(q),
            heads_first(self._repeat_heads(k, n_heads)),
            heads_first(self._repeat_heads(v, n_heads)),
            self._bias(block, q.dtype, n_heads),
            True,
            0.0,
            False,
            False,
            scale=scale,
        )
        return tokens_first(out), lse.reshape(n_heads, rows)

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
        n_heads, n_kv_heads, rows = q.shape[1], k.shape[1], q.shape[0]
        k_rep, v_rep = self._repeat_heads(k, n_heads), self._repeat_heads(v, n_heads)
        dq, dk, dv = torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
            heads_first(dout.contiguous()),
            heads_first(q),
            heads_first(k_rep),
            heads_first(v_rep),
            heads_first(out.contiguous()),
            lse.float().reshape(1, n_heads, rows, 1).contiguous(),
            *_unused_rng_state(),
            self._bias(block, q.dtype, n_heads),
            None,
            None,
            rows,
            k.shape[0],
            0.0,
            False,
            scale=scale,
        )
        return (
            tokens_first(dq),
            self._sum_groups(tokens_first(dk), n_kv_heads),
            self._sum_groups(tokens_first(dv), n_kv_heads),
        )


def _probe_blocks(device: torch.device) -> list[BlockMask]:
    """A causal block over two documents and a full off-diagonal block (what a zigzag ring produces)."""
    index = torch.arange(48, device=device)
    segment = (index >= 13).to(torch.int64)
    diagonal = block_mask(index, segment, index, segment)
    off_diagonal = block_mask(index[24:], segment[24:], index[:24], segment[:24])
    return [block for block in (diagonal, off_diagonal) if block is not None]


def _relative_error(actual: Tensor, expected: Tensor) -> float:
    expected = expected.to(torch.float64)
    return float((actual.to(torch.float64) - expected).abs().max() / expected.abs().max().clamp_min(1e-6))


@functools.cache
def _passes_probe(
    kernel: BlockKernel,
    device: torch.device,
    dtype: torch.dtype,
    head_dim: int,
    n_heads: int,
    n_kv_heads: int,
) -> bool:
    """Whether ``kernel`` reproduces the math kernel on this device for these shapes."""
    reference = MathKernel()
    generator = torch.Generator(device="cpu").manual_seed(0)
    scale = 1.0 / math.sqrt(head_dim)
    try:
        for block in _probe_blocks(device):
            if not kernel.accepts(block):
                return False
            rows, cols = block.shape
            q, dout = (
                torch.randn(rows, n_heads, head_dim, generator=generator).to(device, dtype) for _ in range(2)
            )
            k, v = (
                torch.randn(cols, n_kv_heads, head_dim, generator=generator).to(device, dtype)
                for _ in range(2)
            )
            out, lse = normalize_empty_rows(*kernel.forward(q, k, v, block, scale), block.row_has_key)
            ref_out, ref_lse = normalize_empty_rows(
                *reference.forward(q, k, v, block, scale), block.row_has_key
            )
            grads = kernel.backward(
                dout, q, k, v, ref_out, ref_lse.to(accumulator_dtype(dtype)), block, scale
            )
            ref_grads = reference.backward(dout, q, k, v, ref_out, ref_lse, block, scale)
            errors = [_relative_error(out, ref_out), _relative_error(lse.exp(), ref_lse.exp())]
            errors += [_relative_error(g, ref) for g, ref in zip(grads, ref_grads, strict=True)]
            if max(errors) > _PROBE_TOLERANCE[dtype]:
                logger.warning(
                    "attention kernel %s disagrees with the math kernel (%s); not used", kernel.name, errors
                )
                return False
    except Exception as exc:  # any failure of a private entry point means "not usable here"
        logger.warning("attention kernel %s is unavailable on %s for %s: %s", kernel.name, device, dtype, exc)
        return False
    return True


_KERNELS: dict[str, BlockKernel] = {
    kernel.name: kernel
    for kernel in (
        FlashAttn4VarlenKernel(),
        FlashAttnVarlenKernel(),
        TorchFlashVarlenKernel(),
        TorchEfficientKernel(),
        TorchCudnnKernel(),
    )
}
_VARLEN_PREFERENCE = (
    _KERNELS["flash_attn4_varlen"],
    _KERNELS["flash_attn_varlen"],
    _KERNELS["torch_flash_varlen"],
)


def _eligible(name: str, dtype: torch.dtype, head_dim: int) -> bool:
    if name == "flash_attn4_varlen":
        return dtype in _HALF_DTYPES and _flash_head_dim_ok(head_dim) and _flash_attn4_ops() is not None
    if name == "flash_attn_varlen":
        return dtype in _HALF_DTYPES and _flash_head_dim_ok(head_dim) and _flash_attn_varlen_ops() is not None
    if name in ("torch_flash_varlen", "torch_cudnn"):
        return dtype in _HALF_DTYPES and _flash_head_dim_ok(head_dim)
    return dtype in (*_HALF_DTYPES, torch.float32)


def unusable_reason(name: str, device: torch.device, dtype: torch.dtype, shape: tuple[int, int, int]) -> str:
    """Why kernel ``name`` is not usable for these inputs (a missing package, a dtype, a failed probe)."""
    if name == "flash_attn4_varlen" and _flash_attn4_ops() is None:
        return "flash-attn-4 (flash_attn.cute) is not installed or does not import"
    if name == "flash_attn_varlen" and _flash_attn_varlen_ops() is None:
        return "flash-attn (2.x, flash_attn.flash_attn_interface) is not installed"
    if not _eligible(name, dtype, shape[0]):
        return f"it does not take {dtype} with head_dim {shape[0]}"
    return "it failed its start-up probe against the math kernel (see the warning above)"


def _usable(
    kernel: BlockKernel, device: torch.device, dtype: torch.dtype, shape: tuple[int, int, int]
) -> bool:
    return _eligible(kernel.name, dtype, shape[0]) and _passes_probe(kernel, device, dtype, *shape)


def cuda_kernels(
    device: torch.device,
    dtype: torch.dtype,
    head_dim: int,
    n_heads: int,
    n_kv_heads: int,
    pinned: str | None = None,
) -> list[BlockKernel]:
    """Usable CUDA kernels, best first: one varlen flash kernel, then the masked efficient kernel.

    ``pinned`` names the only candidate (a backend chosen by the caller); it raises if it is unusable.
    """
    device = torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)
    shape = (head_dim, n_heads, n_kv_heads)
    if pinned is not None:
        if not _usable(_KERNELS[pinned], device, dtype, shape):
            reason = unusable_reason(pinned, device, dtype, shape)
            raise RuntimeError(
                f"attention backend {pinned} is not usable for {dtype}, head_dim {head_dim}: {reason}"
            )
        return [_KERNELS[pinned]]
    chain = [next((kernel for kernel in _VARLEN_PREFERENCE if _usable(kernel, device, dtype, shape)), None)]
    if _usable(_KERNELS["torch_efficient"], device, dtype, shape):
        chain.append(_KERNELS["torch_efficient"])
    return [kernel for kernel in chain if kernel is not None]
