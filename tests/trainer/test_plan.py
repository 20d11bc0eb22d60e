"""``longctx plan`` against worked examples computed by hand in each test (never by the planner's helpers)."""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import pytest

from longctx.cli import main
from longctx.core.errors import ConfigError
from longctx.trainer.planning import flops as flop_model
from longctx.trainer.planning import plan
from longctx.trainer.planning import report as plan_report

KiB, GiB = 1024, 1024**3

# A toy shape small enough to count by hand: h=64, i=176, 2 layers, 4 query heads and 2 KV heads of 16.
TOY_CONFIG = {
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 176,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 100,
    "tie_word_embeddings": False,
}


@pytest.fixture
def toy() -> plan.ModelShape:
    return plan.ModelShape.from_hf(TOY_CONFIG, "toy")


def test_llama3_70b_kv_cache_is_320_kib_per_token_and_40_gib_at_128k() -> None:
    model = plan.load_model_shape("llama-3-70b")
    # 2 (K, V) x 80 layers x 8 KV heads x 128 dims x 2 bytes
    assert plan.kv_cache_bytes_per_token(model, 2) == 2 * 80 * 8 * 128 * 2 == 327_680 == 320 * KiB
    assert 131_072 * plan.kv_cache_bytes_per_token(model, 2) == 40 * GiB
    assert 131_072 * plan.kv_cache_bytes_per_token(model, 1) == 20 * GiB
    assert 131_072 * plan.kv_cache_bytes_per_token(model, 0.5) == 10 * GiB
    at_128k = plan.plan_length(model, 131_072, plan.RunSettings(cp=8)).kv_cache_bytes
    assert at_128k == {"fp16": 40 * GiB, "fp8": 20 * GiB, "fp4": 10 * GiB}


def test_llama3_8b_has_8_03b_parameters() -> None:
    model = plan.load_model_shape("Llama-3-8B")  # preset names are case-insensitive
    per_layer = 4096 * 4096 + 2 * 4096 * 1024 + 4096 * 4096 + 3 * 4096 * 14336 + 2 * 4096
    expected = 32 * per_layer + 4096 + 2 * 128256 * 4096
    assert expected == 8_030_261_248
    assert plan.param_count(model) == expected
    assert plan.param_count(model) == pytest.approx(8.03e9, rel=0.01)
    assert flop_model.matmul_param_count(model) == expected - 128256 * 4096 - (2 * 32 + 1) * 4096


def test_llama2_7b_has_6_74b_parameters() -> None:
    """The preset of Fu et al.'s base model (configs/recipes/fu_128k.yaml): multi-head attention (32
    KV heads), a 32000-token vocabulary, and the 6,738,415,616 parameters of Llama-2-7b-hf."""
    model = plan.load_model_shape("llama-2-7b")
    per_layer = 4 * 4096 * 4096 + 3 * 4096 * 11008 + 2 * 4096
    expected = 32 * per_layer + 4096 + 2 * 32000 * 4096
    assert expected == 6_738_415_616
    assert plan.param_count(model) == expected
    assert model.num_kv_heads == model.num_heads == 32


def test_405b_parameters() -> None:
    assert plan.param_count(plan.load_model_shape("llama-3.1-405b")) == pytest.approx(405.85e9, rel=1e-3)


def test_layer_flops_of_a_toy_config(toy: plan.ModelShape) -> None:
    # projections: 2 * 64 * (64 q + 32 k + 32 v + 64 o); MLP: 2 * 3 * 64 * 176
    flops = plan.layer_flops(toy, 128, causal=False)
    assert flops.projections == 24_576
    assert flops.mlp == 67_584
    assert flops.attention == 2 * 2 * 128 * 64 == 32_768  # QK^T and PV over 128 keys, 4 heads x 16 dims
    assert plan.layer_flops(toy, 128).attention == 16_384  # causal: 64 keys on average
    # forward per token: 2 layers x (24576 + 67584 + 16384) + logits 2 * 64 * 100
    assert flop_model.forward_flops_per_token(toy, 128) == 2 * 108_544 + 12_800


def test_crossover_is_about_six_times_hidden_for_llama_shapes(toy: plan.ModelShape) -> None:
    # toy: (64 * (64 + 32) + 1.5 * 64 * 176) / 64 = 96 + 264 tokens
    assert plan.crossover_length(toy) == 360
    assert plan.crossover_length(toy, causal=True) == 720
    for name in ("llama-3-8b", "llama-3-70b", "llama-3.1-405b"):
        model = plan.load_model_shape(name)
        assert plan.crossover_length(model) / model.hidden_size == pytest.approx(6.0, rel=0.1), name
    # L* / h = 1 + (KV heads / query heads) + 1.5 i / h
    assert plan.crossover_length(plan.load_model_shape("llama-3-8b")) == (1 + 8 / 32 + 1.5 * 3.5) * 4096
    assert plan.crossover_length(plan.load_model_shape("llama-3-70b")) == (1 + 8 / 64 + 1.5 * 3.5) * 8192
    assert (
        plan.crossover_length(plan.load_model_shape("llama-3.1-405b")) == (1 + 8 / 128 + 1.5 * 3.25) * 16384
    )


def test_activation_bytes_with_and_without_flash(toy: plan.ModelShape) -> None:
    # bf16: 4h (norm inputs/outputs) + 2q + 2k (Q, K, V, attention output) + 4i (SwiGLU) elements,
    # plus 4 fp32 log-sum-exps with flash, or 4 heads x 128 bf16 probabilities without.
    common = 2 * (4 * 64 + 2 * 64 + 2 * 32 + 4 * 176)
    assert common == 2_304
    assert plan.activation_bytes_per_token(toy, 128, flash=True) == common + 4 * 4
    assert plan.activation_bytes_per_token(toy, 128, flash=False) == common + 2 * 4 * 128
    row = plan.plan_length(toy, 128, plan.RunSettings())
    assert row.activation_flash_bytes == 128 * 2_320
    assert row.activation_noflash_bytes == 128 * 3_328


def test_ring_bytes_per_step_of_a_toy_config(toy: plan.ModelShape) -> None:
    # 1024 tokens over 4 ranks: blocks of 256 tokens; K and V of 2 heads x 16 dims in bf16
    step = plan.ring_step(toy, 1024, 4, link_bytes_per_s=1e9, achieved_flops=1e12)
    assert step.block_tokens == 256
    assert step.send_bytes == 2 * 256 * 32 * 2 == 32_768
    assert step.forward_flops == 2 * 256 * 256 * 64  # half of 4 b^2 q: causal zigzag
    assert step.forward_comm_s == 32_768 / 1e9
    assert step.backward_comm_s == 3 * 32_768 / 1e9  # the block again plus its fp32 dK/dV
    assert plan.ring_step(toy, 1024, 1, link_bytes_per_s=1e9, achieved_flops=1e12).send_bytes == 0


def test_overlap_threshold_for_toy_numbers(toy: plan.ModelShape) -> None:
    link, achieved = 25e9, 100e12
    # forward: 2 b^2 q / F >= 2 b k 2 / B  ->  b >= k * 2 * F / (q * B) = 32 * 2 * 4000 / 64 = 4000
    forward = plan.overlap_min_block(toy, link_bytes_per_s=link, achieved_flops=achieved, backward=False)
    assert forward == pytest.approx(4000)
    # backward: 2.5 * 2 b^2 q / F >= 2 b k (2 + 4) / B  ->  b >= 32 * 6 * 4000 / (2.5 * 2 * 64) = 4800
    backward = plan.overlap_min_block(toy, link_bytes_per_s=link, achieved_flops=achieved, backward=True)
    assert backward == pytest.approx(4800)
    # at the threshold compute and transfer take equal time; one block size below, transfer is exposed
    at = plan.ring_step(toy, 4 * 4800, 4, link_bytes_per_s=link, achieved_flops=achieved)
    assert at.min_block_tokens == pytest.approx(4800)
    assert at.backward_compute_s == pytest.approx(at.backward_comm_s) and at.hidden
    below = plan.ring_step(toy, 4 * 4792, 4, link_bytes_per_s=link, achieved_flops=achieved)
    assert not below.hidden and below.backward_compute_s < below.backward_comm_s


def test_overlap_threshold_reduces_to_ring_attentions_f_over_b() -> None:
    # multi-head attention, full (non-causal) blocks, bf16: 4 b^2 q / F = 2 b q 2 / B  ->  b = F / B
    mha = plan.ModelShape.from_hf({**TOY_CONFIG, "num_key_value_heads": 4}, "mha")
    b = plan.overlap_min_block(
        mha, link_bytes_per_s=50e9, achieved_flops=400e12, backward=False, causal=False
    )
    assert b == pytest.approx(400e12 / 50e9) == pytest.approx(8000)
    assert plan.ring_step_flops(mha, 8000, causal=False) / 400e12 == pytest.approx(
        plan.kv_block_bytes(mha, 8000) / 50e9
    )


def test_rank_memory(toy: plan.ModelShape) -> None:
    """FSDP2 over 2 ranks, no checkpointing: every part counted by hand for the toy shape."""
    params = 2 * (64 * 192 + 3 * 64 * 176 + 2 * 64) + 64 + 2 * 100 * 64
    assert params == 105_280
    memory = plan.rank_memory(toy, 1024, 4, state_shards=2)
    # per token a block saves c(2q + 2k + 4i) + 4a + 2(4h + rh + 4) + 2ch (bf16 residual under FSDP: each
    # norm keeps a float32 copy of its input, its bf16 normalized value and a float32 statistic; the norms'
    # outputs are the projections' inputs; the output projection's input is the attention output itself)
    saved = 2 * 896 + 16 + 2 * (4 * 64 + 2 * 64 + 4) + 2 * 2 * 64
    assert saved == 2_840
    held = 256 * saved  # one block, 256 tokens per rank
    # backward's start holds more than its end: both blocks' activations and the output projection's gradient
    assert 2 * held + 4 * 6_400 / 2 > held + 4 * params / 2
    assert memory.model_states == 12 * params / 2 + 4 * 6_400 / 2
    # plus the block in backward's gradients: MLP gate, up, product 3ci and the block's input and output 2rh
    assert memory.activations == 2 * held + 256 * (2 * 3 * 176 + 2 * 2 * 64)
    assert memory.ring_buffers == 2 * (2 * 256 * 32 * 2) + 2 * (2 * 256 * 32 * 4)
    assert memory.optimizer_step == 20 * params / 2
    assert memory.total == memory.backward
    recomputed = plan.rank_memory(toy, 1024, 4, state_shards=2, activation_checkpointing=True)
    # with recomputation a block holds only its input, 2h: every gradient outweighs both blocks' inputs,
    # so the peak is backward's end, with one block's input left
    assert 256 * 2 * 64 + 4 * params / 2 > 2 * 256 * 2 * 64 + 4 * 6_400 / 2
    assert recomputed.model_states == 16 * params / 2
    assert recomputed.activations == 256 * 2 * 64 + 256 * (saved + 2 * 3 * 176 + 2 * 2 * 64)


def test_sharded_rank_memory_by_hand(toy: plan.ModelShape) -> None:
    """FSDP2 over 4 ranks, selective checkpointing: every part counted by hand for the toy shape."""
    params = 105_280
    block = 64 * 192 + 3 * 64 * 176 + 2 * 64  # h(2q + 2k) + 3hi + 2h
    memory = plan.rank_memory(toy, 1024, 4, state_shards=4, activation_checkpointing="selective")
    assert memory.model_states == 12 * params / 4 + 4 * 6_400 / 4
    # two blocks and the output projection, gathered in bf16 with bf16 gradients and fp32 reduce buffers
    assert memory.gathered_params == (2 * block + 100 * 64) * (2 + 2 + 4)
    # per token per layer: input rh + the outputs of its matmuls and attention c(2q + 2k + 2h + 2i) + fp32
    # lse 4a, plus one layer's saved activations (2_840 bytes per token) and gradients while recomputed
    kept = 2 * 64 + 2 * (2 * 64 + 2 * 32 + 2 * 64 + 2 * 176) + 4 * 4
    assert memory.activations == 2 * 256 * kept + 256 * (2_840 + 1_312)
    # all 256 tokens of the rank fit one chunk: fp32 logits and gradient plus the bf16 product
    assert memory.logits == 256 * 100 * (4 + 4 + 2)
    assert memory.total == pytest.approx(
        memory.model_states
        + memory.gathered_params
        + memory.activations
        + memory.logits
        + memory.ring_buffers
    )
    fp32 = plan.rank_memory(toy, 1024, 4, activation_checkpointing="none", compute_bytes=4)
    # float32 throughout: c = r = 4 in the per-token terms of test_rank_memory
    saved = 4 * 896 + 16 + 2 * (4 * 64 + 4 * 64 + 4) + 2 * 4 * 64
    assert fp32.gathered_params == 0
    assert fp32.activations == 2 * 256 * saved + 256 * (4 * 3 * 176 + 4 * 2 * 64)


def test_one_unsharded_process_keeps_a_float32_residual_stream(toy: plan.ModelShape) -> None:
    """bf16 autocast over float32 parameters: block inputs, norms and their gradients are float32 (r = 4),
    and autocast casts the norms' outputs to bf16 once for each of the five input projections (5h more)."""
    autocast = plan.rank_memory(toy, 1024, 1, activation_checkpointing="full")
    sharded = plan.rank_memory(toy, 1024, 1, state_shards=2, activation_checkpointing="full")
    saved = 2 * 896 + 16 + 2 * (4 * 64 + 4 * 64 + 4) + 2 * 5 * 64
    # at backward's end (every gradient outweighs the other block's input): one block's float32 input for
    # 1024 tokens, the recomputed block's saved activations and gradients
    assert autocast.activations == 1024 * 4 * 64 + 1024 * (saved + 2 * 3 * 176 + 4 * 2 * 64)
    assert autocast.activations > sharded.activations
    assert plan.rank_memory(toy, 1024, 1, activation_checkpointing="full", residual_bytes=2).activations == (
        1024 * 2 * 64 + 1024 * (2_840 + 1_312)
    )


def test_the_peak_moves_to_the_end_of_backward_and_to_the_optimizer_step(toy: plan.ModelShape) -> None:
    """Short windows: every gradient outweighs the blocks' activations (the peak is backward's end), and
    AdamW's step, 20 bytes per parameter, outweighs all of backward."""
    from longctx.trainer.planning.memory import working_bytes_per_token

    params = 105_280
    memory = plan.rank_memory(toy, 8, 1, activation_checkpointing="full")
    held = 8 * 4 * 64  # one block's float32 input for 8 tokens
    assert memory.model_states == 12 * params + 4 * params
    assert memory.activations == held + 8 * working_bytes_per_token(toy, "full", 2, 4)
    assert memory.backward < memory.optimizer_step == 20 * params == memory.total


def test_a_gpu_that_is_too_small_is_refused_with_the_breakdown(toy: plan.ModelShape) -> None:
    from longctx.trainer.planning.memory import check_fits, usable_bytes

    memory = plan.rank_memory(toy, 1024, 4, state_shards=4)
    assert usable_bytes(80e9) == 0.9 * 80e9 - 2 * GiB
    check_fits(memory, 80e9, where="an 80 GB GPU", settings="toy")
    with pytest.raises(
        ConfigError,
        match=r"does not fit a tiny GPU: about .* per rank \(weights, AdamW moments and gradients "
        r".*activations.*optimizer step",
    ):
        check_fits(memory, memory.total, where="a tiny GPU", settings="toy")  # the headroom is missing


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("80GB", 80e9),
        ("80GiB", 80 * GiB),
        ("141gb", 141e9),
        ("141G", 141e9),
        ("80", 80e9),  # a bare number is GB, as GPUs are sold
        ("80 GB", 80e9),
        ("0.5T", 5e11),
        ("81559MiB", 81559 * 1024**2),  # as nvidia-smi reports an H100's memory
        ("8e10B", 8e10),
        ("1024B", 1024),
    ],
)
def test_parse_bytes(text: str, value: float) -> None:
    assert plan.parse_bytes(text) == value


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("80 bananas", "bad memory size '80 bananas'"),
        ("-80", "bad memory size '-80'"),
        ("0", "bad memory size '0'"),
        ("inf", "bad memory size 'inf'"),
        ("nan", "bad memory size 'nan'"),
        ("80G B", "bad memory size '80G B'"),
        ("80000000000", "more than any GPU holds (at most 2 TB here); a bare number is GB"),  # bytes as GB
        ("80TB", "memory size '80TB' is 8e+13 bytes, more than any GPU holds"),  # TB for GB
        ("2.1T", "more than any GPU holds"),
        ("2", "leaves nothing for training"),  # 2 GB: less than the reserve
    ],
)
def test_nonsense_gpu_memory_is_refused_in_one_line(text: str, message: str, capsys) -> None:
    argv = ["plan", "--model", "llama-3-8b", "--lengths", "64K", "--cp", "8", "--gpu-memory", text]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_bare_gpu_memory_is_gb_and_what_does_not_fit_says_what_would(capsys) -> None:
    """The issue's command: 80 is 80 GB; 128K at cp 8 does not fit without checkpointing, and the plan
    names the smallest change of each kind that does, each checked here against the memory model
    directly."""
    from longctx.trainer.planning.memory import rank_memory, usable_bytes

    argv = ["plan", "--model", "llama-3-8b", "--lengths", "32K,128K", "--cp", "8", "--gpu-memory", "80"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "fits a 74.5 GiB GPU when the total stays under 65.1 GiB" in out  # 80e9 bytes, 90% less 2 GiB
    assert [line.split()[-2:] for line in out.splitlines() if line.startswith("fits ")] == [["yes", "NO"]]
    model, usable = plan.load_model_shape("llama-3-8b"), usable_bytes(80e9)

    def total(cp: int, shards: int, mode: str) -> float:
        return rank_memory(model, 131_072, cp, state_shards=shards, activation_checkpointing=mode).total

    assert total(8, 8, "none") > usable and total(8, 8, "selective") > usable
    assert total(8, 8, "full") <= usable  # the smallest checkpointing change
    # no ring between 8 and 16 splits 128K into 2 x cp equal chunks; cp 16 needs 16 GPUs and fits
    assert [cp for cp in range(9, 16) if 131_072 % (2 * cp) == 0] == []
    assert total(16, 16, "none") <= usable
    # more GPUs at cp 8 only shard the model state: without checkpointing the activations alone are
    # too large; with selective checkpointing 64 GPUs hold them (the fewest, by a plain scan)
    assert total(8, 65_536, "none") > usable
    selective = next(gpus for gpus in range(16, 4096, 8) if total(8, gpus, "selective") <= usable)
    assert selective == 64
    (line,) = [line for line in out.splitlines() if "does not fit" in line]
    assert line == (
        "128K does not fit 74.5 GiB per GPU; it would with cp 16 on 16 GPUs "
        f"({plan_report.human_bytes(total(16, 16, 'none'))} per rank), activation checkpointing selective "
        f"and 64 GPUs at cp 8 ({plan_report.human_bytes(total(8, 64, 'selective'))} per rank) or activation "
        f"checkpointing full ({plan_report.human_bytes(total(8, 8, 'full'))} per rank)"
    )


def test_auto_needs_a_change_only_when_even_full_checkpointing_does_not_fit(capsys) -> None:
    """With ``auto`` a length that fits in some mode gets no line (128K at cp 8 fits with full
    checkpointing); one that fits in none (1M) gets a line naming only a larger cp or more GPUs, judged
    in the mode ``auto`` would choose there, each checked against the memory model directly."""
    from longctx.trainer.models.shape import ACTIVATION_CHECKPOINTING
    from longctx.trainer.planning.memory import rank_memory, usable_bytes

    argv = ["plan", "--model", "llama-3-8b", "--lengths", "128K,1M", "--cp", "8", "--gpu-memory", "80"]
    assert main([*argv, "--activation-checkpointing", "auto"]) == 0
    out = capsys.readouterr().out
    model, usable = plan.load_model_shape("llama-3-8b"), usable_bytes(80e9)

    def total(length: int, cp: int, shards: int, mode: str) -> float:
        return rank_memory(model, length, cp, state_shards=shards, activation_checkpointing=mode).total

    assert [line.split()[-2:] for line in out.splitlines() if line.startswith("fits ")] == [["yes", "NO"]]
    assert total(131_072, 8, 8, "full") <= usable < total(131_072, 8, 8, "selective")
    assert all(total(1_048_576, 8, 8, mode) > usable for mode in ACTIVATION_CHECKPOINTING)
    # more GPUs at cp 8 cannot hold 1M's activations even with full checkpointing; cp 16 is the next ring
    assert total(1_048_576, 8, 65_536, "full") > usable
    assert [cp for cp in range(9, 16) if 1_048_576 % (2 * cp) == 0] == []
    chosen = next(mode for mode in ACTIVATION_CHECKPOINTING if total(1_048_576, 16, 16, mode) <= usable)
    (line,) = [line for line in out.splitlines() if "does not fit" in line]
    assert line == (
        f"1M does not fit 74.5 GiB per GPU; it would with cp 16 on 16 GPUs, auto checkpointing {chosen} "
        f"({plan_report.human_bytes(total(1_048_576, 16, 16, chosen))} per rank)"
    )


def test_a_change_under_auto_is_judged_in_the_mode_auto_chooses_there() -> None:
    """Llama-3-8B on 262,146-token windows (2 x 3 x 43,691) from cp 1 on 8 GPUs of 80 GB with ``auto``:
    no mode fits at cp 1 however many GPUs shard the state; at cp 3, the next ring that splits the
    window, full checkpointing fits once the state is sharded over 12 GPUs (the fewest, by a plain
    scan), far fewer than cp 43,691 needs, and the change says so, with that mode's total."""
    from longctx.trainer.models.shape import ACTIVATION_CHECKPOINTING
    from longctx.trainer.planning.fit import Layout, smallest_changes
    from longctx.trainer.planning.memory import rank_memory, usable_bytes

    model, length, usable = plan.load_model_shape("llama-3-8b"), 262_146, usable_bytes(80e9)

    def total(cp: int, gpus: int, mode: str) -> float:
        return rank_memory(model, length, cp, state_shards=gpus, activation_checkpointing=mode).total

    def chosen(cp: int, gpus: int) -> str | None:
        return next((mode for mode in ACTIVATION_CHECKPOINTING if total(cp, gpus, mode) <= usable), None)

    assert [cp for cp in range(2, 43_692) if length % (2 * cp) == 0] == [3, 43_691]
    assert total(1, 65_536, "full") > usable
    gpus = next(n for n in range(9, 4096, 3) if chosen(3, n) is not None)
    assert gpus == 12 and chosen(3, gpus) == "full"
    layout = Layout(cp=1, gpus=8, dp_replicate=1, activation_checkpointing="auto")
    (change,) = smallest_changes(model, length, layout, 80e9)
    assert change.kinds == ("cp",) and change.mode == "full"
    assert change.describe() == "cp 3 on 12 GPUs, auto checkpointing full"
    assert change.total_bytes == total(3, 12, "full")


def test_the_fewest_more_gpus_match_a_linear_scan() -> None:
    """More GPUs at the same ring shard the model state further: the binary search finds the GPU
    count a plain scan over every multiple of cp x replicas finds."""
    from longctx.trainer.planning.fit import Layout, smallest_changes
    from longctx.trainer.planning.memory import rank_memory, usable_bytes

    model = plan.load_model_shape("llama-3-70b")
    for cp, replicas in ((1, 1), (2, 2)):
        layout = Layout(cp=cp, gpus=8, dp_replicate=replicas, activation_checkpointing="full")
        (more,) = [c for c in smallest_changes(model, 8192, layout, 80e9) if c.kinds == ("gpus",)]
        ring = cp * replicas
        scan = next(
            gpus
            for gpus in range(8 + ring, 4096, ring)
            if rank_memory(
                model, 8192, cp, state_shards=gpus // replicas, activation_checkpointing="full"
            ).total
            <= usable_bytes(80e9)
        )
        assert more.layout.gpus == scan and more.layout.cp == cp, (cp, replicas)
        assert more.describe() == f"{scan} GPUs at cp {cp}"


def test_changes_together_when_none_fits_alone() -> None:
    """Llama-3-8B on 131,074-token windows and 141 GB GPUs: 65,537 is prime, so no larger ring splits
    the window; one GPU cannot hold the AdamW state whatever the checkpointing, and more GPUs cannot
    hold the activations without full checkpointing. The plan pairs full checkpointing with the fewest
    GPUs a plain scan finds."""
    from longctx.trainer.planning.fit import Layout, smallest_changes
    from longctx.trainer.planning.memory import rank_memory, usable_bytes

    model, length, usable = plan.load_model_shape("llama-3-8b"), 131_074, usable_bytes(141e9)

    def total(shards: int, mode: str) -> float:
        return rank_memory(model, length, 1, state_shards=shards, activation_checkpointing=mode).total

    assert all(total(1, mode) > usable for mode in ("none", "selective", "full"))
    assert total(65_536, "none") > usable and total(65_536, "selective") > usable
    scan = next(gpus for gpus in range(2, 4096) if total(gpus, "full") <= usable)
    layout = Layout(cp=1, gpus=1, dp_replicate=1, activation_checkpointing="none")
    (change,) = smallest_changes(model, length, layout, 141e9)
    assert change.describe() == f"activation checkpointing full and {scan} GPUs at cp 1"
    assert change.total_bytes == total(scan, "full")


def test_checkpointing_with_a_larger_cp_on_more_gpus_is_offered_with_the_changes_of_one_kind(capsys) -> None:
    """The issue's plan: Llama-3-70B at 128K on 80 GB GPUs from cp 8. A larger cp alone fits only at
    cp 128 on 128 GPUs, but full checkpointing with cp 16 on 32 GPUs fits at 61.4 GiB: the plan
    offers, for each checkpointing mode, the fewest GPUs (then the smallest cp) a larger ring needs
    and the fewest GPUs at cp 8, each found here by a plain scan over the memory model."""
    from longctx.trainer.models.shape import ACTIVATION_CHECKPOINTING
    from longctx.trainer.planning.memory import rank_memory, usable_bytes

    model, length, usable = plan.load_model_shape("llama-3-70b"), 131_072, usable_bytes(80e9)

    def total(cp: int, gpus: int, mode: str) -> float:
        return rank_memory(model, length, cp, state_shards=gpus, activation_checkpointing=mode).total

    rings = [cp for cp in range(9, 65_537) if length % (2 * cp) == 0]

    def scan(mode: str, cps: list[int]) -> tuple[int, int] | None:
        """(GPUs, cp) of the fewest GPUs (then the smallest cp) among ``cps`` that fit in ``mode``."""
        found = [
            (gpus, cp)
            for cp in cps
            for gpus in range(-(-8 // cp) * cp, 1025, cp)
            if total(cp, gpus, mode) <= usable
        ]
        return min(found) if found else None

    assert all(total(8, 8, mode) > usable for mode in ACTIVATION_CHECKPOINTING)  # nothing alone at cp 8

    def option(what: str, change: str, cp: int, gpus: int, mode: str) -> str:
        return f"{what}{change} ({plan_report.human_bytes(total(cp, gpus, mode))} per rank)"

    options = []
    for mode in ACTIVATION_CHECKPOINTING:
        what = "" if mode == "none" else f"activation checkpointing {mode} and "
        ring, same = scan(mode, rings), scan(mode, [8])
        if ring is not None:
            options.append(option(what, f"cp {ring[1]} on {ring[0]} GPUs", ring[1], ring[0], mode))
        if same is not None:
            options.append(option(what, f"{same[0]} GPUs at cp 8", 8, same[0], mode))
    assert "activation checkpointing full and cp 16 on 32 GPUs (61.4 GiB per rank)" in options
    assert (
        main(["plan", "--model", "llama-3-70b", "--lengths", "128K", "--cp", "8", "--gpu-memory", "80"]) == 0
    )
    (line,) = [line for line in capsys.readouterr().out.splitlines() if "does not fit" in line]
    assert (
        line
        == "128K does not fit 74.5 GiB per GPU; it would with "
        + ", ".join(options[:-1])
        + " or "
        + options[-1]
    )


def test_the_llama3_8b_64k_config_fits_8_gpus_of_80_gb(capsys: pytest.CaptureFixture) -> None:
    """The shipped real-run example: sharded over its 8 ranks it fits, as one replica per rank it does not."""
    config = str(Path(__file__).parents[2] / "configs" / "llama3_8b_64k.yaml")
    argv = ["plan", "--config", config, "--model", "llama-3-8b", "--gpus", "8", "--gpu-memory", "80GB"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "sharded over 8 ranks, activation checkpointing selective" in out
    assert [line.split()[-1] for line in out.splitlines() if line.startswith("fits ")] == ["yes"]
    assert main([*argv, "--state-shards", "1"]) == 0
    assert [
        line.split()[-1] for line in capsys.readouterr().out.splitlines() if line.startswith("fits ")
    ] == ["NO"]


def test_auto_checkpointing_prints_the_cheapest_mode_that_fits(capsys: pytest.CaptureFixture) -> None:
    """``auto`` per length: each printed mode fits 80 GB, and every mode that recomputes less does not."""
    from longctx.trainer.models.shape import ACTIVATION_CHECKPOINTING
    from longctx.trainer.planning.memory import fits, rank_memory

    lengths = [4096, 8192, 65536, 262144]
    argv = ["plan", "--model", "llama-3-8b", "--lengths", "4K,8K,64K,256K", "--gpus", "8"]
    assert main([*argv, "--gpu-memory", "80GB", "--activation-checkpointing", "auto"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("activation checkpointing "))
    chosen = row.split()[2:]
    shape = plan.load_model_shape("llama-3-8b")
    for length, mode in zip(lengths, chosen, strict=True):
        order = ACTIVATION_CHECKPOINTING.index(mode)
        memories = [
            rank_memory(shape, length, 1, state_shards=8, activation_checkpointing=m)
            for m in ACTIVATION_CHECKPOINTING
        ]
        assert fits(memories[order], 80e9) or mode == "full", (length, mode)
        assert not any(fits(memory, 80e9) for memory in memories[:order]), (length, mode)
    assert chosen[0] == "none" and chosen[-1] == "full" and len(set(chosen)) == 3, chosen
    # without a GPU's memory auto cannot tell what fits: it plans the safe mode
    assert main([*argv, "--activation-checkpointing", "auto"]) == 0
    row = next(
        line for line in capsys.readouterr().out.splitlines() if line.startswith("activation checkpointing ")
    )
    assert row.split()[2:] == ["full"] * 4


def test_wall_clock_for_a_toy_budget(toy: plan.ModelShape) -> None:
    # 6 x (2 layers x (64 * 192 + 3 * 64 * 176) + 64 * 100) + 3 x 2 layers x 16384 causal attention
    per_token = 6 * 98_560 + 3 * 2 * 16_384
    assert per_token == 689_664
    seconds = plan.train_seconds(toy, 128, tokens=1e12, gpus=8, peak_flops=100e12, mfu=0.5)
    assert seconds == pytest.approx(689_664 * 1e12 / (8 * 100e12 * 0.5)) == pytest.approx(1724.16)


@pytest.mark.parametrize(
    ("text", "value"), [("8192", 8192), ("8K", 8192), ("128k", 131_072), ("1M", 1_048_576), ("0.5K", 512)]
)
def test_parse_length(text: str, value: int) -> None:
    assert plan.parse_length(text) == value


@pytest.mark.parametrize(("text", "value"), [("20B", 2e10), ("1.5T", 1.5e12), ("300M", 3e8), ("1000", 1e3)])
def test_parse_count(text: str, value: float) -> None:
    assert plan.parse_count(text) == value


@pytest.mark.parametrize("text", ["", "12Q", "K", "-8K", "0", "1.5", "8K,,abc"])
def test_bad_lengths_are_config_errors(text: str) -> None:
    with pytest.raises(ConfigError):
        plan.parse_lengths(text)


def test_config_json_by_folder_or_file(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**TOY_CONFIG, "num_key_value_heads": None}))
    by_folder = plan.load_model_shape(str(tmp_path))
    by_file = plan.load_model_shape(str(tmp_path / "config.json"))
    assert dataclasses.replace(by_folder, name="toy") == dataclasses.replace(by_file, name="toy")
    assert by_folder.num_kv_heads == 4 and by_folder.head_dim == 16  # MHA default, hidden / heads


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"hidden_size": None}, "lacks hidden_size"),
        ({"num_key_value_heads": 3}, "not a multiple"),
        ({"num_local_experts": 8}, "mixture-of-experts"),
        ({"intermediate_size": 0}, "positive integers"),
    ],
)
def test_bad_configs(change: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        plan.ModelShape.from_hf({**TOY_CONFIG, **change}, "bad")


def test_cli_writes_one_csv_row_per_length(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "plan.csv"
    argv = ["plan", "--model", "llama-3-70b", "--lengths", "8K,32K,128K,1M", "--cp", "8", "--csv", str(out)]
    assert main([*argv, "--gpus", "256", "--tokens", "20B", "--peak-tflops", "989", "--mfu", "0.4"]) == 0
    printed = capsys.readouterr().out
    assert "fp16 320 KiB" in printed and "40 GiB" in printed and "wall-clock" in printed
    with out.open() as handle:
        rows = list(csv.DictReader(handle))
    assert [int(r["length_tokens"]) for r in rows] == [8192, 32768, 131072, 1048576]
    assert int(rows[2]["kv_cache_fp16_bytes"]) == 40 * GiB
    assert int(rows[2]["ring_send_bytes_per_step"]) == 2 * 16384 * 8 * 128 * 2
    assert all(float(r["train_hours"]) > 0 for r in rows)


def test_cli_takes_a_config_path_and_omits_the_wall_clock(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    (tmp_path / "config.json").write_text(json.dumps(TOY_CONFIG))
    out = tmp_path / "toy.csv"
    assert main(["plan", "--model", str(tmp_path), "--lengths", "128,1K", "--csv", str(out)]) == 0
    with out.open() as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == 2 and "train_hours" not in rows[0]
    assert "wall-clock" not in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--model", "llama-9-1t", "--lengths", "8K"], "llama-3-70b"),
        (["--model", "llama-3-8b", "--lengths", "8Q"], "bad length '8Q'"),
        (["--model", "llama-3-8b", "--lengths", "1000", "--cp", "16"], "multiple of 2 x cp"),
        (
            ["--model", "llama-3-8b", "--lengths", "8K", "--cp", "8", "--gpus", "12"],
            "cp = 8 must divide --gpus = 12",
        ),
        (
            ["--model", "llama-3-8b", "--lengths", "8K", "--tokens", "1B"],
            "both a token budget and a GPU count",
        ),
        (["--model", "llama-3-8b", "--lengths", "8K", "--mfu", "1.5"], "MFU"),
    ],
)
def test_cli_user_errors_exit_2_without_traceback(
    extra: list[str], message: str, capsys: pytest.CaptureFixture
) -> None:
    assert main(["plan", *extra]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_the_staged_config_plans_every_stage(capsys: pytest.CaptureFixture) -> None:
    """``longctx plan --config`` on the staged recipe: one column per stage length, and a row per
    stage whose tokens per step, tokens, memory per rank and step time are worked out here from the
    config's own numbers (rows x length; 6 N_matmul + 6 n q L causal training FLOPs per token)."""
    import yaml

    path = Path(__file__).parents[2] / "configs" / "llama3_8b_128k_staged.yaml"
    stages = yaml.safe_load(path.read_text())["train"]["stages"]
    argv = ["plan", "--config", str(path), "--model", "llama-3-8b", "--gpus", "64", "--gpu-memory", "80GB"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    lengths = [s["seq_len"] for s in stages]
    header = next(line for line in out.splitlines() if line.startswith(" " * 10) and "K" in line)
    assert header.split() == [f"{n // 1024}K" for n in lengths]
    totals = next(line for line in out.splitlines() if line.startswith("rank: total")).split()[
        -2 * len(lengths) :
    ]
    table = out[out.index("stages (train.stages) on 64 GPUs") :].splitlines()
    model = plan.load_model_shape("llama-3-8b")
    n_matmul = flop_model.matmul_param_count(model)
    q = model.num_heads * model.head_dim
    tokens = 0
    for stage, row, total in zip(stages, table[2:], zip(totals[::2], totals[1::2]), strict=False):
        cells = row.split()
        rows, length = stage["global_batch_rows"], stage["seq_len"]
        per_token = 6 * n_matmul + 6 * model.num_layers * q * length  # PaLM 12 n q L, halved: causal
        step = rows * length * per_token / (64 * 989e12 * 0.4)
        # stage, length, RoPE (2 words), steps, rows/step, tokens/step, tokens, memory, fits, time/step
        assert cells[:4] == [
            str(stages.index(stage) + 1),
            f"{length // 1024}K",
            "llama3",
            f"x{stage['factor']:g}",
        ]
        assert cells[4:7] == [f"{stage['steps']:,}", f"{rows:,}", plan_report.human_count(rows * length)]
        assert " ".join(cells[8:10]) == " ".join(total) and cells[10] == "yes"  # its length's column
        assert " ".join(cells[11:13]) == plan_report.human_seconds(step)
        tokens += stage["steps"] * rows * length
    assert 0.99 * 800e9 <= tokens <= 1.01 * 800e9  # about 800B tokens, as the Llama 3 report says
    assert table[-1].startswith(f"total: {plan_report.human_count(tokens)} tokens")


RECIPES = Path(__file__).parents[2] / "configs" / "recipes"


@pytest.mark.parametrize(
    ("name", "model", "shape", "gpus", "rope", "paper_tokens"),
    [
        # Llama-3-8B: hidden 4096, KV dim 1024, MLP 14336, 32 layers, vocabulary 128256; ProLong's 20B
        ("prolong_64k.yaml", "llama-3-8b", (4096, 1024, 14336, 32, 128256), 8, "theta 8e+06", 20e9),
        # Llama-2-7B: hidden 4096, KV dim 4096 (no GQA), MLP 11008, 32 layers, vocabulary 32000; Fu's 5B
        ("fu_128k.yaml", "llama-2-7b", (4096, 4096, 11008, 32, 32000), 16, "theta 5e+06", 5e9),
    ],
)
def test_each_recipe_plans_its_stage_tokens_and_time(
    name: str,
    model: str,
    shape: tuple[int, int, int, int, int],
    gpus: int,
    rope: str,
    paper_tokens: float,
    capsys: pytest.CaptureFixture,
) -> None:
    """``longctx plan --config configs/recipes/<name> --gpus N``: a row per stage whose tokens and
    time per step and per stage are worked out here from the config's own numbers (rows x length
    tokens a step; 6 N_matmul + 6 n q L causal training FLOPs per token, N_matmul counted by hand);
    the stage's tokens are the paper's budget, and the pack's total is the stage's tokens."""
    import yaml

    path = RECIPES / name
    config = yaml.safe_load(path.read_text())
    stages = config["train"]["stages"]
    argv = ["plan", "--config", str(path), "--model", model, "--gpus", str(gpus), "--gpu-memory", "80GB"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    table = out[
        out.index(f"stages (train.stages) on {gpus} GPUs at 989 TFLOP/s peak x MFU 0.4:") :
    ].splitlines()
    hidden, kv, mlp, layers, vocab = shape
    n_matmul = layers * (2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * mlp) + vocab * hidden
    total_tokens = total_seconds = 0.0
    for number, (stage, row) in enumerate(zip(stages, table[2:], strict=False), start=1):
        rows, length, steps = stage["global_batch_rows"], stage["seq_len"], stage["steps"]
        per_token = 6 * n_matmul + 6 * layers * hidden * length  # causal: half of PaLM's 12 n q L
        step = rows * length * per_token / (gpus * 989e12 * 0.4)
        cells = row.split()
        width = len(rope.split())
        assert cells[: 2 + width] == [str(number), f"{length // 1024}K", *rope.split()]
        after = cells[2 + width :]  # steps, rows, tokens/step, tokens, memory (2), fits, time/step...
        assert after[:4] == [
            f"{steps:,}",
            f"{rows:,}",
            plan_report.human_count(rows * length),
            plan_report.human_count(steps * rows * length),
        ]
        assert after[6] == "yes"  # fits 80 GB, as the recipe's comments say
        times = f"{plan_report.human_seconds(step)} {plan_report.human_seconds(steps * step)}"
        assert " ".join(after[7:]) == " ".join(times.split())  # time per step and per stage
        total_tokens += steps * rows * length
        total_seconds += steps * step
    assert 0.95 * paper_tokens <= total_tokens <= 1.05 * paper_tokens
    assert 0.95 * total_tokens <= config["pack"]["mix_total_tokens"] <= 1.05 * total_tokens
    assert table[2 + len(stages)] == (
        f"total: {plan_report.human_count(total_tokens)} tokens, {plan_report.human_seconds(total_seconds)} "
        "of training"
    )
