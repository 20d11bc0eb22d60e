"""The transformers implementation on several processes (gloo), and its refusals through the CLI.

References: transformers running each document alone (default attention, float64) for packed rows
split zigzag over context-parallel rings of 2 and 3 ranks; the same training in one process for
world 4 (DP 2 x CP 2) and for a resume at world 2; transformers' ``AutoModelForCausalLM`` reading
the exported folder. Tiny random Qwen3 (q/k norms, tied embeddings) and OLMo 2 (untied) models are
built here and saved with ``save_pretrained``; nothing is downloaded.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import yaml
from safetensors.torch import load_file

from longctx import jobs
from longctx.config import parse_config
from longctx.core.errors import ConfigError
from longctx.trainer.build import build_model
from longctx.trainer.checkpoint import Checkpoint, load_checkpoint, read_trainer_state
from longctx.trainer.models import interface
from longctx.trainer.models.decoder import RingAttention
from longctx.trainer.models.hf import HFCausalLM
from longctx.trainer.parallel.state import ParallelState
from longctx.trainer.parallel.zigzag import zigzag_indices
from longctx.trainer.preflight import check_before_start
from tests.trainer.test_hf_model import (
    DOCS,
    MODELS,
    TINY,
    documents_alone,
    packed,
    relative_error,
    save_random,
)
from tests.trainer.test_train import SEQ_LEN, train_config

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

VOCAB = 320  # the packed fixture's tokenizer
YARN = {"rope_type": "yarn", "factor": 2.0}


def spawn(world: int, job: Any, tmp: Path, *args: Any) -> None:
    """``job(rank, world, store, *args)`` on ``world`` forked gloo ranks (they inherit this process's
    imports: torch and transformers are most of a rank's start-up)."""
    store = tmp / f"store-{job.__name__}-{world}"
    mp.start_processes(job, args=(world, str(store), *args), nprocs=world, join=True, start_method="fork")


def _ring_job(rank: int, world: int, store: str, folders: dict[str, str], out: str) -> None:
    """Each model on this rank's zigzag share of the packed row: logits of every token and the
    gradients of the summed token losses, gathered to rank 0."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    row = packed(DOCS, TINY["vocab_size"])
    index = zigzag_indices(len(row["input_ids"]), world, rank)
    inputs = {k: row[k][index] for k in ("input_ids", "position_ids", "segment_ids")} | {"token_index": index}
    results = {}
    for name, folder in folders.items():
        model = interface.load_folder(
            folder,
            implementation="transformers",
            dtype=torch.float64,
            attention=RingAttention(dist.group.WORLD),
        )
        model(**inputs, rope_seq_len=len(index) * world, labels=row["labels"][index]).sum().backward()
        with torch.no_grad():
            logits = model.logits(model(**inputs))
        parts = [torch.empty_like(logits) for _ in range(world)]
        dist.all_gather(parts, logits)
        window = torch.empty(len(row["input_ids"]), logits.shape[-1], dtype=logits.dtype)
        for member, part in enumerate(parts):
            window[zigzag_indices(len(row["input_ids"]), world, member)] = part
        grads = {}
        for param_name, param in model.named_parameters():
            dist.all_reduce(param.grad)
            grads[param_name] = param.grad
        results[name] = {"logits": window, "grads": grads}
    if rank == 0:
        torch.save(results, out)
    dist.destroy_process_group()


@pytest.mark.slow
def test_packed_rows_on_rings_of_2_and_3_equal_each_document_alone(tmp_path: Path) -> None:
    folders = {name: str(save_random(tmp_path / name, name, seed=i)) for i, name in enumerate(sorted(MODELS))}
    row = packed(DOCS, TINY["vocab_size"])
    references = {name: documents_alone(Path(folder), row, DOCS) for name, folder in folders.items()}
    for world in (2, 3):
        out = tmp_path / f"cp{world}.pt"
        spawn(world, _ring_job, tmp_path, folders, str(out))
        results = torch.load(out, weights_only=True)
        for name, (logits, _, grads) in references.items():
            assert relative_error(results[name]["logits"], logits) < 1e-10, (world, name)
            for param_name, grad in results[name]["grads"].items():
                assert relative_error(grad, grads[param_name]) < 1e-10, (world, name, param_name)


def _sharded_load_job(rank: int, world: int, store: str, folder: str, out: str) -> None:
    """Load the checkpoint into a model sharded over ``world`` ranks (FSDP2 over data parallelism),
    each rank reading only its rows, and gather every tensor back to rank 0."""
    from longctx.trainer.models.weights import load_weights, loadable_tensors
    from longctx.trainer.parallel.state import init_parallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    state = init_parallel(cp=1, timeout_s=300)
    config = interface.from_hf(json.loads(Path(folder, "config.json").read_text()))
    model = build_model(config, state, activation_checkpointing="none", bf16=False).model
    load_weights(model, folder)
    full, sharded = {}, []
    for name, tensor in loadable_tensors(model).items():
        if hasattr(tensor, "full_tensor"):
            sharded += [name] if tensor.to_local().shape[0] < tensor.shape[0] else []
            tensor = tensor.full_tensor()
        full[name] = tensor.detach()
    if rank == 0:
        torch.save({"tensors": full, "sharded": sharded}, out)
    dist.destroy_process_group()


@pytest.mark.parametrize("model_type", ["qwen3_moe", "gpt_neox"])
def test_a_sharded_load_converts_checkpoints_as_transformers_does(model_type: str, tmp_path: Path) -> None:
    """A mixture of experts stored one tensor per expert (fused into one parameter per layer) and
    GPT-NeoX's renamed output head, loaded by 2 FSDP2 ranks each reading its slices: the model's
    tensors are transformers' own model's, loaded by ``from_pretrained``."""
    from tests.trainer.families import save_tiny

    folder = save_tiny(tmp_path / model_type, model_type)
    out = tmp_path / "loaded.pt"
    spawn(2, _sharded_load_job, tmp_path, str(folder), str(out))
    result = torch.load(out, weights_only=True)
    loaded = result["tensors"]
    assert any("experts" in n or "embed_out" in n or "lm_head" in n for n in result["sharded"]), result[
        "sharded"
    ]
    reference = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    want = dict(reference.named_parameters())
    assert loaded.keys() <= want.keys() | {n for n, _ in reference.named_buffers()}
    assert {n for n in want if n not in loaded} <= {"lm_head.weight"}  # a tied head is the embedding
    for name, tensor in loaded.items():
        expected = want[name] if name in want else reference.get_buffer(name)
        assert torch.equal(tensor, expected), name


# Training: world 4 against one process ------------------------------------------------------------------


def save_base(folder: Path, model_type: str) -> Path:
    """A random float32 checkpoint of ``model_type`` with the packed fixture's vocabulary."""
    config = transformers.AutoConfig.for_model(
        model_type, **{**TINY, **MODELS[model_type], "vocab_size": VOCAB}
    )
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return folder


def run_config(packed_root: Path, output: Path, base: Path, **train: Any) -> dict[str, Any]:
    settings = {
        "model": {"hf_path": str(base), "rope_scaling": YARN},
        "global_batch_rows": 4,
        "log": {"every": 1},
        "optim": {"lr": 3e-3, "warmup_steps": 0, "min_lr_ratio": 1.0},
        "checkpoint": {"every": 3, "keep": 2},
        **train,
    }
    return train_config(packed_root, output, **settings)


def checkpoint_model(output: Path, step: int) -> HFCausalLM:
    """The model of checkpoint ``step``, read back into one process (resharding whatever mesh wrote it)."""
    folder = output / "train" / "checkpoints" / f"step_{step:07d}"
    config = interface.from_hf(read_trainer_state(folder)["meta"]["model"], "auto")
    model = build_model(config, ParallelState.single(), activation_checkpointing="none", bf16=False).model
    assert isinstance(model, HFCausalLM)
    load_checkpoint(Checkpoint(folder, step), model, None, ParallelState.single())
    return model


def _train_job(rank: int, world: int, store: str, runs: list[tuple[str, dict]], out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    results = {name: jobs.train(parse_config(cfg), progress=False).losses for name, cfg in runs}
    Path(out, f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


def train_on(world: int, runs: list[tuple[str, dict]], tmp: Path) -> dict[str, list[float]]:
    out = tmp / f"results{world}"
    out.mkdir()
    spawn(world, _train_job, tmp, runs, str(out))
    return json.loads((out / "rank0.json").read_text())


def assert_close_losses(got: list[float], want: list[float]) -> None:
    assert len(got) == len(want) and all(abs(a - b) <= 1e-5 * abs(b) for a, b in zip(got, want)), (got, want)


def assert_same_weights(folder: Path, reference: Path) -> None:
    got, want = load_file(folder / "model.safetensors"), load_file(reference / "model.safetensors")
    assert got.keys() == want.keys()
    worst = max((got[k] - want[k]).abs().max().item() for k in want)
    assert worst <= 1e-5, worst


@pytest.mark.slow
def test_world_4_equals_world_1_resumes_at_world_2_and_exports(packed: Path, tmp_path: Path) -> None:
    bases = {name: save_base(tmp_path / f"base_{name}", name) for name in sorted(MODELS)}
    # DP 2 x CP 2 against one process accumulating the same 4 rows per step: Qwen3 6 steps (checkpoints
    # at 3 and 6) with full activation checkpointing, OLMo 2 3 steps with selective checkpointing.
    settings = {
        "qwen3": {"steps": 6, "activation_checkpointing": "full"},
        "olmo2": {"steps": 3, "activation_checkpointing": "selective"},
    }
    runs = [
        (name, run_config(packed, tmp_path / name, base, cp=2, **settings[name]))
        for name, base in bases.items()
    ]
    reference = {
        name: jobs.train(parse_config(run_config(packed, tmp_path / f"ref_{name}", base, **settings[name])))
        for name, base in bases.items()
    }
    world4 = train_on(4, runs, tmp_path)
    for name in bases:
        assert_close_losses(world4[name], reference[name].losses)
        assert_same_weights(tmp_path / name / "train" / "final", tmp_path / f"ref_{name}" / "train" / "final")

    # Qwen3 killed after its step-3 checkpoint resumes on 2 ranks (CP 2): the last 3 steps and weights
    # of the uninterrupted run.
    resumed = tmp_path / "resumed"
    shutil.copytree(tmp_path / "qwen3", resumed)
    shutil.rmtree(resumed / "train" / "checkpoints" / "step_0000006")
    shutil.rmtree(resumed / "train" / "final")
    again = run_config(packed, resumed, bases["qwen3"], cp=2, **settings["qwen3"])
    world2 = train_on(2, [("resumed", again)], tmp_path)
    assert_close_losses(world2["resumed"], reference["qwen3"].losses[3:])
    assert_same_weights(resumed / "train" / "final", tmp_path / "ref_qwen3" / "train" / "final")

    # The export opens in transformers with the trained model's logits, the run's RoPE and context.
    final = resumed / "train" / "final"
    hf = transformers.AutoModelForCausalLM.from_pretrained(final, dtype=torch.float32).eval()
    assert type(hf).__name__ == "Qwen3ForCausalLM"
    assert hf.config.max_position_embeddings == SEQ_LEN
    assert hf.config.rope_parameters["rope_type"] == "yarn" and hf.config.rope_parameters["factor"] == 2.0
    trained = checkpoint_model(resumed, 6)
    ids = torch.randint(3, VOCAB, (200,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        theirs = hf(input_ids=ids[None]).logits[0]
        zeros = torch.zeros(200, dtype=torch.long)
        mine = trained.logits(trained(ids, torch.arange(200), torch.arange(200), zeros, rope_seq_len=SEQ_LEN))
    assert (theirs - mine).abs().max().item() <= 1e-5


# Refusals before any rank starts ---------------------------------------------------------------------------

REFUSALS = {
    "sliding": (
        "qwen3",
        {"use_sliding_window": True, "sliding_window": 64, "max_window_layers": 0},
        "auto",
        "sliding-window layers (sliding_window = 64, shorter than the 256-token windows",
    ),
    "softcapping": ("gemma2", {"sliding_window": 4096}, "auto", "logit soft-capping (attn_logit_softcapping"),
    "absolute_positions": (
        "gpt2",
        {"n_embd": 32, "n_layer": 2, "n_head": 4},
        "auto",
        "absolute position embeddings (transformer.wpe)",
    ),
    "nope_layers": ("smollm3", {"no_rope_layers": [1, 0]}, "auto", "NoPE layers"),
    "own_decoder_forced": ("qwen3", {}, "longctx", "unsupported model_type 'qwen3'"),
}


def refused_run(packed: Path, tmp_path: Path, name: str) -> Path:
    """The config file of a 2-step run on a random checkpoint of REFUSALS[name]'s model."""
    model_type, extra, implementation, _ = REFUSALS[name]
    config = transformers.AutoConfig.for_model(model_type, **{**TINY, "vocab_size": VOCAB, **extra})
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(tmp_path / f"base_{name}")
    model = {"hf_path": str(tmp_path / f"base_{name}"), "implementation": implementation}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(train_config(packed, tmp_path / name, steps=2, model=model)))
    return path


@pytest.mark.parametrize("name", [name for name in REFUSALS if name != "sliding"])
def test_unsupported_models_are_refused_by_the_check_before_start(
    packed: Path, tmp_path: Path, name: str
) -> None:
    """The check that ``longctx train`` runs before any rank starts (the test below runs it through
    the command once) names what the model has that the run cannot train, and writes nothing."""
    cfg = parse_config(yaml.safe_load(refused_run(packed, tmp_path, name).read_text()))
    with pytest.raises(ConfigError) as refused:
        check_before_start(cfg.train, cfg.context, cfg.output, 2)
    line = str(refused.value)
    assert "\n" not in line and line.startswith("train.model") and REFUSALS[name][3] in line, line
    assert not (tmp_path / name).exists()


@pytest.mark.slow
def test_an_unsupported_model_is_refused_before_any_rank_starts(packed: Path, tmp_path: Path) -> None:
    """`longctx train --nproc 2` on a model with windows shorter than the run's: exit status 2, one
    line naming what is missing, nothing written into the output folder."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    config = refused_run(packed, tmp_path, "sliding")
    command = [sys.executable, "-m", "longctx.cli", "train", "--config", str(config), "--nproc", "2"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("longctx train: train.model") and REFUSALS["sliding"][3] in lines[0]
    assert not (tmp_path / "sliding").exists()
