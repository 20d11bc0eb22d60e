"""Which block kernels compute attention on a device: the kernel chain a ring step uses.

On CPU, PyTorch's flash kernel for CPU with an additive mask, for every float dtype. On CUDA, see
``cuda_kernels.py`` (FlashAttention-4 or -2 varlen, PyTorch's flash varlen, PyTorch's memory-efficient
kernel with a mask, each only after it reproduces the math kernel on this device), always ending with the
math kernel. ``backend=`` pins one kernel (still followed by the math kernel for blocks it cannot
express). Selection lives apart from the kernels so that the CUDA kernels, which build on the
generic ones in ``kernels.py``, are imported by nothing that ``kernels.py`` imports.
"""

from __future__ import annotations

import torch

from longctx.trainer.attention.kernels import BlockKernel, CpuFlashKernel, MathKernel

BACKENDS = (
    "auto",
    "math",
    "cpu_flash",
    "flash_attn4_varlen",
    "flash_attn_varlen",
    "torch_flash_varlen",
    "torch_efficient",
    "torch_cudnn",
)
"""``backend=`` values: ``auto`` (the chain above) or one pinned kernel (``kernels``, ``cuda_kernels``)."""


def select_kernels(
    device: torch.device,
    dtype: torch.dtype,
    head_dim: int,
    n_heads: int,
    n_kv_heads: int,
    backend: str = "auto",
) -> tuple[BlockKernel, ...]:
    """Ordered kernels for inputs of this device and shape; the last one accepts every block."""
    if backend not in BACKENDS:
        raise ValueError(f"unknown attention backend {backend!r}; expected one of {BACKENDS}")
    if not dtype.is_floating_point:
        raise TypeError(f"attention needs floating-point inputs, got {dtype}")
    if device.type == "cuda" and backend not in ("math", "cpu_flash"):
        # Imported here so that CPU-only installs never touch the CUDA kernel bindings.
        from longctx.trainer.attention.cuda_kernels import cuda_kernels

        pinned = None if backend == "auto" else backend
        return (*cuda_kernels(device, dtype, head_dim, n_heads, n_kv_heads, pinned), MathKernel())
    if backend == "cpu_flash" or (backend == "auto" and device.type == "cpu"):
        if device.type != "cpu":
            raise ValueError(f"the cpu_flash backend runs on CPU tensors, got {device}")
        return (CpuFlashKernel(),)
    if backend not in ("auto", "math"):
        raise ValueError(f"backend {backend!r} needs CUDA tensors, got {device}")
    return (MathKernel(),)


def attention_backend(
    requested: str, device: torch.device, dtype: torch.dtype, head_dim: int, n_heads: int, n_kv_heads: int
) -> tuple[str, str | None]:
    """``requested`` (``train.kernels.attention``) when it runs here, else ``auto`` and the one line that
    says why: a pinned kernel that is not installed, needs another device or fails its start-up probe
    falls back to the automatic chain."""
    if requested == "auto":
        return requested, None
    try:
        select_kernels(device, dtype, head_dim, n_heads, n_kv_heads, requested)
    except (RuntimeError, ValueError) as exc:
        return "auto", f"train.kernels.attention {requested}: {exc}; using auto"
    return requested, None
