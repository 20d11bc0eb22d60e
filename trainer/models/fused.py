"""The model's pointwise work and its loss: PyTorch's operators, or liger-kernel's fused Triton kernels.

:class:`EagerOps` is the reference (and the fallback): RMSNorm in float32, SiLU-gated product, RoPE in
float32, and the loss computed by the model in chunks of logits (``Transformer.token_cross_entropy``).
:class:`LigerOps` (``pip install 'longctx[gpu]'``, CUDA only) replaces them with liger-kernel's fused
RMSNorm, SwiGLU, RoPE and fused linear cross-entropy, which never materializes the ``[tokens, vocab]``
logits. ``train.kernels.fused`` picks one (:func:`fused_ops`): ``none``; ``liger``; ``auto``, liger
where it is installed and passes its start-up probe on a CUDA device. liger-kernel is used only after
the probe reproduces the eager ops, forward and backward, on this device in float32 and bf16 (within
2e-2 of the largest magnitude); a missing package, a CPU device or a failed probe falls back to the
eager ops with one line saying why.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from longctx.trainer.models.rope import apply_rotary

logger = logging.getLogger(__name__)

FUSED_CHOICES = ("auto", "liger", "none")
PROBE_TOLERANCE = 2e-2


class EagerOps:
    """PyTorch's own operators (the model's reference implementation)."""

    name = "none"

    def rms_norm(self, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        """Normalize the last dimension in float32; the result has ``x``'s dtype, scaled by ``weight``."""
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
        return weight * normed.to(x.dtype)

    def silu_mul(self, gate: Tensor, up: Tensor) -> Tensor:
        """SwiGLU's gated product ``silu(gate) * up``."""
        return F.silu(gate) * up

    def rotary(self, q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """``q`` ``[B, T, heads, d]`` and ``k`` ``[B, T, kv_heads, d]`` rotated by tables ``[B, T, d]``."""
        return apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)

    def linear_cross_entropy(
        self, hidden: Tensor, weight: Tensor, labels: Tensor, ignore_index: int
    ) -> Tensor | None:
        """Per-token cross-entropy of ``hidden @ weight.T`` (float32), or None: the model's chunked loss."""
        return None


class LigerOps(EagerOps):
    """liger-kernel's fused Triton kernels (CUDA). With ``pointwise=False`` only its loss: compiled blocks
    (``torch.compile``) fuse the norms, SwiGLU and RoPE themselves."""

    name = "liger"

    def __init__(self, *, pointwise: bool = True) -> None:
        from liger_kernel.transformers import functional

        self._functional = functional
        self.pointwise = pointwise
        if not pointwise:
            self.name = "liger (loss only)"

    def rms_norm(self, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        if not self.pointwise:
            return super().rms_norm(x, weight, eps)
        shape = x.shape
        out = self._functional.liger_rms_norm(
            x.reshape(-1, shape[-1]), weight, eps, casting_mode="llama", in_place=False
        )
        return out.view(shape)

    def silu_mul(self, gate: Tensor, up: Tensor) -> Tensor:
        if not self.pointwise:
            return super().silu_mul(gate, up)
        return self._functional.liger_swiglu(gate, up)

    def rotary(self, q: Tensor, k: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        if not self.pointwise:
            return super().rotary(q, k, cos, sin)
        # liger rotates its inputs in place: hand it copies, never a tensor autograd or a selective
        # checkpoint keeps (the projections' outputs); it takes heads-first views
        q_rot, k_rot = self._functional.liger_rope(
            q.clone().transpose(1, 2), k.clone().transpose(1, 2), cos, sin
        )
        return q_rot.transpose(1, 2), k_rot.transpose(1, 2)

    def linear_cross_entropy(
        self, hidden: Tensor, weight: Tensor, labels: Tensor, ignore_index: int
    ) -> Tensor | None:
        losses = self._functional.liger_fused_linear_cross_entropy(
            hidden, weight, labels, ignore_index=ignore_index, reduction="none"
        )
        return losses.float()


EAGER = EagerOps()


def _relative_error(actual: Tensor, expected: Tensor) -> float:
    actual, expected = actual.detach(), expected.detach().double()
    scale = expected.abs().max().clamp_min(1.0)
    return float((actual.double() - expected).abs().max() / scale)


def _probe_cases(device: torch.device, dtype: torch.dtype) -> dict[str, tuple[Any, list[Tensor]]]:
    """Each op on small random inputs of this device and dtype: a callable of (ops, *inputs), which runs
    on the inputs' device, and the inputs."""
    generator = torch.Generator().manual_seed(0)

    def randn(*shape: int, scale: float = 1.0) -> Tensor:
        return (scale * torch.randn(*shape, generator=generator)).to(device, dtype)

    tokens, hidden, heads, kv_heads, dim, vocab = 48, 64, 4, 2, 16, 96
    angles = torch.randn(1, tokens, dim // 2, generator=generator).repeat(1, 1, 2)

    def rope(ops: EagerOps, q: Tensor, k: Tensor) -> Tensor:
        table = angles.to(q.device)
        return torch.cat([t.flatten(2) for t in ops.rotary(q, k, table.cos(), table.sin())], dim=-1)

    def loss(ops: EagerOps, hidden_states: Tensor, weight: Tensor) -> Tensor:
        labels = torch.arange(tokens, device=hidden_states.device) % vocab
        labels[::5] = -100  # tokens that predict nothing (document ends, padding): a loss of 0
        return _loss(ops, hidden_states, weight, labels)

    return {
        "rms_norm": (lambda ops, x, w: ops.rms_norm(x, w, 1e-6), [randn(1, tokens, hidden), randn(hidden)]),
        "swiglu": (
            lambda ops, a, b: ops.silu_mul(a, b),
            [randn(tokens, 3 * hidden), randn(tokens, 3 * hidden)],
        ),
        "rope": (rope, [randn(1, tokens, heads, dim), randn(1, tokens, kv_heads, dim)]),
        "linear_cross_entropy": (loss, [randn(tokens, hidden), randn(vocab, hidden, scale=0.1)]),
    }


def _loss(ops: EagerOps, hidden: Tensor, weight: Tensor, labels: Tensor) -> Tensor:
    losses = ops.linear_cross_entropy(hidden, weight, labels, -100)
    if losses is None:
        losses = F.cross_entropy(F.linear(hidden, weight).float(), labels, reduction="none")
    return losses


def probe_errors(ops: EagerOps, device: torch.device, dtype: torch.dtype) -> dict[str, float | str]:
    """For each probe case, the largest error of ``ops`` (forward and the inputs' gradients, relative to
    the largest magnitude) against :class:`EagerOps` in float64 on the CPU, or why it could not run."""
    errors: dict[str, float | str] = {}
    for name, (call, inputs) in _probe_cases(device, dtype).items():
        leaves = [x.detach().requires_grad_() for x in inputs]
        reference = [x.detach().cpu().double().requires_grad_() for x in inputs]
        try:
            out = call(ops, *leaves)
            out.backward(torch.ones_like(out))
        except Exception as exc:  # a kernel that cannot run here is not usable here
            errors[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            continue
        expected = call(EAGER, *reference)
        expected.backward(torch.ones_like(expected))
        found = [_relative_error(out.cpu(), expected)]
        found += [_relative_error(a.grad.cpu(), e.grad) for a, e in zip(leaves, reference, strict=True)]
        errors[name] = max(found)
    return errors


def probe(ops: EagerOps, device: torch.device, dtypes: tuple[torch.dtype, ...]) -> str | None:
    """None when ``ops`` reproduces :class:`EagerOps` in float64 on every probe case (:func:`probe_errors`,
    within :data:`PROBE_TOLERANCE`), else why not."""
    for dtype in dtypes:
        for name, error in probe_errors(ops, device, dtype).items():
            if isinstance(error, str):
                return f"{name} ({dtype}) failed: {error}"
            if not error <= PROBE_TOLERANCE:
                return f"{name} ({dtype}) differs from PyTorch's ops by {error:.1e}"
    return None


@functools.cache
def _liger_on(device: torch.device) -> tuple[EagerOps | None, str | None]:
    if importlib.util.find_spec("liger_kernel") is None:
        return None, "liger-kernel is not installed (pip install 'longctx[gpu]')"
    if device.type != "cuda":
        return None, f"liger-kernel runs on CUDA devices, not {device.type}"
    try:
        ops = LigerOps()
    except Exception as exc:  # an import that fails (no triton, a version mismatch) means unusable here
        return None, f"liger-kernel does not import: {type(exc).__name__}: {exc}"
    failure = probe(ops, device, (torch.float32, torch.bfloat16))
    return (None, f"liger-kernel failed its start-up probe: {failure}") if failure else (ops, None)


def fused_ops(choice: str, device: torch.device, *, compiled: bool = False) -> tuple[EagerOps, str | None]:
    """The ops for ``train.kernels.fused`` on ``device``, and the one line to print when the choice falls
    back (None when nothing is worth saying: ``none``, or ``auto`` on a CPU). With ``compiled`` blocks
    only liger's loss is used (the compiler fuses the pointwise work)."""
    if choice not in FUSED_CHOICES:
        raise ValueError(f"train.kernels.fused must be one of {', '.join(FUSED_CHOICES)}, got {choice!r}")
    if choice == "none" or (choice == "auto" and device.type != "cuda"):
        return EAGER, None
    ops, reason = _liger_on(device)
    if ops is None:
        return EAGER, f"train.kernels.fused {choice}: {reason}; using PyTorch's ops"
    return (LigerOps(pointwise=False) if compiled else ops), None
