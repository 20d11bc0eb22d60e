"""The configuration of a Llama-family decoder (:class:`ModelConfig`) and its Hugging Face form.

A config is read from and written to a ``config.json`` of Llama, Mistral or Qwen2 the way transformers
reads it (:meth:`ModelConfig.from_hf`, :meth:`ModelConfig.to_hf`): transformers' defaults for the keys
it omits, the keys this model does not interpret kept verbatim, RoPE through ``longctx.trainer.models.rope``,
and the checkpoint's sliding-window attention read so that training can refuse to change it
(:meth:`ModelConfig.check`). The modules themselves are ``longctx.trainer.models.decoder``;
reading and writing weights is ``longctx.trainer.models.weights``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from longctx.trainer.models.rope import HF_ROPE_KEYS, RopeConfig
from longctx.trainer.models.shape import ModelShape

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")

_ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM", "qwen2": "Qwen2ForCausalLM"}

# transformers' config-class defaults for the keys read here, applied when config.json omits them.
_HF_DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {"max_position_embeddings": 2048, "rms_norm_eps": 1e-6},
    "mistral": {"max_position_embeddings": 4096 * 32, "rms_norm_eps": 1e-6, "num_key_value_heads": 8},
    "qwen2": {"max_position_embeddings": 32768, "rms_norm_eps": 1e-6, "num_key_value_heads": 32},
}

# Keys ModelConfig interprets; every other config.json key is kept verbatim in ``hf_extra``.
_MODEL_KEYS = frozenset(
    {
        "model_type",
        "architectures",
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "hidden_act",
        "rms_norm_eps",
        "tie_word_embeddings",
        "attention_bias",
        "mlp_bias",
        "attention_dropout",
        # Storage dtype of the tensors, not a model property: written by folder.write_checkpoint when saving.
        "dtype",
        "torch_dtype",
        "transformers_version",
    }
)


@dataclass(frozen=True)
class ModelConfig:
    """Shape and hyperparameters of a Llama-family decoder, convertible to and from ``config.json``.

    ``attention_bias`` and ``mlp_bias`` are Llama's switches (biases on all four attention
    projections, on the MLP); Qwen2 always has q/k/v biases and no others (:attr:`qkv_bias`).
    ``hf_extra`` holds the config.json keys this model does not interpret (token ids,
    ``initializer_range``, sliding-window settings, ...) and is written back unchanged by :meth:`to_hf`.
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rope: RopeConfig
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    mlp_bias: bool = False
    hf_extra: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"unsupported model_type {self.model_type!r}: "
                f"longctx supports {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        if self.model_type != "llama" and (self.attention_bias or self.mlp_bias):
            raise ValueError(f"attention_bias and mlp_bias are Llama options, not {self.model_type!r} ones")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.rope.head_dim != self.head_dim:
            raise ValueError(f"rope.head_dim {self.rope.head_dim} differs from head_dim {self.head_dim}")

    @property
    def input_embedding(self) -> tuple[int, str]:
        """The rows of the embedding token ids index, and its name (one embedding here)."""
        return self.vocab_size, "embedding"

    @property
    def shape(self) -> ModelShape:
        """The dimensions the FLOP model (``longctx.trainer.planning.flops``) reads."""
        return ModelShape(
            name=self.model_type,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_layers=self.num_hidden_layers,
            num_heads=self.num_attention_heads,
            num_kv_heads=self.num_key_value_heads,
            head_dim=self.head_dim,
            vocab_size=self.vocab_size,
            tie_word_embeddings=self.tie_word_embeddings,
        )

    @property
    def qkv_bias(self) -> bool:
        """Whether the q, k and v projections have biases."""
        return self.attention_bias or self.model_type == "qwen2"

    @property
    def max_position_embeddings(self) -> int:
        """The context length the config declares (used by some RoPE scalings)."""
        return self.rope.max_position_embeddings

    @property
    def sliding_window(self) -> int | None:
        """Window of the checkpoint's sliding-window attention layers, or None if all attend fully.

        Read as transformers does: Mistral applies ``sliding_window`` (default 4096) to every layer
        unless it is null; Qwen2 only with ``use_sliding_window``, to the layers marked
        ``sliding_attention`` in ``layer_types`` (default: layers from ``max_window_layers`` on).
        This model always attends fully (see :meth:`check`).
        """
        extra = self.hf_extra
        if self.model_type == "mistral":
            return extra.get("sliding_window", 4096)
        if self.model_type == "qwen2" and extra.get("use_sliding_window", False):
            window = extra.get("sliding_window", 4096)
            layer_types = extra.get("layer_types") or [
                "sliding_attention" if i >= extra.get("max_window_layers", 28) else "full_attention"
                for i in range(self.num_hidden_layers)
            ]
            return window if window is not None and "sliding_attention" in layer_types else None
        return None

    def check(self, seq_len: int) -> None:
        """Refuse to train windows of ``seq_len`` tokens that the checkpoint's attention cannot see.

        This model attends over whole documents. That equals the checkpoint's sliding-window
        attention only while no document is longer than the window, so a window smaller than
        ``seq_len`` is an error; to extend such a model to full attention on purpose, set
        ``sliding_window`` to null (Mistral) or ``use_sliding_window`` to false (Qwen2) in config.json.
        """
        window = self.sliding_window
        if window is not None and window < seq_len:
            raise ValueError(
                f"this {self.model_type} checkpoint uses sliding-window attention of {window} tokens, "
                f"smaller than the training length {seq_len}; longctx trains full causal attention, "
                "which would change the model. Set sliding_window to null (Mistral) or use_sliding_window "
                "to false (Qwen2) in config.json to extend it to full attention deliberately."
            )

    @classmethod
    def from_hf(cls, hf_config: Mapping[str, Any]) -> ModelConfig:
        """Build from a Hugging Face ``config.json`` dict of a Llama, Mistral or Qwen2 model.

        Raises ``ValueError`` for other model types and for features this model does not implement
        (activations other than SiLU, attention dropout, per-layer RoPE).
        """
        model_type = hf_config.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"unsupported model_type {model_type!r}: longctx supports {', '.join(SUPPORTED_MODEL_TYPES)}"
            )
        hf = {**_HF_DEFAULTS[model_type], **{k: v for k, v in hf_config.items() if v is not None}}
        missing = [
            key
            for key in (
                "vocab_size",
                "hidden_size",
                "intermediate_size",
                "num_hidden_layers",
                "num_attention_heads",
            )
            if key not in hf
        ]
        if missing:
            raise ValueError(f"config.json lacks {', '.join(missing)}")
        if hf.get("hidden_act", "silu") != "silu":
            raise ValueError(f"only SwiGLU (hidden_act 'silu') is supported, got {hf['hidden_act']!r}")
        if hf.get("attention_dropout", 0.0):
            raise ValueError("attention_dropout is not supported; set it to 0.0")
        head_dim = hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]
        consumed = _MODEL_KEYS | HF_ROPE_KEYS
        return cls(
            model_type=model_type,
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf["intermediate_size"],
            num_hidden_layers=hf["num_hidden_layers"],
            num_attention_heads=hf["num_attention_heads"],
            num_key_value_heads=hf.get("num_key_value_heads", hf["num_attention_heads"]),
            head_dim=head_dim,
            rope=RopeConfig.from_hf(hf, head_dim),
            rms_norm_eps=float(hf["rms_norm_eps"]),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            attention_bias=bool(hf.get("attention_bias", False)) if model_type == "llama" else False,
            mlp_bias=bool(hf.get("mlp_bias", False)) if model_type == "llama" else False,
            hf_extra={k: v for k, v in hf_config.items() if k not in consumed},
        )

    def to_hf(self) -> dict[str, Any]:
        """The ``config.json`` dict transformers loads this model from (without the storage dtype)."""
        hf: dict[str, Any] = {
            **self.hf_extra,
            "architectures": [_ARCHITECTURES[self.model_type]],
            "model_type": self.model_type,
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "hidden_act": "silu",
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_dropout": 0.0,
            **self.rope.to_hf(),
        }
        if self.model_type == "llama":
            hf.update(attention_bias=self.attention_bias, mlp_bias=self.mlp_bias)
        return hf

    def with_rope(
        self,
        *,
        rope_scaling: Mapping[str, Any] | None = None,
        rope_theta: float | None = None,
        max_position_embeddings: int | None = None,
    ) -> ModelConfig:
        """This config with RoPE overrides declared as in ``config.json`` (``RopeConfig.with_overrides``)."""
        rope = self.rope.with_overrides(
            rope_scaling=rope_scaling, rope_theta=rope_theta, max_position_embeddings=max_position_embeddings
        )
        return dataclasses.replace(self, rope=rope)

    @classmethod
    def tiny(cls, model_type: str = "llama", **overrides: Any) -> ModelConfig:
        """A small config for tests and demos: hidden 64, 2 layers, 4 heads, 2 kv heads, vocab 128.

        ``overrides`` replace any field; ``head_dim`` defaults to ``hidden_size // num_attention_heads``
        and ``rope`` to default RoPE over 256 positions. Mistral gets ``sliding_window: null``
        (full attention) unless ``hf_extra`` is given.
        """
        values: dict[str, Any] = {
            "vocab_size": 128,
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            **overrides,
        }
        head_dim = values.setdefault("head_dim", values["hidden_size"] // values["num_attention_heads"])
        values.setdefault("rope", RopeConfig(head_dim=head_dim, max_position_embeddings=256))
        values.setdefault("hf_extra", {"sliding_window": None} if model_type == "mistral" else {})
        return cls(model_type=model_type, **values)
