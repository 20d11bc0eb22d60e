"""Any transformers causal LM over packed, context-parallel rows: the ``transformers`` implementation.

:class:`HFCausalLM` trains the model a checkpoint's ``config.json`` describes with that model's own
transformers modeling code (its projections, q/k norms, biases, RoPE module), longctx's ring attention
plugged in through transformers' ``AttentionInterface`` (``hf_attention``), and the same interface as
the own decoder (``longctx.trainer.models.decoder.Transformer``): ``forward(input_ids, position_ids,
token_index, segment_ids, rope_seq_len=..., labels=...)`` returns final hidden states, or each token's
loss computed in chunks from them (``model.chunked_cross_entropy``: ``[tokens, vocab]`` logits never
exist at once), ``logits(hidden)``, ``attention`` (the
:class:`~longctx.trainer.models.decoder.RingAttention`),
``config`` (an :class:`HFModelConfig`) and Hugging Face parameter names (the causal LM's own children
are the wrapper's, so its state dict, distributed checkpoints and the export use transformers' names).

RoPE scaling from the run (``train.model.rope_scaling``, ``rope_theta``, ``max_position_embeddings`` =
``context.target``) is written into the transformers config (``rope_parameters`` in transformers 5,
``rope_scaling`` and ``rope_theta`` before), so the model's rotary module computes it and the exported
``config.json`` declares it. Length-dependent types (``dynamic``, ``longrope``) take their frequencies
from the window length, as on the own path: the rotary module is run with the frequencies transformers
computes for that length (its ``ROPE_INIT_FUNCTIONS`` with ``seq_len``), not with the per-rank
``max(position_ids) + 1`` transformers would use. Which models qualify: ``hf_arch``.
"""

from __future__ import annotations

import copy
import importlib.util
import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch
from torch import Tensor, nn

from longctx.core.errors import ConfigError
from longctx.trainer.models.decoder import (
    Attention,
    RingAttention,
    bind_row,
    checkpointing_mode,
    chunked_cross_entropy,
)
from longctx.trainer.models.hf_arch import (
    call_problems,
    config_problems,
    model_problems,
    rotary_modules,
    window_pinnable,
)
from longctx.trainer.models.hf_attention import (
    ATTENTION_NAME,
    PROBE_NAME,
    ROWS_KWARG,
    PackedRows,
    attention_calls,
    checkpoint_layers,
    register,
)
from longctx.trainer.models.hf_conversion import checkpoint_transforms, to_checkpoint
from longctx.trainer.models.rope_keys import LENGTH_DEPENDENT_TYPES, declared_rope, with_run_rope
from longctx.trainer.models.shape import ModelShape

EXTRA = "pip install 'longctx[transformers]'"
# The config.json keys that declare RoPE (transformers 5 writes rope_parameters; the others are read too).
_ROPE_DECLARATION = (
    "rope_parameters",
    "rope_scaling",
    "rope_theta",
    "max_position_embeddings",
    "original_max_position_embeddings",
)
# Not part of the model: the writing library's version, the attention kernel, the storage dtype (the
# export writes its own, see folder.write_checkpoint).
_UNSAVED_KEYS = (
    "transformers_version",
    "_attn_implementation_autoset",
    "attn_implementation",
    "dtype",
    "torch_dtype",
)


def require_transformers() -> Any:
    """The ``transformers`` module, or a :class:`ConfigError` naming the extra that installs it."""
    if importlib.util.find_spec("transformers") is None or importlib.util.find_spec("accelerate") is None:
        raise ConfigError(
            "the transformers implementation (train.model.implementation) needs transformers and "
            f"accelerate: {EXTRA}"
        )
    import transformers

    if int(transformers.__version__.split(".")[0]) < 5:
        raise ConfigError(
            "the transformers implementation (train.model.implementation) needs transformers 5 (its "
            f"rope_parameters and checkpoint conversion), found {transformers.__version__}: {EXTRA}"
        )
    return transformers


def _causal_lm_class_name(config: Any) -> str:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    name = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.model_type)
    if name is None:
        kind = "an encoder-decoder" if getattr(config, "is_encoder_decoder", False) else "not a causal LM"
        raise ConfigError(
            f"{config.model_type} cannot be trained with ring attention: it is {kind} in transformers"
        )
    return name


def _transformers_config(hf: Mapping[str, Any]) -> Any:
    """The transformers config object of a ``config.json`` dict (its class chosen by ``model_type``;
    never code from a checkpoint folder)."""
    transformers = require_transformers()
    values = copy.deepcopy(
        {k: v for k, v in hf.items() if k not in ("model_type", "auto_map")}
    )  # kept as given
    model_type = hf.get("model_type")
    if model_type not in transformers.CONFIG_MAPPING:
        raise ConfigError(
            f"model_type {model_type!r} is not in the installed transformers {transformers.__version__} "
            "(longctx never runs code from a checkpoint folder; a newer transformers may have it)"
        )
    # config.json writes Infinity and NaN as {"__float__": ...}; transformers decodes them when it reads one
    values = transformers.PreTrainedConfig._decode_special_floats(values)
    try:
        return transformers.AutoConfig.for_model(model_type, **values)
    except Exception as err:  # the config classes' validators raise many kinds
        raise ConfigRefused(model_type, _reason(err)) from None


class ConfigRefused(ConfigError):
    """transformers' config class of ``model_type`` refuses a config.json (``reason``: its message)."""

    def __init__(self, model_type: str, reason: str) -> None:
        super().__init__(f"transformers' {model_type} config refuses it: {reason}")
        self.reason = reason


def _reason(err: Exception) -> str:
    """An exception's message in one line: its last informative line (transformers' strict config
    validators put the validator's name first and the reason last)."""
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return lines[-1].strip('"') if lines else type(err).__name__


@dataclass(frozen=True)
class HFModelConfig:
    """The ``config.json`` of a transformers causal LM, as the ``transformers`` implementation trains it.

    ``hf`` is the dict transformers writes for it (keys that differ from the config class's defaults,
    ``architectures`` naming the causal-LM class); :meth:`to_hf` gives it back for the export and for
    a checkpoint's settings. The properties the trainer reads (``vocab_size``, ``shape`` for FLOPs and
    the memory estimate...) come from the transformers config object.
    """

    hf: Mapping[str, Any]

    @classmethod
    def from_hf(cls, hf_config: Mapping[str, Any]) -> HFModelConfig:
        """Read a ``config.json`` dict through its transformers config class (defaults filled, the
        legacy RoPE keys converted as the installed transformers converts them)."""
        config = _transformers_config(hf_config)
        return cls._of(config)

    @classmethod
    def _of(cls, config: Any) -> HFModelConfig:
        written = json.loads(config.to_json_string(use_diff=True))  # what save_pretrained writes
        hf = {k: v for k, v in written.items() if k not in _UNSAVED_KEYS}
        hf["model_type"] = config.model_type
        hf["architectures"] = [_causal_lm_class_name(config)]
        return cls(hf)

    def to_hf(self) -> dict[str, Any]:
        """The ``config.json`` dict (without the storage dtype, which the export adds)."""
        return dict(self.hf)

    @cached_property
    def transformers_config(self) -> Any:
        """The transformers config object of :attr:`hf`."""
        return _transformers_config(self.hf)

    @property
    def model_type(self) -> str:
        return str(self.hf["model_type"])

    @property
    def vocab_size(self) -> int:
        return int(self.transformers_config.vocab_size)

    @property
    def input_embedding(self) -> tuple[int, str]:
        """The fewest rows of an embedding that token ids index, and what that embedding is: the
        token embedding (``vocab_size``), or the per-layer input embedding of Gemma 3n and Gemma 4
        when its ``vocab_size_per_layer_input`` is smaller (every token id indexes it too)."""
        per_layer = getattr(self.transformers_config, "vocab_size_per_layer_input", None)
        if per_layer is not None and int(per_layer) < self.vocab_size:
            return int(per_layer), "per-layer input embedding (vocab_size_per_layer_input)"
        return self.vocab_size, "embedding"

    @property
    def tie_word_embeddings(self) -> bool:
        return bool(getattr(self.transformers_config, "tie_word_embeddings", False))

    @property
    def num_hidden_layers(self) -> int:
        return int(self.transformers_config.num_hidden_layers)

    @property
    def max_position_embeddings(self) -> int:
        return int(self.transformers_config.max_position_embeddings)

    @property
    def rope_type(self) -> str:
        """The RoPE type every layer uses (``default`` when the config declares none)."""
        config = self.transformers_config
        params = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
        return str(params.get("rope_type", params.get("type", "default")))

    @property
    def shape(self) -> ModelShape:
        """The dimensions the FLOP model and the memory estimate read (dense-model approximations
        for others, e.g. mixtures of experts)."""
        c = self.transformers_config
        heads = c.num_attention_heads
        return ModelShape(
            name=self.model_type,
            hidden_size=c.hidden_size,
            intermediate_size=getattr(c, "intermediate_size", None) or 4 * c.hidden_size,
            num_layers=c.num_hidden_layers,
            num_heads=heads,
            num_kv_heads=getattr(c, "num_key_value_heads", None) or heads,
            head_dim=getattr(c, "head_dim", None) or c.hidden_size // heads,
            vocab_size=c.vocab_size,
            tie_word_embeddings=self.tie_word_embeddings,
        )

    def check(self, seq_len: int) -> None:
        """Refuse (:class:`ConfigError`, one line) a model the ring cannot train at ``seq_len``-token
        windows: its config (``hf_arch.config_problems``) and its modules, built on the meta device
        (``hf_arch.model_problems``)."""
        problems = config_problems(self.transformers_config, seq_len)
        try:
            causal_lm = build_causal_lm(self, attention=PROBE_NAME, buffers_on_meta=True)
        except _BuildError as err:
            problems.append(err.problem)
        else:
            decoder, head = _modules(causal_lm, *decoder_and_head(causal_lm))
            problems += model_problems(causal_lm, decoder, head)
            if not decoder_layer_names(causal_lm):
                problems.append("no decoder layers to shard (_no_split_modules)")
            if decoder is not None and getattr(type(causal_lm), "_supports_attention_backend", False):
                kinds = {p.split(" (")[0] for p in problems}  # one line per kind of problem
                problems += [
                    p for p in call_problems(*attention_calls(decoder, 16)) if p.split(" (")[0] not in kinds
                ]
        if problems:
            raise refusal(self.model_type, problems)

    def with_rope(
        self,
        *,
        rope_scaling: Mapping[str, Any] | None = None,
        rope_theta: float | None = None,
        max_position_embeddings: int | None = None,
    ) -> HFModelConfig:
        """This config with a run's RoPE settings, by the rule both implementations follow
        (``rope_keys.with_run_rope``). A model that declares no RoPE only gets its
        ``max_position_embeddings`` (``check`` refuses it)."""
        config = self.transformers_config
        full = config.to_dict()
        declared = {k: full[k] for k in _ROPE_DECLARATION if full.get(k) is not None}
        hf = {**self.to_hf(), **declared}
        if not declared_rope(hf):
            if max_position_embeddings is not None:
                hf["max_position_embeddings"] = max_position_embeddings
            return HFModelConfig.from_hf(hf)
        heads = config.hidden_size // config.num_attention_heads
        if hf.get("head_dim", "absent") is None:  # Mixtral: None means hidden / heads, which RoPE setup needs
            hf["head_dim"] = heads
        try:
            hf = with_run_rope(
                hf,
                rope_scaling=rope_scaling,
                rope_theta=rope_theta,
                max_position_embeddings=max_position_embeddings,
                head_dim=getattr(config, "head_dim", None) or heads,
            )
            wanted = hf["rope_parameters"].get("rope_type")
            scaled = HFModelConfig.from_hf(hf)
        except ConfigRefused as err:
            if rope_scaling is None:
                raise
            raise ConfigError(
                f"train.model.rope_scaling: transformers' {self.model_type} config does not take rope_type "
                f"{wanted!r} ({err.reason})"
            ) from None
        except ValueError as err:  # ConfigError too
            raise ConfigError(f"train.model.rope_scaling: {err}") from None
        if rope_scaling is not None and isinstance(wanted, str) and scaled.rope_type != wanted:
            raise ConfigError(
                f"train.model.rope_scaling: transformers' {self.model_type} config turns rope_type "
                f"{wanted!r} into {scaled.rope_type!r}; give this model a rope_type its config keeps"
            )
        return scaled


def _find(root: nn.Module, module: nn.Module | None) -> str | None:
    """The qualified name of ``module`` in ``root`` (None when absent)."""
    return (
        next((name for name, m in root.named_modules() if m is module), None) if module is not None else None
    )


def decoder_and_head(causal_lm: nn.Module) -> tuple[str | None, str | None]:
    """The names of a causal LM's decoder (its one child besides the output head) and output head."""
    head = _find(causal_lm, causal_lm.get_output_embeddings())
    others = [name for name, _ in causal_lm.named_children() if name != head]
    return (others[0] if len(others) == 1 else None), head


def decoder_layer_names(causal_lm: nn.Module) -> list[str]:
    """The decoder blocks FSDP2 shards one by one: the outermost modules of the causal LM's
    ``_no_split_modules`` classes, in order."""
    classes = set(getattr(causal_lm, "_no_split_modules", None) or ())
    names: list[str] = []
    for name, module in causal_lm.named_modules():
        if type(module).__name__ in classes and not any(name.startswith(f"{n}.") for n in names):
            names.append(name)
    return names


def refusal(model_type: str, problems: list[str]) -> ConfigError:
    """The one-line refusal of a model with ``problems`` (``hf_arch``'s descriptions)."""
    return ConfigError(f"{model_type} cannot be trained with ring attention: it has {'; '.join(problems)}")


class _BuildError(ConfigError):
    """transformers could not build the model with ring attention (``problem`` says why)."""

    def __init__(self, model_type: str, problem: str) -> None:
        super().__init__(str(refusal(model_type, [problem])))
        self.problem = problem


def build_causal_lm(
    config: HFModelConfig, *, attention: str = ATTENTION_NAME, buffers_on_meta: bool = False
) -> nn.Module:
    """The transformers causal LM of ``config`` with ring attention (or another registered
    ``attention``, the check's probe), float32 parameters on the meta device and its buffers (RoPE
    frequencies) computed on the CPU, or on the meta device too with ``buffers_on_meta`` (a model only
    inspected). Fill it with ``to_empty`` and a weight loader."""
    require_transformers()
    import transformers
    from accelerate import init_empty_weights

    register()
    try:
        with init_empty_weights(include_buffers=buffers_on_meta):
            causal_lm = transformers.AutoModelForCausalLM.from_config(
                config.transformers_config, attn_implementation=attention, dtype=torch.float32
            )
        causal_lm.tie_weights()  # the meta parameters replaced the ones transformers tied
        return causal_lm
    except (ValueError, KeyError, TypeError, AttributeError, ImportError) as err:
        message = str(err).splitlines()[0] if str(err) else type(err).__name__
        if "attn_implementation" in message or attention in message:
            problem = f"no transformers attention interface (it refuses a custom attention: {message})"
        else:
            problem = f"a config transformers cannot build a model from ({type(err).__name__}: {message})"
        raise _BuildError(config.model_type, problem) from None


def _modules(root: nn.Module, *names: str | None) -> list[nn.Module | None]:
    return [root.get_submodule(n) if n is not None else None for n in names]


class _WindowRope:
    """A length-dependent rotary module's ``forward`` with the frequencies of a given length.

    transformers' ``dynamic_rope_update`` picks the frequencies from ``max(position_ids) + 1`` of the
    call, which differs between the ranks of a ring and from the window's; this runs the function it
    wraps with the frequencies transformers computes for ``seq_len`` instead.
    """

    def __init__(self, module: nn.Module) -> None:
        self.module = module
        self.inner = type(module).forward.__wrapped__
        self.seq_len: int | None = None
        self._tables: dict[tuple[int, torch.device], tuple[Tensor, float]] = {}

    def __call__(self, x: Tensor, position_ids: Tensor, *args: Any, **kwargs: Any) -> Any:
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        length = self.seq_len if self.seq_len is not None else int(position_ids.max()) + 1
        key = (length, x.device)
        if key not in self._tables:
            module = self.module
            self._tables[key] = ROPE_INIT_FUNCTIONS[module.rope_type](module.config, x.device, seq_len=length)
        inv_freq, scaling = self._tables[key]
        with torch.no_grad():
            self.module.inv_freq.copy_(inv_freq)
        self.module.attention_scaling = scaling
        return self.inner(self.module, x, position_ids, *args, **kwargs)


class HFCausalLM(nn.Module):
    """A transformers causal LM trained on packed rows with ring attention (see the module docstring).

    ``attention`` defaults to :class:`RingAttention` with no group (local); ``activation_checkpointing``
    is a mode of ``model.checkpointing_mode``. Built on the meta device for parameters (buffers on the
    CPU): call ``to_empty`` and fill the weights (``weights.load_weights``, ``build.fill_random``).
    """

    def __init__(
        self,
        config: HFModelConfig,
        *,
        attention: Attention | None = None,
        activation_checkpointing: str | bool = "none",
    ) -> None:
        super().__init__()
        causal_lm = build_causal_lm(config)
        decoder, head = decoder_and_head(causal_lm)
        problems = model_problems(causal_lm, *_modules(causal_lm, decoder, head))
        if problems or decoder is None or head is None:
            raise refusal(config.model_type, problems)
        self.config = config
        self.attention: Attention = attention if attention is not None else RingAttention()
        for name, child in causal_lm.named_children():  # transformers' parameter names, unchanged
            self.add_module(name, child)
        self._decoder, self._head = decoder, head
        self._input_embedding = _find(self, causal_lm.get_input_embeddings())
        self._layers = decoder_layer_names(causal_lm)
        tconfig = config.transformers_config
        scale = float(getattr(tconfig, "logit_scale", None) or 1.0)  # Cohere multiplies the logits
        scale /= float(getattr(tconfig, "logits_scaling", None) or 1.0)  # Granite divides them
        self.logit_scale = scale
        self._window_ropes = [
            _WindowRope(m)
            for m in rotary_modules(self)
            if getattr(m, "rope_type", None) in LENGTH_DEPENDENT_TYPES
        ]
        for pinned in self._window_ropes:
            assert window_pinnable(pinned.module)  # model_problems refuses the others
            pinned.module.forward = pinned
        checkpoint_layers(self.decoder_layers, checkpointing_mode(activation_checkpointing))
        self.base_model_prefix = causal_lm.base_model_prefix
        self.checkpoint_transforms = checkpoint_transforms(causal_lm)
        # The causal LM itself, not registered as a child (its children are this module's): transformers'
        # checkpoint conversion and experts dispatch are methods of it.
        self.__dict__["_causal_lm"] = causal_lm

    @property
    def decoder_layers(self) -> list[nn.Module]:
        """The decoder blocks, in order (FSDP2 shards each)."""
        return [self.get_submodule(name) for name in self._layers]

    @property
    def input_embedding(self) -> nn.Module:
        return self.get_submodule(self._input_embedding)

    @property
    def output_head(self) -> nn.Module:
        return self.get_submodule(self._head)

    @property
    def tied(self) -> bool:
        """Whether the output head's weight is the input embedding's."""
        return self.output_head.weight is self.input_embedding.weight

    def _experts_for(self, dtype: torch.dtype) -> None:
        """Mixture-of-experts layers in float64 (tests, references) computed by transformers' eager
        experts: its default, ``grouped_mm``, has no float64 kernel."""
        causal_lm = self._causal_lm
        current = getattr(causal_lm.config, "_experts_implementation", None)
        if dtype == torch.float64 and current not in (None, "eager"):
            causal_lm.set_experts_implementation("eager")

    def checkpoint_tensors(self, tensors: dict[str, Tensor]) -> dict[str, Tensor]:
        """Full tensors under this model's names, as ``save_pretrained`` stores them (transformers'
        checkpoint conversion reverted: per-expert tensors, renamed keys; ``hf_conversion``)."""
        return to_checkpoint(self._causal_lm, tensors)

    def logits(self, hidden: Tensor) -> Tensor:
        """Vocabulary logits of hidden states, as the causal LM computes them (head, then its logit scale)."""
        logits = self.output_head(hidden)
        return logits * self.logit_scale if self.logit_scale != 1.0 else logits

    def forward(
        self,
        input_ids: Tensor,
        position_ids: Tensor,
        token_index: Tensor,
        segment_ids: Tensor,
        *,
        rope_seq_len: int | None = None,
        labels: Tensor | None = None,
    ) -> Tensor:
        """As ``Transformer.forward``: hidden states ``[B, T, hidden]`` (``[T, hidden]`` for 1-D inputs)
        of packed rows, or with ``labels`` each token's cross-entropy. ``rope_seq_len``: the window
        length the length-dependent RoPE types use (default ``max(position_ids) + 1``)."""
        shapes = {t.shape for t in (input_ids, position_ids, token_index, segment_ids)}
        if len(shapes) != 1 or input_ids.dim() not in (1, 2):
            raise ValueError(f"inputs must share one [B, T] or [T] shape, got {sorted(map(tuple, shapes))}")
        single = input_ids.dim() == 1
        if single:
            input_ids, position_ids, token_index, segment_ids = (
                t[None] for t in (input_ids, position_ids, token_index, segment_ids)
            )
        window = rope_seq_len if rope_seq_len is not None else int(position_ids.max()) + 1
        self._experts_for(self.input_embedding.weight.dtype)
        for pinned in self._window_ropes:
            pinned.seq_len = window
        rows = [bind_row(self.attention, token_index[b], segment_ids[b]) for b in range(input_ids.shape[0])]
        decoder = self.get_submodule(self._decoder)
        hidden = decoder(
            input_ids=input_ids,
            position_ids=position_ids,
            use_cache=False,
            **{ROWS_KWARG: PackedRows(rows, window)},
        ).last_hidden_state
        hidden = hidden[0] if single else hidden
        if labels is None:
            return hidden
        losses = chunked_cross_entropy(hidden, labels, self.logits, vocab_size=self.config.vocab_size)
        # FSDP2 hooks the output for backward; an output that is a view could lose that hook
        return losses.clone() if losses._base is not None else losses
