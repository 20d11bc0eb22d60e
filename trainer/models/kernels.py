"""What ``train.kernels`` selects, each choice behind a start-up probe with a one-line fallback.

* ``attention``: the ring's block kernel (``longctx.trainer.attention.select``): ``auto`` (on CUDA the
  first usable of FlashAttention-4, FlashAttention-2 and PyTorch's flash varlen kernels, then PyTorch's
  memory-efficient kernel), or one kernel pinned; a pinned kernel that is not installed or fails its
  probe against the math kernel falls back to ``auto``.
* ``fused``: norms, SwiGLU, RoPE and the loss from liger-kernel (``longctx.trainer.models.fused``).
* ``compile``: ``torch.compile`` of each decoder block's two halves around the attention
  (``DecoderLayer.compile_halves``): the ring (its exchanges, its plan) stays out of every graph, so it is
  an opaque operator by construction. Not with selective checkpointing, whose per-op policy must see eager
  operators (the block then runs eagerly, and says so). Inductor's and Triton's caches go to the run
  folder (``RunLayout.compile_cache``), never to a shared temporary folder.

Defaults are the exact, measured paths: ``attention: auto``, ``fused: auto`` (liger only where its
package is installed, on CUDA, and its probe passes), ``compile: false`` until a GPU report shows it
faster.

A model of the ``transformers`` implementation (``hf.HFCausalLM``) takes the attention choice only: its
norms, MLP and RoPE are its transformers modules, which liger's ops and the compiled halves do not replace, so
``fused: liger`` and ``compile: true`` fall back there with one line each (``fused: auto`` silently).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from longctx.trainer.attention.select import attention_backend
from longctx.trainer.models.decoder import Transformer
from longctx.trainer.models.fused import EAGER, fused_ops


@dataclass(frozen=True)
class KernelChoice:
    """What a model runs with, and the one-line notes of the choices that fell back."""

    attention: str
    fused: str
    compiled: bool
    notes: list[str] = field(default_factory=list)

    def describe(self) -> str:
        compiled = "yes" if self.compiled else "no"
        return f"attention {self.attention}, fused ops {self.fused}, compiled blocks {compiled}"


def use_compile_cache(folder: Path) -> None:
    """Inductor's (and its Triton kernels') cache in ``folder``, unless ``TORCHINDUCTOR_CACHE_DIR`` names
    another one: the default, a folder shared under ``$TMPDIR``, which Inductor also writes into the
    environment itself when it is imported, is replaced."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    if os.environ.get("TORCHINDUCTOR_CACHE_DIR") in (None, default_cache_dir()):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(folder)


def compile_probe(device: torch.device, backend: str = "inductor") -> str | None:
    """None when ``torch.compile`` builds and runs a small function with gradients on ``device``, else why not
    (no C++ compiler on a CPU, no Triton on a GPU, ...)."""
    try:
        x = torch.randn(8, 8, device=device, requires_grad=True)
        compiled = torch.compile(lambda t: torch.nn.functional.silu(t) * t + 1.0, backend=backend)
        y = compiled(x)
        y.sum().backward()
        expected = torch.nn.functional.silu(x.detach()) * x.detach() + 1.0
        if not torch.allclose(y.detach(), expected, rtol=1e-5, atol=1e-6):
            return "a compiled probe function gave other values than eager"
    except Exception as exc:  # any failure of the compiler stack means "not usable here"
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    return None


def apply_kernels(
    model: nn.Module,
    *,
    attention: str,
    fused: str,
    compile_blocks: bool,
    device: torch.device,
    dtype: torch.dtype,
    compile_cache: Path | None = None,
    compile_backend: str = "inductor",
) -> KernelChoice:
    """Set ``model``'s attention backend, fused ops and compiled blocks as asked (``train.kernels``), each
    falling back when it cannot run here; ``dtype`` is what attention computes in (bf16 under autocast).
    ``compile_backend`` is ``torch.compile``'s (``aot_eager`` traces the same graphs without generating
    code: the GPU suite's CPU smoke run uses it). ``model`` is the own decoder (``model.Transformer``) or a
    transformers model (``hf.HFCausalLM``, the attention choice only: see the module docstring)."""
    notes: list[str] = []
    shape = model.config.shape
    backend, note = attention_backend(
        attention, device, dtype, shape.head_dim, shape.num_heads, shape.num_kv_heads
    )
    notes += [note] if note else []
    if hasattr(model.attention, "backend"):
        model.attention.backend = backend
    if not isinstance(model, Transformer):
        return KernelChoice(backend, EAGER.name, False, notes + _own_decoder_only(fused, compile_blocks))
    compiled = False
    if compile_blocks:
        checkpointing = model.model.activation_checkpointing
        if checkpointing == "selective":
            notes.append(
                "train.kernels.compile: not with selective activation checkpointing, whose per-op policy "
                "needs eager operators; the blocks run eagerly"
            )
        else:
            if compile_cache is not None:
                use_compile_cache(compile_cache)
            failure = compile_probe(device, compile_backend)
            if failure:
                notes.append(
                    f"train.kernels.compile: torch.compile does not run here ({failure}); eager blocks"
                )
            else:
                for layer in model.model.layers:
                    layer.compile_halves(compile_backend)
                compiled = True
    ops, note = fused_ops(fused, device, compiled=compiled)
    notes += [note] if note else []
    model.use_ops(ops)
    return KernelChoice(backend, ops.name, compiled, notes)


def _own_decoder_only(fused: str, compile_blocks: bool) -> list[str]:
    """The fallback lines of the choices a transformers model does not take (``fused: auto`` needs none)."""
    where = "train.model.implementation longctx only; this transformers model runs its own modules"
    notes = []
    if fused == "liger":
        notes.append(f"train.kernels.fused liger: {where}; using PyTorch's ops")
    if compile_blocks:
        notes.append(f"train.kernels.compile: {where}; eager blocks")
    return notes
