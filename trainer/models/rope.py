"""Rotary position embeddings (RoPE) and every way Hugging Face configs declare to scale them.

RoPE (Su et al., "RoFormer", arXiv:2104.09864) rotates each pair of query/key channels by an angle
``position * inv_freq[i]``, so attention scores depend on relative positions only. Extending a model's
context means changing ``inv_freq`` (and sometimes scaling cos/sin by an "attention factor"). The
scaling types below reproduce ``transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS`` (and the
``default`` type of the Llama family) to floating-point precision, plus one type of our own:

============  ===============================================================================
rope_type     what it does
============  ===============================================================================
default       ``inv_freq[i] = theta ** (-2i / d)``
linear        position interpolation: ``inv_freq / factor`` (Chen et al., arXiv:2306.15595)
ntk           NTK-aware base change (bloc97, 2023): ``theta' = theta * factor ** (d / (d - 2))``
dynamic       NTK base change whose factor grows with the current sequence length (emozilla, 2023)
yarn          per-frequency blend of interpolation and extrapolation + attention factor (arXiv:2309.00071)
llama3        Llama 3.1 frequency-band scaling (Meta, "The Llama 3 Herd of Models", arXiv:2407.21783)
longrope      searched per-frequency factors, short/long sets + attention factor (arXiv:2402.13753)
proportional  rotate only the first ``partial_rotary_factor`` share of angles, the rest not at all
============  ===============================================================================

``ntk`` is not a transformers type; :meth:`RopeConfig.to_hf` writes it as ``default`` RoPE with the
changed base, which is exactly equivalent, so saved checkpoints load anywhere.

Sequence-length dependent types (``dynamic``, ``longrope``): transformers recomputes the frequencies
from ``max(position_ids) + 1`` of the batch it is called with. This module is stateless: callers pass
that ``seq_len`` explicitly (see :func:`inverse_frequencies`). Training passes the **window length**
(``seq_len`` of the shards, ``rope_seq_len`` in ``Transformer.forward``) for every packed row, so
every document of a row, short or long, is rotated with the frequencies of the full window, not
those of its own length; evaluation of packed windows does the same. Only when the caller passes no
length (``rope_seq_len=None``) does the model fall back to ``max(position_ids) + 1`` of the batch,
as transformers does. Under context parallelism every rank passes the same value (the whole
window's), or the ranks would rotate with different frequencies.

Everything here is computed in float64 and the cos/sin tables are returned in float32, so long
positions lose no precision to float32 products (transformers multiplies in float32).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from longctx.trainer.models.rope_keys import (
    _REQUIRED_KEYS,
    _TYPE_KEYS,
    LENGTH_DEPENDENT_TYPES,
    ORIGINAL_LENGTH_TYPES,
    declared_rope,
    ntk_base,
    per_layer_type,
    with_run_rope,
)

logger = logging.getLogger(__name__)

DEFAULT_THETA = 10_000.0

_SCALING_FIELDS = frozenset(name for keys in _TYPE_KEYS.values() for name in keys)


@dataclass(frozen=True)
class RopeConfig:
    """RoPE parameters of one model, normalized from any Hugging Face config layout.

    ``head_dim`` is the rotated dimension (the whole attention head: the Llama family has no partial
    rotary except through ``proportional``). Fields other than ``rope_type``, ``theta`` and
    ``max_position_embeddings`` are the scaling parameters of ``rope_type`` (see ``_TYPE_KEYS``) and
    stay ``None`` when unused or left to their default.
    """

    head_dim: int
    rope_type: str = "default"
    theta: float = DEFAULT_THETA
    max_position_embeddings: int = 2048
    factor: float | None = None
    original_max_position_embeddings: int | None = None
    attention_factor: float | None = None
    beta_fast: float | None = None
    beta_slow: float | None = None
    mscale: float | None = None
    mscale_all_dim: float | None = None
    truncate: bool | None = None
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    short_factor: tuple[float, ...] | None = None
    long_factor: tuple[float, ...] | None = None
    partial_rotary_factor: float | None = None

    def __post_init__(self) -> None:
        if self.rope_type not in _TYPE_KEYS:
            raise ValueError(f"unknown rope_type {self.rope_type!r}; supported: {', '.join(_TYPE_KEYS)}")
        if self.head_dim <= 0 or self.head_dim % 2:
            raise ValueError(f"RoPE needs an even, positive head_dim, got {self.head_dim}")
        unused = _SCALING_FIELDS - set(_TYPE_KEYS[self.rope_type])
        stray = [name for name in sorted(unused) if getattr(self, name) is not None]
        if "partial_rotary_factor" in stray:
            raise ValueError(
                "Llama-family models rotate whole heads: partial_rotary_factor needs rope_type 'proportional'"
            )
        if stray:
            raise ValueError(f"rope_type {self.rope_type!r} takes no {', '.join(stray)}")
        missing = [name for name in _REQUIRED_KEYS.get(self.rope_type, ()) if getattr(self, name) is None]
        if missing:
            raise ValueError(f"rope_type {self.rope_type!r} requires {', '.join(missing)}")
        for name in ("short_factor", "long_factor"):
            value = getattr(self, name)
            if value is not None and len(value) != self.head_dim // 2:
                raise ValueError(
                    f"{name} must have head_dim / 2 = {self.head_dim // 2} entries, got {len(value)}"
                )
        if self.rope_type in ORIGINAL_LENGTH_TYPES and self.original_max_position_embeddings is None:
            object.__setattr__(self, "original_max_position_embeddings", self.max_position_embeddings)

    @property
    def depends_on_seq_len(self) -> bool:
        """True for types whose frequencies change with the current sequence length."""
        return self.rope_type in LENGTH_DEPENDENT_TYPES

    @classmethod
    def from_hf(cls, hf_config: Mapping[str, Any], head_dim: int) -> RopeConfig:
        """Read RoPE settings from a Hugging Face ``config.json`` dict, as transformers 5 does.

        Accepts the transformers 5 layout (``rope_parameters`` holding ``rope_theta``) and the legacy
        one (top-level ``rope_theta`` plus ``rope_scaling`` with ``rope_type`` or ``type``); like
        transformers, a non-empty ``rope_scaling`` wins over ``rope_parameters``, and a top-level
        ``original_max_position_embeddings`` (Phi-3 style) wins over the one in the dict.
        ``max_position_embeddings`` is required. Keys the type does not use are dropped with a warning
        (transformers ignores them too).
        """
        params = declared_rope(hf_config)
        if per_layer_type(params):
            raise ValueError("per-layer-type rope_parameters are not supported by Llama-family models")
        rope_type = params.pop("rope_type", None) or "default"
        if rope_type not in _TYPE_KEYS:
            raise ValueError(f"unknown rope_type {rope_type!r}; supported: {', '.join(_TYPE_KEYS)}")
        theta = params.pop("rope_theta", None) or DEFAULT_THETA
        if "max_position_embeddings" not in hf_config:
            raise ValueError("config has no max_position_embeddings")
        if "partial_rotary_factor" not in params and hf_config.get("partial_rotary_factor") is not None:
            params["partial_rotary_factor"] = hf_config["partial_rotary_factor"]
        if rope_type != "proportional" and params.get("partial_rotary_factor", 1.0) == 1.0:
            params.pop("partial_rotary_factor", None)
        if rope_type not in ("proportional", "default") and "partial_rotary_factor" in params:
            # transformers' default Llama RoPE ignores the key; scaled types would rotate part of a head.
            raise ValueError(
                "Llama-family models rotate whole heads: partial_rotary_factor needs rope_type 'proportional'"
            )
        if (
            rope_type in ORIGINAL_LENGTH_TYPES
            and hf_config.get("original_max_position_embeddings") is not None
        ):
            params["original_max_position_embeddings"] = hf_config["original_max_position_embeddings"]
        unused = sorted(set(params) - set(_TYPE_KEYS[rope_type]))
        if unused:
            logger.warning("ignoring RoPE keys %s, which rope_type %r does not use", unused, rope_type)
            params = {key: value for key, value in params.items() if key not in unused}
        for name in ("short_factor", "long_factor"):
            if params.get(name) is not None:
                params[name] = tuple(float(x) for x in params[name])
        values = {key: value for key, value in params.items() if value is not None}
        return cls(
            head_dim=head_dim,
            rope_type=rope_type,
            theta=float(theta),
            max_position_embeddings=int(hf_config["max_position_embeddings"]),
            **values,
        )

    def to_hf(self) -> dict[str, Any]:
        """The ``config.json`` keys that declare this RoPE, readable by transformers 4 and 5.

        Writes ``rope_parameters`` (transformers 5) and the equivalent legacy ``rope_theta`` +
        ``rope_scaling`` (``null`` for default RoPE), so older readers do not silently drop the
        scaling. ``ntk`` becomes ``default`` RoPE with the changed base (see :func:`ntk_theta`).
        """
        if self.rope_type == "ntk":
            return RopeConfig(
                self.head_dim, theta=ntk_theta(self), max_position_embeddings=self.max_position_embeddings
            ).to_hf()
        params: dict[str, Any] = {}
        for name in _TYPE_KEYS[self.rope_type]:
            value = getattr(self, name)
            # transformers requires yarn's ``factor`` key even when null (derived from the lengths).
            if value is not None or (self.rope_type, name) == ("yarn", "factor"):
                params[name] = list(value) if isinstance(value, tuple) else value
        return {
            "max_position_embeddings": self.max_position_embeddings,
            "rope_theta": self.theta,
            "rope_scaling": {"rope_type": self.rope_type, **params} if self.rope_type != "default" else None,
            "rope_parameters": {"rope_type": self.rope_type, "rope_theta": self.theta, **params},
        }

    def with_overrides(
        self,
        *,
        rope_scaling: Mapping[str, Any] | None = None,
        rope_theta: float | None = None,
        max_position_embeddings: int | None = None,
    ) -> RopeConfig:
        """This RoPE with a run's overrides, each declared as in a Hugging Face ``config.json``, by the
        rule both implementations follow (``rope_keys.with_run_rope``)."""
        declared = with_run_rope(
            self.to_hf(),
            rope_scaling=rope_scaling,
            rope_theta=rope_theta,
            max_position_embeddings=max_position_embeddings,
            head_dim=self.head_dim,
        )
        return RopeConfig.from_hf(declared, self.head_dim)


HF_ROPE_KEYS = frozenset(
    {
        "rope_theta",
        "rope_scaling",
        "rope_parameters",
        "max_position_embeddings",
        "original_max_position_embeddings",
        "partial_rotary_factor",
    }
)
"""Top-level ``config.json`` keys read by :meth:`RopeConfig.from_hf` and written by ``to_hf``."""


# Inverse frequencies ---------------------------------------------------------------------------------------


def _exponents(dim: int, device: torch.device | None) -> Tensor:
    """``2i / dim`` for ``i = 0 .. dim/2 - 1``, in float64."""
    return torch.arange(0, dim, 2, dtype=torch.float64, device=device) / dim


def _base_frequencies(theta: float, dim: int, device: torch.device | None) -> Tensor:
    """Unscaled RoPE: ``theta ** (-2i / dim)``."""
    return 1.0 / theta ** _exponents(dim, device)


def ntk_theta(config: RopeConfig) -> float:
    """The NTK-aware base of ``config`` (``rope_keys.ntk_base``)."""
    return ntk_base(config.theta, config.factor, config.head_dim)


def _default(config: RopeConfig, seq_len: int | None, device: torch.device | None) -> tuple[Tensor, float]:
    return _base_frequencies(config.theta, config.head_dim, device), 1.0


def _linear(config: RopeConfig, seq_len: int | None, device: torch.device | None) -> tuple[Tensor, float]:
    """Position interpolation: dividing every frequency by ``factor`` equals dividing positions by it."""
    return _base_frequencies(config.theta, config.head_dim, device) / config.factor, 1.0


def _ntk(config: RopeConfig, seq_len: int | None, device: torch.device | None) -> tuple[Tensor, float]:
    return _base_frequencies(ntk_theta(config), config.head_dim, device), 1.0


def _dynamic(config: RopeConfig, seq_len: int | None, device: torch.device | None) -> tuple[Tensor, float]:
    """Dynamic NTK: the base grows with ``seq_len`` beyond ``max_position_embeddings``.

    ``theta' = theta * (factor * L / L0 - (factor - 1)) ** (d / (d - 2))`` with
    ``L = max(seq_len, L0)`` and ``L0 = max_position_embeddings`` (as transformers computes it), so
    sequences no longer than ``L0`` get the unscaled frequencies, and at ``L = factor * L0`` the base
    is ``theta * (factor**2 - factor + 1) ** (d / (d - 2))``: larger than the static NTK base
    ``theta * factor ** (d / (d - 2))`` of :func:`ntk_theta` for any ``factor > 1`` (the two meet at
    ``L = (2 * factor - 1) / factor * L0``). In training ``seq_len`` is the window length and ``L0``
    the run's ``context.target``, which ``max_position_embeddings`` is set to.
    """
    d, l0 = config.head_dim, config.max_position_embeddings
    length = l0 if seq_len is None else max(seq_len, l0)
    theta = config.theta * (config.factor * length / l0 - (config.factor - 1)) ** (d / (d - 2))
    return _base_frequencies(theta, d, device), 1.0


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature ``0.1 * mscale * ln(scale) + 1`` (1 when not extending)."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn(config: RopeConfig, seq_len: int | None, device: torch.device | None) -> tuple[Tensor, float]:
    """YaRN ("NTK-by-parts" + temperature), Peng et al., arXiv:2309.00071, sections 3.2-3.4.

    Frequencies that complete fewer than ``beta_slow`` rotations over the original context are
    interpolated (divided by ``factor``); those completing more than ``beta_fast`` are kept
    (extrapolated); a linear ramp over the dimension index blends the two in between. The attention
    factor ``0.1 ln(factor) + 1`` (or the DeepSeek ``mscale / mscale_all_dim`` ratio) compensates the
    flatter attention distribution at long range.
    """
    d, base = config.head_dim, config.theta
    original = config.original_max_position_embeddings
    factor = config.factor if config.factor is not None else config.max_position_embeddings / original
    attention_factor = config.attention_factor
    if attention_factor is None:
        if config.mscale and config.mscale_all_dim:
            attention_factor = _yarn_mscale(factor, config.mscale) / _yarn_mscale(
                factor, config.mscale_all_dim
            )
        else:
            attention_factor = _yarn_mscale(factor)
    beta_fast = config.beta_fast or 32
    beta_slow = config.beta_slow or 1

    def dimension_of(rotations: float) -> float:
        # The dimension index whose wavelength fits ``rotations`` times into the original context.
        return d * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = dimension_of(beta_fast), dimension_of(beta_slow)
    if config.truncate is None or config.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    ramp = ((torch.arange(d // 2, dtype=torch.float64, device=device) - low) / (high - low)).clamp(0, 1)
    extrapolated = _base_frequencies(base, d, device)
    interpolated = extrapolated / factor
    return interpolated * ramp + extrapolated * (1 - ramp), float(attention_factor)


def _llama3(config: RopeConfig, seq_len: int | None, device: torch.device | None) -> tuple[Tensor, float]:
    """Llama 3.1 scaling: keep high frequencies, divide low ones by ``factor``, blend the band between.

    Wavelengths shorter than ``L0 / high_freq_factor`` are kept, longer than ``L0 / low_freq_factor``
    are divided by ``factor``, and in between the two are mixed with weight
    ``(L0 / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)``.
    """
    inv_freq = _base_frequencies(config.theta, config.head_dim, device)
    original = config.original_max_position_embeddings
    low_freq_wavelen = original / config.low_freq_factor
    high_freq_wavelen = original / config.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    smooth = (original / wavelen - config.low_freq_factor) / (
        config.high_freq_factor - config.low_freq_factor
    )
    blended = (1 - smooth) * inv_freq / config.factor + smooth * inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / config.factor, inv_freq)
    medium = (wavelen >= high_freq_wavelen) & (wavelen <= low_freq_wavelen)
    return torch.where(medium, blended, scaled), 1.0


def _longrope(config: RopeConfig, seq_len: int | None, device: torch.device | None) -> tuple[Tensor, float]:
    """LongRoPE (Ding et al., arXiv:2402.13753): ``inv_freq[i] = theta ** (-2i/d) / ext[i]``.

    ``ext`` is ``long_factor`` when ``seq_len`` exceeds ``original_max_position_embeddings`` and
    ``short_factor`` otherwise (or when ``seq_len`` is None). The attention factor defaults to
    ``sqrt(1 + ln(factor) / ln(original))`` with ``factor = max_position_embeddings / original`` when
    not given.
    """
    original = config.original_max_position_embeddings
    factor = config.factor if config.factor is not None else config.max_position_embeddings / original
    attention_factor = config.attention_factor
    if attention_factor is None:
        attention_factor = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    ext = config.long_factor if seq_len is not None and seq_len > original else config.short_factor
    ext_factors = torch.tensor(ext, dtype=torch.float64, device=device)
    return _base_frequencies(config.theta, config.head_dim, device) / ext_factors, float(attention_factor)


def _proportional(
    config: RopeConfig, seq_len: int | None, device: torch.device | None
) -> tuple[Tensor, float]:
    """Rotate the first ``partial_rotary_factor`` share of the angles; the rest get frequency 0.

    The exponents keep the full ``head_dim`` as denominator, so the rotated angles have the
    frequencies they would have in a fully rotated head; all frequencies are divided by ``factor``.
    """
    d = config.head_dim
    share = 1.0 if config.partial_rotary_factor is None else config.partial_rotary_factor
    rotated = int(share * d // 2)
    inv_freq = torch.zeros(d // 2, dtype=torch.float64, device=device)
    inv_freq[:rotated] = _base_frequencies(config.theta, d, device)[:rotated]
    return inv_freq / (1.0 if config.factor is None else config.factor), 1.0


_INVERSE_FREQUENCIES: dict[
    str, Callable[[RopeConfig, int | None, torch.device | None], tuple[Tensor, float]]
] = {
    "default": _default,
    "linear": _linear,
    "ntk": _ntk,
    "dynamic": _dynamic,
    "yarn": _yarn,
    "llama3": _llama3,
    "longrope": _longrope,
    "proportional": _proportional,
}


def inverse_frequencies(
    config: RopeConfig, seq_len: int | None = None, *, device: torch.device | str | None = None
) -> tuple[Tensor, float]:
    """``(inv_freq, attention_scaling)``: float64 ``[head_dim // 2]`` frequencies and the cos/sin factor.

    ``seq_len`` is the current sequence length (``max(position_ids) + 1`` of the batch) and only
    matters for ``dynamic`` and ``longrope``; ``None`` gives what transformers computes at model init.
    """
    device = torch.device(device) if device is not None else None
    return _INVERSE_FREQUENCIES[config.rope_type](config, seq_len, device)


# Applying the rotation -------------------------------------------------------------------------------------


def rotary_cos_sin(
    position_ids: Tensor, inv_freq: Tensor, attention_scaling: float = 1.0
) -> tuple[Tensor, Tensor]:
    """Float32 ``cos`` and ``sin`` tables ``[*position_ids.shape, head_dim]`` for the given positions.

    Each token's rotation depends on its own position id only, so any subset or permutation of tokens
    (e.g. a context-parallel zigzag shard) gets exactly the rows of the full table. Angles use the
    Hugging Face "rotate half" layout (the two halves of the head share frequencies), and both tables
    are multiplied by ``attention_scaling`` as transformers does.
    """
    angles = position_ids.to(torch.float64)[..., None] * inv_freq.to(
        device=position_ids.device, dtype=torch.float64
    )
    angles = torch.cat((angles, angles), dim=-1)
    return (angles.cos() * attention_scaling).float(), (angles.sin() * attention_scaling).float()


def _rotate_half(x: Tensor) -> Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate ``x`` ``[..., tokens, heads, head_dim]`` by tables ``[..., tokens, head_dim]``.

    Computed in float32 and returned in ``x``'s dtype, so bf16 activations are rotated accurately.
    """
    cos, sin = cos.unsqueeze(-2), sin.unsqueeze(-2)
    x32 = x.float()
    return (x32 * cos + _rotate_half(x32) * sin).to(x.dtype)
