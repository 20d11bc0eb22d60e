"""Sharded training (FSDP2 on a device mesh, gloo, several processes) against one process.

References: the same trainer in one process (no mesh, no sharding, gradient accumulation over the
same global batch), a random Llama saved by ``transformers`` as the starting point, and
``transformers`` itself for the exported folder.

- World 4 as DP 2 x CP 2, DP 4, CP 4 and HSDP (2 replicas x CP 2), and DP 2 x CP 2 with selective and
  CP 4 with full activation checkpointing: three optimizer steps give the losses and final weights of
  one process (fp32, 1e-5), and every rank holds about 1/world (1/2 with 2 replicas) of the parameter
  and optimizer bytes.
- 3 steps at world 4 (DP 2 x CP 2) + resume at world 2 (CP 2) + 3 steps = 6 uninterrupted steps, the
  newer (step 6) checkpoint having been damaged: the ranks' checksums find it, it is skipped and kept.
- The folder exported by the sharded run loads in ``AutoModelForCausalLM`` and ``AutoTokenizer``, and
  its logits equal those of the trained model read back from the checkpoint.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from longctx import jobs
from longctx.config import parse_config
from longctx.trainer.checkpoint import Checkpoint, list_checkpoints, load_checkpoint, read_trainer_state
from longctx.trainer.models.decoder import ModelConfig, Transformer
from longctx.trainer.parallel.state import ParallelState
from tests.trainer.test_train import SEQ_LEN, train_config

transformers = pytest.importorskip("transformers")


@pytest.fixture
def config(packed: Path, base_llama: Path):
    """A run config over the packed windows, training the random Llama saved by transformers."""

    def make(output: Path, **train: Any) -> dict[str, Any]:
        settings = {
            "model": {"hf_path": str(base_llama)},
            "global_batch_rows": 4,
            "log": {"every": 1},
            "optim": {"lr": 3e-3, "warmup_steps": 0, "min_lr_ratio": 1.0},
            "checkpoint": {"every": 3, "keep": 2},
            **train,
        }
        return train_config(packed, output, **settings)

    return make


def weights(output: Path, step: int) -> dict[str, torch.Tensor]:
    """The model of checkpoint ``step``, read back into one process (resharding whatever mesh wrote it)."""
    folder = output / "train" / "checkpoints" / f"step_{step:07d}"
    model = Transformer(ModelConfig.from_hf(read_trainer_state(folder)["meta"]["model"]))
    load_checkpoint(Checkpoint(folder, step), model, None, ParallelState.single())
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _worker(rank: int, world: int, store: str, runs: list[tuple[str, dict]], out: str) -> None:
    """One rank: train each run in turn in one process group (each run builds its own mesh)."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    results = {}
    for name, cfg in runs:
        result = jobs.train(parse_config(cfg), progress=False)
        results[name] = {"losses": result.losses, "state_bytes": result.state_bytes}
    Path(out, f"rank{rank}.json").write_text(json.dumps(results))
    dist.destroy_process_group()


def spawn(world: int, runs: list[tuple[str, dict]], tmp: Path) -> list[dict[str, Any]]:
    """Run ``runs`` on ``world`` gloo ranks; every rank's results."""
    out = tmp / f"results{world}"
    out.mkdir()
    # fork: the ranks inherit this process's imports (torch, transformers), which are most of their start-up
    mp.start_processes(
        _worker,
        args=(world, str(tmp / f"store{world}"), runs, str(out)),
        nprocs=world,
        join=True,
        start_method="fork",
    )
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def assert_close_losses(got: list[float], want: list[float], rtol: float) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert abs(a - b) <= rtol * abs(b), (got, want)


def assert_same_weights(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], atol: float) -> None:
    assert got.keys() == want.keys()
    worst = max((got[k] - want[k]).abs().max().item() for k in want)
    assert worst <= atol, worst


@pytest.mark.slow
def test_sharded_layouts_resume_and_export_equal_one_process(config, packed: Path, tmp_path: Path) -> None:
    # The reference, in this process: no mesh, no sharding, 4 rows accumulated per step,
    # checkpoints at 3 and 6.
    reference = jobs.train(parse_config(config(tmp_path / "ref", steps=6)), progress=False)
    layouts = {
        "dp2_cp2": {"cp": 2},
        "dp4": {"cp": 1},
        "cp4": {"cp": 4},
        "hsdp2_cp2": {"cp": 2, "dp_replicate": 2},
        # recomputation under FSDP2 and the ring (the reference keeps everything)
        "dp2_cp2_selective": {"cp": 2, "activation_checkpointing": "selective"},
        "cp4_full": {"cp": 4, "activation_checkpointing": "full"},
    }
    # DP 2 x CP 2 runs 6 steps (and is resumed below); the other layouts 3 (a constant learning rate
    # makes their first 3 steps those of a 6-step run).
    runs = [
        (name, config(tmp_path / name, steps=6 if name == "dp2_cp2" else 3, **mesh))
        for name, mesh in layouts.items()
    ]
    ranks = spawn(4, runs, tmp_path)

    at_step_3 = weights(tmp_path / "ref", 3)
    for name, mesh in layouts.items():
        assert_close_losses(ranks[0][name]["losses"][:3], reference.losses[:3], 1e-5)
        assert_same_weights(weights(tmp_path / name, 3), at_step_3, 1e-5)
        shard_ranks = 4 // mesh.get("dp_replicate", 1)
        for rank in ranks:
            sizes = rank[name]["state_bytes"]
            for part in ("params", "optimizer"):
                share = sizes[f"{part}_local"] / sizes[f"{part}_total"]
                assert abs(share - 1 / shard_ranks) < 0.02, (name, part, share)
    assert_close_losses(ranks[0]["dp2_cp2"]["losses"], reference.losses, 1e-5)

    # Its step-6 checkpoint damaged (flipped bytes in one rank's shard file: the checksums find it), it
    # resumes on 2 ranks (DP 1 x CP 2) from step 3: the uninterrupted run's last 3 steps and final weights.
    resumed = tmp_path / "resumed"
    shutil.copytree(tmp_path / "dp2_cp2", resumed)
    checkpoints = resumed / "train" / "checkpoints"
    shard = checkpoints / "step_0000006" / "dcp" / "__3_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 16] = bytes(
        b ^ 0xFF for b in data[len(data) // 2 : len(data) // 2 + 16]
    )
    shard.write_bytes(bytes(data))
    shutil.rmtree(resumed / "train" / "final")
    again = spawn(2, [("resumed", config(resumed, cp=2, steps=6))], tmp_path)
    assert_close_losses(again[0]["resumed"]["losses"], reference.losses[3:], 1e-5)
    assert_same_weights(weights(resumed, 6), weights(tmp_path / "ref", 6), 1e-5)
    assert [c.step for c in list_checkpoints(checkpoints)] == [6, 3]
    assert (checkpoints / "step_0000006.damaged" / "dcp" / "__3_0.distcp").read_bytes() == bytes(data)

    # The export written by the 2 sharded ranks opens in transformers with the trained model's logits.
    final = resumed / "train" / "final"
    hf = transformers.AutoModelForCausalLM.from_pretrained(final, dtype=torch.float32).eval()
    ours = Transformer(ModelConfig.from_hf(json.loads((final / "config.json").read_text())))
    ours.load_state_dict(weights(resumed, 6))
    ids = torch.randint(0, ours.config.vocab_size, (1, 200), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        theirs = hf(input_ids=ids).logits[0]
        mine = ours.logits(
            ours(ids[0], torch.arange(200), torch.arange(200), torch.zeros(200, dtype=torch.long))
        )
    assert (theirs - mine).abs().max().item() <= 1e-5
    assert hf.config.max_position_embeddings == SEQ_LEN
    tokenizer = transformers.AutoTokenizer.from_pretrained(final)
    text = "Long documents, packed."
    from tokenizers import Tokenizer

    assert (
        tokenizer(text, add_special_tokens=False)["input_ids"]
        == Tokenizer.from_file(str(packed / "tokenizer.json")).encode(text, add_special_tokens=False).ids
    )
    assert tokenizer.eos_token is not None and tokenizer.model_max_length == SEQ_LEN
