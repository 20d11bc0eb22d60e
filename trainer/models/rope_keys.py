"""Which keys each RoPE scaling type takes and needs, and the config-time check of
``train.model.rope_scaling`` (no torch import: configs are validated by every command).

The tables mirror transformers' ``_validate_<type>_rope_parameters``; :mod:`longctx.trainer.models.rope`
computes the frequencies from them.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

# Keys each rope_type reads from a Hugging Face ``rope_parameters`` / ``rope_scaling`` dict, besides
# ``rope_type`` and ``rope_theta``.
_TYPE_KEYS: dict[str, tuple[str, ...]] = {
    "default": (),
    "linear": ("factor",),
    "ntk": ("factor",),
    "dynamic": ("factor",),
    "yarn": (
        "factor",
        "original_max_position_embeddings",
        "attention_factor",
        "beta_fast",
        "beta_slow",
        "mscale",
        "mscale_all_dim",
        "truncate",
    ),
    "llama3": ("factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"),
    "longrope": (
        "short_factor",
        "long_factor",
        "original_max_position_embeddings",
        "factor",
        "attention_factor",
    ),
    "proportional": ("factor", "partial_rotary_factor"),
}
_REQUIRED_KEYS: dict[str, tuple[str, ...]] = {
    "linear": ("factor",),
    "ntk": ("factor",),
    "dynamic": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor"),
    "longrope": ("short_factor", "long_factor"),
}
_COMMON_KEYS = ("rope_type", "type", "rope_theta")
_LIST_KEYS = ("short_factor", "long_factor")
_INT_KEYS = ("original_max_position_embeddings",)
_BOOL_KEYS = ("truncate",)


def _did_you_mean(word: str, candidates: list[str]) -> str:
    close = difflib.get_close_matches(word, candidates, n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def check_rope_scaling(scaling: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` (one line) unless ``scaling`` declares a known ``rope_type`` with the
    keys that type needs, no key it does not take, and values of the right kind."""
    if not isinstance(scaling, Mapping):
        raise ValueError(
            f"must be a mapping like {{rope_type: yarn, factor: 4.0}}, got {type(scaling).__name__}"
        )
    rope_type = scaling.get("rope_type", scaling.get("type"))
    if rope_type is None:
        raise ValueError(f"needs a rope_type, one of {', '.join(_TYPE_KEYS)}")
    if rope_type not in _TYPE_KEYS:
        raise ValueError(
            f"unknown rope_type {rope_type!r}{_did_you_mean(str(rope_type), list(_TYPE_KEYS))}; "
            f"known: {', '.join(_TYPE_KEYS)}"
        )
    allowed = [*_TYPE_KEYS[rope_type], *_COMMON_KEYS]
    for key in scaling:
        if key not in allowed:
            takes = ", ".join(_TYPE_KEYS[rope_type]) or "no scaling parameters"
            raise ValueError(
                f"rope_type {rope_type!r} takes no key "
                f"{key!r}{_did_you_mean(str(key), allowed)}; it takes {takes}"
            )
    missing = [key for key in _REQUIRED_KEYS.get(rope_type, ()) if scaling.get(key) is None]
    if missing:
        raise ValueError(f"rope_type {rope_type!r} requires {', '.join(missing)}")
    for key, value in scaling.items():
        if key in ("rope_type", "type") or value is None:
            continue
        if key in _LIST_KEYS:
            ok = isinstance(value, (list, tuple)) and all(
                isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 for x in value
            )
            kind = "a list of positive numbers"
        elif key in _BOOL_KEYS:
            ok, kind = isinstance(value, bool), "true or false"
        elif key in _INT_KEYS:
            ok, kind = (
                isinstance(value, int) and not isinstance(value, bool) and value > 0,
                "a positive integer",
            )
        else:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0
            kind = "a positive number"
        if not ok:
            raise ValueError(f"{key} must be {kind}, got {value!r}")


def takes_factor(scaling: Mapping[str, Any]) -> bool:
    """Whether the ``rope_type`` of a checked ``scaling`` has a ``factor`` (``default`` has none)."""
    return "factor" in _TYPE_KEYS.get(scaling.get("rope_type", scaling.get("type")), ())


ORIGINAL_LENGTH_TYPES = ("yarn", "llama3", "longrope")
"""Types with a pretraining length (``original_max_position_embeddings``), which transformers defaults to
``max_position_embeddings`` when absent."""

LENGTH_DEPENDENT_TYPES = ("dynamic", "longrope")
"""Types whose frequencies depend on the current sequence length (training passes the window's)."""

_LEGACY_KEYS = ("rope_scaling", "rope_theta")

FREQUENCY_KEYS = frozenset(
    {*_COMMON_KEYS, "partial_rotary_factor", "max_position_embeddings"}.union(*_TYPE_KEYS.values())
)
"""Keys of a RoPE declaration that set its frequencies (or the length they are set for): what a run's
``rope_scaling`` replaces. Any other key in a checkpoint's ``rope_parameters`` is the model's own,
read by its attention rather than by the RoPE (Ministral 3's ``llama_4_scaling_beta``, the position
temperature; multimodal models' ``mrope_section``), and is kept."""


def ntk_base(theta: float, factor: float, dim: int) -> float:
    """The NTK-aware base for ``dim`` rotated channels: ``theta * factor ** (dim / (dim - 2))``.

    Changing the base instead of the positions leaves the highest frequency untouched and stretches
    the lowest one by exactly ``factor``, so nearby tokens keep their resolution (bloc97, "NTK-Aware
    Scaled RoPE", r/LocalLLaMA, 2023).
    """
    return theta * factor ** (dim / (dim - 2))


def declared_rope(hf: Mapping[str, Any]) -> dict[str, Any]:
    """The RoPE a ``config.json`` dict declares, read as transformers 5 reads it: a non-empty legacy
    ``rope_scaling`` wins over ``rope_parameters``; a top-level ``rope_theta`` fills a missing base.
    Per-layer-type declarations (``{"full_attention": {...}, "sliding_attention": {...}}``) come back
    as they are."""
    params = dict(hf.get("rope_scaling") or hf.get("rope_parameters") or {})
    if "type" in params:
        params.setdefault("rope_type", params.pop("type"))
    if not per_layer_type(params) and "rope_theta" not in params and hf.get("rope_theta"):
        params["rope_theta"] = hf["rope_theta"]
    return params


def per_layer_type(params: Mapping[str, Any]) -> bool:
    """Whether a RoPE declaration gives one RoPE per layer type (Gemma 3, OLMo 3...)."""
    return any(isinstance(value, Mapping) for value in params.values())


def with_run_rope(
    hf: Mapping[str, Any],
    *,
    rope_scaling: Mapping[str, Any] | None = None,
    rope_theta: float | None = None,
    max_position_embeddings: int | None = None,
    head_dim: int | None = None,
) -> dict[str, Any]:
    """A ``config.json`` dict with a run's RoPE settings (``train.model.rope_scaling``, ``rope_theta``,
    and ``max_position_embeddings`` = ``context.target``): the one rule both implementations follow.

    * ``rope_scaling`` replaces the type and its parameters (``None``: the checkpoint's stay); a
      ``rope_theta`` inside it wins over ``rope_theta``, which wins over the checkpoint's base.
    * A scaling with a pretraining length (:data:`ORIGINAL_LENGTH_TYPES`) that does not give
      ``original_max_position_embeddings`` gets the checkpoint's: its top-level
      ``original_max_position_embeddings`` (Phi-3) or else its ``max_position_embeddings``; the
      checkpoint's ``partial_rotary_factor`` and its keys that are not RoPE parameters
      (:data:`FREQUENCY_KEYS`) are kept.
    * A top-level ``original_max_position_embeddings`` (Phi-3), which transformers prefers to the one in
      the RoPE parameters, is set to the value the run uses, so that the run's value is the one used.
    * ``ntk`` (not a transformers type) becomes default RoPE with the NTK base (:func:`ntk_base` over
      the rotated part of ``head_dim``).
    * ``max_position_embeddings`` is replaced last.

    The result declares RoPE in ``rope_parameters`` (transformers 5), without the legacy keys. Raises
    ``ValueError`` (one line) for a per-layer-type declaration that the run would override.
    """
    out = {key: value for key, value in hf.items() if key not in _LEGACY_KEYS}
    current = declared_rope(hf)
    if per_layer_type(current):
        if rope_scaling is not None or rope_theta is not None:
            raise ValueError(
                f"the model declares one RoPE per layer type ({', '.join(sorted(current))}); "
                "train.model.rope_scaling and rope_theta cannot override it"
            )
        out["rope_parameters"] = current
    else:
        theta = (rope_scaling or {}).get("rope_theta") or rope_theta or current.get("rope_theta") or 10_000.0
        if rope_scaling is None:
            rope_type = current.get("rope_type", "default")
            params = {k: v for k, v in current.items() if k not in ("rope_type", "rope_theta")}
        else:
            rope_type = rope_scaling.get("rope_type") or rope_scaling.get("type")
            params = {
                k: v
                for k, v in rope_scaling.items()
                if k not in ("type", "rope_type", "rope_theta") and v is not None
            }
            if current.get("partial_rotary_factor") is not None:
                params.setdefault("partial_rotary_factor", current["partial_rotary_factor"])
            for key, value in current.items():  # the model's own keys (FREQUENCY_KEYS)
                if key not in FREQUENCY_KEYS:
                    params.setdefault(key, value)
            pretrained = hf.get("original_max_position_embeddings") or hf.get("max_position_embeddings")
            if rope_type in ORIGINAL_LENGTH_TYPES and pretrained is not None:
                params.setdefault("original_max_position_embeddings", pretrained)
        if rope_type == "ntk":
            if head_dim is None:
                raise ValueError("rope_type 'ntk' needs the model's head_dim")
            rotated = int(head_dim * params.pop("partial_rotary_factor", 1.0))
            theta = ntk_base(float(theta), float(params.pop("factor")), rotated)
            rope_type = "default"
        if "original_max_position_embeddings" in out and "original_max_position_embeddings" in params:
            out["original_max_position_embeddings"] = params["original_max_position_embeddings"]
        out["rope_parameters"] = {"rope_type": rope_type, "rope_theta": float(theta), **params}
    if max_position_embeddings is not None:
        out["max_position_embeddings"] = max_position_embeddings
    return out
