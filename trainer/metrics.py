"""Training metrics: JSON lines per step, FLOPs and MFU estimates, loss by position bucket."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from trainer.model import ModelConfig, Transformer

# Dense bf16 peak per device, FLOP/s, by a substring of torch.cuda.get_device_name().
PEAK_BF16_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 125e12, "4090": 165e12}


def peak_flops(device: torch.device, configured_tflops: float | None) -> float | None:
    """Peak FLOP/s for MFU: the configured value, else the device's dense bf16 peak; None on CPU."""
    if configured_tflops is not None:
        return configured_tflops * 1e12
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for key, flops in PEAK_BF16_FLOPS.items() if key in name), None)


def matmul_params(config: ModelConfig) -> int:
    """Parameters that take part in a matmul per token (embeddings lookups excluded, LM head included)."""
    h, d = config.hidden_size, config.head_dim
    attn = h * d * (config.num_attention_heads * 2 + config.num_key_value_heads * 2)
    mlp = 3 * h * config.intermediate_size
    return config.num_hidden_layers * (attn + mlp) + h * config.vocab_size


def training_flops(config: ModelConfig, tokens: int, causal_pairs: int) -> float:
    """FLOPs of forward plus backward: 6 per matmul parameter per token, plus attention scores and
    values over the (query, key) pairs that document-masked causal attention really computes
    (``causal_pairs`` = sum over segments of ``len * (len + 1) / 2``): 4 FLOPs per pair per head
    dimension in the forward, 3x that with the backward."""
    attention = 12 * config.num_hidden_layers * config.num_attention_heads * config.head_dim * causal_pairs
    return 6.0 * matmul_params(config) * tokens + attention


@torch.no_grad()
def token_losses(model: Transformer, hidden: torch.Tensor, labels: torch.Tensor, chunk: int = 8192) -> torch.Tensor:
    """Per-token cross-entropy (float32, 0 where ``labels`` is -100), computed chunk by chunk."""
    flat_h, flat_l = hidden.reshape(-1, hidden.shape[-1]), labels.reshape(-1)
    out = torch.empty(flat_l.shape, dtype=torch.float32, device=hidden.device)
    for start in range(0, flat_l.numel(), chunk):
        logits = model.logits(flat_h[start : start + chunk]).float()
        out[start : start + chunk] = F.cross_entropy(logits, flat_l[start : start + chunk], reduction="none", ignore_index=-100)
    return out.view(labels.shape)


class MetricsWriter:
    """Appends one JSON object per line to ``path`` (rank 0 only). On resume, lines of steps after
    the resumed step (written by the killed run after its last checkpoint) are dropped first."""

    def __init__(self, path: Path, resume_step: int) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists():
            kept = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line).get("step", 0) <= resume_step]
            tmp = path.with_name(path.name + ".tmp")
            tmp.write_text("".join(line + "\n" for line in kept))
            os.replace(tmp, path)

    def write(self, record: dict[str, Any]) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
