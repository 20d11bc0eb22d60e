"""One FLOP model for the planner and the training metrics, and one torchrun launcher."""

from __future__ import annotations

import sys

import pytest
import torch

from longctx.trainer.launch import torchrun_command
from longctx.trainer.models.decoder import ModelConfig
from longctx.trainer.planning import flops, plan


def _tiny() -> ModelConfig:
    return ModelConfig.tiny(vocab_size=300, intermediate_size=172)


def test_training_flops_count_matmuls_and_attended_pairs() -> None:
    config = _tiny()
    h, i, n, a, g, d, v = 64, 172, 2, 4, 2, 16, 300
    matmul = n * (h * d * (2 * a + 2 * g) + 3 * h * i) + h * v  # q, k, v, o; gate, up, down; LM head
    assert flops.matmul_param_count(config.shape) == matmul
    lengths = [100, 28]  # two documents in a 128-token window
    pairs = sum(length * (length + 1) // 2 for length in lengths)
    expected = (
        6.0 * matmul * 128 + 12.0 * n * a * d * pairs
    )  # 2 FLOPs per multiply-add, backward = 2x forward
    assert flops.training_flops(config.shape, 128, pairs) == expected


def test_planner_uses_the_same_model() -> None:
    shape = plan.load_model_shape("llama-3-8b")
    for length in (8192, 65536):  # the planner's causal window: L / 2 keys per query
        assert plan.train_flops_per_token(shape, length) == flops.training_flops(shape, 1, length / 2)


def test_torchrun_command_runs_a_module_on_local_ranks() -> None:
    cmd = torchrun_command(4, "longctx.cli", ["train", "--config", "c.yaml"])
    assert cmd == [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node=4",
        "-m",
        "longctx.cli",
        "train",
        "--config",
        "c.yaml",
    ]
    with pytest.raises(ValueError, match="nproc"):
        torchrun_command(0, "longctx.cli", [])


def test_attention_flops_count_the_pairs_of_an_explicit_document_mask() -> None:
    lengths = [5, 1, 12, 1, 1, 20]
    mask = torch.zeros(40, 40, dtype=torch.bool)
    start = 0
    for length in lengths:  # block-diagonal causal mask, built from the lengths alone
        mask[start : start + length, start : start + length] = torch.ones(length, length).tril().bool()
        start += length
    assert flops.causal_pair_count(lengths) == int(mask.sum())
    q_dim = 4 * 16
    per_pair = 2 * 2 * q_dim  # QK^T and PV: one multiply-add (2 FLOPs) per pair and query width element
    assert flops.attention_flops(q_dim, int(mask.sum())) == per_pair * int(mask.sum())
