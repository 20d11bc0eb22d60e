"""Where a training step's time goes: ``torch.profiler`` over one step, its device time by kind of work.

Every kernel of the step (device time; on a CPU, every operator's own CPU time) is put in one category:

* ``attention``: the ring's block kernels (FlashAttention-2/4, PyTorch's flash, memory-efficient, cuDNN
  and CPU flash kernels) and the ring's own bookkeeping (merging, its accumulators);
* ``matmuls``: GEMMs (cuBLAS/cuBLASLt/CUTLASS kernels, ``aten::mm`` and relatives), the loss's output
  projection excepted;
* ``norms``: RMSNorm, forward and backward (liger's kernel, or PyTorch's ops called from ``rms_norm``);
* ``loss``: the output projection, softmax and cross-entropy of the chunked (or fused) loss;
* ``optimizer``: AdamW's step, gradient clipping, the gradients' scaling and zeroing;
* ``communication``: NCCL/gloo kernels (none at world size 1); the host's wait on the ring's transfers
  (``WAIT_CLOCK``) is reported beside, in seconds of wall time;
* ``other``: everything else: RoPE, SwiGLU's gating, residual additions, casts, copies;
* ``unattributed``: device time of kernels the profiler linked to no CPU operator (on a GPU: all device
  events' time less the attributed kernels'), so that the shares add up to the device's busy time.

Kernels are attributed by their name where it says what they are, else by the operator that launched them
and that operator's Python stack (``with_stack``), and backward kernels by the forward operator that
recorded their node (autograd's sequence numbers). The profiled step is slower than an unprofiled one;
the shares of device time are what the breakdown reports.
"""

from __future__ import annotations

import re
import time
from collections import defaultdict
from collections.abc import Callable

import torch

CATEGORIES = ("attention", "matmuls", "norms", "loss", "optimizer", "communication", "other", "unattributed")

_KERNEL_NAMES = (
    ("communication", re.compile(r"nccl|gloo", re.I)),
    ("attention", re.compile(r"flash|fmha|attention|attn|cudnn.*(fprop|dgrad|sdpa)", re.I)),
    ("norms", re.compile(r"rms_norm|rmsnorm", re.I)),
    ("loss", re.compile(r"cross_entropy|log_softmax|nll_loss", re.I)),
)
"""Kernels whose name says what they are, whatever launched them."""
_GEMM = re.compile(r"gemm|nvjet|xmma|cutlass|cublas", re.I)
"""GEMM kernels: matmuls, unless the operator that launched them belongs to the loss or the attention."""
_STACK_FRAMES = (
    ("optimizer", re.compile(r"torch/optim/|clip_grad|scale_gradients|zero_grad|_foreach", re.I)),
    ("loss", re.compile(r"cross_entropy")),
    ("attention", re.compile(r"trainer/attention/")),
    ("norms", re.compile(r"rms_norm")),
)
"""Python functions (profiler events of their own, or frames of an event's stack) and what they do."""
_OPERATORS = (
    ("optimizer", re.compile(r"Optimizer\.step|adam|_foreach|clip_grad", re.I)),
    ("attention", re.compile(r"longctx::ring_attention|scaled_dot_product|flash|efficient_attention", re.I)),
    ("loss", re.compile(r"cross_entropy|log_softmax|nll_loss", re.I)),
    ("matmuls", re.compile(r"aten::(mm|addmm|bmm|matmul|linear|baddbmm)$")),
)


_OPERATOR_NAME = re.compile(r"^(aten|longctx|c10d|_c10d_functional)::")
"""CPU events that are operators (the Python functions and the autograd engine's own events are not)."""


def _match(table, text: str) -> str | None:
    return next((category for category, pattern in table if pattern.search(text)), None)


def _operator_category(event, forward_of: dict[int, str]) -> str | None:
    """The category of a CPU operator from its own name, its Python stack, its ancestors, or (a backward
    node) the forward operator with its sequence number."""
    node = event
    while node is not None:
        # the Python code that ran it (the Python functions among its ancestors, or its recorded stack)
        # says more than an operator's name: a matmul of the loss, of the attention's bookkeeping
        frames = [node.name, *(node.stack or [])]
        found = next((c for frame in frames if (c := _match(_STACK_FRAMES, frame))), None)
        if found is None:
            found = _match(_OPERATORS, node.name)
        if found is None and node.name.startswith("autograd::engine::evaluate_function"):
            found = forward_of.get(node.sequence_nr)
        if found is not None:
            return found
        node = node.cpu_parent
    return None


def breakdown(prof: torch.profiler.profile, device: torch.device) -> dict[str, float]:
    """Seconds of device time (CPU: operators' own time) per category of :data:`CATEGORIES`."""
    events = list(prof.events())
    forward_of: dict[int, str] = {}
    for event in events:  # forward operators that record autograd nodes: their category, by sequence number
        if event.sequence_nr >= 0 and not event.name.startswith("autograd::engine"):
            category = _operator_category(event, {})
            if category is not None:
                forward_of.setdefault(event.sequence_nr, category)
    seconds: dict[str, float] = defaultdict(float)
    if device.type == "cuda":
        busy = sum(
            e.time_range.elapsed_us() for e in events if e.device_type == torch.autograd.DeviceType.CUDA
        )
        seconds["unattributed"] = busy / 1e6
    for event in events:
        if device.type == "cuda":
            for kernel in event.kernels:
                category = _match(_KERNEL_NAMES, kernel.name) or _operator_category(event, forward_of)
                if category is None:
                    category = "matmuls" if _GEMM.search(kernel.name) else "other"
                seconds[category] += kernel.duration / 1e6
                seconds["unattributed"] -= kernel.duration / 1e6
        elif event.self_cpu_time_total > 0 and _OPERATOR_NAME.match(event.name):
            category = _operator_category(event, forward_of) or "other"
            seconds[category] += event.self_cpu_time_total / 1e6
    seconds["unattributed"] = max(0.0, seconds["unattributed"])  # rounding of microsecond durations
    return {category: seconds.get(category, 0.0) for category in CATEGORIES}


def profile_step(step: Callable[[], object], device: torch.device, comm_clock=None) -> dict:
    """One call of ``step`` under ``torch.profiler``: its wall time, the device (or CPU) time per category
    and its share, and the host's wait on the ring's transfers (``comm_clock.seconds``, when given)."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
        torch.cuda.synchronize(device)
    waited = comm_clock.seconds if comm_clock is not None else 0.0
    started = time.perf_counter()
    with torch.profiler.profile(activities=activities, with_stack=True) as prof:
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    wall = time.perf_counter() - started
    seconds = breakdown(prof, device)
    total = sum(seconds.values())
    return {
        "wall_s": wall,
        "measured": "device kernel time" if device.type == "cuda" else "CPU operator self time",
        "seconds": seconds,
        "share": {category: value / total if total else 0.0 for category, value in seconds.items()},
        "busy_s": total,
        "communication_wait_s": (comm_clock.seconds - waited) if comm_clock is not None else None,
    }
