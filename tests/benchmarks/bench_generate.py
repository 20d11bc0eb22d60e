"""Greedy decoding for the needle evaluation: our key/value cache against two baselines doing the
same work on the same model and prompt.

1. transformers' own cached greedy generation (``LlamaForCausalLM.generate``, sdpa attention), the
   peer library: the ratio shows what our decoding costs next to it;
2. recomputing the whole prefix for every new token with the model's training forward (what
   evaluation did before the cache): the ratio shows what the cache saves.

All three produce the same tokens (checked). One thread, so CPU time measures the work even when
other jobs compete for the cores; median and spread over repetitions, CPU and wall time both.

    .venv/bin/python tests/benchmarks/bench_generate.py [--prompt 2048] [--new 32] [--reps 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from longctx.trainer.evaluation.generate import greedy_generate
from longctx.trainer.models.interface import load_folder


def recompute_generate(model, prompt: list[int], new: int) -> list[int]:
    """The baseline without a cache: one full forward over prompt + generated tokens per token."""
    ids, out = list(prompt), []
    with torch.no_grad():
        for _ in range(new):
            positions = torch.arange(len(ids))
            hidden = model(
                torch.tensor(ids), positions, positions, torch.zeros_like(positions), rope_seq_len=len(ids)
            )
            out.append(int(model.logits(hidden[-1:]).argmax(-1)))
            ids.append(out[-1])
    return out


def measure(run: Callable[[], list[int]], reps: int) -> tuple[list[float], list[float], list[int]]:
    """CPU and wall seconds of each repetition (after a warm-up), and the tokens produced."""
    tokens = run()
    cpu, wall = [], []
    for _ in range(reps):
        started, started_cpu = time.perf_counter(), time.process_time()
        run()
        wall.append(time.perf_counter() - started)
        cpu.append(time.process_time() - started_cpu)
    return cpu, wall, tokens


def describe(values: list[float]) -> str:
    return f"{statistics.median(values):7.3f} s (spread {min(values):.3f}-{max(values):.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prompt", type=int, default=2048, help="prompt tokens")
    parser.add_argument("--new", type=int, default=32, help="generated tokens")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=4096,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 8 // 3,
        num_hidden_layers=args.layers,
        num_attention_heads=args.hidden // 32,
        num_key_value_heads=2,
        max_position_embeddings=args.prompt + args.new,
        attn_implementation="sdpa",
    )
    with tempfile.TemporaryDirectory() as tmp:
        theirs = LlamaForCausalLM(config).eval()
        theirs.save_pretrained(Path(tmp), safe_serialization=True)
        ours = load_folder(tmp)
    prompt = torch.randint(
        0, config.vocab_size, (args.prompt,), generator=torch.Generator().manual_seed(1)
    ).tolist()

    def transformers_generate() -> list[int]:
        with torch.no_grad():
            out = theirs.generate(
                torch.tensor([prompt]),
                max_new_tokens=args.new,
                min_new_tokens=args.new,
                do_sample=False,
                pad_token_id=0,
                eos_token_id=None,
            )
        return out[0, args.prompt :].tolist()

    runs = {
        "longctx, key/value cache": lambda: greedy_generate(ours, prompt, args.new, torch.device("cpu")),
        "transformers generate (sdpa, cache)": transformers_generate,
        "longctx, recompute the prefix": lambda: recompute_generate(ours, prompt, args.new),
    }
    print(
        f"load: {os.getloadavg()[0]:.1f} (1-min average); 1 thread; model hidden {args.hidden}, "
        f"{args.layers} layers; prompt {args.prompt} tokens, {args.new} new; {args.reps} repetitions"
    )
    results = {name: measure(run, args.reps) for name, run in runs.items()}
    reference = results["transformers generate (sdpa, cache)"][2]
    for name, (cpu, wall, tokens) in results.items():
        same = "same tokens" if tokens == reference else "DIFFERENT TOKENS"
        print(f"{name:38} cpu {describe(cpu)}  wall {describe(wall)}  {same}")
    ours_cpu, ours_wall = (statistics.median(x) for x in results["longctx, key/value cache"][:2])
    for name in list(runs)[1:]:
        cpu, wall = (statistics.median(x) for x in results[name][:2])
        print(f"longctx cached / {name}: cpu {ours_cpu / cpu:.2f}x, wall {ours_wall / wall:.2f}x")


if __name__ == "__main__":
    main()
