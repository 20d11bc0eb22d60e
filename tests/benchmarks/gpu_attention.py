"""The GPU suite's attention sections: kernel exactness and attention speed (see ``gpu_suite.py``).

Exactness: for every kernel the ring can select on the device, forward and backward of the ring over
doc-masked packed windows, against ``reference_attention`` (float64 on the CPU, plain softmax with an
explicit block-diagonal causal mask built from the document lengths alone, on the same low-precision
inputs upcast). Two ways of running the ring are checked: ``ring_attention`` at P = 1 (the whole window on
one device), and a virtual P = 4 zigzag ring, which computes every (rank, source) block pair of a 4-rank
ring with the ring's own block primitives and merges them as ``ring.py`` does, so that the off-diagonal
blocks of context parallelism (non-causal varlen sequences) run on the device's kernels too. On one
layout, ``ring_attention`` also gets q, k and v as strided views (head_dim stride 2), which fused kernels
must not read as contiguous.

Speed: TFLOP/s of useful work (``longctx.trainer.planning.flops``: ``4 q x pairs`` forward, 3x that forward
plus
backward, pairs counted with the causal and document masks) of ``ring_attention`` at P = 1, against
``torch.nn.functional.scaled_dot_product_attention`` with the flash backend on one causal document.
"""

from __future__ import annotations

import math
import random
import time
from collections import Counter
from collections.abc import Callable, Sequence
from functools import partial

import torch
import torch.nn.functional as F
from gpu_kernels import run_kernel_exactness
from gpu_measure import (
    Deadline,
    free_memory,
    max_relative_error,
    norm_relative_error,
    summary_ms,
    synchronize,
    time_ms,
)
from torch import Tensor

from longctx.trainer.attention import build_ring_plan, ring_attention
from longctx.trainer.attention.kernels import (
    BlockKernel,
    accumulator_dtype,
    block_backward,
    block_forward,
    default_scale,
    kernel_calls,
)
from longctx.trainer.attention.masks import block_mask
from longctx.trainer.attention.merge import merge_into
from longctx.trainer.attention.select import select_kernels
from longctx.trainer.parallel.zigzag import segment_ids, zigzag_indices
from longctx.trainer.planning.flops import TRAIN_FACTOR, attention_flops, causal_pair_count

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 2e-2}
"""The project's stated tolerances (tests/trainer/test_ring_attention.py), max error relative to the
reference's largest magnitude."""

VIRTUAL_WORLD = 4
STRIDED_LAYOUT = "many_short"
"""The layout also run with q, k and v as views of head_dim stride 2 (``ring_single_rank(strided=True)``)."""
Emit = Callable[[dict], None]


# Layouts ---------------------------------------------------------------------------------------------------
def random_lengths(total: int, low: int, high: int, rng: random.Random) -> list[int]:
    """Document lengths drawn uniformly from ``[low, high]`` until they fill ``total`` (the last cut)."""
    lengths: list[int] = []
    while sum(lengths) < total:
        lengths.append(rng.randint(low, high))
    lengths[-1] -= sum(lengths) - total
    return lengths


def exactness_layouts(tokens: int, seed: int = 0) -> dict[str, list[int]]:
    """Document lengths of the packed windows the exactness section checks (each sums to ``tokens``).

    ``one_document``; ``many_short`` (1 to ``tokens / 24`` tokens each); ``length_one`` (mostly one-token
    documents, runs of them, with short documents between); ``padding_tail`` (documents, then the packer's
    padding segment, which attention treats as one more segment).
    """
    rng = random.Random(seed)
    short = random_lengths(tokens, 1, max(2, tokens // 24), rng)
    ones: list[int] = []
    while sum(ones) < tokens:
        ones.append(1 if rng.random() < 0.7 else rng.randint(2, 32))
    ones[-1] -= sum(ones) - tokens
    padding = tokens // 6
    documents = random_lengths(tokens - padding, max(1, tokens // 8), max(2, tokens // 3), rng)
    return {
        "one_document": [tokens],
        "many_short": short,
        "length_one": [n for n in ones if n > 0],
        "padding_tail": [*documents, padding],
    }


def segments_of(lengths: Sequence[int]) -> Tensor:
    """Segment id of every token, derived as the trainer does (from ``cu_seqlens``)."""
    cu = torch.tensor([0, *lengths]).cumsum(0).to(torch.int32)
    return segment_ids(cu, int(cu[-1]))


# Reference -------------------------------------------------------------------------------------------------
def document_mask(lengths: Sequence[int]) -> Tensor:
    """Dense ``[T, T]`` mask, True where query ``i`` may see key ``j``: block-diagonal and causal."""
    total = sum(lengths)
    mask = torch.zeros(total, total, dtype=torch.bool)
    start = 0
    for length in lengths:
        mask[start : start + length, start : start + length] = torch.ones(
            length, length, dtype=torch.bool
        ).tril()
        start += length
    return mask


def reference_attention(
    q: Tensor, k: Tensor, v: Tensor, dout: Tensor, lengths: Sequence[int], scale: float
) -> list[Tensor]:
    """Output and q/k/v gradients of masked softmax attention, float64 on the CPU.

    Plain ``softmax(q k^T * scale + mask) v`` with the mask of ``document_mask`` and autograd for the
    gradients; computed one key/value head (and its group of query heads) at a time to bound memory.
    Query head ``h`` reads key/value head ``h // (heads // kv_heads)``.
    """
    q, k, v, dout = (x.detach().to("cpu", torch.float64) for x in (q, k, v, dout))
    mask = document_mask(lengths)
    group = q.shape[1] // k.shape[1]
    out, dq = torch.empty_like(q), torch.empty_like(q)
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    for g in range(k.shape[1]):
        heads = slice(g * group, (g + 1) * group)
        qg = q[:, heads].clone().requires_grad_()
        kg, vg = (x[:, g].clone().requires_grad_() for x in (k, v))
        scores = torch.einsum("qhd,kd->hqk", qg, kg) * scale
        probs = scores.masked_fill(~mask, float("-inf")).softmax(-1)
        og = torch.einsum("hqk,kd->qhd", probs, vg)
        og.backward(dout[:, heads])
        out[:, heads], dq[:, heads] = og.detach(), qg.grad
        dk[:, g], dv[:, g] = kg.grad, vg.grad
    return [out, dq, dk, dv]


# The ring, two ways ----------------------------------------------------------------------------------------
def strided_leaf(x: Tensor) -> tuple[Tensor, Tensor]:
    """A leaf buffer twice as wide as ``x`` along head_dim and the view ``buffer[..., ::2]`` holding ``x``
    (a head_dim stride of 2, which fused kernels must not read as contiguous)."""
    buffer = torch.zeros(*x.shape[:-1], 2 * x.shape[-1], dtype=x.dtype, device=x.device)
    buffer[..., ::2] = x
    buffer.requires_grad_()
    return buffer, buffer[..., ::2]


def ring_single_rank(
    inputs: Sequence[Tensor], segments: Tensor, device: torch.device, backend: str, *, strided: bool = False
) -> tuple[list[Tensor], Counter]:
    """``ring_attention`` at P = 1 over the whole window: output, q/k/v gradients, kernel call counts.

    ``strided`` hands q, k and v in as views with a head_dim stride of 2 (see ``strided_leaf``)."""
    q, k, v, dout = (x.to(device, copy=True) for x in inputs)
    if strided:
        (q_buf, q), (k_buf, k), (v_buf, v) = (strided_leaf(x) for x in (q, k, v))
    else:
        q_buf, k_buf, v_buf = q, k, v = tuple(x.requires_grad_() for x in (q, k, v))
    plan = build_ring_plan(torch.arange(q.shape[0], device=device), segments.to(device))
    out = ring_attention(q, k, v, plan, backend=backend)
    out.backward(dout)
    grads = [buf.grad[..., ::2] if strided else buf.grad for buf in (q_buf, k_buf, v_buf)]
    kernels = select_kernels(device, q.dtype, q.shape[2], q.shape[1], k.shape[1], backend)
    used = Counter(
        kernel.name
        for block in plan.blocks
        if block is not None
        for kernel, _ in kernel_calls(kernels, block)
    )
    return [out.detach(), *grads], used


def ring_virtual_zigzag(
    inputs: Sequence[Tensor],
    segments: Tensor,
    device: torch.device,
    kernels: tuple[BlockKernel, ...],
    world: int = VIRTUAL_WORLD,
) -> tuple[list[Tensor], Counter]:
    """Every block pair of a ``world``-rank zigzag ring on one device, merged as ``ring.py`` merges them.

    Rank ``r`` holds the zigzag chunks ``r`` and ``2 world - 1 - r``; its output is the log-sum-exp merge
    of its blocks against every rank's keys (``block_mask``, ``kernel_calls``, ``block_forward``,
    ``merge_into``), and its backward runs each block with the merged output and log-sum-exp
    (``block_backward``), accumulating in fp32 and casting to the input dtype, as the ring does. Only
    the transfers are left out. Returns the whole window's output and gradients, and kernel call counts.
    """
    q, k, v, dout = (x.to(device) for x in inputs)
    dtype, acc, scale = q.dtype, accumulator_dtype(q.dtype), default_scale(q.shape[2])
    segments = segments.to(device)
    ranks = [zigzag_indices(q.shape[0], world, r).to(device) for r in range(world)]
    out_full = torch.empty_like(q)
    dq, dk, dv = (torch.zeros(x.shape, dtype=acc, device=device) for x in (q, k, v))
    dkv = {r: torch.zeros((2, *k[rows].shape), dtype=acc, device=device) for r, rows in enumerate(ranks)}
    used: Counter = Counter()
    for rows in ranks:
        q_r, dout_r = q[rows], dout[rows]
        blocks = []
        for s, cols in enumerate(ranks):
            block = block_mask(rows, segments[rows], cols, segments[cols])
            if block is not None:
                blocks.append((s, cols, kernel_calls(kernels, block)))
        out = torch.zeros(q_r.shape, dtype=acc, device=device)
        lse = torch.full((q_r.shape[1], q_r.shape[0]), float("-inf"), dtype=acc, device=device)
        for _, cols, calls in blocks:
            k_s, v_s = k[cols], v[cols]
            for kernel, tile in calls:
                used[kernel.name] += 1
                tile_out, tile_lse = block_forward(
                    kernel, q_r[tile.rows], k_s[tile.cols], v_s[tile.cols], tile, scale
                )
                merge_into(out[tile.rows], lse[:, tile.rows], tile_out, tile_lse)
        out = out.to(dtype)
        out_full[rows] = out
        lse = torch.where(torch.isneginf(lse), float("inf"), lse)  # keyless rows, as ring_backward does
        dq_r = torch.zeros(q_r.shape, dtype=acc, device=device)
        for s, cols, calls in blocks:
            k_s, v_s = k[cols], v[cols]
            for kernel, tile in calls:
                tile_dq, tile_dk, tile_dv = block_backward(
                    kernel,
                    dout_r[tile.rows],
                    q_r[tile.rows],
                    k_s[tile.cols],
                    v_s[tile.cols],
                    out[tile.rows],
                    lse[:, tile.rows],
                    tile,
                    scale,
                )
                dq_r[tile.rows] += tile_dq
                dkv[s][0, tile.cols] += tile_dk
                dkv[s][1, tile.cols] += tile_dv
        dq[rows] = dq_r
    for s, cols in enumerate(ranks):  # each block's dk/dv accumulator, home at its owner
        dk[cols], dv[cols] = dkv[s][0], dkv[s][1]
    return [out_full, dq.to(dtype), dk.to(dtype), dv.to(dtype)], used


# Exactness -------------------------------------------------------------------------------------------------
PACKAGES = {"flash_attn_varlen": "flash-attn (2.x)", "flash_attn4_varlen": "flash-attn-4 (flash_attn.cute)"}
"""Backends that need a package of their own (the only acceptable reason to skip a backend)."""


def not_installed(backend: str) -> bool:
    """Whether ``backend`` needs a package this machine lacks or cannot import (flash-attn-4 without its
    CuTe DSL libraries, say). flash-attn-4 installs ``flash_attn.cute`` without ``flash_attn/__init__.py``,
    so the presence of ``flash_attn`` says nothing about FlashAttention-2."""
    if backend not in PACKAGES:
        return False
    from longctx.trainer.attention import cuda_kernels

    ops = (
        cuda_kernels._flash_attn4_ops
        if backend == "flash_attn4_varlen"
        else cuda_kernels._flash_attn_varlen_ops
    )
    return ops() is None


def unavailable_reason(backend: str, exc: Exception) -> str:
    """Why a pinned backend cannot run here, in one line."""
    if not_installed(backend):
        return f"{PACKAGES[backend]} is not installed or does not import"
    return f"{type(exc).__name__}: {exc}"


def rejection_status(settings, backend: str) -> str:
    """How a backend that cannot run is recorded: unavailable (its package is missing), rejected (an
    experimental kernel, reported without failing the run), or a failure."""
    if not_installed(backend):
        return "unavailable"
    return "rejected" if backend in settings.experimental_backends else "FAIL"


def probe_kernels(settings, emit: Emit) -> list[str]:
    """Each pinned backend's own start-up probe on every head shape of ``settings.probe_shapes``.

    The ring drops a kernel that disagrees with the math kernel on its probe (with a warning), so a
    wrong kernel would make training slower, not wrong, and the ring checks below would never see it.
    Here such a rejection is a failure; only a backend whose package is not installed is skipped.
    Returns the failures.
    """
    failures = []
    for dtype in settings.exact_dtypes:
        for head_dim, heads, kv_heads in settings.probe_shapes:
            for backend in settings.exact_backends:
                if backend in ("auto", "math"):
                    continue
                case = {"dtype": str(dtype), "backend": backend, "probe_shape": [head_dim, heads, kv_heads]}
                try:
                    select_kernels(settings.device, dtype, head_dim, heads, kv_heads, backend)
                except (RuntimeError, ValueError) as exc:
                    status = rejection_status(settings, backend)
                    emit({**case, "status": status, "reason": unavailable_reason(backend, exc)})
                    if status == "FAIL":
                        failures.append(
                            f"{dtype} {backend} probe at head_dim/heads/kv {head_dim}/{heads}/{kv_heads}"
                        )
                    continue
                emit({**case, "status": "ok"})
    return failures


def compare(actual: Sequence[Tensor], expected: Sequence[Tensor], dtype: torch.dtype) -> dict:
    """Errors of output and gradients against the reference, and whether all are within tolerance."""
    names = ("out", "dq", "dk", "dv")
    errors = {name: max_relative_error(a, e) for name, a, e in zip(names, actual, expected, strict=True)}
    norms = {name: norm_relative_error(a, e) for name, a, e in zip(names, actual, expected, strict=True)}
    worst = max(errors.values())
    return {
        "max_error": errors,
        "norm_error": norms,
        "worst": worst,
        "tolerance": TOLERANCE[dtype],
        "passed": math.isfinite(worst) and worst <= TOLERANCE[dtype],
    }


def exactness_inputs(tokens: int, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype, seed: int):
    """Fresh random q, k, v and output gradient, rounded to ``dtype`` (CPU tensors)."""
    generator = torch.Generator().manual_seed(seed)
    shapes = [(tokens, heads), (tokens, kv_heads), (tokens, kv_heads), (tokens, heads)]
    return [
        torch.randn(*shape, head_dim, generator=generator, dtype=torch.float64).to(dtype) for shape in shapes
    ]


def run_exactness(settings, deadline: Deadline, emit: Emit) -> dict:
    """Section 1: every selectable kernel, both ring modes, every layout and dtype, against float64."""
    device, tokens = settings.device, settings.exact_tokens
    heads, kv_heads, head_dim = settings.heads, settings.kv_heads, settings.head_dim
    scale = default_scale(head_dim)
    chains = {
        str(dtype): [k.name for k in select_kernels(device, dtype, head_dim, heads, kv_heads)]
        for dtype in settings.exact_dtypes
    }
    failures, checked, skipped = probe_kernels(settings, emit), 0, 0
    estimate_s = settings.exact_case_estimate_s  # then the last layout's time, with a margin
    for dtype in settings.exact_dtypes:
        for seed, (layout, lengths) in enumerate(exactness_layouts(tokens).items()):
            if not deadline.allows(estimate_s):
                reason = f"section time cap (a layout takes about {estimate_s:.0f} s here)"
                emit({"dtype": str(dtype), "layout": layout, "status": "skipped", "reason": reason})
                skipped += 1
                continue
            layout_started = time.perf_counter()
            inputs = exactness_inputs(tokens, heads, kv_heads, head_dim, dtype, seed)
            segments = segments_of(lengths)
            t0 = time.perf_counter()
            expected = reference_attention(*inputs, lengths, scale)
            reference_s = time.perf_counter() - t0
            for backend in settings.exact_backends:
                try:
                    kernels = select_kernels(device, dtype, head_dim, heads, kv_heads, backend)
                except (RuntimeError, ValueError) as exc:
                    status = rejection_status(settings, backend)
                    if status == "FAIL":
                        failures.append(f"{dtype} {layout} {backend}: rejected")
                    emit(
                        {
                            "dtype": str(dtype),
                            "layout": layout,
                            "backend": backend,
                            "status": status,
                            "reason": unavailable_reason(backend, exc),
                        }
                    )
                    continue
                modes = ["P=1", f"zigzag P={VIRTUAL_WORLD}"] + (
                    ["P=1 strided"] if layout == STRIDED_LAYOUT else []
                )
                for mode in modes:
                    t0 = time.perf_counter()
                    if mode.startswith("P=1"):
                        strided = mode.endswith("strided")
                        actual, used = ring_single_rank(inputs, segments, device, backend, strided=strided)
                    else:
                        actual, used = ring_virtual_zigzag(inputs, segments, device, kernels)
                    synchronize(device)
                    result = compare(actual, expected, dtype)
                    checked += 1
                    if not result["passed"]:
                        failures.append(f"{dtype} {layout} {backend} {mode}")
                    emit(
                        {
                            "dtype": str(dtype),
                            "layout": layout,
                            "documents": len(lengths),
                            "backend": backend,
                            "mode": mode,
                            "kernels_used": dict(used),
                            "status": "ok" if result["passed"] else "FAIL",
                            **result,
                            "seconds": time.perf_counter() - t0,
                            "reference_s": reference_s,
                        }
                    )
            del inputs, expected
            free_memory(device)
            estimate_s = 1.2 * (time.perf_counter() - layout_started)
    other = run_kernel_exactness(settings, deadline, emit)
    failures += other["failures"]
    return {
        "tokens": tokens,
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "auto_kernel_chain": chains,
        "checked": checked,
        "skipped_layouts": skipped,
        "fused_and_compiled_checked": not other["skipped"],
        "failures": failures,
        "passed": not failures and checked > 0 and skipped == 0 and not other["skipped"],
    }


# Speed -----------------------------------------------------------------------------------------------------
def matmul_tflops(device: torch.device, size: int, dtype: torch.dtype) -> float:
    """The device's dense matmul rate on random data, TFLOP/s (the ceiling attention is read against)."""
    a, b = (torch.randn(size, size, device=device, dtype=dtype) for _ in range(2))
    times = time_ms(lambda: a @ b, device, warmup=3, reps=10)
    return 2 * size**3 / (summary_ms(times)["median_ms"] * 1e-3) / 1e12


def sdpa_callables(
    q: Tensor, k: Tensor, v: Tensor, dout: Tensor, device: torch.device, backend: str = "flash"
):
    """Causal SDPA forward and forward+backward on heads-first copies of the inputs, with the ``flash`` or
    ``cudnn`` backend (``torch.nn.attention.SDPBackend``).

    Uses SDPA's native grouped-query support where the backend takes it, else keys and values
    repeated to the query heads (outside the timed region); returns the two callables and which way.
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel

    chosen = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]

    def heads_first(x: Tensor) -> Tensor:
        return x.detach().transpose(0, 1).unsqueeze(0).contiguous().requires_grad_()

    qh, kh, vh, gh = (
        heads_first(q),
        heads_first(k),
        heads_first(v),
        dout.transpose(0, 1).unsqueeze(0).contiguous(),
    )
    gqa = "native"
    context = sdpa_kernel([chosen])
    try:
        with context:
            F.scaled_dot_product_attention(
                qh[:, :, :8], kh[:, :, :8], vh[:, :, :8], is_causal=True, enable_gqa=True
            )
    except RuntimeError:
        gqa = "keys repeated"
        group = q.shape[1] // k.shape[1]
        kh, vh = (x.detach().repeat_interleave(group, dim=1).requires_grad_() for x in (kh, vh))

    def forward() -> Tensor:
        with sdpa_kernel([chosen]):
            return F.scaled_dot_product_attention(qh, kh, vh, is_causal=True, enable_gqa=gqa == "native")

    def forward_backward() -> tuple:
        return torch.autograd.grad(forward(), (qh, kh, vh), gh)

    return forward, forward_backward, gqa


def _rate(flops: float, times: list[float]) -> dict:
    stats = summary_ms(times)
    return {**stats, "tflops": flops / (stats["median_ms"] * 1e-3) / 1e12}


def usable_backends(settings) -> list[str]:
    """The ring kernels of ``settings.speed_backends`` that run here (a missing package or a rejected
    probe leaves one out; the exactness section says why)."""
    usable = []
    for backend in settings.speed_backends:
        try:
            select_kernels(
                settings.device,
                settings.speed_dtype,
                settings.head_dim,
                settings.heads,
                settings.kv_heads,
                backend,
            )
        except (RuntimeError, ValueError):
            continue
        usable.append(backend)
    return usable


def measure_length(settings, tokens: int, emit: Emit, backends: Sequence[str] = ()) -> dict:
    """Ours on one document and on many (the automatic chain, and each of ``backends`` pinned, at the lengths
    of ``settings.speed_backend_tokens``), and SDPA (flash; cuDNN where it runs) on one document, at one
    length; the summary row."""
    device, dtype = settings.device, settings.speed_dtype
    heads, kv_heads, head_dim = settings.heads, settings.kv_heads, settings.head_dim
    warmup, reps = settings.speed_reps(tokens)
    options = {"device": device, "dtype": dtype, "requires_grad": True}
    q = torch.randn(tokens, heads, head_dim, **options)
    k, v = (torch.randn(tokens, kv_heads, head_dim, **options) for _ in range(2))
    dout = torch.randn(tokens, heads, head_dim, device=device, dtype=dtype)
    index = torch.arange(tokens, device=device)
    layouts = {
        "one_document": [tokens],
        "many_documents": random_lengths(tokens, 1, 2 * settings.speed_mean_document, random.Random(tokens)),
    }
    measured: dict[str, dict] = {}
    pinned_rates: dict[str, dict] = {}
    for layout, lengths in layouts.items():
        segments = segments_of(lengths).to(device)
        plan_ms = time_ms(lambda s=segments: build_ring_plan(index, s), device, warmup=0, reps=1)[0]
        plan = build_ring_plan(index, segments)
        forward = attention_flops(heads * head_dim, causal_pair_count(lengths))
        fwd = _rate(
            forward, time_ms(lambda p=plan: ring_attention(q, k, v, p), device, warmup=warmup, reps=reps)
        )

        def forward_backward(p=plan, backend: str = "auto") -> tuple:
            return torch.autograd.grad(ring_attention(q, k, v, p, backend=backend), (q, k, v), dout)

        fwd_bwd = _rate(TRAIN_FACTOR * forward, time_ms(forward_backward, device, warmup=warmup, reps=reps))
        measured[layout] = {"forward": fwd, "forward_backward": fwd_bwd}
        emit({
            "tokens": tokens, "layout": layout, "impl": "ring_attention", "documents": len(lengths),
            "useful_forward_flops": forward, "plan_build_ms": plan_ms, "forward": fwd,
            "forward_backward": fwd_bwd, "status": "ok",
        })  # fmt: skip
        for backend in backends if tokens in settings.speed_backend_tokens else ():
            rate = _rate(
                TRAIN_FACTOR * forward,
                time_ms(partial(forward_backward, plan, backend), device, warmup=warmup, reps=reps),
            )
            pinned_rates.setdefault(backend, {})[layout] = rate
            emit({
                "tokens": tokens, "layout": layout, "impl": f"ring_attention[{backend}]",
                "documents": len(lengths), "forward_backward": rate, "status": "ok",
            })  # fmt: skip
    forward = attention_flops(heads * head_dim, causal_pair_count([tokens]))
    baselines = {}
    for backend in ("flash", "cudnn") if device.type == "cuda" else ("flash",):
        try:
            sdpa_fwd, sdpa_fb, gqa = sdpa_callables(q, k, v, dout, device, backend)
            sdpa = {
                "forward": _rate(forward, time_ms(sdpa_fwd, device, warmup=warmup, reps=reps)),
                "forward_backward": _rate(
                    TRAIN_FACTOR * forward, time_ms(sdpa_fb, device, warmup=warmup, reps=reps)
                ),
            }
        except RuntimeError as exc:  # the cuDNN backend where cuDNN's attention is missing: reported
            if backend == "flash":
                raise
            emit(
                {
                    "tokens": tokens,
                    "impl": f"sdpa_{backend}",
                    "status": "unavailable",
                    "reason": str(exc)[:300],
                }
            )
            continue
        baselines[backend] = sdpa
        emit({
            "tokens": tokens, "layout": "one_document", "impl": f"sdpa_{backend}", "gqa": gqa,
            "useful_forward_flops": forward, **sdpa, "status": "ok",
        })  # fmt: skip
    one, many = measured["one_document"], measured["many_documents"]
    row = {"tokens": tokens}
    for phase in ("forward", "forward_backward"):
        row[f"{phase}_vs_sdpa"] = baselines["flash"][phase]["median_ms"] / one[phase]["median_ms"]
        if "cudnn" in baselines:
            row[f"{phase}_vs_sdpa_cudnn"] = baselines["cudnn"][phase]["median_ms"] / one[phase]["median_ms"]
        # Proportionally faster on many documents: the useful rate stays that of one document.
        row[f"{phase}_many_documents_rate_vs_one"] = many[phase]["tflops"] / one[phase]["tflops"]
        row[f"{phase}_many_documents_speedup"] = one[phase]["median_ms"] / many[phase]["median_ms"]
    row["pinned_forward_backward_tflops"] = {
        backend: {layout: rate["tflops"] for layout, rate in rates.items()}
        for backend, rates in pinned_rates.items()
    }
    emit({"tokens": tokens, "summary": row, "status": "ok"})
    return row


def run_speed(settings, deadline: Deadline, emit: Emit) -> dict:
    """Section 2: ``ring_attention`` (P = 1) against flash SDPA, forward and forward+backward."""
    device, dtype = settings.device, settings.speed_dtype
    heads, kv_heads, head_dim = settings.heads, settings.kv_heads, settings.head_dim
    ceiling = matmul_tflops(device, settings.matmul_size, dtype)
    backends = usable_backends(settings)
    rows, last_cost, last_tokens = [], None, None
    for tokens in settings.speed_tokens:
        # The last length's time, scaled by the work per call (quadratic) and the number of calls.
        if last_cost is not None and not deadline.allows(
            last_cost
            * (tokens / last_tokens) ** 2
            * sum(settings.speed_reps(tokens))
            / sum(settings.speed_reps(last_tokens))
        ):
            reason = "section time cap (estimated from the last size)"
            emit({"tokens": tokens, "status": "skipped", "reason": reason})
            continue
        started = time.perf_counter()
        rows.append(measure_length(settings, tokens, emit, backends))
        free_memory(device)
        last_cost, last_tokens = time.perf_counter() - started, tokens
    goal, many_goal = settings.speed_goal, settings.many_documents_goal
    met = [
        r["tokens"] for r in rows if r["forward_backward_vs_sdpa"] >= goal and r["forward_vs_sdpa"] >= goal
    ]
    many_met = [r["tokens"] for r in rows if r["forward_backward_many_documents_rate_vs_one"] >= many_goal]
    return {
        "dtype": str(dtype),
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
        "matmul_tflops": ceiling,
        "auto_chain": [k.name for k in select_kernels(device, dtype, head_dim, heads, kv_heads)],
        "pinned_backends": backends,
        "flop_model": "forward 4*q_dim*pairs (causal, document-masked); "
        f"forward+backward {TRAIN_FACTOR:g}x forward (longctx.trainer.planning.flops)",
        "goal": f"ring_attention speed >= {goal}x SDPA's on one document (sdpa_ms / ours_ms)",
        "rows": rows,
        "goal_met_at": met,
        "goal_met": bool(rows) and len(met) == len(rows),
        "many_documents_goal": f"forward+backward useful rate, many documents >= {many_goal}x one document's",
        "many_documents_goal_met_at": many_met,
        "many_documents_goal_met": bool(rows) and len(many_met) == len(rows),
        "all_sizes_measured": len(rows) == len(settings.speed_tokens),
    }
