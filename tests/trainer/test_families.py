"""The family helper (families.py) against transformers: every RoPE causal LM family builds as a
tiny model, its checkpoint holds that model, and the reference logits are transformers' own run
of each document alone.

References: transformers' auto mappings and default configurations (which families exist, which
layer kinds a family has), the model in memory before ``save_pretrained`` (its weights, its plain
forward on one document and on that document without its last token), and the packed row run as
one sequence (which the per-document reference must not equal).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
from safetensors.torch import load_file  # noqa: E402
from transformers import CONFIG_MAPPING  # noqa: E402
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES  # noqa: E402

from tests.trainer import families  # noqa: E402

LENGTHS = [7, 13, 1, 20, 7]
MAX_PARAMETERS = 600_000  # the largest family (a 546,688-parameter Phi-4 multimodal) with room
FAMILIES = families.rope_families()


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """Tiny models run several times faster on one thread than on two contended ones."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_every_causal_lm_is_a_family_or_excluded_with_a_reason() -> None:
    excluded = families.excluded_families()
    assert sorted(FAMILIES + list(excluded)) == sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)
    assert not set(FAMILIES) & set(excluded)
    # RoPE in every form: rope_parameters, per-layer-type RoPE, rotary_dim, MLA, hybrids
    assert {"llama", "gpt_neox", "gptj", "codegen", "gemma3_text", "deepseek_v3", "qwen3_next"} <= set(
        FAMILIES
    )
    assert excluded["gpt2"] == excluded["jamba"] == excluded["kimi_linear"] == "no rotary positions"
    assert excluded["bart"] == "encoder-decoder"
    assert excluded["gemma3"].startswith("composite") and excluded["gemma4_assistant"].startswith("composite")


@pytest.mark.parametrize("model_type", FAMILIES)
def test_tiny_config_is_tiny_and_keeps_every_kind_of_layer(model_type: str) -> None:
    default = CONFIG_MAPPING[model_type]()
    tiny = families.tiny_config(model_type)
    settings = tiny.to_dict()
    assert settings["vocab_size"] == families.VOCAB_SIZE
    assert all(settings[k] <= 64 for k in ("hidden_size", "n_embd", "d_model") if k in settings)
    for key, value in settings.items():
        if key.endswith("_token_id") and value is not None:
            assert all(0 <= i < families.VOCAB_SIZE for i in (value if isinstance(value, list) else [value]))
        if re.search(r"dropout|pdrop|jitter", key) and isinstance(value, float):
            assert value == 0.0, key
        if key in ("sliding_window", "keep_window_size", "max_position_embeddings") and value:  # 0: none
            assert value >= 128, key
    for key in ("layer_types", "mlp_layer_types", "layers_block_type", "indexer_types"):
        kinds = getattr(default, key, None)
        if kinds is not None:
            assert set(getattr(tiny, key)) == set(kinds), key


@pytest.mark.parametrize("model_type", FAMILIES)
def test_reference_is_transformers_on_each_document_of_the_saved_model(
    model_type: str, tmp_path: Path
) -> None:
    folder = families.save_tiny(tmp_path, model_type)
    model = families.build_tiny(model_type)  # built again: the checkpoint must hold this model
    assert sum(p.numel() for p in model.parameters()) < MAX_PARAMETERS
    assert all(m.p == 0 for m in model.modules() if isinstance(m, torch.nn.Dropout))

    ids = torch.randint(3, families.VOCAB_SIZE, (sum(LENGTHS),), generator=torch.Generator().manual_seed(1))
    reference = families.reference_logits(folder, LENGTHS, ids)
    assert reference.attention == families.reference_attention(model_type)
    logits = reference.logits
    assert logits.shape == (sum(LENGTHS), families.VOCAB_SIZE) and logits.dtype == torch.float64
    assert logits.isfinite().all()
    with torch.no_grad():
        longest = model(input_ids=ids[None, 21:41], use_cache=False).logits[0]  # the fourth document
        prefix = model(input_ids=ids[None, 21:40], use_cache=False).logits[0]
        together = model(input_ids=ids[None], use_cache=False).logits[0]
    assert families.relative_error(logits[21:41], longest.double()) < reference.tolerance
    assert families.relative_error(prefix, longest[:-1]) < reference.tolerance  # causal
    assert families.relative_error(logits[7:], together[7:].double()) > 1e-3  # the documents are really alone


def test_save_tiny_is_deterministic_per_seed_and_loads_as_the_model_it_saved(tmp_path: Path) -> None:
    first = load_file(families.save_tiny(tmp_path / "a", "deepseek_v3", seed=3) / "model.safetensors")
    again = load_file(families.save_tiny(tmp_path / "b", "deepseek_v3", seed=3) / "model.safetensors")
    other = load_file(families.save_tiny(tmp_path / "c", "deepseek_v3", seed=4) / "model.safetensors")
    assert first.keys() == again.keys() == other.keys()
    for name in first:
        torch.testing.assert_close(first[name], again[name], rtol=0, atol=0)
        if first[name].is_floating_point():
            assert not torch.equal(first[name], other[name]), name
    bias = first["model.layers.1.mlp.gate.e_score_correction_bias"]  # a saved buffer, zeros at init
    assert bias.std() > 0.05
    expected = families.build_tiny("deepseek_v3", seed=3).state_dict()
    for name, tensor in families.load_reference(tmp_path / "a").state_dict().items():
        torch.testing.assert_close(tensor, expected[name], rtol=0, atol=0, msg=name)


@pytest.mark.parametrize(
    ("model_type", "attention", "float32"),
    [
        ("llama", "sdpa", ()),
        ("gpt_oss", "eager", ()),  # its eager softmax, sinks included, stays in float64
        ("deepseek_v3", "sdpa", ("linear", "sigmoid")),  # a float32 router
        ("gemma2", "eager", ("softmax",)),  # its eager softmax upcast to float32
        ("laguna", "sdpa", ("sigmoid", "softplus")),  # a float32 attention gate and router
        ("blt", "sdpa", ("logits",)),
    ],
)
def test_the_reference_says_where_it_computes_in_float32(
    model_type: str, attention: str, float32: tuple[str, ...], tmp_path: Path
) -> None:
    ids = torch.randint(3, families.VOCAB_SIZE, (sum(LENGTHS),), generator=torch.Generator().manual_seed(1))
    reference = families.reference_logits(families.save_tiny(tmp_path, model_type), LENGTHS, ids)
    assert (reference.attention, reference.float32) == (attention, float32)
    expected = families.FLOAT32_TOLERANCE if float32 else families.FLOAT64_TOLERANCE
    assert reference.tolerance == expected
