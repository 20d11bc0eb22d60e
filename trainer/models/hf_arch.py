"""Which transformers models the ring can train, checked before any rank starts.

Ring attention computes exact causal attention within each document of a packed window, with softmax
scale and nothing else. A transformers causal LM trains on the ``transformers`` implementation
(``longctx.trainer.models.hf``) when its attention is exactly that and its positions are RoPE. Refused,
in one line naming what is missing (:func:`architecture_problems`):

* a model that is not a decoder-only causal LM of the installed transformers (encoder-decoders,
  unknown ``model_type``: no code from a checkpoint folder is ever run), or whose attention does not go
  through transformers' ``AttentionInterface``;
* attention other than full causal attention: sliding-window layers whose window is shorter than the
  training windows (``sliding_window``, ``layer_types`` with ``sliding_attention``,
  ``use_sliding_window``), chunked or linear-attention layers, attention dropout, attention sinks,
  query/key and value heads of different sizes;
* logit soft-capping (``final_logit_softcapping``, ``attn_logit_softcapping``);
* positions other than RoPE: ALiBi, absolute position embeddings, NoPE layers, no rotary module;
  length-dependent RoPE (``dynamic``, ``longrope``) whose rotary module cannot be given the window
  length (see ``hf``);
* modules or parameters outside the decoder and the output head (their computation would be skipped
  by the chunked loss, which applies the head to hidden states).
"""

from __future__ import annotations

import re
from typing import Any

from torch import nn

from longctx.trainer.models.rope_keys import LENGTH_DEPENDENT_TYPES

_SINK_NAMES = ("sinks", "s_aux", "attention_sinks")
_POSITION_TABLE = re.compile(r"pos|wpe")  # GPT-2's wpe, OPT's embed_positions, ...
_FULL = "full_attention"
_SLIDING = "sliding_attention"


def _get(config: Any, key: str) -> Any:
    return getattr(config, key, None)


def _sliding_problem(config: Any, seq_len: int) -> str | None:
    """Sliding-window (or other non-full) layers the ring would change, read as transformers does."""
    layer_types = _get(config, "layer_types")
    window = _get(config, "sliding_window")
    if _get(config, "attention_chunk_size") is not None:
        return f"chunked attention (attention_chunk_size = {config.attention_chunk_size})"
    if layer_types:
        other = sorted({t for t in layer_types if t not in (_FULL, _SLIDING)})
        if other:
            return f"layers other than full or sliding attention (layer_types: {', '.join(other)})"
        sliding = _SLIDING in layer_types
    elif hasattr(config, "use_sliding_window"):
        sliding = bool(config.use_sliding_window) and window is not None
    else:
        sliding = window is not None
    if sliding and (window is None or window < seq_len):
        return (
            f"sliding-window layers (sliding_window = {window}, shorter than the {seq_len}-token windows; "
            "ring attention is full causal attention)"
        )
    return None


def config_problems(config: Any, seq_len: int) -> list[str]:
    """What in a transformers config the ring cannot train at windows of ``seq_len`` tokens."""
    problems = []
    if _get(config, "is_encoder_decoder"):
        problems.append("an encoder-decoder (is_encoder_decoder)")
    sliding = _sliding_problem(config, seq_len)
    if sliding:
        problems.append(sliding)
    caps = [f"{k} = {v}" for k, v in sorted(config.to_dict().items()) if "softcap" in k and v]
    if caps:
        problems.append(f"logit soft-capping ({', '.join(caps)})")
    if _get(config, "attention_dropout"):
        problems.append(f"attention dropout (attention_dropout = {config.attention_dropout})")
    if _get(config, "alibi"):
        problems.append("ALiBi positions (alibi)")
    kind = _get(config, "position_embedding_type")
    if kind is not None and kind not in ("rope", "rotary"):
        problems.append(f"non-RoPE positions (position_embedding_type = {kind!r})")
    no_rope = _get(config, "no_rope_layers")
    if no_rope and not all(no_rope):
        nope = [i for i, uses_rope in enumerate(no_rope) if not uses_rope]
        problems.append(f"NoPE layers (no_rope_layers: no RoPE in layers {', '.join(map(str, nope))})")
    v_dim, qk_dim = _get(config, "v_head_dim"), _get(config, "qk_head_dim")
    if v_dim is not None and qk_dim is not None and v_dim != qk_dim:
        problems.append(
            f"query/key and value heads of different sizes (qk_head_dim {qk_dim}, v_head_dim {v_dim})"
        )
    return problems


def _own_buffers(module: nn.Module) -> set[str]:
    return {name for name, _ in module.named_buffers(recurse=False)}


def rotary_modules(model: nn.Module) -> list[nn.Module]:
    """The modules holding RoPE frequencies, transformers' rotary embeddings: an ``inv_freq`` buffer, or
    one per layer type (``sliding_attention_inv_freq``, Gemma 3)."""
    return [m for m in model.modules() if any(n.endswith("inv_freq") for n in _own_buffers(m))]


def _rope_types(rotary: nn.Module) -> list[str]:
    """The RoPE types a rotary module computes (one, or one per layer type)."""
    kind = getattr(rotary, "rope_type", None)
    return [str(v) for v in kind.values()] if isinstance(kind, dict) else [str(kind)]


def window_pinnable(rotary: nn.Module) -> bool:
    """Whether a length-dependent rotary module can be run with the window length's frequencies: one
    RoPE type, and a ``forward`` wrapped by transformers' ``dynamic_rope_update`` (whose inner
    function computes cos/sin from the module's ``inv_freq`` and ``attention_scaling``)."""
    return isinstance(getattr(rotary, "rope_type", None), str) and hasattr(
        type(rotary).forward, "__wrapped__"
    )


def model_problems(causal_lm: nn.Module, decoder: nn.Module | None, head: nn.Module | None) -> list[str]:
    """What in a built (e.g. meta-device) causal LM the ring cannot train: see the module docstring.
    ``decoder`` and ``head`` are its decoder and output head, None when they could not be told apart."""
    problems = []
    if not getattr(type(causal_lm), "_supports_attention_backend", False):
        problems.append(
            f"no transformers attention interface ({type(causal_lm).__name__}'s attention does not go "
            "through AttentionInterface)"
        )
    if head is None or decoder is None:
        children = ", ".join(name for name, _ in causal_lm.named_children())
        problems.append(f"modules besides one decoder and one output head ({children})")
    elif _own_buffers(causal_lm) or list(causal_lm.parameters(recurse=False)):
        problems.append(f"parameters outside its decoder and output head ({type(causal_lm).__name__})")
    rotary = rotary_modules(causal_lm)
    if not rotary:
        tables = [
            f"{name}.{buffer}" if name else buffer
            for name, m in causal_lm.named_modules()
            if "rotary" in type(m).__name__.lower()
            for buffer in _own_buffers(m)
        ]
        if tables:
            problems.append(
                f"rotary positions from a fixed sin/cos table ({tables[0]}), not a rotary module with "
                "inverse frequencies that RoPE scaling can set"
            )
        else:
            problems.append("no rotary position embedding (no RoPE module)")
    inputs = causal_lm.get_input_embeddings() if hasattr(causal_lm, "get_input_embeddings") else None
    tables = [
        n
        for n, m in causal_lm.named_modules()
        if isinstance(m, nn.Embedding) and m is not inputs and "token" not in n.rsplit(".", 1)[-1]
    ]
    positions = [n for n in tables if _POSITION_TABLE.search(n.rsplit(".", 1)[-1])]
    if positions:
        problems.append(f"absolute position embeddings ({', '.join(positions)})")
    others = [n for n in tables if n not in positions]
    if others:
        problems.append(f"embedding tables besides its token embeddings ({', '.join(others)})")
    sinks = [n for n, _ in causal_lm.named_parameters() if n.rsplit(".", 1)[-1] in _SINK_NAMES]
    if sinks:
        problems.append(f"attention sinks ({', '.join(sinks[:2])}{', ...' if len(sinks) > 2 else ''})")
    dependent = [m for m in rotary if set(_rope_types(m)) & set(LENGTH_DEPENDENT_TYPES)]
    if any(not window_pinnable(m) for m in dependent):
        kinds = sorted(set(_rope_types(dependent[0])) & set(LENGTH_DEPENDENT_TYPES))
        problems.append(
            f"length-dependent RoPE ({', '.join(kinds)}) whose rotary module cannot be given the "
            "window length"
        )
    return problems


def call_problems(calls: list[Any], stopped: Exception | None) -> list[str]:
    """What the attention calls of a model (``hf_attention.attention_calls``: the layers its forward
    reached on the meta device) show the ring cannot compute, which its config does not say: packed
    rows that do not reach the attention, an attention mask of the model's own (a learned or dynamic
    mask), attention sinks. Soft-capping, dropout and sliding windows are read from the config
    (:func:`config_problems`), and refused at run time too."""
    if not calls and stopped is None:
        return ["no attention call through transformers' attention interface"]
    problems = []
    lost = sorted({c.module for c in calls if not c.rows})
    if lost:
        problems.append(
            "decoder layers that do not pass the model's keyword arguments to their attention "
            f"({', '.join(lost)} gets none of them, so the ring's document masks cannot reach it)"
        )
    masked = sorted({c.module for c in calls if c.mask})
    if masked:
        problems.append(
            f"an attention mask of its own ({', '.join(masked)} is given one; ring attention applies "
            "document masks only)"
        )
    sinks = sorted({f"{c.module} is given {k}" for c in calls for k in ("s_aux", "sinks") if k in c.extras})
    if sinks:
        problems.append(f"attention sinks ({'; '.join(sinks)})")
    return problems


def describe(problems: list[str]) -> str:
    """One line: what the model has that the ring attention path does not train."""
    return "; ".join(problems)
