"""RoPE: every scaling type against transformers' rope functions, config layouts, and per-token rotation."""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest
import torch

from longctx.trainer.models.rope import (
    RopeConfig,
    apply_rotary,
    inverse_frequencies,
    ntk_theta,
    rotary_cos_sin,
)
from longctx.trainer.parallel.zigzag import zigzag_indices

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding  # noqa: E402

MAX_POS = 256


def _factors(n: int, seed: int) -> list[float]:
    generator = torch.Generator().manual_seed(seed)
    return (1.0 + 3.0 * torch.rand(n, generator=generator)).tolist()


# (head_dim, theta, rope_parameters without rope_theta) for every type transformers has.
HF_CASES: list[tuple[int, float, dict[str, Any]]] = [
    (16, 10_000.0, {"rope_type": "default"}),
    (64, 500_000.0, {"rope_type": "default"}),
    (16, 10_000.0, {"rope_type": "linear", "factor": 2.0}),
    (64, 1_000_000.0, {"rope_type": "linear", "factor": 8.0}),
    (16, 10_000.0, {"rope_type": "dynamic", "factor": 2.0}),
    (64, 500_000.0, {"rope_type": "dynamic", "factor": 4.0}),
    (16, 10_000.0, {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}),
    (
        64,
        1_000_000.0,
        {
            "rope_type": "yarn",
            "factor": 8.0,
            "original_max_position_embeddings": 128,
            "beta_fast": 16,
            "beta_slow": 2,
        },
    ),
    (
        32,
        10_000.0,
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "truncate": False},
    ),
    (
        32,
        10_000.0,
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "attention_factor": 0.8},
    ),
    (
        64,
        10_000.0,
        {
            "rope_type": "yarn",
            "factor": 16.0,
            "original_max_position_embeddings": 32,
            "mscale": 0.707,
            "mscale_all_dim": 1.0,
        },
    ),
    (16, 10_000.0, {"rope_type": "yarn", "factor": None, "original_max_position_embeddings": 64}),
    (
        16,
        500_000.0,
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ),
    (
        64,
        500_000.0,
        {
            "rope_type": "llama3",
            "factor": 32.0,
            "low_freq_factor": 2.0,
            "high_freq_factor": 8.0,
            "original_max_position_embeddings": 128,
        },
    ),
    (
        16,
        10_000.0,
        {
            "rope_type": "longrope",
            "short_factor": _factors(8, 0),
            "long_factor": _factors(8, 1),
            "original_max_position_embeddings": 64,
        },
    ),
    (
        32,
        10_000.0,
        {
            "rope_type": "longrope",
            "short_factor": _factors(16, 2),
            "long_factor": _factors(16, 3),
            "original_max_position_embeddings": 128,
            "factor": 3.0,
            "attention_factor": 1.25,
        },
    ),
    (16, 10_000.0, {"rope_type": "proportional", "partial_rotary_factor": 0.25}),
    (32, 10_000.0, {"rope_type": "proportional", "partial_rotary_factor": 0.5, "factor": 2.0}),
    (16, 10_000.0, {"rope_type": "proportional", "partial_rotary_factor": 1.0}),
]
SEQ_LENS = [None, 10, 64, 65, 128, MAX_POS, MAX_POS + 1, 1000, 4096]


def _case_id(case: tuple[int, float, dict[str, Any]]) -> str:
    head_dim, theta, params = case
    extras = ",".join(f"{k}={v}" for k, v in params.items() if k != "rope_type" and not isinstance(v, list))
    return f"{params['rope_type']}-d{head_dim}-{theta:g}-{extras}"


def _hf_dict(head_dim: int, theta: float, params: dict[str, Any]) -> dict[str, Any]:
    return {
        "hidden_size": head_dim * 4,
        "num_attention_heads": 4,
        "head_dim": head_dim,
        "max_position_embeddings": MAX_POS,
        "rope_parameters": {**copy.deepcopy(params), "rope_theta": theta},
    }


def _hf_reference(hf: dict[str, Any], seq_len: int | None) -> tuple[torch.Tensor, float]:
    config = LlamaConfig(**copy.deepcopy(hf))
    rope_type = config.rope_parameters["rope_type"]
    if rope_type == "default":
        return LlamaRotaryEmbedding.compute_default_rope_parameters(config)
    return ROPE_INIT_FUNCTIONS[rope_type](config, seq_len=seq_len)


@pytest.mark.parametrize("case", HF_CASES, ids=_case_id)
def test_inverse_frequencies_match_transformers(case: tuple[int, float, dict[str, Any]]) -> None:
    hf = _hf_dict(*case)
    ours = RopeConfig.from_hf(hf, head_dim=case[0])
    for seq_len in SEQ_LENS:
        expected_freq, expected_scaling = _hf_reference(hf, seq_len)
        inv_freq, scaling = inverse_frequencies(ours, seq_len)
        assert inv_freq.shape == expected_freq.shape
        torch.testing.assert_close(inv_freq, expected_freq.double(), atol=1e-6, rtol=1e-6)
        assert scaling == pytest.approx(float(expected_scaling), abs=1e-6)


@pytest.mark.parametrize("case", HF_CASES, ids=_case_id)
def test_to_hf_round_trips_and_transformers_reads_it(case: tuple[int, float, dict[str, Any]]) -> None:
    ours = RopeConfig.from_hf(_hf_dict(*case), head_dim=case[0])
    written = {"hidden_size": case[0] * 4, "num_attention_heads": 4, "head_dim": case[0], **ours.to_hf()}
    assert RopeConfig.from_hf(written, head_dim=case[0]) == ours
    for seq_len in (None, 1000):
        expected_freq, expected_scaling = _hf_reference(written, seq_len)
        inv_freq, scaling = inverse_frequencies(ours, seq_len)
        torch.testing.assert_close(inv_freq, expected_freq.double(), atol=1e-6, rtol=1e-6)
        assert scaling == pytest.approx(float(expected_scaling), abs=1e-6)


@pytest.mark.parametrize(
    ("head_dim", "theta", "factor"), [(16, 10_000.0, 2.0), (64, 500_000.0, 8.0), (128, 1e6, 4.0)]
)
def test_ntk_changes_the_base(head_dim: int, theta: float, factor: float) -> None:
    config = RopeConfig(head_dim, "ntk", theta=theta, factor=factor)
    base = theta * factor ** (head_dim / (head_dim - 2))
    expected = torch.tensor(
        [1.0 / base ** (2 * i / head_dim) for i in range(head_dim // 2)], dtype=torch.float64
    )
    inv_freq, scaling = inverse_frequencies(config)
    torch.testing.assert_close(inv_freq, expected, atol=1e-12, rtol=1e-12)
    assert scaling == 1.0
    assert ntk_theta(config) == pytest.approx(base)
    # The highest frequency is kept and the lowest is stretched by exactly ``factor``.
    default, _ = inverse_frequencies(RopeConfig(head_dim, theta=theta))
    assert inv_freq[0] == default[0]
    assert (default[-1] / inv_freq[-1]).item() == pytest.approx(factor)


def test_ntk_is_written_as_default_rope_with_the_new_base() -> None:
    config = RopeConfig(16, "ntk", theta=10_000.0, factor=4.0, max_position_embeddings=MAX_POS)
    written = config.to_hf()
    assert written["rope_scaling"] is None
    assert written["rope_parameters"] == {
        "rope_type": "default",
        "rope_theta": pytest.approx(ntk_theta(config)),
    }
    hf = {"hidden_size": 64, "num_attention_heads": 4, "head_dim": 16, **written}
    expected, _ = _hf_reference(hf, None)
    torch.testing.assert_close(inverse_frequencies(config)[0], expected.double(), atol=1e-6, rtol=1e-6)


def test_legacy_and_v5_layouts_agree() -> None:
    legacy = {
        "max_position_embeddings": 512,
        "rope_theta": 50_000.0,
        "rope_scaling": {"type": "linear", "factor": 4},
    }
    v5 = {
        "max_position_embeddings": 512,
        "rope_parameters": {"rope_type": "linear", "factor": 4, "rope_theta": 5e4},
    }
    assert (
        RopeConfig.from_hf(legacy, 16)
        == RopeConfig.from_hf(v5, 16)
        == RopeConfig(16, "linear", 5e4, 512, factor=4)
    )
    # No RoPE keys at all: default RoPE with the default base.
    assert RopeConfig.from_hf({"max_position_embeddings": 512}, 16) == RopeConfig(
        16, max_position_embeddings=512
    )


def test_rope_scaling_wins_and_top_level_original_length_wins() -> None:
    hf = {
        "max_position_embeddings": 4096,
        "original_max_position_embeddings": 1024,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048},
        "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10_000.0},
    }
    config = RopeConfig.from_hf(hf, 16)
    assert (config.rope_type, config.factor, config.original_max_position_embeddings) == ("yarn", 4.0, 1024)
    defaulted = RopeConfig.from_hf(
        {"max_position_embeddings": 4096, "rope_scaling": {"type": "yarn", "factor": 2}}, 16
    )
    assert defaulted.original_max_position_embeddings == 4096


def test_bad_configs_are_refused(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(ValueError, match="unknown rope_type 'mrope'"):
        RopeConfig.from_hf({"max_position_embeddings": 64, "rope_scaling": {"rope_type": "mrope"}}, 16)
    with pytest.raises(ValueError, match="requires factor"):
        RopeConfig.from_hf({"max_position_embeddings": 64, "rope_scaling": {"rope_type": "linear"}}, 16)
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        RopeConfig.from_hf(
            {
                "max_position_embeddings": 64,
                "partial_rotary_factor": 0.5,
                "rope_scaling": {"type": "linear", "factor": 2},
            },
            16,
        )
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        RopeConfig(16, "linear", factor=2.0, partial_rotary_factor=0.5)
    with pytest.raises(ValueError, match="head_dim / 2 = 8"):
        RopeConfig(16, "longrope", short_factor=(1.0,) * 4, long_factor=(1.0,) * 8)
    with pytest.raises(ValueError, match="no max_position_embeddings"):
        RopeConfig.from_hf({"rope_theta": 1e4}, 16)
    with caplog.at_level(logging.WARNING, logger="longctx.trainer.models.rope"):
        config = RopeConfig.from_hf(
            {
                "max_position_embeddings": 64,
                "rope_scaling": {"type": "linear", "factor": 2.0, "finetuned": True},
            },
            16,
        )
        ignored_partial = RopeConfig.from_hf(
            {"max_position_embeddings": 64, "partial_rotary_factor": 0.5}, 16
        )
    assert config == RopeConfig(16, "linear", max_position_embeddings=64, factor=2.0)
    assert ignored_partial == RopeConfig(
        16, max_position_embeddings=64
    )  # transformers' default RoPE ignores it too
    assert "finetuned" in caplog.text and "partial_rotary_factor" in caplog.text


@pytest.mark.parametrize("case", HF_CASES, ids=_case_id)
def test_cos_sin_match_transformers_rotary_embedding(case: tuple[int, float, dict[str, Any]]) -> None:
    hf = _hf_dict(*case)
    ours = RopeConfig.from_hf(hf, head_dim=case[0])
    generator = torch.Generator().manual_seed(0)
    for max_position in (40, 200, 300):
        position_ids = torch.randint(0, max_position, (2, 24), generator=generator)
        position_ids[0, 0] = max_position - 1
        hf_rotary = LlamaRotaryEmbedding(LlamaConfig(**copy.deepcopy(hf)))  # fresh: no cached dynamic state
        expected_cos, expected_sin = hf_rotary(torch.zeros(1, dtype=torch.float32), position_ids)
        seq_len = max_position if ours.depends_on_seq_len else None
        inv_freq, scaling = inverse_frequencies(ours, seq_len)
        cos, sin = rotary_cos_sin(position_ids, inv_freq, scaling)
        # transformers multiplies positions by frequencies in float32: angles up to 300 carry ~2e-5 error.
        torch.testing.assert_close(cos, expected_cos, atol=1e-4, rtol=0)
        torch.testing.assert_close(sin, expected_sin, atol=1e-4, rtol=0)
        zero = torch.zeros(1, 1, dtype=torch.long)
        assert rotary_cos_sin(zero, inv_freq, scaling)[0].flatten().tolist() == pytest.approx(
            [scaling] * case[0]
        )


def _packed_positions(lengths: list[int]) -> torch.Tensor:
    return torch.cat([torch.arange(n) for n in lengths])


@pytest.mark.parametrize(
    "case", HF_CASES + [(16, 10_000.0, {"rope_type": "ntk", "factor": 4.0})], ids=_case_id
)
@pytest.mark.parametrize("world_size", [2, 4])
def test_rotation_of_a_zigzag_shard_is_the_shard_of_the_full_rotation(
    case: tuple[int, float, dict[str, Any]], world_size: int
) -> None:
    head_dim = case[0]
    config = RopeConfig.from_hf(_hf_dict(*case), head_dim=head_dim)
    position_ids = _packed_positions([37, 150, 5, 64])  # 256 tokens, per-document positions
    window = position_ids.numel()
    # Length-dependent types must see the same sequence length on every rank: the whole window's.
    inv_freq, scaling = inverse_frequencies(config, int(position_ids.max()) + 1)
    x = torch.randn(window, 3, head_dim, generator=torch.Generator().manual_seed(1))
    full = apply_rotary(x, *rotary_cos_sin(position_ids, inv_freq, scaling))
    for rank in range(world_size):
        shard = zigzag_indices(window, world_size, rank)
        rotated = apply_rotary(x[shard], *rotary_cos_sin(position_ids[shard], inv_freq, scaling))
        assert torch.equal(rotated, full[shard])
    permutation = torch.randperm(window, generator=torch.Generator().manual_seed(2))
    rotated = apply_rotary(x[permutation], *rotary_cos_sin(position_ids[permutation], inv_freq, scaling))
    assert torch.equal(rotated, full[permutation])


def test_rotation_preserves_norm_and_relative_position() -> None:
    config = RopeConfig(16, "yarn", factor=4.0, original_max_position_embeddings=64)
    inv_freq, _ = inverse_frequencies(config)
    generator = torch.Generator().manual_seed(3)
    q, k = torch.randn(1, 1, 16, generator=generator), torch.randn(1, 1, 16, generator=generator)

    def score(q_pos: int, k_pos: int) -> float:
        rq = apply_rotary(q, *rotary_cos_sin(torch.tensor([q_pos]), inv_freq))
        rk = apply_rotary(k, *rotary_cos_sin(torch.tensor([k_pos]), inv_freq))
        return (rq * rk).sum().item()

    assert score(10, 3) == pytest.approx(score(107, 100), abs=1e-4)
    rotated = apply_rotary(q, *rotary_cos_sin(torch.tensor([1234]), inv_freq))
    assert rotated.norm().item() == pytest.approx(q.norm().item(), rel=1e-5)


def test_apply_rotary_keeps_dtype_and_computes_in_float32() -> None:
    config = RopeConfig(16)
    cos, sin = rotary_cos_sin(torch.arange(8), *inverse_frequencies(config))
    x = torch.randn(8, 2, 16)
    out = apply_rotary(x.bfloat16(), cos, sin)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(
        out.float(), apply_rotary(x.bfloat16().float(), cos, sin), atol=1e-2, rtol=1e-2
    )


def test_run_overrides_are_declared_like_hf_configs() -> None:
    pretrained = RopeConfig(16, theta=500_000.0, max_position_embeddings=8192)
    extended = pretrained.with_overrides(
        rope_scaling={"rope_type": "yarn", "factor": 4.0}, max_position_embeddings=32768
    )
    assert extended == RopeConfig(
        16, "yarn", 500_000.0, 32768, factor=4.0, original_max_position_embeddings=8192
    )
    assert pretrained.with_overrides(rope_theta=1e6) == RopeConfig(
        16, theta=1e6, max_position_embeddings=8192
    )
    # A rope_theta inside the scaling dict wins, as in transformers.
    both = pretrained.with_overrides(
        rope_scaling={"type": "linear", "factor": 2, "rope_theta": 7.0}, rope_theta=9.0
    )
    assert (both.rope_type, both.factor, both.theta) == ("linear", 2, 7.0)
    # ntk (not a transformers type) is default RoPE with the NTK base, for both implementations
    ntk = pretrained.with_overrides(rope_scaling={"rope_type": "ntk", "factor": 8.0})
    assert ntk == RopeConfig(16, theta=500_000.0 * 8.0 ** (16 / 14), max_position_embeddings=8192)
