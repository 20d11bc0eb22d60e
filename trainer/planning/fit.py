"""What would make a training setting fit its GPUs: the smallest change of each kind, by the memory model.

When a window does not fit (``longctx.trainer.planning.memory.fits``), three changes lower the per-rank
memory, each at its own price:

* **activation checkpointing** (``none`` -> ``selective`` -> ``full``): recomputation, no hardware
  (none under ``auto``, which already takes the cheapest mode that fits, ``memory.choose_checkpointing``);
* **a larger cp**: fewer tokens per rank (the ring's block), on the same GPUs when the new ring size
  divides them, else on the fewest more it fits on;
* **more GPUs** at the same cp: the model state is sharded over more ranks (FSDP2 over
  ``dp_shard x cp``, as ``longctx train`` shards it).

:func:`smallest_changes` returns, for the setting's checkpointing mode and each stronger one, the
smallest change of each kind that fits: the mode alone, the larger ring on the fewest GPUs, the
fewest more GPUs at the same ring; so a mode is offered together with a ring and GPUs when neither
fits alone (full checkpointing with cp 16 on 32 GPUs for Llama-3-70B at 128K on 80 GB, where a
larger ring alone needs cp 128 on 128 GPUs). Under ``auto`` a changed layout is judged in the mode
``auto`` would choose there. Every figure is
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


def _ring_sizes(length: int, above: int) -> list[int]:
    """Ring sizes larger than ``above`` (up to :data:`MAX_GPUS`) that split windows of ``length``."""
    return [cp for cp in range(above + 1, min(length, MAX_GPUS) + 1) if MeshShape.window_splits(length, cp)]


def _fewest_gpus(
    model: ModelShape, length: int, layout: Layout, device_bytes: float, kinds: tuple[str, ...], at_least: int
) -> Change | None:
    """``layout`` on the fewest GPUs, a multiple of ``cp x dp_replicate`` and at least ``at_least``,
    that fit: a binary search, since the per-rank memory only falls as the state is sharded over more
    ranks (from 2 on)."""
    ring = layout.cp * layout.dp_replicate
    layout = replace(layout, shards=None)
    low, high = -(-at_least // ring), MAX_GPUS // ring
    if low > high or _fitting(model, length, replace(layout, gpus=high * ring), device_bytes, kinds) is None:
        return None
    while low < high:
        middle = (low + high) // 2
        if _fitting(model, length, replace(layout, gpus=middle * ring), device_bytes, kinds) is None:
            low = middle + 1
        else:
            high = middle
    return _fitting(model, length, replace(layout, gpus=low * ring), device_bytes, kinds)


def _larger_cp(
    model: ModelShape, length: int, layout: Layout, device_bytes: float, kinds: tuple[str, ...]
) -> Change | None:
    """The larger ring that fits on the fewest GPUs (at least ``layout.gpus``; then the smallest
    ring): each ring on the fewest GPUs it fits on, until a ring alone needs more GPUs than the best."""
    best: Change | None = None
    for cp in _ring_sizes(length, layout.cp):
        ring = cp * layout.dp_replicate
        if best is not None and ring > best.layout.gpus:
            break
        start = -(-layout.gpus // ring) * ring
        change = _fewest_gpus(model, length, replace(layout, cp=cp), device_bytes, kinds, start)
        if change is not None and (best is None or change.layout.gpus < best.layout.gpus):
            best = change
    return best


def _more_gpus(
    model: ModelShape, length: int, layout: Layout, device_bytes: float, kinds: tuple[str, ...]
) -> Change | None:
    """The fewest more GPUs (multiples of ``cp x dp_replicate``) at the same ring that fit."""
    ring = layout.cp * layout.dp_replicate
    return _fewest_gpus(model, length, layout, device_bytes, kinds, (layout.gpus // ring + 1) * ring)


def _strength(mode: str) -> int:
    """How much a mode recomputes (``auto``: as little as it can, 0)."""
    return ACTIVATION_CHECKPOINTING.index(mode) if mode in ACTIVATION_CHECKPOINTING else 0


def _dominated(change: Change, others: list[Change]) -> bool:
    """Whether another change fits with no more checkpointing, no larger ring and no more GPUs."""
    return any(
        other is not change
        and _strength(other.layout.activation_checkpointing)
        <= _strength(change.layout.activation_checkpointing)
        and other.layout.cp <= change.layout.cp
        and other.layout.gpus <= change.layout.gpus
        for other in others
    )


def smallest_changes(model: ModelShape, length: int, layout: Layout, device_bytes: float) -> list[Change]:
    """The smallest change of each kind that makes windows of ``length`` tokens fit ``device_bytes``
    per GPU: for the layout's checkpointing mode and then each stronger one, the mode alone (when it
    fits, no stronger mode is tried), the larger ring on the fewest GPUs, and the fewest more GPUs at
    the same ring; less those another change beats on every count (no more checkpointing, no larger
    ring, no more GPUs). Empty when the setting fits already, or nothing within :data:`MAX_GPUS` GPUs
    does. Under ``auto`` the setting fits when any mode does, and a change is only ever of cp or GPUs."""
    if layout.activation_checkpointing not in CHECKPOINTING_SETTINGS:
        raise ConfigError(f"unknown activation checkpointing {layout.activation_checkpointing!r}")
    if _fitting(model, length, layout, device_bytes, ()) is not None:
        return []
    found: list[Change] = []
    for mode in (layout.activation_checkpointing, *_stronger_modes(layout.activation_checkpointing)):
        at = replace(layout, activation_checkpointing=mode)
        more = ("activation_checkpointing",) if mode != layout.activation_checkpointing else ()
        alone = _fitting(model, length, at, device_bytes, more) if more else None
        if alone is not None:
            found.append(alone)
            break
        for search, kind in ((_larger_cp, "cp"), (_more_gpus, "gpus")):
            change = search(model, length, at, device_bytes, (*more, kind))
            if change is not None:
                found.append(change)
    return [change for change in found if not _dominated(change, found)]
