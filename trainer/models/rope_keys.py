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
