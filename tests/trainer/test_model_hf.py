"""The decoder against transformers (Llama, Mistral, Qwen2) on packed rows; Hugging Face checkpoint I/O."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

from longctx.trainer.models import interface
from longctx.trainer.models.decoder import ModelConfig, RingAttention, Transformer
from longctx.trainer.models.files import config_json, weight_files
from longctx.trainer.models.interface import load_folder
from longctx.trainer.models.rope import RopeConfig
from longctx.trainer.models.weights import save_model
from longctx.trainer.parallel.zigzag import zigzag_indices

transformers = pytest.importorskip("transformers")
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

DOC_LENGTHS = [5, 11, 8]
SEGMENT_IDS = [7, 3, 9]  # arbitrary document ids: only equality matters


def reference_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, q_index: torch.Tensor, q_segment: torch.Tensor
) -> torch.Tensor:
    """Float64 attention with an explicit mask: same segment and key index <= query index."""
    group = q.shape[1] // k.shape[1]
    k64 = k.double().repeat_interleave(group, dim=1)
    v64 = v.double().repeat_interleave(group, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.double(), k64) / math.sqrt(q.shape[-1])
    allowed = (q_segment[:, None] == q_segment[None, :]) & (q_index[None, :] <= q_index[:, None])
    probs = scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, v64).to(q.dtype)


def packed_row(vocab: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """One packed row of three documents: ids, per-document positions, window indices, segment ids."""
    generator = torch.Generator().manual_seed(seed)
    total = sum(DOC_LENGTHS)
    return {
        "input_ids": torch.randint(0, vocab, (1, total), generator=generator),
        "position_ids": torch.cat([torch.arange(n) for n in DOC_LENGTHS])[None],
        "token_index": torch.arange(total)[None],
        "segment_ids": torch.cat([torch.full((n,), s) for n, s in zip(DOC_LENGTHS, SEGMENT_IDS)])[None],
    }


def document_slices() -> list[slice]:
    starts = [sum(DOC_LENGTHS[:i]) for i in range(len(DOC_LENGTHS))]
    return [slice(start, start + n) for start, n in zip(starts, DOC_LENGTHS)]


@torch.no_grad()
def randomize(model: torch.nn.Module, seed: int) -> None:
    """Random weights everywhere (biases and norms included), large enough to exercise every path."""
    generator = torch.Generator().manual_seed(seed)
    for name, param in sorted(model.named_parameters()):
        if "norm" in name:
            param.copy_(1.0 + 0.2 * torch.randn(param.shape, generator=generator))
        else:
            param.copy_(0.15 * torch.randn(param.shape, generator=generator))


def ours_packed_logits(model: Transformer, row: dict[str, torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return model.logits(model(**row))[0]


def hf_document_logits(hf_model: torch.nn.Module, row: dict[str, torch.Tensor]) -> list[torch.Tensor]:
    """transformers' logits for each document of the row, run alone."""
    with torch.no_grad():
        return [hf_model(input_ids=row["input_ids"][:, part]).logits[0] for part in document_slices()]


def assert_documents_match(ours: torch.Tensor, theirs: list[torch.Tensor]) -> float:
    worst = 0.0
    for part, expected in zip(document_slices(), theirs):
        torch.testing.assert_close(ours[part], expected, atol=1e-5, rtol=1e-5)
        worst = max(worst, (ours[part] - expected).abs().max().item())
    return worst


TINY = {
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 256,
}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "rope_theta": 10_000.0}
LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
    "rope_theta": 500_000.0,
}
LONGROPE = {
    "rope_type": "longrope",
    "short_factor": [1.0 + 0.25 * i for i in range(8)],
    "long_factor": [2.0 + 0.5 * i for i in range(8)],
    "original_max_position_embeddings": 64,
    "rope_theta": 10_000.0,
}
# (model_type, extra HF config keys); every case is checked in both directions and per document.
HF_CASES: list[tuple[str, dict[str, Any]]] = [
    ("llama", {}),
    ("llama", {"tie_word_embeddings": True, "attention_bias": True, "mlp_bias": True}),
    ("llama", {"rope_parameters": YARN}),
    ("llama", {"rope_parameters": LLAMA3}),
    ("llama", {"rope_parameters": {"rope_type": "linear", "factor": 4.0, "rope_theta": 10_000.0}}),
    ("mistral", {"sliding_window": None}),
    ("mistral", {"sliding_window": 64, "rope_parameters": LONGROPE}),  # no document is longer than the window
    ("qwen2", {}),
    ("qwen2", {"tie_word_embeddings": True, "rope_parameters": YARN}),
]


def _case_id(case: tuple[str, dict[str, Any]]) -> str:
    model_type, extra = case
    parts = [model_type] + [k if not isinstance(v, dict) else v["rope_type"] for k, v in extra.items()]
    return "-".join(parts)


def make_hf_model(model_type: str, extra: dict[str, Any], seed: int) -> torch.nn.Module:
    config = AutoConfig.for_model(model_type, **TINY, **extra, attn_implementation="eager")
    model = AutoModelForCausalLM.from_config(config).eval()
    randomize(model, seed)
    if config.tie_word_embeddings:
        assert model.lm_head.weight is model.model.embed_tokens.weight
    return model


@pytest.mark.parametrize("case", HF_CASES, ids=_case_id)
def test_hf_checkpoint_loads_and_matches_per_document(
    case: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    model_type, extra = case
    hf_model = make_hf_model(model_type, extra, seed=1)
    hf_model.save_pretrained(tmp_path / "hf")
    assert (tmp_path / "hf" / "model.safetensors").is_file()
    ours = load_folder(tmp_path / "hf", attention=reference_attention)
    assert ours.config.model_type == model_type
    row = packed_row(TINY["vocab_size"])
    assert_documents_match(ours_packed_logits(ours, row), hf_document_logits(hf_model, row))


@pytest.mark.parametrize("case", HF_CASES, ids=_case_id)
def test_saved_checkpoint_loads_in_transformers_and_matches(
    case: tuple[str, dict[str, Any]], tmp_path: Path
) -> None:
    model_type, extra = case
    config = ModelConfig.from_hf({"model_type": model_type, **TINY, **extra})
    ours = Transformer(config, attention=reference_attention)
    randomize(ours, seed=2)
    save_model(ours, tmp_path / "ours")
    hf_model = AutoModelForCausalLM.from_pretrained(tmp_path / "ours", attn_implementation="eager").eval()
    assert (
        type(hf_model).__name__
        == {"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2"}[model_type] + "ForCausalLM"
    )
    assert hf_model.config.tie_word_embeddings == config.tie_word_embeddings
    row = packed_row(TINY["vocab_size"], seed=1)
    assert_documents_match(ours_packed_logits(ours, row), hf_document_logits(hf_model, row))
    # And back: the saved checkpoint reloads into an identical model and config.
    reloaded = load_folder(tmp_path / "ours", attention=reference_attention)
    assert reloaded.config == config
    for name, tensor in ours.state_dict().items():
        assert torch.equal(reloaded.state_dict()[name], tensor), name


def test_sharded_checkpoints_both_ways(tmp_path: Path) -> None:
    hf_model = make_hf_model("qwen2", {}, seed=3)
    hf_model.save_pretrained(tmp_path / "hf", max_shard_size="20KB")
    assert (tmp_path / "hf" / "model.safetensors.index.json").is_file()
    assert len(weight_files(tmp_path / "hf")) > 1
    ours = load_folder(tmp_path / "hf", attention=reference_attention)
    row = packed_row(TINY["vocab_size"], seed=2)
    assert_documents_match(ours_packed_logits(ours, row), hf_document_logits(hf_model, row))

    save_model(ours, tmp_path / "ours", max_shard_size=20_000)
    index = json.loads((tmp_path / "ours" / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 1 and shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"
    assert not (tmp_path / "ours" / "model.safetensors").exists()
    assert set(index["weight_map"]) == set(ours.state_dict())
    assert index["metadata"]["total_size"] == sum(t.numel() * 4 for t in ours.state_dict().values())
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ours", attn_implementation="eager").eval()
    assert_documents_match(ours_packed_logits(ours, row), hf_document_logits(reloaded, row))


def test_save_in_bfloat16_records_the_dtype(tmp_path: Path) -> None:
    ours = Transformer(ModelConfig.tiny("llama"))
    save_model(ours, tmp_path / "bf16", dtype=torch.bfloat16)
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert {t.dtype for t in load_file(tmp_path / "bf16" / "model.safetensors").values()} == {torch.bfloat16}
    loaded = load_folder(tmp_path / "bf16", dtype=torch.float32)
    assert loaded.model.embed_tokens.weight.dtype == torch.float32
    torch.testing.assert_close(
        loaded.model.embed_tokens.weight, ours.model.embed_tokens.weight.bfloat16().float()
    )


def test_save_refuses_to_overwrite(tmp_path: Path) -> None:
    ours = Transformer(ModelConfig.tiny("llama"))
    save_model(ours, tmp_path / "ckpt")
    with pytest.raises(FileExistsError):
        save_model(ours, tmp_path / "ckpt")
    (tmp_path / "empty").mkdir()
    save_model(ours, tmp_path / "empty")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "empty"]  # no staging directory left


def test_pickle_only_checkpoints_are_refused_without_unpickling(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(ModelConfig.tiny("llama").to_hf()))
    (tmp_path / "pytorch_model.bin").write_bytes(b"not a pickle: must never be opened")
    with pytest.raises(ValueError, match="safetensors only"):
        load_folder(tmp_path)
    (tmp_path / "pytorch_model.bin").unlink()
    with pytest.raises(FileNotFoundError, match=r"model\.safetensors"):
        load_folder(tmp_path)


def test_weight_names_are_checked(tmp_path: Path) -> None:
    config = ModelConfig.tiny("llama")
    ours = Transformer(config)
    save_model(ours, tmp_path / "ok")
    tensors = load_file(tmp_path / "ok" / "model.safetensors")

    def write(name: str, state: dict[str, torch.Tensor]) -> Path:
        directory = tmp_path / name
        directory.mkdir()
        (directory / "config.json").write_text(json.dumps(config.to_hf()))
        save_file(state, directory / "model.safetensors")
        return directory

    # Old Llama conversions stored RoPE buffers: skipped, frequencies come from the config.
    with_buffers = write(
        "buffers", {**tensors, "model.layers.0.self_attn.rotary_emb.inv_freq": torch.ones(8)}
    )
    load_folder(with_buffers)
    missing = write("missing", {k: v for k, v in tensors.items() if k != "model.norm.weight"})
    with pytest.raises(ValueError, match=r"missing \['model.norm.weight'\]"):
        load_folder(missing)
    unexpected = write("unexpected", {**tensors, "model.layers.9.mlp.up_proj.weight": torch.ones(2)})
    with pytest.raises(ValueError, match=r"unexpected \['model\.layers\.9\.mlp\.up_proj\.weight'"):
        load_folder(unexpected)
    wrong_shape = write("shape", {**tensors, "model.norm.weight": torch.ones(63)})
    with pytest.raises(ValueError, match=r"model.norm.weight: checkpoint shape \(63,\)"):
        load_folder(wrong_shape)
    # A tied model ignores a stored lm_head.weight, as transformers does.
    tied = ModelConfig.tiny("qwen2", tie_word_embeddings=True)
    directory = tmp_path / "tied"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(tied.to_hf()))
    tied_tensors = {k: v for k, v in tensors.items() if not k.startswith("model.layers")} | {
        k: v for k, v in Transformer(tied).state_dict().items() if k.startswith("model.layers")
    }
    save_file(tied_tensors, directory / "model.safetensors")
    assert "lm_head.weight" in tied_tensors
    assert load_folder(directory).lm_head is None


def test_config_round_trip_and_unknown_model_type(tmp_path: Path) -> None:
    for model_type in ("llama", "mistral", "qwen2"):
        config = ModelConfig.tiny(
            model_type, rope=RopeConfig(16, "yarn", factor=4.0, max_position_embeddings=256)
        )
        assert ModelConfig.from_hf(config.to_hf()) == config
    gemma = {"model_type": "gemma", **TINY}
    with pytest.raises(ValueError, match=r"unsupported model_type 'gemma'.*llama, mistral, qwen2"):
        ModelConfig.from_hf(gemma)
    (tmp_path / "config.json").write_text(json.dumps(gemma))
    with pytest.raises(ValueError, match="unsupported model_type 'gemma'"):
        ModelConfig.from_hf(config_json(tmp_path))
    with pytest.raises(ValueError, match="hidden_act"):
        ModelConfig.from_hf({"model_type": "llama", **TINY, "hidden_act": "gelu"})
    with pytest.raises(ValueError, match="lacks vocab_size"):
        ModelConfig.from_hf({"model_type": "llama", "hidden_size": 64})
    # Keys the model does not interpret survive a round trip.
    config = ModelConfig.from_hf({"model_type": "llama", **TINY, "bos_token_id": 5, "eos_token_id": [6, 7]})
    assert config.to_hf()["bos_token_id"] == 5 and config.to_hf()["eos_token_id"] == [6, 7]


def test_sliding_windows_shorter_than_the_training_length_are_refused(tmp_path: Path) -> None:
    mistral = ModelConfig.from_hf({"model_type": "mistral", **TINY, "sliding_window": 16})
    assert mistral.sliding_window == 16
    mistral.check(16)
    with pytest.raises(
        ValueError, match="sliding-window attention of 16 tokens, smaller than the training length 32"
    ):
        mistral.check(32)
    assert (
        ModelConfig.from_hf({"model_type": "mistral", **TINY}).sliding_window == 4096
    )  # transformers' default
    assert (
        ModelConfig.from_hf({"model_type": "mistral", **TINY, "sliding_window": None}).sliding_window is None
    )
    qwen = {"model_type": "qwen2", **TINY, "sliding_window": 16}
    assert ModelConfig.from_hf(qwen).sliding_window is None  # use_sliding_window is off by default
    assert (
        ModelConfig.from_hf({**qwen, "use_sliding_window": True, "max_window_layers": 2}).sliding_window
        is None
    )
    assert (
        ModelConfig.from_hf({**qwen, "use_sliding_window": True, "max_window_layers": 1}).sliding_window == 16
    )
    (tmp_path / "config.json").write_text(json.dumps(mistral.to_hf()))
    save_file(Transformer(mistral).state_dict(), tmp_path / "model.safetensors")
    with pytest.raises(ValueError, match="sliding-window"):
        interface.check(interface.from_hf(config_json(tmp_path)), 64)
    interface.check(interface.from_hf(config_json(tmp_path)), 16)


@pytest.fixture
def tiny_model() -> Transformer:
    model = Transformer(ModelConfig.tiny("qwen2"), attention=reference_attention)
    randomize(model, seed=4)
    return model


def test_batch_rows_and_single_rows_agree(tiny_model: Transformer) -> None:
    first, second = packed_row(128, seed=5), packed_row(128, seed=6)
    second["segment_ids"] = torch.zeros_like(second["segment_ids"])  # one long document
    second["position_ids"] = second["token_index"].clone()
    batch = {key: torch.cat([first[key], second[key]]) for key in first}
    with torch.no_grad():
        together = tiny_model(**batch)
        alone = [tiny_model(**{key: row[key][0] for key in row}) for row in (first, second)]
    assert together.shape == (2, sum(DOC_LENGTHS), 64) and alone[0].shape == (sum(DOC_LENGTHS), 64)
    torch.testing.assert_close(together[0], alone[0], atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(together[1], alone[1], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize(
    "rope",
    [
        RopeConfig(16, max_position_embeddings=256),
        RopeConfig(16, "dynamic", factor=4.0, max_position_embeddings=8),
        RopeConfig(
            16,
            "longrope",
            short_factor=(1.5,) * 8,
            long_factor=(3.0,) * 8,
            original_max_position_embeddings=8,
        ),
    ],
    ids=lambda rope: rope.rope_type,
)
def test_zigzag_shards_see_their_rows_of_the_window(rope: RopeConfig) -> None:
    """Running the zigzag shards of P=2 ranks back to back equals the full row, permuted the same way.

    The attention masks by global token index, not by order, and RoPE is per token; length-dependent
    RoPE gets the window's length explicitly, as every rank of a context-parallel group must.
    """
    model = Transformer(ModelConfig.tiny("llama", rope=rope), attention=reference_attention)
    randomize(model, seed=5)
    row = {key: value[0] for key, value in packed_row(128, seed=7).items()}
    window = row["input_ids"].numel()
    order = torch.cat([zigzag_indices(window, 2, rank) for rank in range(2)])
    window_len = int(row["position_ids"].max()) + 1
    with torch.no_grad():
        full = model(**row)
        shuffled = model(**{key: value[order] for key, value in row.items()}, rope_seq_len=window_len)
        for rank in range(2):
            shard = zigzag_indices(window, 2, rank)
            cos, sin = model.rope_tables(row["position_ids"][shard], rope_seq_len=window_len)
            full_cos, full_sin = model.rope_tables(row["position_ids"])
            assert torch.equal(cos, full_cos[shard]) and torch.equal(sin, full_sin[shard])
    torch.testing.assert_close(shuffled, full[order], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize(
    "rope_parameters",
    [
        {"rope_type": "dynamic", "factor": 4.0, "rope_theta": 10_000.0},
        {**LONGROPE, "original_max_position_embeddings": 10},
    ],
    ids=["dynamic", "longrope"],
)
def test_length_dependent_rope_uses_the_batch_max_position_like_transformers(
    rope_parameters: dict[str, Any],
) -> None:
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    hf = {**TINY, "max_position_embeddings": 8, "rope_parameters": rope_parameters}
    model = Transformer(ModelConfig.from_hf({"model_type": "llama", **hf}))
    position_ids = torch.cat([packed_row(128)["position_ids"], torch.arange(24)[None] // 3])
    for batch in (position_ids[:1], position_ids[1:], position_ids):  # longest document: 11, 8, 11 tokens
        rotary = LlamaRotaryEmbedding(AutoConfig.for_model("llama", **hf))  # fresh: no cached length
        expected = rotary(torch.zeros(1), batch)
        actual = model.rope_tables(batch)
        torch.testing.assert_close(actual, expected, atol=1e-5, rtol=0)
    # An explicit length overrides the batch's (context parallelism passes the window's).
    assert not torch.allclose(model.rope_tables(batch, rope_seq_len=4)[0], model.rope_tables(batch)[0])


def test_default_ring_attention_matches_the_reference(tiny_model: Transformer) -> None:
    row = packed_row(128, seed=8)
    ring = Transformer(tiny_model.config)
    ring.load_state_dict(tiny_model.state_dict())
    assert isinstance(ring.attention, RingAttention) and ring.attention.group is None
    with torch.no_grad():
        torch.testing.assert_close(ring(**row), tiny_model(**row), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("mode", [True, "full", "selective"])
def test_activation_checkpointing_and_chunked_loss_keep_gradients(
    tiny_model: Transformer, mode: str | bool
) -> None:
    row = packed_row(128, seed=9)
    labels = torch.roll(row["input_ids"], -1, dims=1)
    labels[0, [4, 15, -1]] = -100  # document ends predict nothing
    calls = []

    def counted(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(torch.is_grad_enabled())
        return reference_attention(*args, **kwargs)

    checkpointed = Transformer(tiny_model.config, attention=counted, activation_checkpointing=mode)
    checkpointed.load_state_dict(tiny_model.state_dict())

    hidden = tiny_model(**row)
    full = F.cross_entropy(tiny_model.logits(hidden)[0], labels[0], ignore_index=-100, reduction="sum")
    full.backward()
    chunked = checkpointed.cross_entropy_sum(checkpointed(**row), labels, chunk_tokens=5)
    chunked.backward()
    torch.testing.assert_close(chunked, full, atol=1e-5, rtol=1e-5)
    for (name, a), (_, b) in zip(tiny_model.named_parameters(), checkpointed.named_parameters()):
        torch.testing.assert_close(b.grad, a.grad, atol=1e-5, rtol=1e-5, msg=name)
    # every mode recomputes a plain attention function in backward: selective keeps the output of the ring
    # operator only (tests/trainer/test_checkpointing.py counts the ring's runs)
    assert len(calls) == 2 * tiny_model.config.num_hidden_layers


def test_init_weights_and_tied_output() -> None:
    model = Transformer(ModelConfig.tiny("llama", tie_word_embeddings=True, attention_bias=True))
    model.init_weights(std=0.02, generator=torch.Generator().manual_seed(0))
    assert model.lm_head is None and model.output_weight is model.model.embed_tokens.weight
    assert "lm_head.weight" not in model.state_dict()
    assert torch.equal(model.model.layers[0].self_attn.o_proj.bias, torch.zeros(64))
    assert torch.equal(model.model.norm.weight, torch.ones(64))
    assert abs(model.model.embed_tokens.weight.std().item() - 0.02) < 0.002
    with pytest.raises(ValueError, match="share one"):
        model(
            torch.zeros(1, 4, dtype=torch.long),
            torch.zeros(1, 3, dtype=torch.long),
            torch.zeros(1, 4),
            torch.zeros(1, 4),
        )
