"""Measuring on a device for the GPU suite (``gpu_suite.py``): time caps, timers, memory, errors.

Shared by the suite's sections; every helper also works on CPU, so ``--cpu-smoke`` runs the same code.
"""

from __future__ import annotations

import gc
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch


@dataclass
class Deadline:
    """A section's time cap: it ends at ``end`` (``time.monotonic``), never after the suite's own end."""

    end: float

    @classmethod
    def after(cls, seconds: float, outer: Deadline | None = None) -> Deadline:
        end = time.monotonic() + seconds
        return cls(end if outer is None else min(end, outer.end))

    def left(self) -> float:
        """Seconds until the cap (negative once it has passed)."""
        return self.end - time.monotonic()

    def allows(self, estimate_s: float) -> bool:
        """Whether work estimated to take ``estimate_s`` seconds still fits before the cap."""
        return self.left() >= estimate_s


def synchronize(device: torch.device) -> None:
    """Wait for the device's queued work (a no-op on CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_ms(fn: Callable[[], object], device: torch.device, *, warmup: int, reps: int) -> list[float]:
    """Milliseconds of each of ``reps`` calls of ``fn`` after ``warmup`` untimed ones.

    On CUDA each call is bracketed by CUDA events on the current stream (device time, no host clock);
    on CPU by ``time.perf_counter``.
    """
    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    for _ in range(reps):
        if device.type == "cuda":
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return times


def summary_ms(times: list[float]) -> dict[str, float]:
    """Median and spread of a timing series."""
    return {
        "median_ms": statistics.median(times),
        "min_ms": min(times),
        "max_ms": max(times),
        "reps": len(times),
    }


def max_relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``max |actual - expected| / max(max |expected|, 1)``, the project's error measure (as in
    tests/trainer/test_ring_attention.py: absolute where the reference is below 1 in magnitude, e.g. the
    exactly zero gradients of one-token documents). NaN or inf anywhere gives inf."""
    actual, expected = actual.detach().double().cpu(), expected.detach().double().cpu()
    if actual.shape != expected.shape:
        raise ValueError(f"shape {tuple(actual.shape)} differs from the reference's {tuple(expected.shape)}")
    if not bool(torch.isfinite(actual).all()):
        return math.inf
    return float((actual - expected).abs().max() / expected.abs().max().clamp_min(1.0))


def norm_relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``||actual - expected|| / ||expected||`` (Frobenius), the usual whole-tensor figure."""
    actual, expected = actual.detach().double().cpu(), expected.detach().double().cpu()
    if not bool(torch.isfinite(actual).all()):
        return math.inf
    return float((actual - expected).norm() / expected.norm().clamp_min(1e-30))


def free_memory(device: torch.device) -> None:
    """Collect garbage and return cached blocks to the device, so the next try starts clean (a no-op on
    CPU, where nothing is cached and a collection only costs time)."""
    if device.type == "cuda":
        gc.collect()
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def reset_peak(device: torch.device) -> None:
    """Start a new peak-memory window (CUDA only)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_gib(device: torch.device) -> dict[str, float] | None:
    """Peak allocated and reserved device memory since the last ``reset_peak``, and what is allocated
    now (between steps: weights and optimizer states; the trainer frees gradients after each step), GiB;
    None on CPU."""
    if device.type != "cuda":
        return None
    return {
        "peak_allocated_gib": torch.cuda.max_memory_allocated(device) / 2**30,
        "peak_reserved_gib": torch.cuda.max_memory_reserved(device) / 2**30,
        "allocated_between_steps_gib": torch.cuda.memory_allocated(device) / 2**30,
    }


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is the device running out of memory (PyTorch's OOM error, or a CUDA/cuBLAS
    allocation failure raised as a plain RuntimeError)."""
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "CUBLAS_STATUS_ALLOC_FAILED" in text)
