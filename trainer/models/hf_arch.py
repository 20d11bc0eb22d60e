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

from typing import Any

from torch import nn

LENGTH_DEPENDENT_ROPE = ("dynamic", "longrope")
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
    """The modules holding RoPE frequencies (an ``inv_freq`` buffer), transformers' rotary embeddings."""
    return [m for m in model.modules() if "inv_freq" in _own_buffers(m)]


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
        problems.append("no rotary position embedding (no RoPE module)")
    inputs = causal_lm.get_input_embeddings() if hasattr(causal_lm, "get_input_embeddings") else None
    positions = [n for n, m in causal_lm.named_modules() if isinstance(m, nn.Embedding) and m is not inputs]
    if positions:
        problems.append(f"absolute position embeddings ({', '.join(positions)})")
    dependent = [m for m in rotary if getattr(m, "rope_type", None) in LENGTH_DEPENDENT_ROPE]
    if any(not window_pinnable(m) for m in dependent):
        problems.append(
            f"length-dependent RoPE ({dependent[0].rope_type}) whose rotary module cannot be given the "
            "window length"
        )
    return problems


def describe(problems: list[str]) -> str:
    """One line: what the model has that the ring attention path does not train."""
    return "; ".join(problems)
