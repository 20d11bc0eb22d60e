"""The trainer against the bare work it does, in one run, on CPU or on one GPU (``--device cuda``):

1. **Step cost.** CPU seconds (and wall seconds) per optimizer step of ``longctx train`` (in this
   process, one rank, through ``longctx.jobs.train``) against a minimal ``transformers`` training loop
   on the same model (a random Llama of the demo's shape, saved by transformers), the same packed
   rows in the same order (2048-token windows of several documents; transformers masks packed
   documents from ``position_ids``) and the same optimizer. The trainer's per-step cost is the
   difference between a long and a short run divided by the difference in steps, so its start-up
   (data checks, model build, final checkpoint and export) cancels; it includes data loading,
   statistics and the default logging (loss by position every 10 steps). One thread per process.
   Both loops must give the same losses (relative 1e-3 in fp32; in bf16 3e-2 over the first 20 steps,
   since rounding makes two correct loops drift apart as they train) or the script stops: the same work. On a
   GPU both run in bf16 autocast over fp32 weights (the trainer's ``precision: auto``), with the GPU
   synchronized before each clock is read; the default GPU model is a 12-layer Llama (hidden 1024, vocabulary
   32000) on 8192-token windows (``--shape``, ``--seq-len``). transformers masks the packed documents with an
   explicit mask (SDPA's masked kernel), longctx with its document-masked varlen kernel: the ratio is what a
   user switching loops gets, kernels included.
2. **Implementations.** The same step cost (``--implementations``) of ``longctx train`` on the same
   Llama checkpoint and rows with ``train.model.implementation: longctx`` (the own decoder) and
   ``transformers`` (transformers' ``LlamaForCausalLM`` with ring attention through its attention
   interface), alternated in each repetition; both must give the same losses (relative 1e-4 in fp32).
   ``auto`` takes the own decoder for the families it reads when it is the faster one.
3. **Loading memory.** Peak host memory (resident set, and its private part) per rank while 4 gloo
   ranks load a checkpoint of about 100M parameters into their FSDP2 shards, the way ``longctx train``
   does (meta device, ``fully_shard``, each rank reading its safetensors slices), against a naive load
   (every rank builds the whole model and reads every tensor, then shards), against the checkpoint's
   size and against the rank's shard.

Several repetitions; medians and spreads (min-max); ratios against the baselines measured in the same run.

    .venv/bin/python tests/benchmarks/bench_train.py [--repeats 5] [--load-repeats 2] [--skip-steps]
        [--skip-memory] [--implementations]

On a GPU machine without datatrove (which packing needs), pack the windows here and carry them::

    # here
    .venv/bin/python tests/benchmarks/bench_train.py --seq-len 8192 --prepare-windows runs/bench_windows
    # there
    python3 tests/benchmarks/bench_train.py --device cuda --seq-len 8192 --windows runs/bench_windows
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

DEMO_SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 172,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 4096,
}
GPU_SHAPE = {
    "hidden_size": 1024,
    "intermediate_size": 2816,
    "num_hidden_layers": 12,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
}
SHAPES = {"demo": DEMO_SHAPE, "gpu": GPU_SHAPE}
COMPARED_BF16_STEPS = 20
"""Steps whose losses must agree in bf16 (3e-2): over 60 steps the two loops drifted 7e-2 apart on an H200."""
LOAD_SHAPE = {
    "hidden_size": 768,
    "intermediate_size": 2048,
    "num_hidden_layers": 8,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
    "vocab_size": 32000,
}
OPTIM = {
    "lr": 1e-3,
    "warmup_steps": 0,
    "min_lr_ratio": 1.0,
    "betas": [0.9, 0.95],
    "eps": 1e-8,
    "weight_decay": 0.1,
}


def save_llama(folder: Path, shape: dict, seed: int = 0, max_positions: int = 512) -> Path:
    """A random ``LlamaForCausalLM`` of ``shape`` saved by transformers (float32 safetensors)."""
    import transformers

    config = transformers.LlamaConfig(
        **shape, max_position_embeddings=max_positions, tie_word_embeddings=False
    )
    torch.manual_seed(seed)
    transformers.LlamaForCausalLM(config).save_pretrained(folder, max_shard_size="10GB")
    return folder


def make_windows(root: Path, seq_len: int) -> Path:
    """A curated synthetic corpus packed into ``seq_len``-token windows (the packer's own pipeline)."""
    from longctx import jobs
    from tests.packer.test_pack_helpers import make_config, make_run

    make_run(root)
    jobs.pack(
        make_config(
            root,
            seq_lens=[seq_len],
            shard_tokens=max(65536, 8 * seq_len),
            pool_tokens=max(65536, 8 * seq_len),
        )
    )
    return root


def train_config(
    root: Path, output: Path, model: Path, steps: int, seq_len: int, device: str, implementation: str = "auto"
) -> dict:
    return {
        "output": str(output),
        "context": {"original": 512, "target": seq_len},
        "tokenizer": {"path": str(root / "tokenizer.json")},
        "train": {
            "shards": str(root / "shards" / f"seq{seq_len}"),
            "model": {"hf_path": str(model), "implementation": implementation},
            "steps": steps,
            "precision": "bf16" if device == "cuda" else "fp32",
            "optim": dict(OPTIM),
            "coverage": {"required_position": 1000, "allow_short": True},
            "checkpoint": {"every": 10_000, "keep": 1},
        },
    }


def sync(device: str) -> None:
    """Wait for the GPU's queued work, so that a clock read after it counts that work."""
    if device == "cuda":
        torch.cuda.synchronize()


def trainer_run(
    root: Path,
    model: Path,
    steps: int,
    scratch: Path,
    seq_len: int,
    device: str,
    implementation: str = "auto",
) -> tuple[float, float, list[float]]:
    """CPU and wall seconds of one whole ``longctx train`` run of ``steps`` steps, and its losses."""
    from longctx import jobs
    from longctx.config import parse_config

    output = scratch / f"run{steps}"
    shutil.rmtree(output, ignore_errors=True)
    cfg = parse_config(train_config(root, output, model, steps, seq_len, device, implementation))
    sync(device)
    wall, cpu = time.perf_counter(), time.process_time()
    result = jobs.train(cfg, progress=False)
    sync(device)
    return time.process_time() - cpu, time.perf_counter() - wall, result.losses


def packed_rows(root: Path, count: int, seq_len: int) -> list[dict[str, torch.Tensor]]:
    """The first ``count`` rows ``longctx train`` reads (seed 0, one row per step), in order."""
    from longctx.packer.dataset import PackedDataset

    dataset = PackedDataset(root / "shards" / f"seq{seq_len}", tokenizer=root / "tokenizer.json", seed=0)
    rows, epoch = [], 0
    while len(rows) < count:
        rows += [dataset[int(i)] for i in dataset.order(epoch)]
        epoch += 1
    return rows[:count]


def transformers_steps(
    model_dir: Path, rows: list[dict[str, torch.Tensor]], device: str
) -> tuple[float, float, list[float]]:
    """CPU and wall seconds of a minimal transformers loop over ``rows[1:]`` (one row per step; ``rows[0]``
    is an untimed warm-up step), and the losses of every step; on a GPU in bf16 autocast, each row
    copied to the GPU in the step as the trainer does."""
    import transformers

    model = (
        transformers.AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32, attn_implementation="sdpa"
        )
        .to(device)
        .train()
    )
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": OPTIM["weight_decay"]}, {"params": rest, "weight_decay": 0.0}],
        lr=OPTIM["lr"],
        betas=tuple(OPTIM["betas"]),
        eps=OPTIM["eps"],
    )

    def step(row: dict[str, torch.Tensor]) -> float:
        labels = torch.where(row["loss_mask"], row["labels"], -100).to(device)
        with torch.autocast(device, dtype=torch.bfloat16, enabled=device == "cuda"):
            logits = model(
                input_ids=row["input_ids"][None].to(device),
                position_ids=row["position_ids"][None].to(device),
                use_cache=False,
            ).logits[0]
        loss = (
            F.cross_entropy(logits.float(), labels, ignore_index=-100, reduction="sum")
            / row["loss_mask"].sum()
        )
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())

    losses = [step(rows[0])]  # warm-up
    sync(device)
    wall, cpu = time.perf_counter(), time.process_time()
    for row in rows[1:]:
        losses.append(step(row))
    sync(device)
    return time.process_time() - cpu, time.perf_counter() - wall, losses


def spread(values: list[float], digits: int = 4) -> str:
    """Median (min-max)."""
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def bench_steps(args: argparse.Namespace, scratch: Path) -> None:
    seq_len, device = args.seq_len, args.device
    root = args.windows or make_windows(scratch / "data", seq_len)
    if not (root / "shards" / f"seq{seq_len}").is_dir():
        raise SystemExit(
            f"error: {root} holds no {seq_len}-token windows (shards/seq{seq_len}); "
            f"make them with --seq-len {seq_len} --prepare-windows {root}"
        )
    shape = SHAPES[args.shape or ("gpu" if device == "cuda" else "demo")]
    model = save_llama(scratch / "llama", shape)
    short, long = args.short_steps, args.short_steps + args.extra_steps
    rows = packed_rows(root, args.extra_steps + 1, seq_len)
    ours_cpu, ours_wall, theirs_cpu, theirs_wall, loss_gap = [], [], [], [], 0.0
    if device == "cuda":  # the process's first run pays CUDA's start (context, kernels, allocator): untimed
        trainer_run(root, model, short, scratch, seq_len, device)
    for _ in range(args.repeats):
        cpu_short, wall_short, _ = trainer_run(root, model, short, scratch, seq_len, device)
        cpu_long, wall_long, ours = trainer_run(root, model, long, scratch, seq_len, device)
        ours_cpu.append((cpu_long - cpu_short) / args.extra_steps)
        ours_wall.append((wall_long - wall_short) / args.extra_steps)
        cpu, wall, theirs = transformers_steps(model, rows, device)
        theirs_cpu.append(cpu / args.extra_steps)
        theirs_wall.append(wall / args.extra_steps)
        # the same work: the same rows through the same model and optimizer give the same losses
        # bf16 rounding makes two correct loops drift apart as they train: compare their first steps
        compared = list(zip(ours, theirs))[: COMPARED_BF16_STEPS if device == "cuda" else None]
        loss_gap = max(loss_gap, max(abs(a - b) / abs(b) for a, b in compared))
    if loss_gap > (3e-2 if device == "cuda" else 1e-3):
        raise SystemExit(
            f"the two loops do not train alike (largest relative loss difference {loss_gap:.2e}): "
            "the comparison would be meaningless"
        )
    print(
        "per repetition, wall s/step, longctx | transformers: "
        + "; ".join(f"{a:.4f} | {b:.4f}" for a, b in zip(ours_wall, theirs_wall))
    )
    ratio_cpu = [a / b for a, b in zip(ours_cpu, theirs_cpu)]
    ratio_wall = [a / b for a, b in zip(ours_wall, theirs_wall)]
    where = torch.cuda.get_device_name() + ", bf16 autocast" if device == "cuda" else "CPU, fp32"
    print(
        f"\n== step cost: Llama {shape}, {seq_len}-token packed windows, one row per step, "
        f"{where}, {torch.get_num_threads()} thread(s); {args.repeats} repetitions, median (min-max)"
    )
    print(f"{'':32}{'CPU s/step':>28}{'wall s/step':>28}")
    print(f"{'longctx train':32}{spread(ours_cpu):>28}{spread(ours_wall):>28}")
    print(f"{'minimal transformers loop':32}{spread(theirs_cpu):>28}{spread(theirs_wall):>28}")
    print(f"{'ratio (longctx / transformers)':32}{spread(ratio_cpu):>28}{spread(ratio_wall):>28}")
    print(
        f"same work: losses of the first {len(compared)} steps agree to {loss_gap:.1e} "
        "(relative) in every repetition"
    )


def bench_implementations(args: argparse.Namespace, scratch: Path) -> None:
    """Per-step cost of the own decoder and of transformers' Llama with ring attention, in one run."""
    seq_len, device = args.seq_len, args.device
    root = args.windows or make_windows(scratch / "data", seq_len)
    shape = SHAPES[args.shape or ("gpu" if device == "cuda" else "demo")]
    model = save_llama(scratch / "llama", shape)
    short, long = args.short_steps, args.short_steps + args.extra_steps
    names = ("longctx", "transformers")
    cpu: dict[str, list[float]] = {name: [] for name in names}
    wall: dict[str, list[float]] = {name: [] for name in names}
    loss_gap = 0.0
    if device == "cuda":  # the process's first run pays CUDA's start: untimed
        trainer_run(root, model, short, scratch, seq_len, device)
    for _ in range(args.repeats):
        losses = {}
        for name in names:
            cpu_short, wall_short, _ = trainer_run(root, model, short, scratch, seq_len, device, name)
            cpu_long, wall_long, losses[name] = trainer_run(root, model, long, scratch, seq_len, device, name)
            cpu[name].append((cpu_long - cpu_short) / args.extra_steps)
            wall[name].append((wall_long - wall_short) / args.extra_steps)
        compared = list(zip(*losses.values()))[: COMPARED_BF16_STEPS if device == "cuda" else None]
        loss_gap = max(loss_gap, max(abs(a - b) / abs(b) for a, b in compared))
    if loss_gap > (3e-2 if device == "cuda" else 1e-4):
        raise SystemExit(
            f"the two implementations do not train alike (largest relative loss gap {loss_gap:.2e})"
        )
    where = torch.cuda.get_device_name() + ", bf16 autocast" if device == "cuda" else "CPU, fp32"
    print(
        f"\n== implementations: Llama {shape}, {seq_len}-token packed windows, one row per step, {where}, "
        f"{torch.get_num_threads()} thread(s); {args.repeats} repetitions, median (min-max)"
    )
    print(f"{'':36}{'CPU s/step':>28}{'wall s/step':>28}")
    for name in names:
        print(f"{'implementation ' + name:36}{spread(cpu[name]):>28}{spread(wall[name]):>28}")
    ratio_cpu = [a / b for a, b in zip(cpu["transformers"], cpu["longctx"])]
    ratio_wall = [a / b for a, b in zip(wall["transformers"], wall["longctx"])]
    print(f"{'ratio (transformers / longctx)':36}{spread(ratio_cpu):>28}{spread(ratio_wall):>28}")
    print(
        f"same work: losses of {len(compared)} steps agree to {loss_gap:.1e} (relative) in every repetition"
    )


# Loading memory ---------------------------------------------------------------------------------------------


def memory_mib() -> dict[str, float]:
    """This process's resident set (``VmRSS``), its peak since the last reset (``VmHWM``) and its
    anonymous and file-backed parts, MiB."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            fields[key] = int(value.split()[0]) / 1024
    return fields


class AnonPeak:
    """The largest ``RssAnon`` (private memory, without the file pages ``VmHWM`` also counts) seen by a
    thread sampling ``/proc/self/status`` every ``interval`` seconds while the block runs, MiB; a sampled
    peak, so a lower bound of the true one."""

    def __init__(self, interval: float = 0.002) -> None:
        import threading

        self.interval, self.peak = interval, 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, memory_mib()["RssAnon"])
            self._stop.wait(self.interval)

    def __enter__(self) -> AnonPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, memory_mib()["RssAnon"])


def reset_peak() -> None:
    """Reset ``VmHWM`` to the current resident set (Linux: ``5`` into ``/proc/self/clear_refs``)."""
    Path("/proc/self/clear_refs").write_text("5")


def load_worker(mode: str, checkpoint: Path, out: Path) -> None:
    """One rank of the loading benchmark (under torchrun): load, then report memory as JSON."""
    import gc

    import torch.distributed as dist

    from longctx.trainer.build import build_model
    from longctx.trainer.models.decoder import ModelConfig, RingAttention, Transformer
    from longctx.trainer.models.files import config_json
    from longctx.trainer.models.weights import load_weights
    from longctx.trainer.parallel.sharding import local_bytes, shard_model
    from longctx.trainer.parallel.state import init_parallel

    torch.set_num_threads(1)
    state = init_parallel(cp=1, timeout_s=600)
    config = ModelConfig.from_hf(config_json(checkpoint))
    dist.barrier()
    gc.collect()
    reset_peak()
    before = memory_mib()
    started = time.perf_counter()
    with AnonPeak() as anon:
        if mode == "slices":
            model = build_model(config, state, activation_checkpointing="none", bf16=False).model
            load_weights(model, checkpoint)
        else:  # naive: the whole model on every rank, every tensor read, then sharded
            model = Transformer(config, attention=RingAttention(state.cp_group))
            load_weights(model, checkpoint)
            shard_model(model, state, bf16=False)
    seconds = time.perf_counter() - started
    gc.collect()
    after = memory_mib()
    report = {
        "peak_mib": after["VmHWM"] - before["VmRSS"],
        "anon_peak_mib": anon.peak - before["RssAnon"],
        "anon_mib": after["RssAnon"] - before["RssAnon"],
        "file_mib": after["RssFile"] - before["RssFile"],
        "local_mib": local_bytes(model.parameters()) / 2**20,
        "seconds": seconds,
    }
    (out / f"{mode}_rank{state.rank}.json").write_text(json.dumps(report))
    dist.destroy_process_group()


def bench_loading(args: argparse.Namespace, scratch: Path) -> None:
    checkpoint = save_llama(scratch / "llama_100m", LOAD_SHAPE)
    size_mib = sum(p.stat().st_size for p in checkpoint.glob("*.safetensors")) / 2**20
    from safetensors import safe_open

    with safe_open(checkpoint / "model.safetensors", "pt") as handle:
        params = sum(torch.Size(handle.get_slice(k).get_shape()).numel() for k in handle.keys())  # noqa: SIM118 - safe_open is not iterable
    results: dict[str, list[list[dict]]] = {"slices": [], "naive": []}
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
    }
    for _ in range(args.load_repeats):
        for mode in ("slices", "naive"):
            out = scratch / f"load_{mode}"
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir()
            # the agent's logs in the scratch folder: by default torchrun leaves a torchelastic_* folder
            # in /tmp
            torchrun = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc-per-node",
                "4",
                "--log-dir",
                str(scratch / "torchrun_logs"),
            ]
            subprocess.run(
                torchrun + [__file__, "--load-worker", mode, str(checkpoint), str(out)],
                check=True,
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            results[mode].append([json.loads((out / f"{mode}_rank{r}.json").read_text()) for r in range(4)])
    print(
        f"\n== loading a {params / 1e6:.1f}M-parameter checkpoint ({size_mib:.0f} MiB, float32) into 4 gloo "
        f"ranks; {args.load_repeats} repetition(s), median (min-max) over ranks and repetitions; MiB above "
        "the resident set before loading"
    )
    print(
        f"{'':32}{'peak MiB':>16}{'/ckpt':>7}{'/shard':>8}{'private peak':>16}{'/ckpt':>7}{'/shard':>8}"
        f"{'held after':>16}{'shard MiB':>10}{'seconds':>18}"
    )
    peaks = {}
    for mode, label in (
        ("slices", "longctx (meta, FSDP2, slices)"),
        ("naive", "naive (whole model per rank)"),
    ):
        ranks = [r for run in results[mode] for r in run]
        peaks[mode] = [r["peak_mib"] for r in ranks]
        private = [r["anon_peak_mib"] for r in ranks]
        shard = statistics.median(r["local_mib"] for r in ranks)
        peak, anon = statistics.median(peaks[mode]), statistics.median(private)
        print(
            f"{label:32}{spread(peaks[mode], 0):>16}{peak / size_mib:>6.2f}x{peak / shard:>7.2f}x"
            f"{spread(private, 0):>16}{anon / size_mib:>6.2f}x{anon / shard:>7.2f}x"
            f"{spread([r['anon_mib'] for r in ranks], 0):>16}{shard:>10.0f}"
            f"{spread([r['seconds'] for r in ranks], 1):>18}"
        )
    print(
        "(peak: VmHWM, which includes the checkpoint pages a rank maps while reading its slices: page cache, "
        "shared and reclaimable; private peak: RssAnon sampled every 2 ms; held after: RssAnon once loaded; "
        "all above the resident set before loading)"
    )
    print(
        "ratio of peaks, longctx / naive: "
        f"{statistics.median(peaks['slices']) / statistics.median(peaks['naive']):.2f}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--short-steps", type=int, default=5)
    parser.add_argument("--extra-steps", type=int, default=20)
    parser.add_argument("--load-repeats", type=int, default=2)
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--skip-steps", action="store_true")
    parser.add_argument(
        "--implementations",
        action="store_true",
        help="only compare train.model.implementation longctx and transformers (step cost)",
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--seq-len", type=int, default=2048, help="window length of the step benchmark")
    parser.add_argument(
        "--shape", choices=sorted(SHAPES), help="model shape (default: demo on CPU, gpu on cuda)"
    )
    parser.add_argument(
        "--windows", type=Path, help="packed windows made by --prepare-windows (default: pack here)"
    )
    parser.add_argument(
        "--prepare-windows", type=Path, metavar="DIR", help="pack the windows into DIR and stop"
    )
    parser.add_argument(
        "--load-worker", nargs=3, metavar=("MODE", "CHECKPOINT", "OUT"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.load_worker:
        mode, checkpoint, out = args.load_worker
        load_worker(mode, Path(checkpoint), Path(out))
        return 0
    if args.prepare_windows:
        shutil.rmtree(args.prepare_windows, ignore_errors=True)
        make_windows(args.prepare_windows, args.seq_len)
        print(
            f"packed {args.seq_len}-token windows into {args.prepare_windows}: carry it, then pass --windows"
        )
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda, but torch sees no CUDA device")
    torch.set_num_threads(1)
    print(f"load: {os.getloadavg()[0]:.1f} (1 min) on {os.cpu_count()} cores; torch {torch.__version__}")
    with tempfile.TemporaryDirectory(prefix="bench_train_") as tmp:
        scratch = Path(tmp)
        if args.implementations:
            bench_implementations(args, scratch)
            print(f"\nload at the end: {os.getloadavg()[0]:.1f} (1 min)")
            return 0
        if not args.skip_steps:
            bench_steps(args, scratch)
        if not args.skip_memory and args.device == "cpu":  # the loading benchmark runs gloo ranks
            bench_loading(args, scratch)
    print(f"\nload at the end: {os.getloadavg()[0]:.1f} (1 min)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
