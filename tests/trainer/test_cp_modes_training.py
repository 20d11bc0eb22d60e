"""Training with each context-parallel mode (``train.cp_mode``) and layout (``train.cp_layout``) at
world 4, FSDP2 over the data-parallel ranks, against the same trainer in one process: three optimizer
steps give the reference's losses and weights at 1e-5 (fp32), for the own decoder (a Llama saved by
transformers) and for the transformers implementation with a family the own decoder cannot read (Qwen3).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from longctx import jobs
from longctx.config import parse_config
from tests.trainer.families import save_tiny
from tests.trainer.test_sharded import assert_close_losses, assert_same_weights, spawn, weights
from tests.trainer.test_train import train_config

pytest.importorskip("transformers")

LLAMA_RUNS: dict[str, dict[str, Any]] = {
    "allgather_dp2_cp2": {"cp": 2, "cp_mode": "allgather"},
    "ulysses_dp2_cp2": {"cp": 2, "cp_mode": "ulysses"},  # 2 query heads, 1 key/value head copied
    "hybrid_cp4": {"cp": 4, "cp_mode": "hybrid", "ulysses": 2},
    "ring_cp4_balanced": {"cp": 4, "cp_mode": "ring", "cp_layout": "balanced"},
    "allgather_cp4_zigzag": {"cp": 4, "cp_mode": "allgather", "cp_layout": "zigzag"},
}
QWEN3_RUNS: dict[str, dict[str, Any]] = {
    "qwen3_ulysses_dp2_cp2": {"cp": 2, "cp_mode": "ulysses"},
    "qwen3_hybrid_cp4": {"cp": 4, "cp_mode": "hybrid", "ulysses": 2},
    "qwen3_allgather_cp4": {"cp": 4, "cp_mode": "allgather"},
}


QWEN3_LR = 1e-4
"""AdamW turns float-reordering noise in near-zero gradients into steps of up to the learning rate: with
the transformers Qwen3 the ring itself lands 7e-5 from one process at 3e-3, so its runs take 1e-4, where
1e-5 bounds that noise and still catches a wrong gradient."""


def _config(packed: Path, output: Path, model: Path, lr: float = 3e-3, **train: Any) -> dict[str, Any]:
    settings = {
        "model": {"hf_path": str(model)},
        "global_batch_rows": 4,
        "steps": 3,
        "log": {"every": 1},
        "optim": {"lr": lr, "warmup_steps": 0, "min_lr_ratio": 1.0},
        "checkpoint": {"every": 3, "keep": 1},
        **train,
    }
    return train_config(packed, output, **settings)


@pytest.mark.slow
def test_every_cp_mode_trains_as_one_process(packed: Path, base_llama: Path, tmp_path: Path) -> None:
    qwen3 = save_tiny(tmp_path / "qwen3", "qwen3", vocab_size=320)
    references = {}
    for name, model, lr in (("llama", base_llama, 3e-3), ("qwen3", qwen3, QWEN3_LR)):
        references[name] = jobs.train(
            parse_config(_config(packed, tmp_path / f"ref_{name}", model, lr)), progress=False
        )
    runs = [(name, _config(packed, tmp_path / name, base_llama, **mesh)) for name, mesh in LLAMA_RUNS.items()]
    runs += [
        (name, _config(packed, tmp_path / name, qwen3, QWEN3_LR, **mesh)) for name, mesh in QWEN3_RUNS.items()
    ]
    ranks = spawn(4, runs, tmp_path)
    for name in [*LLAMA_RUNS, *QWEN3_RUNS]:
        family = "qwen3" if name.startswith("qwen3") else "llama"
        assert_close_losses(ranks[0][name]["losses"], references[family].losses, 1e-5)
        if family == "llama":  # the own decoder's checkpoints read back into one process
            assert_same_weights(weights(tmp_path / name, 3), weights(tmp_path / "ref_llama", 3), 1e-5)
        else:  # the transformers model's exports
            assert_same_weights(exported(tmp_path / name), exported(tmp_path / "ref_qwen3"), 1e-5)


def exported(output: Path) -> dict[str, torch.Tensor]:
    """The weights of a run's exported folder (``train/final``), in float32."""
    tensors: dict[str, torch.Tensor] = {}
    for file in sorted((output / "train" / "final").glob("*.safetensors")):
        tensors |= {name: t.float() for name, t in load_file(file).items()}
    assert tensors, f"no exported weights in {output}"
    return tensors
