"""Training metrics: the device peak for MFU and per-token losses (records go through
``longctx.trainer.tracking``).

The FLOPs an MFU figure divides by come from ``longctx.trainer.planning.flops``, the model ``longctx plan``
uses too.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from longctx.trainer.models.decoder import Transformer

# Dense bf16 peak per device, FLOP/s, by a substring of torch.cuda.get_device_name().
PEAK_BF16_FLOPS = {
    "H200": 989e12,
    "H100": 989e12,
    "A100": 312e12,
    "L40S": 362e12,
    "A10G": 125e12,
    "4090": 165e12,
}


def peak_flops(device: torch.device, configured_tflops: float | None) -> float | None:
    """Peak FLOP/s for MFU: the configured value, else the device's dense bf16 peak; None on CPU."""
    if configured_tflops is not None:
        return configured_tflops * 1e12
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for key, flops in PEAK_BF16_FLOPS.items() if key in name), None)


@torch.no_grad()
def token_losses(
    model: Transformer, hidden: torch.Tensor, labels: torch.Tensor, chunk: int = 8192
) -> torch.Tensor:
    """Per-token cross-entropy (float32, 0 where ``labels`` is -100), computed chunk by chunk."""
    flat_h, flat_l = hidden.reshape(-1, hidden.shape[-1]), labels.reshape(-1)
    out = torch.empty(flat_l.shape, dtype=torch.float32, device=hidden.device)
    for start in range(0, flat_l.numel(), chunk):
        logits = model.logits(flat_h[start : start + chunk]).float()
        out[start : start + chunk] = F.cross_entropy(
            logits, flat_l[start : start + chunk], reduction="none", ignore_index=-100
        )
    return out.view(labels.shape)
