r"""The CUDA paths on one GPU, in one run: kernel exactness, attention speed, training, longest context.

Sections (each with a time cap; the JSON report is rewritten, atomically, after every case, so a run
stopped by a timeout still leaves what it measured):

1. ``exactness``: every kernel the ring can select on the device (FlashAttention-4 and -2 varlen where
   installed, PyTorch's flash varlen, memory-efficient and cuDNN kernels, the math kernel, and the
   automatic chain), forward and backward of ``ring_attention`` at P = 1 and of a virtual P = 4 zigzag
   ring, on doc-masked windows (one document, many short ones, one-token ones, a padding tail; GQA 32/8
   heads, head_dim 128, bf16), against float64 softmax attention with an explicit mask on the CPU; then
   liger-kernel's fused RMSNorm, SwiGLU, RoPE and linear cross-entropy, and a decoder layer compiled by
   ``torch.compile``, against float64 (``gpu_kernels.py``). Within 2e-2 or the check fails.
2. ``speed``: TFLOP/s of useful (causal, doc-masked) work of ``ring_attention`` at 8K, 32K and 128K
   tokens, forward and forward+backward, against SDPA (flash, and cuDNN where it runs) on one causal
   document (goal: at or above SDPA), and on many documents (goal: >= 0.9 of the one-document rate); the
   varlen kernels pinned one by one at 8K and 32K.
3. ``cp_modes``: every context-parallel mode (``train.cp_mode``) and row layout (zigzag, balanced) over a
   virtual group of 8 ranks at 32K and 128K, each rank's attention in turn on the one GPU: the slowest
   rank over the mean and the group's attention rate against the zigzag ring (``gpu_cp.py``).
4. ``training``: Llama-shaped 1.1B and 3B models with random weights on packed windows of the
   many-document layout, bf16, the trainer's own model, kernels and optimizer at world size 1: the
   defaults (``activation_checkpointing: auto``, ``train.kernels`` auto) at 32K with a profiled step's
   breakdown (attention, matmuls, norms, loss, optimizer, communication; ``gpu_profile.py``), the
   2026-11-30 report's configuration (full checkpointing, PyTorch's ops) at 32K, the defaults at 8K and
   128K and for the 3B shape at 64K, and compiled blocks at 32K: tokens/s, MFU (model FLOPs with causal
   and document masks, recompute not counted; goal 40%), peak memory against ``longctx plan`` (within 15%).
5. ``longest``: one training step (full checkpointing) at 64K, 128K and 256K tokens until one runs out of
   memory.
6. ``memory``: the memory model under selective and no checkpointing: a step's peak against
   ``longctx plan`` (goal: within 15%).

Section 1 also runs each kernel's start-up probe on several head shapes: the ring silently drops a kernel
that disagrees with the math kernel there (it would train slower, not wrong), so a rejection is a failure
(for the experimental cuDNN kernel, which ``auto`` does not use, it is reported).

Usage::

    python tests/benchmarks/gpu_suite.py --out runs/gpu_suite.json        # on a GPU (make gpu-check)
    python tests/benchmarks/gpu_suite.py --cpu-smoke --out /tmp/smoke.json # every code path, tiny, CPU
    python tests/benchmarks/gpu_suite.py --sections speed,training ...     # a subset

Exit status: 0 when every check passed (exactness, finite losses, something measured in each section
run), 1 when a check failed or a section raised, 2 without a CUDA device (unless ``--cpu-smoke``) or when
the installed longctx is not this checkout's. Goals (speed, memory estimate) are reported, not enforced.

On this workplace's lent H200 (nothing can be installed there: the packages it lacks travel as wheels,
built here with ``make gpu-wheels``, which also builds this checkout's own wheel; run it in the checkout
the device tool sends, after the last code change), the whole call is ``run`` with
``carry=[".whl"]``, ``timeout_s=600`` and this command (one line)::

    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl && export PYTHONPATH=/tmp/site || exit; set -o pipefail; PYTHONUNBUFFERED=1 \
        python3 tests/benchmarks/gpu_suite.py --out $OUT/gpu_suite.json 2>&1 | tee $OUT/gpu_suite.log

The suite takes under 8 minutes (``--budget-s``, default 450 s, plus start-up: its sections' caps add up
to 510 s, and sections end early once the budget is spent); then copy
``gpu_suite.json`` to ``tests/benchmarks/results/<date>-<gpu>.json``. If the float64 CPU reference is
too slow there for every layout, rerun only that section with a smaller window:
``--sections exactness --exact-tokens 1024``. The device lends 15 minutes in all, starts included, so a
rerun is a subset: the sections that errored or were cut by the budget (``--sections training
--budget-s 240`` measures the training cases alone; cases that would pass the cap are skipped, the most
telling first).
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import datetime
import hashlib
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
from gpu_cases import TrainCase
from gpu_measure import Deadline, free_memory

from longctx.core.atomic import write_json

REPO = Path(__file__).resolve().parents[2]
SECTIONS = ("exactness", "speed", "cp_modes", "training", "longest", "memory")
SOURCE_FOLDERS = {"longctx.trainer": "trainer", "longctx.packer": "packer", "longctx.core": "core"}


@dataclass(frozen=True)
class Settings:
    """Sizes, repetitions and time caps of one mode of the suite (``gpu`` or ``cpu-smoke``)."""

    mode: str
    device: torch.device
    heads: int
    kv_heads: int
    head_dim: int
    exact_tokens: int
    exact_dtypes: tuple[torch.dtype, ...]
    exact_backends: tuple[str, ...]
    exact_case_estimate_s: float
    probe_shapes: tuple[tuple[int, int, int], ...]
    speed_tokens: tuple[int, ...]
    speed_dtype: torch.dtype
    speed_mean_document: int
    matmul_size: int
    train_models: dict[str, dict]
    """Model shapes by name (a ``train.model.tiny`` section plus ``vocab_size``); ``1.1B`` is the base."""
    train_cases: tuple[TrainCase, ...]
    train_mean_document: int
    train_warmup: int
    train_steps: int
    longest_tokens: tuple[int, ...]
    longest_max_document: int
    memory_cases: tuple[tuple[str, int], ...]
    caps: dict[str, float]
    budget_s: float
    speed_backends: tuple[str, ...] = ()
    """Ring kernels also timed pinned in the speed section (where usable), beside the automatic chain."""
    speed_backend_tokens: tuple[int, ...] = ()
    """The lengths at which they are (the longest take most of the section's time)."""
    experimental_backends: tuple[str, ...] = ()
    """Kernels whose rejection by their probe is recorded but does not fail the run (not in ``auto``)."""
    compile_backend: str = "inductor"
    compile_estimate_s: float = 90.0
    build_s_per_billion: float = 7.0
    mfu_goal_cases: tuple[str, ...] = ()
    speed_goal: float = 1.0
    many_documents_goal: float = 0.9
    reps: dict[int, tuple[int, int]] = field(default_factory=dict)
    cp_tokens: tuple[int, ...] = ()
    """Window lengths of the ``cp_modes`` section (``gpu_cp.py``)."""
    cp_world: int = 8
    """Virtual context-parallel ranks of the ``cp_modes`` section."""

    @property
    def train_dims(self) -> dict:
        """The base model (1.1B on a GPU) of the longest-context and memory sections."""
        return self.train_models["1.1B"]

    def speed_reps(self, tokens: int) -> tuple[int, int]:
        """``(warmup, timed repetitions)`` for a length: fewer for the long, slow ones."""
        return next((value for limit, value in sorted(self.reps.items()) if tokens <= limit), (1, 3))


LLAMA_1B = {  # hidden 2048, 22 layers, 16 heads of 128 (4 key/value heads), SwiGLU 5632, vocab 32000: 1.12B
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 22,
    "num_attention_heads": 16,
    "num_key_value_heads": 4,
    "tie_word_embeddings": False,
    "vocab_size": 32000,
}
LLAMA_3B = {  # Llama-3.2-3B's shape: hidden 3072, 28 layers, 24 heads of 128 (8 key/value), 8192, 128256 tied
    "hidden_size": 3072,
    "intermediate_size": 8192,
    "num_hidden_layers": 28,
    "num_attention_heads": 24,
    "num_key_value_heads": 8,
    "tie_word_embeddings": True,
    "vocab_size": 128256,
}
AUTO = {"attention": "auto", "fused": "auto", "compile": False}
BASELINE = {"attention": "auto", "fused": "none", "compile": False}


def training_cases(short: int, mid: int, long: int, big_model_tokens: int) -> tuple[TrainCase, ...]:
    """The training section's cases, the most telling first (a section cap skips the last ones): the
    defaults (auto checkpointing and kernels, profiled) and the 2026-11-30 report's configuration (full
    checkpointing, PyTorch's ops) at ``mid`` tokens, then ``short`` and ``long``, the 3B shape, compiled
    blocks."""
    return (
        TrainCase("1.1B auto", "1.1B", mid, "auto", AUTO, profile=True),
        TrainCase("1.1B full plain", "1.1B", mid, "full", BASELINE),
        TrainCase("1.1B auto short", "1.1B", short, "auto", AUTO),
        TrainCase("1.1B auto long", "1.1B", long, "auto", AUTO),
        TrainCase("3B auto", "3B", big_model_tokens, "auto", AUTO),
        TrainCase("1.1B auto compiled", "1.1B", mid, "auto", {**AUTO, "compile": True}),
    )


def gpu_settings(device: torch.device, budget_s: float, exact_tokens: int | None = None) -> Settings:
    """The sizes of the issue: GQA 32/8 x 128 attention, 1.1B and 3B Llama-shaped models, 8K-128K windows."""
    return Settings(
        mode="gpu",
        device=device,
        heads=32,
        kv_heads=8,
        head_dim=128,
        # above torch_efficient's 2048-token tiles; the float64 CPU reference grows as its square
        exact_tokens=exact_tokens or 2560,
        exact_dtypes=(torch.bfloat16,),
        exact_backends=(
            "auto",
            "flash_attn4_varlen",
            "flash_attn_varlen",
            "torch_flash_varlen",
            "torch_efficient",
            "torch_cudnn",
            "math",
        ),
        exact_case_estimate_s=14.0,
        # (head_dim, heads, kv_heads): the exactness shape, the training models', MHA, and smaller heads
        probe_shapes=((128, 32, 8), (128, 16, 4), (128, 24, 8), (128, 16, 16), (64, 32, 8), (64, 8, 1)),
        speed_tokens=(8192, 32768, 131072),
        speed_dtype=torch.bfloat16,
        speed_mean_document=2048,
        matmul_size=8192,
        train_models={"1.1B": LLAMA_1B, "3B": LLAMA_3B},
        train_cases=training_cases(8192, 32768, 131072, 65536),
        train_mean_document=2048,
        train_warmup=2,
        train_steps=4,
        longest_tokens=(65536, 131072, 262144),
        longest_max_document=32768,
        memory_cases=(("selective", 32768), ("selective", 65536), ("none", 16384)),
        caps={
            "exactness": 90.0,
            "speed": 75.0,
            "cp_modes": 40.0,
            "training": 210.0,
            "longest": 45.0,
            "memory": 50.0,
        },
        budget_s=budget_s,
        speed_backends=("flash_attn4_varlen", "flash_attn_varlen", "torch_flash_varlen", "torch_cudnn"),
        speed_backend_tokens=(8192, 32768),
        experimental_backends=("torch_cudnn",),
        mfu_goal_cases=("1.1B auto", "1.1B auto compiled"),
        reps={8192: (3, 10), 32768: (2, 6)},
        cp_tokens=(32768, 131072),
        cp_world=8,
    )


def smoke_settings(budget_s: float) -> Settings:
    """Every code path at tiny sizes on the CPU (float32 and bfloat16): finds bugs, measures nothing.
    Compiled blocks are traced with ``aot_eager`` (the same graphs, no code generated: Inductor's C++
    compile takes minutes here; tests/trainer/test_kernel_choice.py runs it)."""
    tiny = {
        "hidden_size": 64,
        "intermediate_size": 172,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "tie_word_embeddings": False,
        "vocab_size": 1000,
    }
    return Settings(
        mode="cpu-smoke",
        device=torch.device("cpu"),
        heads=4,
        kv_heads=2,
        head_dim=16,
        exact_tokens=64,
        exact_dtypes=(torch.float32, torch.bfloat16),
        exact_backends=("auto", "cpu_flash", "math"),
        exact_case_estimate_s=0.0,
        probe_shapes=((16, 4, 2), (16, 4, 4)),
        speed_tokens=(256, 512),
        speed_dtype=torch.bfloat16,
        speed_mean_document=32,
        matmul_size=128,
        train_models={
            "1.1B": tiny,
            "3B": {**tiny, "hidden_size": 96, "num_attention_heads": 6, "tie_word_embeddings": True},
        },
        train_cases=training_cases(128, 256, 512, 256),
        train_mean_document=32,
        train_warmup=1,
        train_steps=2,
        longest_tokens=(256, 512, 1024),
        longest_max_document=128,
        memory_cases=(("selective", 256), ("none", 256)),
        caps=dict.fromkeys(SECTIONS, 60.0),
        budget_s=budget_s,
        speed_backends=("cpu_flash", "math"),
        speed_backend_tokens=(256,),
        compile_backend="aot_eager",
        compile_estimate_s=5.0,
        build_s_per_billion=0.0,
        mfu_goal_cases=("1.1B auto", "1.1B auto compiled"),
        reps={1 << 30: (1, 2)},
        cp_tokens=(512,),
        cp_world=4,
    )


# Environment -----------------------------------------------------------------------------------------------
def stale_sources() -> list[str]:
    """Files of this checkout that differ from the longctx Python imports (an installed copy built from
    another state of the tree); empty when they match or when the import is this checkout (editable)."""
    import importlib

    stale = []
    for package, folder in SOURCE_FOLDERS.items():
        installed = Path(importlib.import_module(package).__file__).parent
        source = REPO / folder
        if not source.is_dir() or installed.resolve() == source.resolve():
            continue
        for path in sorted(source.rglob("*.py")):
            copy = installed / path.relative_to(source)
            if not copy.is_file() or copy.read_bytes() != path.read_bytes():
                stale.append(str(path.relative_to(REPO)))
    return stale


def third_party_imports() -> list[str]:
    """Top-level names of the modules outside the standard library that this process has loaded because
    the longctx modules or the suite's own modules import them: what the GPU machine must provide.

    A name counts when such a module's source imports it (at module level or inside a function) and it
    was loaded; optional extras that were never imported (a tracker, flash-attn) and other libraries'
    optional imports (torch's) do not count.
    """
    loaded = {name.partition(".")[0] for name in list(sys.modules)}
    ours = {
        name
        for name, module in list(sys.modules.items())
        if getattr(module, "__file__", None)
        and (name.partition(".")[0] == "longctx" or Path(module.__file__).parent == Path(__file__).parent)
    }
    names: set[str] = set()
    for name in ours:
        tree = ast.parse(Path(sys.modules[name].__file__).read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names.update(alias.name.partition(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
                names.add(node.module.partition(".")[0])
    names -= {"longctx", "__future__", *ours}
    return sorted(name for name in names & loaded if name not in sys.stdlib_module_names)


def source_digest() -> str:
    """SHA-256 over the checkout's longctx sources (paths and bytes): names the code that ran even where
    the copy's git metadata is not this tree's (the device tool sends files, and git may lag behind)."""
    digest = hashlib.sha256()
    for folder in sorted(SOURCE_FOLDERS.values()):
        for path in sorted((REPO / folder).rglob("*.py")):
            digest.update(str(path.relative_to(REPO)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def environment(device: torch.device) -> dict:
    """What ran: device, library versions, the checkout's commit where git can tell."""
    info: dict = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "host": platform.node(),
        "cpu_threads": torch.get_num_threads(),
        "device": str(device),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(
            gpu=props.name,
            capability=f"{props.major}.{props.minor}",
            multiprocessors=props.multi_processor_count,
            memory_gib=props.total_memory / 2**30,
            cudnn=torch.backends.cudnn.version(),
        )
    info["source_sha256"] = source_digest()
    try:
        info["commit"] = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        info["commit"] = None
    return info


# Report ----------------------------------------------------------------------------------------------------
class Report:
    """The JSON report, rewritten atomically after every case so that a killed run leaves its results."""

    def __init__(self, path: Path, header: dict) -> None:
        self.path = path
        self.data = {**header, "sections": {}}
        self.save()

    def save(self) -> None:
        write_json(self.path, self.data)

    def start(self, name: str, cap_s: float) -> Callable[[dict], None]:
        section = {"status": "running", "cap_s": cap_s, "cases": []}
        self.data["sections"][name] = section
        self.save()

        def emit(case: dict) -> None:
            section["cases"].append(case)
            self.save()

        return emit

    def finish(self, name: str, status: str, seconds: float, **fields: object) -> None:
        self.data["sections"][name].update(status=status, seconds=seconds, **fields)
        self.save()


def run_sections(settings: Settings, names: list[str], report: Report) -> bool:
    """Run the chosen sections in order under the suite's budget; whether every check passed."""
    from gpu_attention import run_exactness, run_speed
    from gpu_cp import run_cp_modes
    from gpu_training import run_longest_context, run_memory_model, run_training

    runners = {
        "exactness": lambda d, e, s: run_exactness(settings, d, e),
        "speed": lambda d, e, s: run_speed(settings, d, e),
        "cp_modes": lambda d, e, s: run_cp_modes(settings, d, e),
        "training": lambda d, e, s: run_training(settings, d, e, s),
        "longest": lambda d, e, s: run_longest_context(settings, d, e, s),
        "memory": lambda d, e, s: run_memory_model(settings, d, e, s),
    }
    suite = Deadline.after(settings.budget_s)
    shared: dict = {}
    ok = True
    for name in names:
        cap = settings.caps[name]
        emit = report.start(name, cap)
        t0 = time.perf_counter()
        print(f"== {name} (cap {cap:.0f} s, {suite.left():.0f} s left in the suite)", flush=True)
        if suite.left() <= 0:
            report.finish(name, "skipped", 0.0, reason="suite time budget spent")
            continue
        try:
            summary = runners[name](Deadline.after(cap, suite), emit, shared)
        except Exception as exc:  # recorded in the report; the next section still runs
            ok = False
            report.finish(
                name,
                "error",
                time.perf_counter() - t0,
                error=f"{type(exc).__name__}: {exc}",
                traceback=traceback.format_exc(limit=8)[-4000:],
            )
            print(f"   error: {type(exc).__name__}: {exc}", flush=True)
        else:
            passed = bool(summary.get("passed", True))
            ok &= passed
            report.finish(name, "passed" if passed else "FAILED", time.perf_counter() - t0, summary=summary)
        free_memory(settings.device)
    return ok


# Table -----------------------------------------------------------------------------------------------------
def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} GiB"


def _tokens(n: int) -> str:
    return f"{n // 1024}K" if n >= 1024 and n % 1024 == 0 else str(n)


def table(data: dict) -> str:
    """A short human summary of the report."""
    env = data["environment"]
    lines = [
        f"longctx GPU suite ({data['mode']}): {env.get('gpu', env['device'])}, torch {env['torch']}, "
        f"{data.get('seconds', 0):.0f} s, {'ALL CHECKS PASSED' if data.get('passed') else 'CHECKS FAILED'}"
    ]
    if data["mode"] != "gpu":
        lines.append("  (CPU smoke run: code paths only; these are not GPU figures)")
    for name, section in data["sections"].items():
        summary = section.get("summary", {})
        head = f"{name:10s} {section['status']:7s} {section.get('seconds', 0):6.1f} s"
        if section["status"] == "error":
            lines.append(f"{head}  {section['error']}")
            continue
        if name == "exactness" and summary:
            cases = [c for c in section["cases"] if "worst" in c and "layout" in c]
            worst = max((c["worst"] for c in cases), default=float("nan"))
            missing = sorted(
                {
                    f"{c.get('backend') or c.get('ops')} ({c['reason']})"
                    for c in section["cases"]
                    if c.get("status") in ("unavailable", "rejected") and "probe_shape" not in c
                }
            )
            lines.append(
                f"{head}  {summary['checked']} checks, worst error {worst:.1e}; auto chain "
                + "; ".join(f"{d}: {' > '.join(c)}" for d, c in summary["auto_kernel_chain"].items())
            )
            probes = [c for c in section["cases"] if "probe_shape" in c]
            if probes:
                rejected = [c for c in probes if c["status"] == "FAIL"]
                lines.append(
                    f"    kernel probes: {len(probes) - len(rejected)} of {len(probes)} accepted"
                    + "".join(
                        f"; REJECTED {c['backend']} at {'/'.join(map(str, c['probe_shape']))}: {c['reason']}"
                        for c in rejected
                    )
                )
            for case in cases:
                lines.append(
                    f"    {case['dtype'][6:]:8s} {case['backend']:18s} {case['mode']:11s} "
                    f"{case['layout']:13s} "
                    f"{case['worst']:.1e} / {case['tolerance']:.0e} {case['status']}"
                )
            for case in section["cases"]:
                if case.get("check") in ("fused", "compiled layer") and "worst" in case:
                    what = f"{case['check']} {case.get('ops', case.get('backend'))} {case.get('op', '')}"
                    lines.append(
                        f"    {case['dtype'][6:] if case['dtype'].startswith('torch') else case['dtype']:8s} "
                        f"{what:38s} {case['worst']:.1e} / {case['tolerance']:.0e} {case['status']}"
                    )
            lines += [f"    unavailable: {m}" for m in missing]
        elif name == "speed" and summary:
            lines.append(
                f"{head}  matmul ceiling {summary['matmul_tflops']:.3g} TFLOP/s; {summary['goal']}: "
                f"{'met' if summary['goal_met'] else 'NOT met'}"
            )
            rates = {(c["tokens"], c["layout"], c["impl"]): c for c in section["cases"] if "impl" in c}
            for row in summary["rows"]:
                tokens = row["tokens"]
                ours, sdpa = (
                    rates[(tokens, "one_document", "ring_attention")],
                    rates[(tokens, "one_document", "sdpa_flash")],
                )
                many = rates[(tokens, "many_documents", "ring_attention")]
                fwd, fb = "forward", "forward_backward"
                lines.append(
                    f"    {_tokens(tokens):>5s} fwd {ours[fwd]['tflops']:6.3g} "
                    f"vs SDPA {sdpa[fwd]['tflops']:6.3g} "
                    f"TFLOP/s ({row['forward_vs_sdpa']:.2f}x); fwd+bwd {ours[fb]['tflops']:6.3g} vs "
                    f"{sdpa[fb]['tflops']:6.3g} ({row['forward_backward_vs_sdpa']:.2f}x); many docs "
                    f"{many[fb]['tflops']:6.3g} TFLOP/s, "
                    f"{row['forward_backward_many_documents_speedup']:.2g}x "
                    "one document's speed"
                )
        elif name == "training" and summary.get("cases"):
            best = summary.get("best_mfu")
            best_text = "-" if best is None else f"{best:.1%} ({summary.get('best_goal_case')})"
            goal = summary["mfu_goal"].split(" on ")[0]
            lines.append(
                f"{head}  best MFU {best_text}; {goal}: {'met' if summary['mfu_goal_met'] else 'NOT met'}"
            )
            for case in summary["cases"]:
                if case.get("status") != "measured":
                    lines.append(f"    {case['case']:20s} {case.get('status')}")
                    continue
                mfu, ratio = case.get("mfu"), case.get("peak_over_plan")
                lines.append(
                    f"    {case['case']:20s} {_tokens(case['seq_len']):>5s} {case['checkpointing']:9s} "
                    f"{case['tokens_per_s']:9,.0f} tokens/s, MFU {'-' if mfu is None else f'{mfu:.1%}'}, "
                    f"{case['documents_mean']:.0f} documents; {case['kernels']}"
                    + ("" if ratio is None else f"; peak {ratio:.2f}x plan")
                )
            for case in section["cases"]:
                profile = (case.get("summary") or {}).get("profile")
                if profile:
                    shares = ", ".join(f"{k} {v:.0%}" for k, v in profile["share"].items() if v >= 0.005)
                    lines.append(f"    step breakdown ({case['case']}, {profile['measured']}): {shares}")
        elif name == "longest" and summary:
            parts = []
            for case in section["cases"]:
                label = f"{_tokens(case['tokens'])} {case['status']}"
                if case["status"] == "fits":
                    label += (
                        f" {_gib((case['peak_memory'] or {}).get('peak_allocated_gib'))}"
                        f" (plan {_gib(case['plan_estimate']['total_gib'])}, {case['seconds']:.1f} s)"
                    )
                parts.append(label)
            lines.append(f"{head}  " + "; ".join(parts))
        elif name == "cp_modes" and summary:
            for tokens, rates in summary["rows"].items():
                parts = [
                    f"{mode} {r['tflops']:.1f}"
                    + (f" ({r['vs_ring_zigzag']:.2f}x)" if r["vs_ring_zigzag"] else "")
                    for mode, r in rates.items()
                ]
                lines.append(
                    f"{head}  {_tokens(int(tokens))}, cp {summary['world']}: TFLOP/s " + ", ".join(parts)
                )
        elif name == "memory" and summary:
            parts = [
                f"{c['mode']} {_tokens(c['tokens'])} "
                + (
                    f"{_gib((c['peak_memory'] or {}).get('peak_allocated_gib'))} vs plan "
                    f"{_gib(c['plan_estimate']['total_gib'])}"
                    + (f" ({c['peak_over_plan']:.2f}x)" if "peak_over_plan" in c else "")
                    if c["status"] == "measured"
                    else c["status"]
                )
                for c in section["cases"]
            ]
            lines.append(f"{head}  " + "; ".join(parts))
        else:
            lines.append(head + ("  " + section.get("reason", "") if section.get("reason") else ""))
    return "\n".join(lines)


# Main ------------------------------------------------------------------------------------------------------
def memory_cases(text: str) -> tuple[tuple[str, int], ...]:
    """``MODE:TOKENS,...`` -> ``((mode, tokens), ...)``, for ``--memory-cases``."""
    cases = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        mode, _, tokens = item.partition(":")
        if mode not in ("none", "full", "selective") or not tokens.isdigit() or int(tokens) <= 0:
            raise argparse.ArgumentTypeError(
                f"{item!r}: expected MODE:TOKENS with MODE none, full or selective"
            )
        cases.append((mode, int(tokens)))
    if not cases:
        raise argparse.ArgumentTypeError("no case given")
    return tuple(cases)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on the CPU: code paths only")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON report (default: $OUT/gpu_suite.json where OUT is set, else runs/gpu_suite.json)",
    )
    parser.add_argument(
        "--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {','.join(SECTIONS)}"
    )
    parser.add_argument(
        "--exact-tokens",
        type=int,
        default=None,
        help="window of the exactness checks on a GPU (default 2560; a multiple of 8; the float64 CPU "
        "reference's time grows as its square)",
    )
    parser.add_argument(
        "--memory-cases",
        type=memory_cases,
        default=None,
        help="the memory section's cases as MODE:TOKENS,... (e.g. none:8192,selective:131072; default "
        "selective:32768,selective:65536,none:16384)",
    )
    parser.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="time budget of the whole suite (default 450 s; smoke 240 s)",
    )
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    names = [name.strip() for name in args.sections.split(",") if name.strip()]
    unknown = [name for name in names if name not in SECTIONS]
    if unknown or not names:
        print(
            f"error: unknown section(s) {unknown or names}; expected some of {', '.join(SECTIONS)}",
            file=sys.stderr,
        )
        return 2
    if args.exact_tokens is not None and (args.exact_tokens <= 0 or args.exact_tokens % 8):
        print(f"error: --exact-tokens {args.exact_tokens} must be a positive multiple of 8", file=sys.stderr)
        return 2
    if not args.cpu_smoke and not torch.cuda.is_available():
        print("error: no CUDA device; pass --cpu-smoke for a CPU dry run of every code path", file=sys.stderr)
        return 2
    stale = stale_sources()
    if stale:
        print(
            f"error: the installed longctx is not this checkout ({len(stale)} files differ, "
            f"e.g. {stale[0]}); rebuild its wheel with `make gpu-wheels`",
            file=sys.stderr,
        )
        return 2
    out = args.out or (
        Path(os.environ["OUT"]) / "gpu_suite.json"
        if os.environ.get("OUT")
        else REPO / "runs" / "gpu_suite.json"
    )
    if args.cpu_smoke:
        torch.set_num_threads(1)  # tiny tensors: threads only add overhead, on a shared machine a lot of it
        settings = smoke_settings(args.budget_s or 240.0)
    else:
        device = torch.device("cuda", torch.cuda.current_device())
        settings = gpu_settings(device, args.budget_s or 450.0, args.exact_tokens)
    if args.memory_cases:
        settings = dataclasses.replace(settings, memory_cases=args.memory_cases)
    started = time.perf_counter()
    report = Report(
        out,
        {
            "suite": "longctx gpu_suite",
            "mode": settings.mode,
            "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "argv": sys.argv[1:] if argv is None else argv,
            "environment": environment(settings.device),
            "budget_s": settings.budget_s,
        },
    )
    passed = run_sections(settings, names, report)
    report.data.update(seconds=time.perf_counter() - started, passed=passed, imports=third_party_imports())
    report.save()
    print(table(report.data))
    print(f"report: {out}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
