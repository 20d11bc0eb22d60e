"""What would make a training setting fit its GPUs: the smallest change of each kind, by the memory model.

When a window does not fit (``longctx.trainer.planning.memory.fits``), three changes lower the per-rank
memory, each at its own price:

* **activation checkpointing** (``none`` -> ``selective`` -> ``full``): recomputation, no hardware
  (none under ``auto``, which already takes the cheapest mode that fits, ``memory.choose_checkpointing``);
* **a larger cp**: fewer tokens per rank (the ring's block), on the same GPUs when the new ring size
  divides them, else on the fewest more that it does;
* **more GPUs** at the same cp: the model state is sharded over more ranks (FSDP2 over
  ``dp_shard x cp``, as ``longctx train`` shards it).

:func:`smallest_changes` tries each alone and returns, per kind, the smallest that fits. When none
does alone, it tries full checkpointing together with a larger cp or more GPUs. Under ``auto`` a
changed layout is judged in the mode ``auto`` would choose there. Every figure is
:func:`~longctx.trainer.planning.memory.rank_memory`'s, the estimate ``longctx plan`` prints and ``longctx
train`` checks; the mesh rules (windows split into ``2 x cp`` chunks, ``cp x dp_replicate``
dividing the GPUs) are :class:`~longctx.trainer.parallel.mesh.MeshShape`'s. Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from longctx.core.errors import ConfigError
from longctx.trainer.models.shape import ModelShape
from longctx.trainer.parallel.mesh import MeshShape
from longctx.trainer.planning.memory import (
    ACTIVATION_CHECKPOINTING,
    CHECKPOINTING_SETTINGS,
    choose_checkpointing,
    rank_memory,
    usable_bytes,
)

MAX_GPUS = 65_536
"""The largest job the search considers."""


@dataclass(frozen=True)
class Layout:
    """The settings a change may touch: ring size, GPUs, replicas, activation checkpointing."""

    cp: int
    gpus: int
    dp_replicate: int
    activation_checkpointing: str
    """A mode of ``shape.ACTIVATION_CHECKPOINTING`` or ``auto``."""
    shards: int | None = None
    """Ranks the model state is sharded over when given apart (``longctx plan --state-shards``); a
    change of cp or GPUs drops it for the way ``longctx train`` shards (:attr:`state_shards`)."""

    @property
    def state_shards(self) -> int:
        """Ranks one copy of the model state is sharded over: :attr:`shards`, else as ``longctx
        train`` shards it (``dp_shard x cp``)."""
        if self.shards is not None:
            return self.shards
        return MeshShape.for_world(self.gpus, self.cp, self.dp_replicate).shard_size


@dataclass(frozen=True)
class Change:
    """One change that makes the setting fit, and the per-rank total it leads to."""

    kinds: tuple[str, ...]
    """What changed: ``activation_checkpointing``, ``cp`` and/or ``gpus``."""
    layout: Layout
    total_bytes: float
    mode: str
    """The checkpointing mode :attr:`total_bytes` is for: the layout's, or what ``auto`` chooses there."""

    def describe(self) -> str:
        """``activation checkpointing selective``, ``cp 16 on 16 GPUs`` or ``32 GPUs at cp 8``; under
        ``auto``, the mode it would choose: ``cp 16 on 16 GPUs, auto checkpointing selective``."""
        parts = []
        if "activation_checkpointing" in self.kinds:
            parts.append(f"activation checkpointing {self.layout.activation_checkpointing}")
        if "cp" in self.kinds:
            parts.append(f"cp {self.layout.cp} on {self.layout.gpus} GPUs")
        elif "gpus" in self.kinds:
            parts.append(f"{self.layout.gpus} GPUs at cp {self.layout.cp}")
        text = " and ".join(parts)
        if self.layout.activation_checkpointing == "auto":
            text += f", auto checkpointing {self.mode}"
        return text


def _mode(model: ModelShape, length: int, layout: Layout, device_bytes: float) -> str:
    """The layout's checkpointing mode; for ``auto``, the one ``longctx train`` would choose."""
    if layout.activation_checkpointing != "auto":
        return layout.activation_checkpointing
    return choose_checkpointing(model, length, layout.cp, device_bytes, state_shards=layout.state_shards)


def _stronger_modes(setting: str) -> tuple[str, ...]:
    """The checkpointing modes that keep less than ``setting``'s (none beyond ``auto``, which tries
    them all)."""
    if setting == "auto":
        return ()
    return ACTIVATION_CHECKPOINTING[ACTIVATION_CHECKPOINTING.index(setting) + 1 :]


def _fitting(
    model: ModelShape, length: int, layout: Layout, device_bytes: float, kinds: tuple[str, ...]
) -> Change | None:
    """``layout`` as a :class:`Change` of ``kinds`` when it fits
    (``longctx.trainer.planning.memory.fits``)."""
    mode = _mode(model, length, layout, device_bytes)
    total = rank_memory(
        model, length, layout.cp, state_shards=layout.state_shards, activation_checkpointing=mode
    ).total
    return Change(kinds, layout, total, mode) if total <= usable_bytes(device_bytes) else None


def _more_checkpointing(model: ModelShape, length: int, layout: Layout, device_bytes: float) -> Change | None:
    """The first checkpointing mode beyond ``layout``'s that fits."""
    for mode in _stronger_modes(layout.activation_checkpointing):
        more = replace(layout, activation_checkpointing=mode)
        change = _fitting(model, length, more, device_bytes, ("activation_checkpointing",))
        if change is not None:
            return change
    return None


def _ring_sizes(length: int, above: int) -> list[int]:
    """Ring sizes larger than ``above`` (up to :data:`MAX_GPUS`) that split windows of ``length``."""
    return [cp for cp in range(above + 1, min(length, MAX_GPUS) + 1) if MeshShape.window_splits(length, cp)]


def _larger_cp(
    model: ModelShape, length: int, layout: Layout, device_bytes: float, kinds: tuple[str, ...]
) -> Change | None:
    """The smallest larger ring that fits, on the fewest GPUs (at least ``layout.gpus``) it divides."""
    for cp in _ring_sizes(length, layout.cp):
        ring = cp * layout.dp_replicate
        gpus = -(-layout.gpus // ring) * ring
        if gpus > MAX_GPUS:
            return None
        change = _fitting(model, length, replace(layout, cp=cp, gpus=gpus, shards=None), device_bytes, kinds)
        if change is not None:
            return change
    return None


def _more_gpus(
    model: ModelShape, length: int, layout: Layout, device_bytes: float, kinds: tuple[str, ...]
) -> Change | None:
    """The fewest more GPUs (multiples of ``cp x dp_replicate``) at the same ring that fit: a binary
    search, since the per-rank memory only falls as the state is sharded over more ranks (from 2 on)."""
    ring = layout.cp * layout.dp_replicate
    layout = replace(layout, shards=None)
    low, high = layout.gpus // ring + 1, MAX_GPUS // ring
    if low > high or _fitting(model, length, replace(layout, gpus=high * ring), device_bytes, kinds) is None:
        return None
    while low < high:
        middle = (low + high) // 2
        if _fitting(model, length, replace(layout, gpus=middle * ring), device_bytes, kinds) is None:
            low = middle + 1
        else:
            high = middle
    return _fitting(model, length, replace(layout, gpus=low * ring), device_bytes, kinds)


def smallest_changes(model: ModelShape, length: int, layout: Layout, device_bytes: float) -> list[Change]:
    """The smallest change of each kind that makes windows of ``length`` tokens fit ``device_bytes``
    per GPU (checkpointing, then cp, then GPUs; only the kinds that fit alone). When none fits alone,
    the least checkpointing beyond ``layout``'s together with the smallest larger cp, and with the
    fewest more GPUs, that fit. Empty when the setting fits already, or nothing within
    :data:`MAX_GPUS` GPUs does. Under ``auto`` the setting fits when any mode does, and a change is
    only ever of cp or GPUs."""
    if layout.activation_checkpointing not in CHECKPOINTING_SETTINGS:
        raise ConfigError(f"unknown activation checkpointing {layout.activation_checkpointing!r}")
    if _fitting(model, length, layout, device_bytes, ()) is not None:
        return []
    alone = [
        _more_checkpointing(model, length, layout, device_bytes),
        _larger_cp(model, length, layout, device_bytes, ("cp",)),
        _more_gpus(model, length, layout, device_bytes, ("gpus",)),
    ]
    found = [change for change in alone if change is not None]
    if found:
        return found
    modes = _stronger_modes(layout.activation_checkpointing)
    for search, kind in ((_larger_cp, "cp"), (_more_gpus, "gpus")):
        for mode in modes:
            more = replace(layout, activation_checkpointing=mode)
            change = search(model, length, more, device_bytes, ("activation_checkpointing", kind))
            if change is not None:
                found.append(change)
                break
    return found
