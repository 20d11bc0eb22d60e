"""Every RoPE causal LM family of the installed transformers as a tiny random checkpoint, and
transformers' own logits for it: the ground of the family matrix (issue 35).

``rope_families()`` enumerates the families from transformers' auto mappings (nothing is
hand-listed; ``excluded_families()`` says why each other causal LM is not one), ``tiny_config``
shrinks a family's default configuration, ``save_tiny`` writes a random checkpoint with
``save_pretrained`` in float64 (float32 where the family keeps tensors in float32, its routers),
so its keys are the ones transformers saves: per-expert tensors, ``embed_out``, the original
checkpoint names of families whose modules transformers renamed. ``reference_logits`` runs each
document of a packed row alone through ``from_pretrained``'s model; its ``Reference`` says within
which tolerance a float64 implementation must reproduce the logits.

A tiny configuration is the family's default with every size shrunk by one generic rule
(``_shrink``): the sizes the configuration has are set (hidden 64, 4 heads, head dimension 16, 4
experts with top 2, MLA ranks 16/32 with rotary and non-rotary head parts of 8, 128-token windows,
256 positions, the vocabulary of ``VOCAB_SIZE`` for every family), dropouts and router jitter are
0, special tokens lie inside the vocabulary, and the layers are cut to the first layer of each
distinct kind (its entry in every per-layer list, ``layer_types``, ``mlp_layer_types``... its
membership in every list of layer indices, ``moe_layers``, ``mlp_only_layers``... and its
per-layer overrides), at least two, so that a hybrid keeps its attention layers and a
dense-then-MoE family both kinds of blocks. RoPE parameters stay the family's (Apertus' and CWM's
llama3 scaling, gpt-oss' YaRN, with their original context of 4096 to 16384 above the tiny 256
positions). ``OVERRIDES`` holds what the rule cannot know, each entry saying why.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from transformers import CONFIG_MAPPING, AutoConfig, AutoModelForCausalLM, PreTrainedConfig
from transformers.models.auto.modeling_auto import (
    MODEL_FOR_CAUSAL_LM_MAPPING,
    MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
)

VOCAB_SIZE = 128  # every family: ids 0, 1, 2 are pad, bos, eos; other special ids count down from 127
HIDDEN_SIZE = 64
HEAD_DIM = 16
WINDOW = 128  # sliding, local and chunked attention windows
MAX_POSITIONS = 256

# Sizes set wherever a configuration has the key (a sub-configuration too), even where the default
# is None: an unset size (DeepSeek-V2's num_experts_per_tok, Dots1's n_routed_experts) fails to
# build. Keys not listed here are shrunk by the patterns of ``_size``.
_SIZES: dict[str, int] = {
    "vocab_size": VOCAB_SIZE,
    "vocab_size_per_layer_input": VOCAB_SIZE,  # Gemma 3n/4 per-layer embeddings, indexed by token id
    "hidden_size": HIDDEN_SIZE,
    "hidden_size_global": HIDDEN_SIZE,  # BLT's global transformer, as seen by its local encoder
    "hidden_size_per_layer_input": 16,
    "n_embd": HIDDEN_SIZE,
    "d_model": HIDDEN_SIZE,
    "num_attention_heads": 4,
    "n_head": 4,
    "n_heads": 4,
    "head_dim": HEAD_DIM,
    "kv_channels": HEAD_DIM,
    "max_position_embeddings": MAX_POSITIONS,
    "n_positions": MAX_POSITIONS,
    "n_ctx": MAX_POSITIONS,
    "max_seq_len": MAX_POSITIONS,
    # mixture of experts
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "moe_num_experts": 4,
    "num_experts_per_tok": 2,
    "num_experts_per_token": 2,
    "moe_k": 2,
    "moe_topk": 2,
    "moe_top_k": 2,
    "top_k_experts": 2,
    "n_shared_experts": 1,
    "n_group": 1,
    "topk_group": 1,
    "num_expert_group": 1,
    # multi-head latent attention: q/k heads of 8 + 8, value heads of 8
    "kv_lora_rank": 16,
    "q_lora_rank": 32,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "qk_head_dim": 16,
    "v_head_dim": 8,
    # sparse-attention indexers, linear attention, state-space layers, byte-level hashing
    "index_n_heads": 2,
    "index_num_heads": 2,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_num_heads": 4,
    "mamba_n_heads": 8,
    "mamba_d_state": 16,
    "mamba_d_ssm": 128,
    "mamba_chunk_size": 32,  # the chunked scan pads to a chunk: 256 makes the forward ten times slower
    "encoder_hash_byte_group_vocab": 64,
    "zero_expert_num": 2,  # LongCat-Flash's identity experts, routed like the others
}
_NONE_IS_A_TRAIT = {"q_lora_rank"}  # None: queries without low-rank compression (DeepSeek-V2-Lite)
# ModernBERT's local_attention is the width of a centred window: its causal sliding_window is half.
# Doge masks keys dynamically only beyond keep_window_size tokens.
_WINDOWS = {
    "sliding_window": WINDOW,
    "attention_window_size": WINDOW,
    "attention_chunk_size": WINDOW,
    "keep_window_size": WINDOW,
    "local_attention": 2 * WINDOW,
}
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers")
_DENSE_PREFIX_KEYS = (
    "first_k_dense_replace",
    "num_dense_layers",
    "num_dense_blocks",
    "moe_layer_start_index",
)
_INDEX_LIST_SUFFIXES = ("_idxs", "_ids", "_layers", "_indices")
_ROTARY_FIELDS = {"rope_parameters", "rotary_dim", "rotary_value"}

# What the generic rule cannot know, per family.
OVERRIDES: dict[str, dict[str, Any]] = {
    # The default cohere_compass_text has no RoPE parameters: its rotary module reads M-RoPE
    # parameters per layer type, which released checkpoints carry (sections sum to head_dim / 2).
    "cohere_compass_text": {
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": 10_000.0, "mrope_section": [4, 2, 2]}
        }
    },
    # DbrxAttention reads attn_config.rope_theta, which DbrxAttentionConfig only has when given,
    # and clamps q/k/v with clip_qkv, which fails when it is None (released DBRX: 8).
    "dbrx": {"attn_config": {"rope_theta": 10_000.0, "clip_qkv": 8.0}},
    # The last 15 of 35 layers reuse earlier layers' keys and values; kept: 2 of the 4 tiny layers,
    # after one producer of each attention kind.
    "gemma3n_text": {"num_kv_shared_layers": 2},
    # RoPE is optional here (position_embedding_type None or "nope" in released checkpoints).
    "granitemoehybrid": {"position_embedding_type": "rope"},
    # num_hidden_layers is stored inflated by the recurrent cycles; None re-derives it from the
    # tiny layer count.
    "hrm_text": {"num_layers_per_stack": None},
    # Indexed layers whose keys and values come from an earlier indexed layer, and one indexer
    # layer, as in the released layout (layer 4 indexes, layers 9 and 14 reuse it).
    "kolibri1_1": {
        "num_hidden_layers": 4,
        "layer_types": ["sliding_attention", "indexed_attention", "indexed_attention", "sliding_attention"],
        "index_layers": [1],
        "kv_source_layers": [0, 1, 1, 3],
        "mlp_only_layers": [0],
    },
    # No default layer_types (released checkpoints list them): one dense conv layer, one MoE
    # attention layer.
    "lfm2_moe": {"layer_types": ["conv", "full_attention"], "num_dense_layers": 1},
    # The multimodal model builds its audio and vision encoders; their convolution widths are not
    # named like sizes.
    "phi4_multimodal": {
        "audio_config": {
            "num_blocks": 2,
            "ext_pw_out_channel": HIDDEN_SIZE,
            "depthwise_separable_out_channel": HIDDEN_SIZE,
            "nemo_conv_channels": HIDDEN_SIZE,
        }
    },
    # Indexed attention layers need the QSA indexer settings, which default to None.
    "qwen4_exp_text": {
        "indexer_n_heads": 2,
        "indexer_kv_heads": 1,
        "indexer_head_dim": HEAD_DIM,
        "indexer_budget": 64,
        "indexer_compress_ratio": 4,
    },
    # block_types is a repeating pattern (recurrent, recurrent, attention): 2 layers would have no
    # attention.
    "recurrent_gemma": {"block_types": ["recurrent", "attention"]},
    # A BERT-like model: without is_decoder its attention is bidirectional.
    "roformer": {"is_decoder": True},
    # RoPE in the shared attention blocks is optional (use_mem_rope, default False).
    "zamba2": {"use_mem_rope": True},
    # ZAYA's configuration refuses any other top-k.
    "zaya": {"num_experts_per_tok": 1},
}

# The relative error within which an implementation computing in float64 reproduces the reference
# (``Reference.tolerance``): float64 rounding, or float32 rounding where the reference computes in
# float32 somewhere.
FLOAT64_TOLERANCE = 1e-10
FLOAT32_TOLERANCE = 1e-6


def rope_families() -> list[str]:
    """Every ``model_type`` of transformers' causal LM mapping that is a decoder-only model with
    rotary positions, in the mapping's order.

    Rotary: the configuration class declares RoPE parameters, i.e. the ``rope_parameters`` field
    into which transformers 5 standardizes every RoPE setting (``rope_theta``, ``rope_scaling``,
    ``rotary_pct``, ``rotary_emb_base``, ``partial_rotary_factor``, per-layer-type dictionaries), or,
    for the families that predate it, ``rotary_dim`` (GPT-J, CodeGen) or ``rotary_value`` (RoFormer).
    The declaration counts, not the default value: a family whose default leaves RoPE off or empty
    (Zamba2, GraniteMoeHybrid, cohere_compass_text) is still one, and ``OVERRIDES`` turns it on.
    Decoder-only: not encoder-decoder, and no ``text_config`` (see ``excluded_families``).
    """
    excluded = excluded_families()
    return [model_type for model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES if model_type not in excluded]


def excluded_families() -> dict[str, str]:
    """The other ``model_type`` s of the causal LM mapping, each with the reason it is not a family."""
    reasons = {}
    for model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        cls = CONFIG_MAPPING[model_type]
        if getattr(cls, "is_encoder_decoder", False):
            reasons[model_type] = "encoder-decoder"
        elif "text_config" in cls.sub_configs:
            reasons[model_type] = (
                "composite (text_config): a multimodal wrapper, whose text decoder is a family of its own "
                "or has no causal LM mapping, or a speculative-decoding assistant"
            )
        elif not {f.name for f in dataclasses.fields(cls)} & _ROTARY_FIELDS:
            reasons[model_type] = "no rotary positions"
    return reasons


def tiny_config(model_type: str, **overrides: Any) -> PreTrainedConfig:
    """A tiny configuration of ``model_type`` (see the module docstring); ``overrides`` are applied
    last, a dictionary merged into a dictionary setting (a sub-configuration, ``rope_parameters``)."""
    default = CONFIG_MAPPING[model_type]()
    settings = _shrink(_settings(default), iter(range(VOCAB_SIZE - 1, 2, -1)))
    for extra in (OVERRIDES.get(model_type, {}), overrides):
        for key, value in extra.items():
            merge = isinstance(value, dict) and isinstance(settings.get(key), dict)
            settings[key] = {**settings[key], **value} if merge else value
    return AutoConfig.for_model(model_type, **settings)


def _settings(config: PreTrainedConfig) -> dict[str, Any]:
    """A configuration's fields as stored (``vars``: heterogeneous configurations refuse ``getattr``
    of a per-layer field; ``getattr`` for a field stored under its ``attribute_map`` name), with its
    per-layer overrides (``per_layer_config``: Gemma 4, Dots 3)."""
    stored = vars(config)
    settings = {
        f.name: stored[f.name] if f.name in stored else getattr(config, f.name)
        for f in dataclasses.fields(type(config))
    }
    per_layer = config.to_dict().get("per_layer_config")
    if per_layer:
        settings["per_layer_config"] = {int(i): values for i, values in per_layer.items()}
    return settings


def _shrink(settings: dict[str, Any], free_ids: Iterator[int]) -> dict[str, Any]:
    """The settings that make ``settings`` tiny; ``free_ids`` gives special token ids other than
    pad, bos and eos, shared with the sub-configurations so that no two are equal."""
    tiny = _sizes(settings)
    for key, value in settings.items():
        if isinstance(value, PreTrainedConfig):
            tiny[key] = _shrink(_settings(value), free_ids)
        elif isinstance(value, float) and re.search(r"dropout|pdrop|jitter", key):
            tiny[key] = 0.0
        elif key in _WINDOWS and isinstance(value, int):
            tiny[key] = _WINDOWS[key]
    tiny.update(_token_ids(settings, free_ids))
    tiny.update(_layers(settings))
    return tiny


def _sizes(settings: dict[str, Any]) -> dict[str, Any]:
    """Tiny values for the sizes among ``settings``, a configuration's or one layer's overrides.

    Key and value heads keep the family's kind: as many key/value heads as query heads (MHA, and
    MLA, which repeats keys per head), one (MQA), or 2 of 4 (GQA). MLA's head_dim, the rotary part,
    follows qk_rope_head_dim; a rotary_dim covers half the head, as GPT-J's 64 of 256 a quarter.
    """
    tiny = {key: small for key, value in settings.items() if (small := _size(key, value)) is not value}
    heads = next((settings[k] for k in ("num_attention_heads", "n_head", "n_heads") if k in settings), None)
    for key in ("num_key_value_heads", "num_kv_heads", "kv_n_heads"):
        if key in settings:
            kv = settings[key]
            tiny[key] = 4 if kv in (None, heads) else 1 if kv == 1 else 2
    if "qk_rope_head_dim" in settings and settings.get("head_dim") == settings["qk_rope_head_dim"]:
        tiny["head_dim"] = _SIZES["qk_rope_head_dim"]
    if settings.get("rotary_dim"):
        tiny["rotary_dim"] = HEAD_DIM // 2
    return tiny


def _size(key: str, value: Any) -> Any:
    """The tiny value of one setting, or ``value`` itself when it is not a size."""
    if key in _SIZES and (value is not None or key not in _NONE_IS_A_TRAIT):
        return _SIZES[key]
    if isinstance(value, bool) or not isinstance(value, int):
        return value
    if ("intermediate_size" in key or "ffn_" in key) and "multiple" not in key:
        return 32 if re.search("moe|expert|shared", key) else 128
    if key.endswith(("head_dim", "d_head", "headdim")):
        return HEAD_DIM
    if key.endswith(("lora_rank", "lowrank")):
        return 16
    return value


def _token_ids(settings: dict[str, Any], free_ids: Iterator[int]) -> dict[str, Any]:
    """pad 0, bos 1, eos 2 (an eos list keeps its length), any other special id from ``free_ids``."""
    fixed = {"pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2}
    tiny: dict[str, Any] = {}
    for key in sorted(k for k, v in settings.items() if k.endswith("_token_id") and v is not None):
        first = fixed[key] if key in fixed else next(free_ids)
        value = settings[key]
        tiny[key] = [first] + [next(free_ids) for _ in value[1:]] if isinstance(value, list) else first
    return tiny


def _is_index_list(key: str, value: Any, layers: int) -> bool:
    """Whether ``value`` lists layer indices (``moe_layers``, ``mlp_only_layers``, ``full_attn_idxs``)."""
    return (
        key.endswith(_INDEX_LIST_SUFFIXES)
        and isinstance(value, (list, tuple))
        and all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < layers for i in value)
        and all(a < b for a, b in itertools.pairwise(value))
    )


def _layers(settings: dict[str, Any]) -> dict[str, Any]:
    """Keep the first layer of each distinct kind (at least two layers) in every per-layer setting."""
    layer_key = next((k for k in _LAYER_KEYS if isinstance(settings.get(k), int)), None)
    if layer_key is None:
        return {}
    n = settings[layer_key]
    index_lists = {k: v for k, v in settings.items() if _is_index_list(k, v, n)}
    per_layer = {
        k: v
        for k, v in settings.items()
        if isinstance(v, (list, tuple)) and len(v) == n and k not in index_lists
    }
    layer_configs: dict[int, dict[str, Any]] = settings.get("per_layer_config", {})
    keep: list[int] = []
    kinds: set[str] = set()
    for i in range(n):
        kind = repr(
            ([v[i] for v in per_layer.values()], [i in v for v in index_lists.values()], layer_configs.get(i))
        )
        if kind not in kinds:
            kinds.add(kind)
            keep.append(i)
    keep = sorted(keep + [i for i in range(n) if i not in keep][: max(0, 2 - len(keep))])
    tiny: dict[str, Any] = {layer_key: len(keep)}
    tiny.update(
        {
            key: [_size(key.removesuffix("_per_layer"), value[i]) for i in keep]
            for key, value in per_layer.items()
        }
    )
    tiny.update({key: [keep.index(i) for i in value if i in keep] for key, value in index_lists.items()})
    if layer_configs:
        tiny["per_layer_config"] = {
            new: {
                k: v for k, v in _sizes({**settings, **layer_configs[old]}).items() if k in layer_configs[old]
            }
            for new, old in enumerate(keep)
            if old in layer_configs
        }
    for key in _DENSE_PREFIX_KEYS:
        if isinstance(settings.get(key), int) and settings[key] > 0:
            tiny[key] = 1
    return tiny


def build_tiny(model_type: str, seed: int = 0, **overrides: Any) -> torch.nn.Module:
    """The tiny model of ``model_type`` in float64 with random weights (``randomize``), built
    deterministically (whatever transformers' constructors draw is drawn from ``seed``) and
    finished as ``from_pretrained`` finishes a loaded checkpoint, so that it is the model its
    saved folder loads as."""
    config = tiny_config(model_type, **overrides)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float64, experts_implementation="eager")
    randomize(model, seed)
    _finish_as_loaded(model)
    return model.eval()


def _finish_as_loaded(model: torch.nn.Module) -> None:
    """What ``from_pretrained`` does once the checkpoint is in: run the family's weight
    initialization, whose guarded initializers skip the loaded tensors. It recomputes the buffers
    that are not saved as loading does (GPT-J's and CodeGen's sinusoid tables differ by 4e-8 from
    the ones ``from_config`` builds in float64) and applies the initializers that are not guarded
    (ZAYA's router sets its last balancing bias to -1 over any checkpoint value)."""
    for tensor in model.state_dict(keep_vars=True).values():
        tensor._is_hf_initialized = True
    for module in model.modules():
        module._is_hf_initialized = False
    model.initialize_weights()


@torch.no_grad()
def randomize(model: torch.nn.Module, seed: int) -> None:
    """Random weights large enough to exercise every path: norm weights around 1, every other
    parameter with standard deviation 0.15. A saved floating-point buffer that holds one value
    at initialization (a router's score correction, a layer scale, an activation's constant) gets
    that value plus the same noise, so that only the checkpoint can supply it; a buffer computed
    entry by entry (MiniMax's decay tables, which carry its causal mask) keeps its values, as do
    the buffers that are not saved (RoPE frequencies), which ``from_pretrained`` computes again."""
    generator = torch.Generator().manual_seed(seed)
    tensors = dict(model.named_parameters())
    for module_name, module in model.named_modules():
        for name, buffer in module.named_buffers(recurse=False):
            saved = name not in module._non_persistent_buffers_set
            if saved and buffer.is_floating_point() and bool((buffer == buffer.flatten()[0]).all()):
                tensors[f"{module_name}.{name}".lstrip(".")] = buffer
    for name, tensor in sorted(tensors.items()):
        noise = torch.randn(tensor.shape, generator=generator, dtype=torch.float64)
        if not isinstance(tensor, torch.nn.Parameter):
            tensor.add_(0.15 * noise)
        elif re.search(r"norm|(^|\.)ln", name.lower()):
            tensor.copy_(1.0 + 0.2 * noise)
        else:
            tensor.copy_(0.15 * noise)


def save_tiny(folder: Path, model_type: str, seed: int = 0, **overrides: Any) -> Path:
    """``build_tiny``'s model saved by ``save_pretrained`` into ``folder``, float64."""
    build_tiny(model_type, seed, **overrides).save_pretrained(folder)
    return folder


def reference_attention(model_type: str) -> str:
    """The attention implementation of the reference: ``sdpa``, which computes in float64, where
    the family supports it, else ``eager``."""
    model_class = MODEL_FOR_CAUSAL_LM_MAPPING[CONFIG_MAPPING[model_type]]
    return "sdpa" if model_class._supports_sdpa else "eager"


def load_reference(folder: Path) -> torch.nn.Module:
    """transformers' model of a saved folder, float64, with ``reference_attention`` and eager experts
    (the default grouped matmul refuses float64)."""
    model_type = json.loads((folder / "config.json").read_text())["model_type"]
    return AutoModelForCausalLM.from_pretrained(
        folder,
        dtype=torch.float64,
        attn_implementation=reference_attention(model_type),
        experts_implementation="eager",
    )


@dataclasses.dataclass(frozen=True)
class Reference:
    """transformers' logits for the documents of a packed row, each run alone, and how closely a
    float64 implementation can reproduce them."""

    logits: torch.Tensor  # (sum(lengths), vocab), float64
    attention: str  # the reference's attention implementation: "sdpa" or "eager"
    # Where the reference computes in float32 (``Float32Operations``), "logits" if it returns float32
    # logits (BLT, Beam, Dory, Ergo, HY-V4); empty if nowhere.
    float32: tuple[str, ...]

    @property
    def tolerance(self) -> float:
        """The relative error (largest absolute difference over the largest absolute logit)
        expected of a float64 implementation. Float32 results depend on the shapes and memory
        layout they are computed with (a float32 matrix product's summation order, the vectorized
        or scalar path of an exponential), so another implementation, or transformers' own model on
        another length, agrees with the reference only to about 1e-7 where it computes in float32."""
        return FLOAT32_TOLERANCE if self.float32 else FLOAT64_TOLERANCE


class Float32Operations(TorchFunctionMode):
    """Records the float32 operations a model runs whose result depends on the shapes it runs
    with: matrix products and transcendental functions (an MoE router's linear layer and softmax,
    an eager softmax upcast to float32, a gated-delta or Mamba scan's exponentials). Rotary and
    normalization modules are left out: they compute in float32 in almost every family, on values
    (positions, one row's variance) that do not depend on the other tokens."""

    _OPERATIONS = frozenset(
        {"linear", "matmul", "__matmul__", "mm", "bmm", "addmm", "baddbmm", "einsum", "softmax"}
        | {
            "log_softmax",
            "exp",
            "log",
            "log1p",
            "expm1",
            "sigmoid",
            "tanh",
            "softplus",
            "silu",
            "gelu",
            "erf",
        }
    )
    _LEFT_OUT = re.compile(r"Rotary|RoPE|Norm")  # case matters: SolarOpenModel is no RoPE module

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model
        self.found: set[str] = set()
        self._left_out_depth = 0
        self._hooks: list[torch.utils.hooks.RemovableHandle] = []

    def __enter__(self) -> Float32Operations:
        for module in self.model.modules():
            if self._LEFT_OUT.search(type(module).__name__):
                self._hooks.append(module.register_forward_pre_hook(lambda *_: self._step(1)))
                self._hooks.append(module.register_forward_hook(lambda *_: self._step(-1)))
        return super().__enter__()

    def __exit__(self, *exc_info: object) -> None:
        for hook in self._hooks:
            hook.remove()
        super().__exit__(*exc_info)

    def _step(self, depth: int) -> None:
        self._left_out_depth += depth

    def __torch_function__(self, func, types, args=(), kwargs=None):
        result = func(*args, **(kwargs or {}))
        name = getattr(func, "__name__", "")
        float32 = isinstance(result, torch.Tensor) and result.dtype == torch.float32
        if float32 and self._left_out_depth == 0 and name in self._OPERATIONS:
            self.found.add(name)
        return result


@torch.no_grad()
def reference_logits(folder: Path, lengths: list[int], input_ids: torch.Tensor) -> Reference:
    """transformers' logits for each document of a packed row run alone (a batch of one, positions
    0..n-1), concatenated; ``input_ids`` is the row, shape ``(sum(lengths),)``. The longest
    document runs under ``Float32Operations``."""
    model = load_reference(folder)
    longest = max(range(len(lengths)), key=lengths.__getitem__)
    parts = []
    for index, document in enumerate(input_ids.split(lengths)):
        if index == longest:
            with Float32Operations(model) as recorder:
                parts.append(model(input_ids=document[None], use_cache=False).logits[0])
        else:
            parts.append(model(input_ids=document[None], use_cache=False).logits[0])
    float32 = sorted(recorder.found) + (["logits"] if parts[0].dtype == torch.float32 else [])
    return Reference(
        logits=torch.cat(parts).to(torch.float64),
        attention=model.config._attn_implementation,
        float32=tuple(float32),
    )


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """The largest absolute difference over the largest absolute value of ``want``."""
    return float((got.double() - want.double()).abs().max() / want.double().abs().max().clamp_min(1e-12))
