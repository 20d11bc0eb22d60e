"""The GPU suite's exactness checks of the non-attention kernels (part of section 1, ``exactness``).

* Fused ops (``longctx.trainer.models.fused``): liger-kernel's RMSNorm, SwiGLU, RoPE and fused linear
  cross-entropy, forward and the inputs' gradients, in bf16 and float32 against PyTorch's ops in float64
  on the CPU (``fused.probe_errors``, the start-up probe's cases). Where liger-kernel is not installed
  or cannot run (a CPU), PyTorch's own ops are checked the same way and liger is reported unavailable.
* Compiled blocks (``DecoderLayer.compile_halves``): a decoder layer run by ``torch.compile`` (the
  suite's backend: Inductor on a GPU, ``aot_eager`` in the CPU smoke run) under bf16 autocast, forward
  and backward on a packed row of several documents, against the same layer in float64 on the CPU.

Tolerance: 2e-2 of the reference's largest magnitude in bf16 (1e-5 in float32), as for attention.
"""

from __future__ import annotations

import torch
from gpu_measure import Deadline, max_relative_error

from longctx.trainer.models import fused
from longctx.trainer.models.decoder import DecoderLayer, ModelConfig, RingAttention

TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
FUSED_TOLERANCE = fused.PROBE_TOLERANCE


def check_fused(settings, emit) -> list[str]:
    """Each fused op against float64; returns the failures."""
    failures = []
    ops, reason = fused.fused_ops("liger", settings.device)
    if reason is not None:
        emit({"check": "fused", "ops": "liger", "status": "unavailable", "reason": reason})
    for dtype in (torch.bfloat16, torch.float32):
        for name, error in fused.probe_errors(ops, settings.device, dtype).items():
            case = {
                "check": "fused",
                "ops": ops.name,
                "op": name,
                "dtype": str(dtype),
                "tolerance": FUSED_TOLERANCE,
            }
            if isinstance(error, str):
                failures.append(f"fused {ops.name} {name} {dtype}: {error}")
                emit({**case, "status": "FAIL", "reason": error})
                continue
            ok = error <= FUSED_TOLERANCE
            if not ok:
                failures.append(f"fused {ops.name} {name} {dtype}: {error:.1e}")
            emit({**case, "worst": error, "status": "ok" if ok else "FAIL"})
    return failures


def _layer_inputs(config: ModelConfig, tokens: int, device: torch.device):
    generator = torch.Generator().manual_seed(5)
    lengths = [tokens // 8, 1, tokens // 4, tokens - tokens // 8 - tokens // 4 - 1]
    positions = torch.cat([torch.arange(n) for n in lengths])
    segments = torch.cat([torch.full((n,), s) for s, n in enumerate(lengths)])
    x = torch.randn(1, tokens, config.hidden_size, generator=generator, dtype=torch.float64)
    dout = torch.randn(1, tokens, config.hidden_size, generator=generator, dtype=torch.float64)
    return x, dout, positions, segments


def _run_layer(layer: DecoderLayer, model_rope, x, dout, positions, segments, device, autocast: bool):
    """Forward and backward of one layer on one packed row: output, input gradient, weight gradients."""
    x = x.detach().to(device).requires_grad_()
    attention = RingAttention()
    cos, sin = model_rope(positions[None].to(device))
    row = attention.bind(torch.arange(positions.numel(), device=device), segments.to(device))
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
        out = layer(x, cos, sin, [row])
    out.backward(dout.to(device, out.dtype))
    grads = [p.grad for _, p in sorted(layer.named_parameters())]
    return [out.detach(), x.grad, *grads]


def check_compiled_layer(settings, emit) -> list[str]:
    """A compiled decoder layer under bf16 autocast against the eager layer in float64 on the CPU."""
    from longctx.trainer.models.decoder import Transformer

    config = ModelConfig.tiny(
        "llama",
        hidden_size=256,
        intermediate_size=688,
        num_attention_heads=8,
        num_key_value_heads=2,
        num_hidden_layers=1,
    )
    tokens = 512
    reference_model = Transformer(config).double()
    reference_model.init_weights(std=0.05, generator=torch.Generator().manual_seed(0))
    x, dout, positions, segments = _layer_inputs(config, tokens, settings.device)
    expected = _run_layer(
        reference_model.model.layers[0],
        reference_model.rope_tables,
        x,
        dout,
        positions,
        segments,
        torch.device("cpu"),
        autocast=False,
    )
    model = Transformer(config).to(settings.device)
    model.load_state_dict({name: value.float() for name, value in reference_model.state_dict().items()})
    layer = model.model.layers[0]
    layer.compile_halves(settings.compile_backend)
    try:
        actual = _run_layer(
            layer,
            model.rope_tables,
            x.float(),
            dout.float(),
            positions,
            segments,
            settings.device,
            autocast=True,
        )
    except Exception as exc:  # a compiler that fails here is a failure of this check, reported
        emit(
            {
                "check": "compiled layer",
                "backend": settings.compile_backend,
                "status": "FAIL",
                "reason": f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}",
            }
        )
        return [f"compiled layer ({settings.compile_backend}): {type(exc).__name__}"]
    names = ["out", "dx", *(name for name, _ in sorted(layer.named_parameters()))]
    errors = {name: max_relative_error(a, e) for name, a, e in zip(names, actual, expected, strict=True)}
    worst = max(errors.values())
    ok = worst <= TOLERANCE[torch.bfloat16]
    emit(
        {
            "check": "compiled layer",
            "backend": settings.compile_backend,
            "dtype": "bf16 autocast",
            "worst": worst,
            "max_error": errors,
            "tolerance": TOLERANCE[torch.bfloat16],
            "status": "ok" if ok else "FAIL",
        }
    )
    return [] if ok else [f"compiled layer ({settings.compile_backend}): {worst:.1e}"]


def run_kernel_exactness(settings, deadline: Deadline, emit) -> dict:
    """The fused ops and the compiled layer (skipped when the section's cap has passed)."""
    if not deadline.allows(0.0):
        emit({"check": "kernels", "status": "skipped", "reason": "section time cap"})
        return {"failures": [], "skipped": True}
    failures = check_fused(settings, emit)
    if deadline.allows(settings.compile_estimate_s / 2):
        failures += check_compiled_layer(settings, emit)
    else:
        emit({"check": "compiled layer", "status": "skipped", "reason": "section time cap"})
    return {"failures": failures, "skipped": False}
