r"""``longctx train`` itself on one GPU: the command users run, not the suite's replica of its step.

``tests/benchmarks/gpu_suite.py`` measures the trainer's model and step; this checks the rest of the
CUDA path of ``longctx train``: the data loader and its checks, bf16 autocast, DCP checkpoints written and
read on the device, resume, the export, and the memory refusal before anything is built.

    python tests/benchmarks/gpu_train_cli.py prepare [--demo runs/demo] [--dest runs/gpu_carry]   # here
    python tests/benchmarks/gpu_train_cli.py check [--dest runs/gpu_carry]                        # there

``prepare`` takes a finished ``longctx demo`` run (its 2K shards and tokenizer) and writes a one-GPU config
beside a copy of them (``cp: 1``; the demo trains on 2 CPU ranks). ``check``, on the GPU machine, with
``$OUT`` for its logs:

1. trains 12 steps (checkpoints at 6 and 12);
2. copies that run without what followed its step-6 checkpoint and resumes it to step 12: the losses of
   every step must equal the uninterrupted run's (relative 1e-3);
3. asks for a 7B-shaped model at one process: refused with exit status 2 and a "does not fit" line
   naming the device, with no output folder created (its states alone exceed an H200's memory);
4. opens the export (``final/``) with transformers on the GPU and on the CPU: the same logits (1e-3).

Exit status 0 when every check passed. On this workplace's lent H200 the call is ``run`` with
``carry=[".whl", "runs/gpu_carry"]`` and the command (after ``make gpu-wheels``)::

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl && export PYTHONPATH=/tmp/site || exit; python3 tests/benchmarks/gpu_train_cli.py check
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CONFIG = """\
# longctx train on one GPU: the demo's model and 2K shards, cp 1, bf16 autocast (precision: auto)
output: {dest}/run
context: {{original: 512, target: 2048}}
tokenizer: {{path: {dest}/tokenizer.json}}
train:
  shards: {dest}/shards/seq2048
  model:
    tiny: {tiny}
    rope_scaling: {{rope_type: yarn, factor: 4.0, original_max_position_embeddings: 512}}
  steps: 12
  holdout_rows: 8
  cp: 1
  optim: {{lr: 0.003, warmup_steps: 2, min_lr_ratio: 0.1}}
  checkpoint: {{every: 6, keep: 2}}
  log: {{every: 1}}
"""
DEMO_MODEL = (
    "{hidden_size: 64, intermediate_size: 172, num_hidden_layers: 2, "
    "num_attention_heads: 4, num_key_value_heads: 2}"
)
SEVEN_B = (
    "{hidden_size: 4096, intermediate_size: 14336, num_hidden_layers: 32, "
    "num_attention_heads: 32, num_key_value_heads: 8}"
)


def prepare(demo: Path, dest: Path) -> None:
    """Copy the demo's 2K shards and tokenizer to ``dest`` and write the one-GPU configs there."""
    shards = demo / "shards" / "seq2048"
    if not (shards.is_dir() and (demo / "tokenizer.json").is_file()):
        sys.exit(f"error: {demo} holds no finished demo run (run `longctx demo --output {demo}` first)")
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(shards, dest / "shards" / "seq2048")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy2(demo / name, dest / name)
    (dest / "train.yaml").write_text(CONFIG.format(dest=dest, tiny=DEMO_MODEL))
    (dest / "train_7b.yaml").write_text(CONFIG.format(dest=dest, tiny=SEVEN_B))
    print(f"prepared {dest}: carry it with the wheels")


def train(config: Path, output: Path, logs: Path) -> subprocess.CompletedProcess:
    """``longctx train --config config --output output``, its output kept under ``logs``."""
    run = subprocess.run(
        [sys.executable, "-m", "longctx.cli", "train", "--config", str(config), "--output", str(output)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    (logs / f"{output.name}.log").write_text(run.stdout[-20000:] + run.stderr[-20000:])
    last = (run.stderr or run.stdout).strip().splitlines()
    print(
        f"train --output {output.name}: exit {run.returncode}; {last[-1][:400] if last else ''}", flush=True
    )
    return run


def step_losses(output: Path) -> dict[int, float]:
    rows = [
        json.loads(line) for line in (output / "train" / "metrics.jsonl").read_text().splitlines() if line
    ]
    return {row["step"]: row["loss"] for row in rows if "loss" in row}


def check(dest: Path) -> bool:
    """The four checks of the module docstring; prints one line per finding."""
    import torch
    from transformers import AutoModelForCausalLM

    logs = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="gpu_train_cli_"))
    logs.mkdir(parents=True, exist_ok=True)
    ok = True
    with tempfile.TemporaryDirectory(prefix="gpu_train_cli_") as tmp:
        straight, resumed, refused = Path(tmp) / "straight", Path(tmp) / "resumed", Path(tmp) / "refused"
        ok &= train(dest / "train.yaml", straight, logs).returncode == 0
        shutil.copytree(straight, resumed)
        shutil.rmtree(resumed / "train" / "checkpoints" / "step_0000012")
        shutil.rmtree(resumed / "train" / "final")
        ok &= train(dest / "train.yaml", resumed, logs).returncode == 0
        a, b = step_losses(straight), step_losses(resumed)
        diff = max(abs(a[s] - b[s]) / abs(a[s]) for s in a if s in b)
        print(f"losses, uninterrupted: {[round(a[s], 4) for s in sorted(a)]}")
        print(
            f"losses, resumed at 6:  {[round(b[s], 4) for s in sorted(b)]}; largest "
            f"relative difference {diff:.1e}"
        )
        ok &= len(a) == len(b) == 12 and diff < 1e-3
        for name in (straight, resumed):
            shutil.copy2(name / "train" / "metrics.jsonl", logs / f"{name.name}-metrics.jsonl")

        big = train(dest / "train_7b.yaml", refused, logs)
        ok &= big.returncode == 2 and "does not fit" in big.stderr + big.stdout and not refused.exists()

        final = straight / "train" / "final"
        ids = torch.randint(0, 4000, (1, 512), generator=torch.Generator().manual_seed(0))
        device = "cuda" if torch.cuda.is_available() else "cpu"
        on_cpu = AutoModelForCausalLM.from_pretrained(final, dtype=torch.float32)
        on_device = AutoModelForCausalLM.from_pretrained(final, dtype=torch.float32).to(device)
        with torch.no_grad():
            expected, actual = on_cpu(ids).logits, on_device(ids.to(device)).logits.cpu()
        error = float((expected - actual).abs().max() / expected.abs().max())
        print(
            f"export: {sorted(p.name for p in final.iterdir())}; logits on {device} vs "
            f"CPU, relative error {error:.1e}"
        )
        ok &= error < 1e-3
    print("longctx train on the GPU:", "PASSED" if ok else "FAILED")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("mode", choices=("prepare", "check"))
    parser.add_argument("--demo", type=Path, default=Path("runs/demo"), help="a finished longctx demo run")
    parser.add_argument("--dest", type=Path, default=Path("runs/gpu_carry"), help="the folder to carry")
    args = parser.parse_args()
    if args.mode == "prepare":
        prepare(args.demo, args.dest)
        return 0
    return 0 if check(args.dest) else 1


if __name__ == "__main__":
    sys.exit(main())
