"""The shape of a training job's device mesh and the two rules it sets on a run, in one place.

* World size: the ranks form ``dp_replicate x dp_shard x cp``, so ``cp x dp_replicate`` must divide
  the number of processes (:meth:`MeshShape.for_world`).
* Window length: zigzag context parallelism cuts every window into ``2 x cp`` equal chunks, two per
  rank of a ring (``longctx.trainer.parallel.zigzag``), so the window length must be a multiple of
  ``2 x cp`` (:meth:`MeshShape.check_window`).

Every check of these rules calls this module: the config check at load (``longctx.config``), the
check before any rank starts (``longctx.trainer.preflight``), the trainer, the zigzag split and
``longctx plan``. It imports no torch, so the config check and ``longctx --help`` stay fast;
``longctx.trainer.parallel.state`` builds the mesh itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from longctx.core.errors import ConfigError

MESH_DIMS = ("dp_replicate", "dp_shard", "cp")


@dataclass(frozen=True)
class MeshShape:
    """Sizes of the three mesh dimensions."""

    dp_replicate: int
    dp_shard: int
    cp: int

    @classmethod
    def for_world(
        cls,
        world_size: int,
        cp: int,
        dp_replicate: int = 1,
        *,
        world_key: str = "the number of processes (longctx train --nproc, torchrun --nproc-per-node)",
        cp_key: str = "train.cp",
        replicas_key: str = "train.dp_replicate",
    ) -> MeshShape:
        """The mesh of ``world_size`` ranks with rings of ``cp`` and ``dp_replicate`` replicas.

        Raises :class:`ConfigError` when ``cp x dp_replicate`` does not divide the world size; the
        ``*_key`` arguments name the three settings in the message.
        """
        if cp < 1 or dp_replicate < 1 or world_size % (cp * dp_replicate):
            ring = cp * dp_replicate
            what = f"{cp_key} = {cp}" if dp_replicate == 1 else f"{cp_key} x {replicas_key} = {ring}"
            raise ConfigError(f"{what} must divide {world_key} = {world_size}; use a multiple of {ring}")
        return cls(dp_replicate, world_size // (cp * dp_replicate), cp)

    @staticmethod
    def chunks_per_window(cp: int) -> int:
        """Equal chunks a window is cut into for ``cp`` context-parallel ranks: two per rank (rank
        ``r`` holds chunks ``r`` and ``2 cp - 1 - r``, which balances causal attention's work)."""
        return 2 * cp

    @staticmethod
    def window_splits(length: int, cp: int) -> bool:
        """Whether windows of ``length`` tokens split into :meth:`chunks_per_window` equal chunks."""
        return cp >= 1 and length > 0 and length % MeshShape.chunks_per_window(cp) == 0

    @staticmethod
    def check_window(length: int, cp: int, *, length_key: str, cp_key: str) -> None:
        """Raise :class:`ConfigError` (a ``ValueError``) unless windows of ``length`` tokens split
        into :meth:`chunks_per_window` equal chunks for ``cp`` ranks. ``length_key`` and ``cp_key``
        name the two settings in the message (``context.target``, ``train.cp``...)."""
        chunks = MeshShape.chunks_per_window(cp)
        if MeshShape.window_splits(length, cp):
            return
        other_cp = f", or a {cp_key} that divides {length // 2}" if length > 0 and length % 2 == 0 else ""
        raise ConfigError(
            f"{length_key} = {length} must be a positive multiple of 2 x {cp_key} = {chunks} (zigzag "
            f"context parallelism cuts every window into 2 x cp equal chunks, two per rank); use windows of "
            f"a multiple of {chunks} tokens{other_cp}"
        )

    @property
    def world_size(self) -> int:
        return self.dp_replicate * self.dp_shard * self.cp

    @property
    def dp_size(self) -> int:
        """Data-parallel ranks: groups of ranks that read different rows."""
        return self.dp_replicate * self.dp_shard

    @property
    def shard_size(self) -> int:
        """Ranks one copy of the model state is sharded over (``dp_shard x cp``)."""
        return self.dp_shard * self.cp

    def describe(self) -> str:
        return f"dp_replicate {self.dp_replicate} x dp_shard {self.dp_shard} x cp {self.cp}"
