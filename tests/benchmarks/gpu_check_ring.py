"""Check ring attention's CUDA path on one GPU: exact against the CPU path in bf16, fast against SDPA.

1. Kernel selection: the kernels chosen (after their probes) for bf16, fp16 and fp32.
2. Exactness, bf16 (2048 tokens, 8 query / 2 key heads): single-rank calls over packed windows (one
   document, many documents, one-token documents), and every block pair of a virtual P = 4 zigzag ring
   (diagonal causal blocks and trimmed off-diagonal full blocks), with the automatic kernel chain and
   with the dense ``torch_efficient`` kernel pinned. Output and q/k/v gradients are compared with the
   CPU path on the same bf16 inputs and with the CPU path in float64 (exact); the CUDA error must stay
   within bf16 tolerance (2e-2).
3. Speed: forward+backward TFLOP/s at 8K and 32K tokens, one causal document, against
   ``torch.nn.functional.scaled_dot_product_attention(is_causal=True)``; and the time of a window of
   many documents, which SDPA cannot mask without a dense mask.

    python tests/benchmarks/gpu_check_ring.py [--heads 32] [--kv-heads 8] [--head-dim 128]

Exits with 1 if a check fails, 2 without a CUDA device.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F
from layouts import document_segments

from longctx.trainer.attention import build_ring_plan, ring_attention
from longctx.trainer.attention.kernels import block_backward, block_forward, kernel_calls
from longctx.trainer.attention.masks import block_mask
from longctx.trainer.attention.merge import merge_into
from longctx.trainer.attention.select import select_kernels
from longctx.trainer.attention.zigzag import zigzag_indices

TOLERANCE = 2e-2


def error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    expected = expected.double().cpu()
    return float((actual.double().cpu() - expected).abs().max() / expected.abs().max().clamp_min(1.0))


def full_call(
    segment: torch.Tensor, inputs: list[torch.Tensor], device: str, dtype: torch.dtype, backend: str
):
    """Output and q/k/v gradients of a single-rank call over the whole window."""
    index = torch.arange(len(segment), device=device)
    plan = build_ring_plan(index, segment.to(device))
    q, k, v, grad = (x.to(device, dtype, copy=True) for x in inputs)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    out = ring_attention(q, k, v, plan, backend=backend)
    out.backward(grad)
    return [out.detach(), q.grad, k.grad, v.grad]


def zigzag_block_calls(
    segment: torch.Tensor, inputs: list[torch.Tensor], device: str, dtype: torch.dtype, backend: str
):
    """Output and q/k/v gradients of every block pair of a virtual P = 4 zigzag ring, as the ring computes
    them (all kernel calls of a block merged); each block is its own window here."""
    world, seq_len = 4, len(segment)
    q, k, v, grad = (x.to(device, dtype) for x in inputs)
    kernels = select_kernels(torch.device(device), dtype, q.shape[2], q.shape[1], k.shape[1], backend)
    scale = q.shape[2] ** -0.5
    acc = torch.promote_types(dtype, torch.float32)
    parts = []
    for r in range(world):
        rows = zigzag_indices(seq_len, world, r)
        q_r, grad_r = q[rows], grad[rows]
        for s in range(world):
            cols = zigzag_indices(seq_len, world, s)
            k_s, v_s = k[cols], v[cols]
            block = block_mask(
                rows.to(device), segment[rows].to(device), cols.to(device), segment[cols].to(device)
            )
            if block is None:
                continue
            calls = kernel_calls(kernels, block)
            out = torch.zeros(q_r.shape, dtype=acc, device=device)
            lse = torch.full((q_r.shape[1], q_r.shape[0]), float("-inf"), dtype=acc, device=device)
            for kernel, tile in calls:
                tile_out, tile_lse = block_forward(
                    kernel, q_r[tile.rows], k_s[tile.cols], v_s[tile.cols], tile, scale
                )
                merge_into(out[tile.rows], lse[:, tile.rows], tile_out, tile_lse)
            out = out.to(dtype)
            lse = torch.where(torch.isneginf(lse), float("inf"), lse)  # keyless rows, as the ring does
            grads = [torch.zeros(x.shape, dtype=acc, device=device) for x in (q_r, k_s, v_s)]
            for kernel, tile in calls:
                dq, dk, dv = block_backward(
                    kernel,
                    grad_r[tile.rows],
                    q_r[tile.rows],
                    k_s[tile.cols],
                    v_s[tile.cols],
                    out[tile.rows],
                    lse[:, tile.rows],
                    tile,
                    scale,
                )
                grads[0][tile.rows] += dq
                grads[1][tile.cols] += dk
                grads[2][tile.cols] += dv
            parts += [out, *grads]
    return [torch.cat([p.flatten().double().cpu() for p in parts])]


def check_exactness(args: argparse.Namespace) -> bool:
    seq_len, heads, kv_heads, dim = 2048, 8, 2, args.head_dim
    generator = torch.Generator().manual_seed(0)
    shapes = [(seq_len, heads), (seq_len, kv_heads), (seq_len, kv_heads), (seq_len, heads)]
    inputs = [torch.randn(*shape, dim, generator=generator).bfloat16() for shape in shapes]
    ok = True
    print(f"\nexactness, bf16, {seq_len} tokens, heads {heads}/{kv_heads}, head_dim {dim}")
    print("  errors: CUDA vs CPU fp64 / CPU bf16 vs CPU fp64 / CUDA vs CPU bf16")
    for layout, mean in (("one document", None), ("many documents", 100), ("one-token documents", 1)):
        segment = document_segments(seq_len, mean)
        for check, run in (("single-rank call", full_call), ("zigzag P=4 blocks", zigzag_block_calls)):
            exact = run(segment, inputs, "cpu", torch.float64, "auto")
            cpu = run(segment, inputs, "cpu", torch.bfloat16, "auto")
            for backend in ("auto", "torch_efficient"):
                cuda = run(segment, inputs, "cuda", torch.bfloat16, backend)
                worst = [
                    max(error(a, b) for a, b in zip(x, y, strict=True))
                    for x, y in ((cuda, exact), (cpu, exact), (cuda, cpu))
                ]
                passed = worst[0] <= TOLERANCE
                ok &= passed
                errors = " / ".join(f"{e:.2e}" for e in worst)
                print(f"  {layout:20s} {check:18s} {backend:16s} {errors}  {'ok' if passed else 'FAIL'}")
    return ok


def cuda_time(fn, iters: int = 10) -> float:
    """Median milliseconds of ``fn`` on the current stream."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def time_ring(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad: torch.Tensor, segment: torch.Tensor
) -> float:
    """Median ms of a single-rank ring_attention forward+backward over one window."""
    plan = build_ring_plan(torch.arange(len(segment), device=q.device), segment.to(q.device))
    return cuda_time(lambda: ring_attention(q, k, v, plan).backward(grad))


def time_sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad: torch.Tensor) -> float:
    """Median ms of causal SDPA forward+backward on the same tensors, heads-first."""
    q, k, v = (x.detach().transpose(0, 1).unsqueeze(0).requires_grad_() for x in (q, k, v))
    grad = grad.transpose(0, 1).unsqueeze(0)
    return cuda_time(
        lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).backward(grad)
    )


def check_speed(args: argparse.Namespace) -> None:
    heads, kv_heads, dim = args.heads, args.kv_heads, args.head_dim
    print(f"\nspeed, bf16 forward+backward, heads {heads}/{kv_heads}, head_dim {dim}")
    for seq_len in (8192, 32768):
        options = {"device": "cuda", "dtype": torch.bfloat16, "requires_grad": True}
        q = torch.randn(seq_len, heads, dim, **options)
        k, v = (torch.randn(seq_len, kv_heads, dim, **options) for _ in "kv")
        grad = torch.randn_like(q)
        flops = 3.5 * 2 * seq_len**2 * heads * dim  # causal forward 2*T^2*H*D, backward 2.5x forward
        ours = time_ring(q, k, v, grad, document_segments(seq_len, None))
        sdpa = time_sdpa(q, k, v, grad)
        documents = time_ring(q, k, v, grad, document_segments(seq_len, 2048))
        print(
            f"  {seq_len:6d} tokens: ring_attention {flops / ours / 1e9:6.1f} TFLOP/s ({ours:.2f} ms),"
            f" SDPA {flops / sdpa / 1e9:6.1f} TFLOP/s ({sdpa:.2f} ms), ours/SDPA time {ours / sdpa:.2f}"
        )
        print(f"          documents of ~2K tokens: ring_attention {documents:.2f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--kv-heads", type=int, default=8)
    parser.add_argument("--head-dim", type=int, default=128)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check", file=sys.stderr)
        return 2
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        chain = select_kernels(torch.device("cuda"), dtype, args.head_dim, args.heads, args.kv_heads)
        print(f"  kernels for {dtype}: {' -> '.join(kernel.name for kernel in chain)}")
    ok = check_exactness(args)
    check_speed(args)
    print("\nall checks passed" if ok else "\nSOME CHECKS FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
