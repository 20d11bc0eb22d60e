"""One-GPU training check for the trainer: a ~0.5B-parameter Llama-family model with random
weights, bf16 autocast, activation checkpointing, packed 32K windows of several documents, ring
attention as a local call (P = 1). Prints tokens/s and the MFU estimate the trainer logs.

    python tests/benchmarks/gpu_train_check.py              # on a GPU: 32K tokens, ~0.5B parameters
    python tests/benchmarks/gpu_train_check.py --tiny       # CPU smoke run of the same code path

Exits 2 without CUDA unless --tiny is given.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from longctx.trainer.flops import matmul_param_count, training_flops
from longctx.trainer.metrics import peak_flops
from longctx.trainer.model import ModelConfig, RingAttention, Transformer
from longctx.trainer.rope import RopeConfig


def packed_row(seq_len: int, vocab: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Random tokens in documents of random lengths (a long one and several short ones)."""
    lengths, left = [], seq_len
    while left > 0:
        n = min(left, int(torch.randint(seq_len // 16, seq_len // 2, (1,), generator=generator)))
        lengths.append(n)
        left -= n
    return {
        "input_ids": torch.randint(0, vocab, (seq_len,), generator=generator),
        "position_ids": torch.cat([torch.arange(n) for n in lengths]),
        "segment_ids": torch.cat([torch.full((n,), i) for i, n in enumerate(lengths)]),
        "lengths": torch.tensor(lengths),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="small sizes on CPU (checks the code path only)")
    parser.add_argument("--seq-len", type=int, default=32768)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    if not cuda and not args.tiny:
        print("no CUDA device; pass --tiny for a CPU smoke run", file=sys.stderr)
        return 2
    device = torch.device("cuda" if cuda else "cpu")
    if args.tiny:
        seq_len, dims = 512, dict(hidden_size=64, intermediate_size=172, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, vocab_size=1000)
    else:
        seq_len, dims = args.seq_len, dict(hidden_size=1536, intermediate_size=4096, num_hidden_layers=16,
                                           num_attention_heads=12, num_key_value_heads=2, vocab_size=32000)
    head_dim = dims["hidden_size"] // dims["num_attention_heads"]
    rope = RopeConfig(head_dim=head_dim, theta=500000.0, max_position_embeddings=seq_len, rope_type="yarn",
                      factor=4.0, original_max_position_embeddings=seq_len // 4)
    config = ModelConfig.tiny(rope=rope, **dims)
    model = Transformer(config, attention=RingAttention(None), activation_checkpointing=True).to(device)
    model.init_weights(generator=torch.Generator().manual_seed(0))
    params = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, betas=(0.9, 0.95), weight_decay=0.1)
    generator = torch.Generator().manual_seed(0)
    print(f"device {torch.cuda.get_device_name() if cuda else 'cpu'}; {params / 1e9:.3f}B parameters "
          f"({matmul_param_count(config.shape) / 1e9:.3f}B in matmuls); seq_len {seq_len}; bf16 autocast {cuda}")
    times, losses = [], []
    for step in range(args.steps):
        row = packed_row(seq_len, config.vocab_size, generator)
        ids = row["input_ids"].to(device)
        labels = torch.cat([ids[1:], ids.new_full((1,), -100)])
        boundaries = torch.cumsum(row["lengths"], 0) - 1
        labels[boundaries.to(device)] = -100  # the last token of each document predicts nothing
        if cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cuda):
            hidden = model(ids, row["position_ids"].to(device), torch.arange(seq_len, device=device),
                           row["segment_ids"].to(device), rope_seq_len=seq_len)
            loss = model.cross_entropy_sum(hidden, labels) / (labels != -100).sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        losses.append(float(loss.detach()))
        pairs = int((row["lengths"] * (row["lengths"] + 1) // 2).sum())
        flops = training_flops(config.shape, seq_len, pairs)
        peak = peak_flops(device, None)
        mfu = f"{flops / times[-1] / peak:.1%}" if peak else "n/a"
        print(f"step {step + 1}: loss {losses[-1]:.4f}, {times[-1]:.3f} s, {seq_len / times[-1]:,.0f} tokens/s, "
              f"{flops / times[-1] / 1e12:.1f} TFLOP/s, MFU {mfu}", flush=True)
    steady = times[1:] or times
    print(f"steady state (steps 2..{args.steps}): {seq_len * len(steady) / sum(steady):,.0f} tokens/s")
    if cuda:
        print(f"peak memory {torch.cuda.max_memory_allocated() / 2**30:.1f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
