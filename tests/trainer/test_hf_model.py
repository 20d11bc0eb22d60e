"""The transformers implementation (any transformers causal LM, ring attention through
``AttentionInterface``) in one process, against the unmodified transformers model.

References: transformers itself, running each document of a packed row alone with its default
attention (logits and gradients, float64); transformers' own rotary modules and RoPE functions; the
own decoder (itself tested against transformers in test_model_hf.py) where transformers, given one
document, would pick other RoPE frequencies than the window's. The multi-process checks (context
parallelism 2 and 3, world 4 against world 1, refusals through the CLI) are in test_hf_sharded.py.
"""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from longctx.core.errors import ConfigError
from longctx.trainer.build import build_model, fill_random
from longctx.trainer.config import KernelsConfig
from longctx.trainer.evaluation.generate import greedy_generate
from longctx.trainer.models import interface
from longctx.trainer.models.decoder import ModelConfig, RingAttention, Transformer
from longctx.trainer.models.files import config_json
from longctx.trainer.models.hf import HFCausalLM, HFModelConfig
from longctx.trainer.models.interface import load_folder
from longctx.trainer.models.kernels import KernelChoice
from longctx.trainer.models.rope import RopeConfig, inverse_frequencies
from longctx.trainer.models.weights import materialize
from longctx.trainer.parallel.state import ParallelState
from tests.trainer.test_model_hf import randomize

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

TINY = {
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "max_position_embeddings": 64,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
}
# Qwen3: q/k norms, tied embeddings. OLMo 2: q/k norms over all heads, norms after the blocks, untied.
MODELS: dict[str, dict[str, Any]] = {"qwen3": {"tie_word_embeddings": True}, "olmo2": {}}
DOCS = [7, 13, 1, 20, 7]  # 48 tokens: a multiple of 2 x cp for cp 1, 2 and 3


def save_random(folder: Path, model_type: str, seed: int = 0, **extra: Any) -> Path:
    """A random transformers causal LM (weights large enough to exercise every path) saved by
    ``save_pretrained`` in float64."""
    config = AutoConfig.for_model(model_type, **{**TINY, **MODELS.get(model_type, {}), **extra})
    model = AutoModelForCausalLM.from_config(config)
    randomize(model, seed)
    model.to(torch.float64).save_pretrained(folder)
    return folder


def packed(lengths: list[int], vocab: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """One packed row: ids, per-document positions, window indices, document ids and next-token
    labels within each document (-100 at a document's last token)."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(3, vocab, (sum(lengths),), generator=generator)
    labels = torch.cat([torch.cat([part[1:], torch.tensor([-100])]) for part in ids.split(lengths)])
    return {
        "input_ids": ids,
        "position_ids": torch.cat([torch.arange(n) for n in lengths]),
        "token_index": torch.arange(sum(lengths)),
        "segment_ids": torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths)),
        "labels": labels,
    }


def documents_alone(folder: Path, row: dict[str, torch.Tensor], lengths: list[int]):
    """transformers' logits of each document run alone (default attention) and the gradients of the
    summed next-token losses, float64."""
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64)
    logits, total = [], torch.zeros((), dtype=torch.float64)
    for part in row["input_ids"].split(lengths):
        out = model(input_ids=part[None]).logits[0]
        logits.append(out.detach())
        total = total + F.cross_entropy(out[:-1], part[1:], reduction="sum")
    total.backward()
    return torch.cat(logits), total.detach(), {n: p.grad for n, p in model.named_parameters()}


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-12))


@pytest.mark.parametrize("model_type", sorted(MODELS))
def test_packed_row_equals_each_document_alone(model_type: str, tmp_path: Path) -> None:
    folder = save_random(tmp_path / model_type, model_type)
    row = packed(DOCS, TINY["vocab_size"])
    want_logits, want_loss, want_grads = documents_alone(folder, row, DOCS)

    model = load_folder(folder, implementation="transformers", dtype=torch.float64)
    assert isinstance(model.attention, RingAttention) and model.tied == (model_type == "qwen3")
    inputs = {k: v for k, v in row.items() if k != "labels"}
    logits = model.logits(model(**inputs))
    losses = model(**inputs, labels=row["labels"])
    losses.sum().backward()
    assert relative_error(logits.detach(), want_logits) < 1e-10
    assert relative_error(losses.sum().detach(), want_loss) < 1e-10
    grads = {n: p.grad for n, p in model.named_parameters()}
    assert grads.keys() <= want_grads.keys()  # transformers lists a tied lm_head.weight too
    for name, grad in grads.items():
        assert relative_error(grad, want_grads[name]) < 1e-10, name


def test_the_implementation_is_chosen_by_what_the_own_decoder_reads() -> None:
    llama = AutoConfig.for_model("llama", **TINY).to_dict()
    qwen3 = AutoConfig.for_model("qwen3", **TINY).to_dict()
    assert isinstance(interface.from_hf(llama, "auto"), ModelConfig)
    assert isinstance(interface.from_hf(qwen3, "auto"), HFModelConfig)
    assert isinstance(interface.from_hf(llama, "transformers"), HFModelConfig)
    tiny = interface.tiny({"hidden_size": 32}, 50, "transformers")
    assert isinstance(tiny, HFModelConfig) and tiny.model_type == "llama" and tiny.vocab_size == 50
    assert isinstance(interface.tiny({}, 50, "auto"), ModelConfig)
    with pytest.raises(
        ConfigError, match=r"unsupported model_type 'qwen3'.*implementation auto or transformers"
    ):
        interface.from_hf(qwen3, "longctx")


def test_tiny_llama_trains_alike_on_both_implementations() -> None:
    """The own decoder and transformers' Llama, filled with the same seeded weights, give the same
    token losses and gradients on a packed row (the two paths do the same work)."""
    own_config = ModelConfig.tiny("llama", vocab_size=96, tie_word_embeddings=True)
    state = ParallelState.single()
    own = build_model(own_config, state, activation_checkpointing="none", bf16=False).model
    hf = build_model(
        HFModelConfig.from_hf(own_config.to_hf()), state, activation_checkpointing="none", bf16=False
    )
    hf = hf.model
    assert [n for n, _ in own.named_parameters()] == [n for n, _ in hf.named_parameters()]
    for model in (own, hf):
        fill_random(model, seed=3)
    row = packed(DOCS, 96, seed=1)
    inputs = {k: v for k, v in row.items() if k != "labels"}
    own_losses, hf_losses = (model(**inputs, labels=row["labels"]) for model in (own, hf))
    for losses in (own_losses, hf_losses):
        losses.sum().backward()
    torch.testing.assert_close(hf_losses, own_losses, rtol=1e-5, atol=1e-6)
    for (name, a), (_, b) in zip(own.named_parameters(), hf.named_parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-6, msg=name)


@pytest.mark.parametrize(
    "rope_scaling",
    [
        {"rope_type": "dynamic", "factor": 4.0},
        {
            "rope_type": "longrope",
            "short_factor": [1.0 + 0.25 * i for i in range(8)],
            "long_factor": [2.0 + 0.5 * i for i in range(8)],
            "original_max_position_embeddings": 24,
        },
    ],
    ids=["dynamic", "longrope"],
)
def test_length_dependent_rope_takes_the_window_length(rope_scaling: dict[str, Any]) -> None:
    """With a 48-token window of documents no longer than 20 tokens and a pretraining length of 24,
    dynamic and longrope rotate with the frequencies of the window's length (as the own decoder, given
    rope_seq_len), on every subset of the window's tokens (a rank's zigzag share); transformers alone
    would take each call's largest position (the unscaled or short-factor frequencies here)."""
    base = ModelConfig.tiny("llama", vocab_size=96, rope=RopeConfig(16, max_position_embeddings=24))
    base = base.with_rope(rope_scaling=rope_scaling)
    own_config = base.with_rope(max_position_embeddings=24)
    hf_config = HFModelConfig.from_hf(base.to_hf()).with_rope(max_position_embeddings=24)
    state = ParallelState.single()
    own = build_model(own_config, state, activation_checkpointing="none", bf16=False).model
    hf = build_model(hf_config, state, activation_checkpointing="none", bf16=False).model
    for model in (own, hf):
        fill_random(model, seed=5)
    row = packed(DOCS, 96, seed=2)
    inputs = {k: v for k, v in row.items() if k != "labels"}
    with torch.no_grad():
        want = own.logits(own(**inputs, rope_seq_len=48))
        alone = hf.logits(hf(**inputs))  # no window given: the row's largest position (19)
        got = hf.logits(hf(**inputs, rope_seq_len=48))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(alone, want, rtol=1e-3, atol=1e-3)
    rotary = hf.model.rotary_emb
    full_cos, _ = rotary(torch.zeros(1, dtype=torch.float32), row["position_ids"][None])
    shard = torch.arange(8, 16)  # positions 1..8 of the fourth document only
    cos, _ = rotary(torch.zeros(1, dtype=torch.float32), row["position_ids"][shard][None])
    assert torch.equal(cos[0], full_cos[0, shard])


def test_rope_overrides_reach_the_transformers_rotary_module() -> None:
    """train.model.rope_scaling / rope_theta and max_position_embeddings = target, written into the
    transformers config: the model's rotary frequencies equal longctx's for the same declaration
    (ntk as default RoPE with the NTK base; a missing original length is the checkpoint's)."""
    hf = HFModelConfig.from_hf(AutoConfig.for_model("qwen3", **TINY).to_dict())
    cases = [
        ({"rope_type": "yarn", "factor": 4.0}, None),
        ({"rope_type": "ntk", "factor": 8.0}, None),
        ({"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}, 500_000.0),
        (None, 123_456.0),
    ]
    for scaling, theta in cases:
        config = hf.with_rope(rope_scaling=scaling, rope_theta=theta, max_position_embeddings=256)
        assert config.max_position_embeddings == 256
        model = HFCausalLM(config)
        declared = {"max_position_embeddings": 64, "rope_theta": theta or 10_000.0, "rope_scaling": scaling}
        expected = RopeConfig.from_hf(declared, 8).with_overrides(max_position_embeddings=256)
        inv_freq, scaling_factor = inverse_frequencies(expected)
        torch.testing.assert_close(model.model.rotary_emb.inv_freq, inv_freq.float(), rtol=1e-6, atol=0)
        assert model.model.rotary_emb.attention_scaling == pytest.approx(scaling_factor)
        params = config.to_hf()["rope_parameters"]
        if scaling is not None and scaling["rope_type"] in ("yarn", "llama3"):
            assert params["original_max_position_embeddings"] == 64
        assert params["rope_type"] == (
            "default" if scaling is None or scaling["rope_type"] == "ntk" else scaling["rope_type"]
        )


@pytest.mark.parametrize("mode", ["full", "selective"])
def test_activation_checkpointing_keeps_gradients(mode: str, tmp_path: Path, monkeypatch) -> None:
    """full recomputes each decoder layer, its ring attention included; selective (the per-op policy of
    ``checkpointing.run_block`` on a transformers decoder layer) keeps the ring operator's output, so the
    ring's forward runs once per layer; both give the gradients of none."""
    from longctx.trainer.attention import ring

    folder = save_random(tmp_path / "qwen3", "qwen3")
    row = packed(DOCS, TINY["vocab_size"], seed=3)
    inputs = {k: v for k, v in row.items() if k != "labels"}
    ring_forward, calls = ring.ring_forward, []

    def counted(*args: Any) -> Any:
        calls.append(torch.is_grad_enabled())
        return ring_forward(*args)

    monkeypatch.setattr(ring, "ring_forward", counted)
    results = {}
    for checkpointing in ("none", mode):
        calls.clear()
        model = load_folder(
            folder, implementation="transformers", dtype=torch.float64, activation_checkpointing=checkpointing
        )
        model(**inputs, labels=row["labels"]).sum().backward()
        results[checkpointing] = ({n: p.grad for n, p in model.named_parameters()}, len(calls))
    layers = TINY["num_hidden_layers"]
    assert results["none"][1] == layers
    assert results[mode][1] == (2 * layers if mode == "full" else layers)
    for name, grad in results["none"][0].items():
        assert relative_error(results[mode][0][name], grad) < 1e-12, name


@pytest.mark.slow
@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_memory_model_of_a_transformers_decoder_layer(model_type: str) -> None:
    """What one transformers decoder layer keeps for backward (float32; measured as in
    test_checkpointing.py, a 3-layer model's forward minus a 2-layer one's) against the memory model of
    its dense shape (``HFModelConfig.shape``), which ``activation_checkpointing: auto`` uses: selective
    and full exactly (the per-op policy keeps the same matmul and ring outputs as in the own decoder);
    none more, by the q/k norms' and transformers' own intermediate tensors, at most 25% here (the
    approximation docs/training.md states)."""
    from longctx.trainer.planning import memory
    from tests.trainer.test_checkpointing import TOKENS, LiveStorages, row

    def held(mode: str, layers: int) -> tuple[int, Any]:
        dims = {k: v for k, v in TINY.items() if not k.endswith("token_id")}
        config = HFModelConfig.from_hf({"model_type": model_type, **dims, "num_hidden_layers": layers})
        model = HFCausalLM(config, activation_checkpointing=mode)
        materialize(model, "cpu")
        fill_random(model, seed=0)
        inputs = {k: v[0] for k, v in row(TINY["vocab_size"]).items()}
        with LiveStorages(list(model.parameters())) as live:
            out = model(**inputs)
        kept = live.alive()
        out.sum().backward()  # the kept tensors serve their purpose
        return kept, config.shape

    for mode in ("none", "selective", "full"):
        (three, shape), (two, _) = held(mode, 3), held(mode, 2)
        estimate = TOKENS * memory.held_bytes_per_token(shape, mode, 4, 4)
        if mode == "none":
            assert estimate <= three - two <= 1.25 * estimate, (three - two) / estimate
        else:
            assert three - two == estimate, mode


def test_kernels_on_the_transformers_path_take_the_attention_kernel_only(capsys) -> None:
    """train.kernels on a transformers model: the attention kernel is pinned as asked; liger's fused ops
    and compiled blocks, which replace the own decoder's modules, fall back with one printed line each
    (fused auto silently), and the model computes what it computes without them."""
    config = HFModelConfig.from_hf(ModelConfig.tiny("llama", vocab_size=96).to_hf())
    state = ParallelState.single()
    row = packed(DOCS, 96, seed=2)
    inputs = {k: v for k, v in row.items() if k != "labels"}
    losses = {}
    for name, kernels in {
        "plain": KernelsConfig(attention="math", fused="none"),
        "asked": KernelsConfig(attention="math", fused="liger", compile=True),
        "auto": KernelsConfig(),
    }.items():
        built = build_model(config, state, activation_checkpointing="none", bf16=False, kernels=kernels)
        fill_random(built.model, seed=3)
        losses[name] = built.model(**inputs, labels=row["labels"])
        printed = capsys.readouterr().out.splitlines()
        assert printed == built.kernels.notes, name
        if name == "asked":
            assert built.kernels == KernelChoice("math", "none", False, printed)
            assert built.model.attention.backend == "math"
            assert printed == [
                "train.kernels.fused liger: train.model.implementation longctx only; this transformers "
                "model runs its own modules; using PyTorch's ops",
                "train.kernels.compile: train.model.implementation longctx only; this transformers model "
                "runs its own modules; eager blocks",
            ]
        if name == "auto":
            assert built.kernels == KernelChoice("auto", "none", False, [])
    assert torch.equal(losses["asked"], losses["plain"])


REFUSED = [
    (
        "qwen3",
        {"use_sliding_window": True, "sliding_window": 32, "max_window_layers": 0},
        "sliding-window layers",
    ),
    ("gemma2", {"sliding_window": 4096}, "logit soft-capping (attn_logit_softcapping = 50.0, final"),
    ("gpt2", {"n_embd": 32, "n_layer": 2, "n_head": 4}, "absolute position embeddings (transformer.wpe)"),
    ("bloom", {"n_layer": 2, "n_head": 4}, "no rotary position embedding"),
    ("smollm3", {"no_rope_layers": [1, 0]}, "NoPE layers (no_rope_layers: no RoPE in layers 1)"),
    ("t5", {}, "it is an encoder-decoder"),
    # found by running the model's forward on the meta device with a probe attention
    ("nemotron", {}, "decoder layers that do not pass the model's keyword arguments to their attention"),
    ("doge", {}, "an attention mask of its own (DogeAttention is given one"),
    ("gpt_oss", {}, "attention sinks (model.layers.0.self_attn.sinks"),
]


@pytest.mark.parametrize("case", REFUSED, ids=[case[0] for case in REFUSED])
def test_unsupported_architectures_are_refused_in_one_line(case: tuple[str, dict, str]) -> None:
    model_type, extra, missing = case
    try:
        config = HFModelConfig.from_hf(AutoConfig.for_model(model_type, **{**TINY, **extra}).to_dict())
        config.check(64)
    except ConfigError as err:
        message = str(err)
    else:
        pytest.fail(f"{model_type} was not refused")
    assert missing in message and "\n" not in message, message


def test_a_refusal_names_each_kind_of_problem_once() -> None:
    """gpt-oss's sinks are both a parameter and an argument of its attention: one line says so once."""
    config = HFModelConfig.from_hf(AutoConfig.for_model("gpt_oss", **TINY).to_dict())
    with pytest.raises(ConfigError) as err:
        config.check(64)
    assert str(err.value).count("attention sinks") == 1


@pytest.mark.parametrize(
    ("model_type", "scaling", "message"),
    [
        ("phi3", {"rope_type": "linear", "factor": 4.0}, "phi3 config does not take rope_type 'linear'"),
        # Phi3Config reads yarn as the legacy name of longrope, then misses longrope's factors
        ("phi3", {"rope_type": "yarn", "factor": 4.0}, "phi3 config does not take rope_type 'yarn'"),
        (
            "gemma3_text",
            {"rope_type": "yarn", "factor": 4.0},
            "one RoPE per layer type (full_attention, sliding_attention)",
        ),
    ],
)
def test_a_rope_scaling_the_family_cannot_take_is_refused_naming_the_setting(
    model_type: str, scaling: dict[str, Any], message: str
) -> None:
    config = HFModelConfig.from_hf(AutoConfig.for_model(model_type, **TINY).to_dict())
    with pytest.raises(ConfigError) as err:
        config.with_rope(rope_scaling=scaling, max_position_embeddings=256)
    text = str(err.value)
    assert text.startswith("train.model.rope_scaling: ") and message in text and "\n" not in text, text


def test_a_runs_pretraining_length_wins_over_phi3s_top_level_one() -> None:
    """Phi-3 declares original_max_position_embeddings at the top level, which transformers prefers to
    the one in the RoPE parameters: the run's value must be the one the model uses (its long factors
    apply beyond it), and the one the export declares."""
    phi3 = HFModelConfig.from_hf(
        AutoConfig.for_model("phi3", **{**TINY, "max_position_embeddings": 4096}).to_dict()
    )
    assert phi3.transformers_config.original_max_position_embeddings == 4096
    scaling = {
        "rope_type": "longrope",
        "short_factor": [1.0, 1.5, 2.0, 2.5],
        "long_factor": [3.0, 4.0, 5.0, 6.0],
        "original_max_position_embeddings": 512,
    }
    extended = phi3.with_rope(rope_scaling=scaling, max_position_embeddings=2048)
    assert extended.transformers_config.original_max_position_embeddings == 512
    assert extended.to_hf()["original_max_position_embeddings"] == 512
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    inv_freq, scale = ROPE_INIT_FUNCTIONS["longrope"](extended.transformers_config, "cpu", seq_len=1024)
    declared = {"max_position_embeddings": 2048, "rope_scaling": scaling}
    want, want_scale = inverse_frequencies(RopeConfig.from_hf(declared, 8), seq_len=1024)
    torch.testing.assert_close(inv_freq.double(), want, rtol=1e-6, atol=0)  # the long factors
    assert scale == pytest.approx(want_scale)


def test_a_rope_override_keeps_the_models_own_keys_of_its_rope_parameters(tmp_path: Path) -> None:
    """Ministral 3 reads ``llama_4_scaling_beta`` from its RoPE parameters (a query temperature that
    grows with the position past the original length): a run's YaRN replaces the frequencies and keeps
    it (it was dropped, and every rank failed multiplying None by a tensor). The packed row's logits
    equal transformers' own model's, each document alone, under the extended declaration."""
    base = save_random(tmp_path / "base", "ministral3")
    config = interface.from_hf(config_json(base), "transformers")
    beta = config.transformers_config.rope_parameters["llama_4_scaling_beta"]
    extended = config.with_rope(
        rope_scaling={"rope_type": "yarn", "factor": 4.0}, max_position_embeddings=256
    )
    params = extended.to_hf()["rope_parameters"]
    assert beta > 0 and params["llama_4_scaling_beta"] == beta
    assert (params["rope_type"], params["factor"], params["original_max_position_embeddings"]) == (
        "yarn",
        4.0,
        64,
    )
    folder = shutil.copytree(base, tmp_path / "extended")
    (folder / "config.json").write_text(json.dumps(extended.to_hf()))
    lengths = [70, 30, 60]  # positions past the original 64, where the temperature rises
    row = packed(lengths, TINY["vocab_size"])
    want, _, _ = documents_alone(folder, row, lengths)
    model = load_folder(folder, implementation="transformers", dtype=torch.float64)
    with torch.no_grad():
        got = model.logits(model(**{k: v for k, v in row.items() if k != "labels"}))
    assert relative_error(got, want) < 1e-10


def test_mixtral_takes_yarn() -> None:
    """Mixtral's config leaves head_dim None (hidden / heads), which transformers' YaRN setup needs."""
    mixtral = HFModelConfig.from_hf(AutoConfig.for_model("mixtral", **{**TINY, "head_dim": None}).to_dict())
    extended = mixtral.with_rope(
        rope_scaling={"rope_type": "yarn", "factor": 4.0}, max_position_embeddings=256
    )
    extended.check(64)
    assert extended.rope_type == "yarn" and extended.transformers_config.head_dim == 8


def test_models_the_ring_trains_are_not_refused() -> None:
    """Qwen3 with a sliding window no shorter than the training windows (it never cuts a document),
    and decoders with biases, partial rotary or logit scaling (Phi-3, Granite, Cohere, GPT-NeoX)."""
    for model_type, extra in [
        ("qwen3", {"use_sliding_window": True, "sliding_window": 64, "max_window_layers": 0}),
        ("phi3", {}),
        ("granite", {"logits_scaling": 4.0}),
        ("cohere", {"logit_scale": 0.5}),
        ("gpt_neox", {}),
    ]:
        HFModelConfig.from_hf(AutoConfig.for_model(model_type, **{**TINY, **extra}).to_dict()).check(64)


@pytest.mark.parametrize("model_type", ["granite", "cohere"])
def test_logit_scaling_is_applied_as_the_causal_lm_applies_it(model_type: str, tmp_path: Path) -> None:
    extra = {"logits_scaling": 4.0} if model_type == "granite" else {"logit_scale": 0.5}
    folder = save_random(tmp_path / model_type, model_type, **extra)
    row = packed(DOCS, TINY["vocab_size"])
    want, _, _ = documents_alone(folder, row, DOCS)
    model = load_folder(folder, implementation="transformers", dtype=torch.float64)
    with torch.no_grad():
        got = model.logits(model(**{k: v for k, v in row.items() if k != "labels"}))
    assert relative_error(got, want) < 1e-10


@pytest.mark.parametrize("model_type", ["qwen3", "granite", "diffllama"])
def test_greedy_generation_with_the_key_value_cache_equals_transformers(
    model_type: str, tmp_path: Path
) -> None:
    """``longctx eval``'s generation (generate.greedy_generate, a KVCache as the model's attention) on
    the transformers path, against transformers recomputing the whole sequence for every token.
    Granite scales attention scores by attention_multiplier (1.0), not 1/sqrt(head_dim); DiffLlama's
    differential attention calls the attention twice per layer, each call with its own cache."""
    folder = save_random(tmp_path / model_type, model_type)
    prompt = list(range(3, 23))
    got = greedy_generate(
        load_folder(folder, implementation="transformers", dtype=torch.float64),
        prompt,
        6,
        torch.device("cpu"),
    )
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64)
    sequence = list(prompt)
    with torch.no_grad():
        for _ in range(6):
            sequence.append(int(reference(input_ids=torch.tensor([sequence])).logits[0, -1].argmax()))
    assert got == sequence[len(prompt) :]


def test_eval_loads_checkpoints_with_the_implementation_that_reads_them(tmp_path: Path) -> None:
    """longctx eval scores a checkpoint folder with the own decoder where it reads it (Llama) and
    with its transformers code otherwise (Qwen3); both give transformers' per-document loss."""
    from longctx.core.config import ContextConfig
    from longctx.trainer.evaluation.job import ModelSpec, load_model_spec
    from longctx.trainer.evaluation.measures import loss_by_position

    row = packed(DOCS, TINY["vocab_size"], seed=4)
    cu = torch.tensor([0, *itertools.accumulate(DOCS)])
    sample = {
        "input_ids": row["input_ids"],
        "position_ids": row["position_ids"],
        "labels": row["labels"].clamp_min(0),
        "loss_mask": row["labels"] >= 0,
        "cu_seqlens": cu,
    }
    for model_type, kind in (("llama", Transformer), ("qwen3", HFCausalLM)):
        folder = save_random(tmp_path / model_type, model_type)
        spec = ModelSpec(model_type, str(folder), folder)
        model = load_model_spec(
            spec, None, ContextConfig(original=16, target=48), TINY["vocab_size"], torch.device("cpu")
        )
        assert type(model) is kind
        buckets = loss_by_position(model.double(), [sample], 16, 48, torch.device("cpu"))
        _, total, _ = documents_alone(folder, row, DOCS)
        mean = sum(b["mean_loss"] * b["tokens"] for b in buckets if b["tokens"]) / sum(
            b["tokens"] for b in buckets
        )
        assert mean == pytest.approx(float(total) / int((row["labels"] >= 0).sum()), rel=1e-6)


def test_exported_config_reloads_in_transformers(tmp_path: Path) -> None:
    """The config the export writes (HFModelConfig.to_hf) is the transformers config, with the run's
    RoPE, the causal-LM architecture and no storage dtype or attention implementation."""
    hf = HFModelConfig.from_hf(json.loads(AutoConfig.for_model("olmo2", **TINY).to_json_string()))
    config = hf.with_rope(rope_scaling={"rope_type": "linear", "factor": 2.0}, max_position_embeddings=128)
    written = config.to_hf()
    assert written["architectures"] == ["Olmo2ForCausalLM"]
    assert not {"dtype", "torch_dtype", "transformers_version"} & written.keys()
    folder = tmp_path / "config"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(written))
    reloaded = AutoConfig.from_pretrained(folder)
    assert reloaded.max_position_embeddings == 128
    assert reloaded.rope_parameters == {"rope_type": "linear", "factor": 2.0, "rope_theta": 10_000.0}
    assert HFModelConfig.from_hf(written) == config  # a checkpoint's settings compare equal on resume
