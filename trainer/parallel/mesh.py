"""The shape of a training job's device mesh and the two rules it sets on a run, in one place.

* World size: the ranks form ``dp_replicate x dp_shard x cp``, so ``cp x dp_replicate`` must divide
  the number of processes (:meth:`MeshShape.for_world`).
* Window length: zigzag context parallelism cuts every window into ``2 x cp`` equal chunks, two per
  rank of a ring (``longctx.trainer.parallel.zigzag``), so the window length must be a multiple of
  ``2 x cp`` (:meth:`MeshShape.check_window`); every context-parallel mode keeps that rule.
* Context-parallel mode (``train.cp_mode``, :data:`CP_MODES`): ``ulysses`` and ``hybrid`` split
  attention heads over an all-to-all group of :meth:`MeshShape.ulysses_degree` ranks, which must
  divide the query heads and divide, or be a multiple of, the key/value heads
  (:meth:`MeshShape.check_heads`); the hybrid's degree must divide ``cp`` (:meth:`MeshShape.check_mode`).

Every check of these rules calls this module: the config check at load (``longctx.config``), the
check before any rank starts (``longctx.trainer.preflight``), the trainer, the zigzag split and
``longctx plan``. It imports no torch, so the config check and ``longctx --help`` stay fast;
``longctx.trainer.parallel.state`` builds the mesh itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from longctx.core.errors import ConfigError

MESH_DIMS = ("dp_replicate", "dp_shard", "cp")

CP_MODES = ("ring", "ulysses", "allgather", "hybrid")
"""How a context-parallel group computes attention over a window split across its ranks:
``ring`` passes key/value blocks around the ranks; ``allgather`` gathers every rank's keys and values
(Llama 3); ``ulysses`` trades tokens for heads with all-to-alls (DeepSpeed-Ulysses), so each rank
attends over the whole window for some heads; ``hybrid`` does Ulysses within groups of
``train.ulysses`` ranks and a ring across the groups (USP, LoongTrain)."""


@dataclass(frozen=True)
class CpChoice:
    """How a run's context-parallel group attends (``train.cp_mode`` with ``auto`` resolved) and lays
    rows out over its ranks (``train.cp_layout``)."""

    mode: str = "ring"
    ulysses: int = 1
    """Ranks of one all-to-all group (:meth:`MeshShape.ulysses_degree`): 1 for ring and allgather."""
    layout: str = "balanced"

    def describe(self) -> str:
        degree = f" (all-to-all over {self.ulysses} ranks)" if self.ulysses > 1 else ""
        return f"cp_mode {self.mode}{degree}, cp_layout {self.layout}"


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

    @staticmethod
    def check_mode(mode: str, cp: int, ulysses: int | None, *, mode_key: str, ulysses_key: str) -> None:
        """Raise :class:`ConfigError` unless ``mode`` (one of :data:`CP_MODES`) can run on ``cp``
        ranks: the hybrid needs an all-to-all degree ``ulysses`` with ``1 < ulysses < cp`` that divides
        ``cp``, and no other mode takes one."""
        if mode not in CP_MODES:
            raise ConfigError(f"{mode_key} = {mode!r} is not one of {', '.join(CP_MODES)}")
        if mode != "hybrid":
            if ulysses is not None and ulysses != MeshShape.ulysses_degree(mode, cp, None):
                raise ConfigError(f"{ulysses_key} is the all-to-all degree of {mode_key} = hybrid; remove it")
            return
        if ulysses is None or not 1 < ulysses < cp or cp % ulysses:
            divisors = [d for d in range(2, cp) if cp % d == 0]
            advice = (
                f"one of {', '.join(map(str, divisors))}" if divisors else "none exists: use ring or ulysses"
            )
            raise ConfigError(
                f"{mode_key} = hybrid needs {ulysses_key} between 1 and cp = {cp} that divides it "
                f"(got {ulysses}); {advice}"
            )

    @staticmethod
    def ulysses_degree(mode: str, cp: int, ulysses: int | None) -> int:
        """Ranks of one all-to-all group: ``cp`` for ``ulysses``, ``ulysses`` for ``hybrid``, else 1."""
        return {"ulysses": cp, "hybrid": ulysses or 1}.get(mode, 1)

    @staticmethod
    def ring_degree(mode: str, cp: int, ulysses: int | None) -> int:
        """Ranks of one ring (or all-gather) group: ``cp`` over the all-to-all degree."""
        return cp // MeshShape.ulysses_degree(mode, cp, ulysses)

    @staticmethod
    def heads_problem(num_heads: int, num_kv_heads: int, degree: int) -> str | None:
        """Why heads cannot be split over ``degree`` all-to-all ranks, or None when they can: the
        query heads must divide evenly, and the key/value heads too, or be copied (as USP does) to
        ``degree`` heads when there are fewer, which needs ``degree`` a multiple of them."""
        if degree <= 1:
            return None
        if num_heads % degree:
            return f"{num_heads} query heads do not split over {degree} ranks"
        if num_kv_heads % degree and degree % num_kv_heads:
            return (
                f"{num_kv_heads} key/value heads neither split over {degree} ranks nor divide {degree} "
                "(to be copied)"
            )
        return None

    @staticmethod
    def check_heads(num_heads: int, num_kv_heads: int, degree: int, *, degree_key: str) -> None:
        """Raise :class:`ConfigError` naming ``degree_key`` when :meth:`heads_problem` finds one."""
        problem = MeshShape.heads_problem(num_heads, num_kv_heads, degree)
        if problem is not None:
            degrees = [
                d
                for d in range(2, num_heads + 1)
                if MeshShape.heads_problem(num_heads, num_kv_heads, d) is None
            ]
            raise ConfigError(
                f"{degree_key} = {degree}: {problem}; use a degree among {degrees or 'none'}, or cp_mode ring"
            )

    @staticmethod
    def kv_head_copies(num_kv_heads: int, degree: int) -> int:
        """How many times each key/value head is copied so that ``degree`` ranks get one each (1 when
        the heads split without copies)."""
        return degree // num_kv_heads if num_kv_heads < degree else 1

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
