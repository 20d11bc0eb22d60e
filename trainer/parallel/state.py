"""The device mesh of a training job: data-parallel replicate x data-parallel shard x context parallel.

Ranks form a 3-D mesh with named dimensions ``("dp_replicate", "dp_shard", "cp")``, row-major: rank
``r = (replica * dp_shard + shard) * cp + cp_rank``, so the ranks of one ring are neighbours (on one
node when ``cp`` fits in it). The ranks of a ring read the same rows (each keeps its zigzag share), so
the data-parallel rank is ``replica * dp_shard + shard`` and the data-parallel size ``dp_replicate x
dp_shard``. Weights, gradients and optimizer states are sharded (FSDP2) over ``dp_shard x cp`` and,
when ``dp_replicate > 1``, replicated across that dimension (HSDP).

The mesh is built the same way on CPU (gloo) and GPU (NCCL) with ``init_device_mesh``; every group
it creates gets the configured timeout, so a dead or stuck rank ends in an error, not a hang. A
single process needs no process group: :attr:`ParallelState.mesh` is then ``None`` and the model is
trained unsharded. The shape and the rules it sets (world size, window length) are
``longctx.trainer.parallel.mesh``'s.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from longctx.trainer.parallel.mesh import MESH_DIMS, MeshShape


@dataclass(frozen=True)
class ParallelState:
    """This rank's place in the mesh and the groups it communicates over."""

    rank: int
    shape: MeshShape
    dp_rank: int
    cp_rank: int
    device: torch.device
    mesh: Any | None  # DeviceMesh over MESH_DIMS; None for a single process
    fsdp_mesh: Any | None  # 1-D (dp_shard x cp) or 2-D (dp_replicate, dp_shard x cp) mesh for fully_shard
    cp_group: dist.ProcessGroup | None  # None: the ring is local (cp = 1)
    world_group: dist.ProcessGroup | None  # None: a single process, no communication
    timeout_s: int = 600
    """The process groups' timeout (``train.comm_timeout_s``), for groups created later too."""
    subgroups: dict[int, Any] = field(default_factory=dict, compare=False)
    """:func:`cp_subgroups` by all-to-all degree, created on first use."""

    @classmethod
    def single(cls, device: torch.device | None = None) -> ParallelState:
        """One process, no communication."""
        return cls(0, MeshShape(1, 1, 1), 0, 0, device or torch.device("cpu"), None, None, None, None)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def world_size(self) -> int:
        return self.shape.world_size

    @property
    def dp_size(self) -> int:
        return self.shape.dp_size

    @property
    def cp_size(self) -> int:
        return self.shape.cp

    @property
    def sharded(self) -> bool:
        """Whether the model is sharded with FSDP2 (any job of more than one process)."""
        return self.fsdp_mesh is not None


def _device() -> torch.device:
    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        return device
    return torch.device("cpu")


def _set_timeout(group: dist.ProcessGroup, timeout: timedelta) -> None:
    """Give a group the run's timeout (device-mesh groups otherwise get c10d's 10/30-minute default)."""
    setter = getattr(dist.distributed_c10d, "_set_pg_timeout", None)  # private, present in torch 2.6-2.13
    if setter is not None:
        setter(timeout, group)


def build_mesh(shape: MeshShape, device_type: str) -> tuple[Any, Any]:
    """``(mesh, fsdp_mesh)``: the named 3-D mesh and the mesh ``fully_shard`` shards over.

    torch 2.10+ builds both as views of one 1-D world mesh (``_unflatten``), which avoids the
    deprecation warning for slicing a flattened dimension off the root mesh; older versions flatten
    ``dp_shard x cp`` (``_flatten``, private but present from 2.6).
    """
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    dims = (shape.dp_replicate, shape.dp_shard, shape.cp)
    if hasattr(DeviceMesh, "_unflatten"):
        world = init_device_mesh(device_type, (shape.world_size,), mesh_dim_names=("world",))
        mesh = world._unflatten(0, dims, MESH_DIMS)
        hsdp = world._unflatten(0, (shape.dp_replicate, shape.shard_size), ("dp_replicate", "dp_shard_cp"))
        fsdp_mesh = hsdp if shape.dp_replicate > 1 else hsdp["dp_shard_cp"]
    else:
        mesh = init_device_mesh(device_type, dims, mesh_dim_names=MESH_DIMS)
        flat = mesh["dp_shard", "cp"]._flatten("dp_shard_cp")
        fsdp_mesh = mesh["dp_replicate", "dp_shard_cp"] if shape.dp_replicate > 1 else flat
    return mesh, fsdp_mesh


def init_parallel(cp: int, timeout_s: int, dp_replicate: int = 1) -> ParallelState:
    """Join the torchrun job (or run as one process) and build the device mesh.

    Uses NCCL when CUDA is available and gloo otherwise; joins an already initialized default group
    (tests that run several jobs in one set of processes). Raises :class:`ConfigError` when the
    mesh does not divide the world size.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if dist.is_available() and dist.is_initialized():
        world_size = dist.get_world_size()
    shape = MeshShape.for_world(world_size, cp, dp_replicate)
    device = _device()
    if world_size == 1:
        return ParallelState.single(device)
    timeout = timedelta(seconds=timeout_s)
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo", timeout=timeout)
    mesh, fsdp_mesh = build_mesh(shape, device.type)
    groups = {mesh[name].get_group() for name in MESH_DIMS}
    groups |= set(fsdp_mesh.get_all_groups())
    for group in groups:
        _set_timeout(group, timeout)
    replica, shard, cp_rank = mesh.get_coordinate()
    return ParallelState(
        rank=dist.get_rank(),
        shape=shape,
        dp_rank=replica * shape.dp_shard + shard,
        cp_rank=cp_rank,
        device=device,
        mesh=mesh,
        fsdp_mesh=fsdp_mesh,
        cp_group=mesh["cp"].get_group() if shape.cp > 1 else None,
        world_group=dist.group.WORLD,
        timeout_s=timeout_s,
    )


def cp_subgroups(
    state: ParallelState, ulysses: int
) -> tuple[dist.ProcessGroup | None, dist.ProcessGroup | None]:
    """This rank's ``(ring group, all-to-all group)`` when its context-parallel group of ``cp`` ranks is
    cut into all-to-all groups of ``ulysses`` consecutive ranks (context-parallel rank ``c`` is member
    ``c % ulysses`` of group ``c // ulysses``, as ``longctx.trainer.parallel.layout`` lays rows out) and
    rings across them; None for a group of one. Created once per degree (every rank creates every
    group, in one order) with the job's timeout, and kept on ``state``."""
    if ulysses in state.subgroups:
        return state.subgroups[ulysses]
    cp = state.cp_size
    if ulysses <= 1 or state.cp_group is None:
        groups: tuple[dist.ProcessGroup | None, dist.ProcessGroup | None] = (state.cp_group, None)
    else:
        bases = range(0, state.world_size, cp)
        blocks = [[b + g * ulysses + m for m in range(ulysses)] for b in bases for g in range(cp // ulysses)]
        rings = [[b + g * ulysses + m for g in range(cp // ulysses)] for b in bases for m in range(ulysses)]
        timeout = timedelta(seconds=state.timeout_s)
        all_to_all, _ = dist.new_subgroups_by_enumeration(blocks, timeout=timeout)
        ring, _ = dist.new_subgroups_by_enumeration(rings, timeout=timeout) if cp > ulysses else (None, None)
        groups = (ring, all_to_all)
    state.subgroups[ulysses] = groups
    return groups


def all_gather_stats(values: torch.Tensor, state: ParallelState) -> torch.Tensor:
    """Every rank's copy of the 1-D float64 ``values``, stacked ``[world, n]`` (one collective for
    all of a step's statistics: sums and maxima are taken from the stack)."""
    if state.world_group is None:
        return values[None]
    out = torch.empty(state.world_size * values.numel(), dtype=values.dtype, device=state.device)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # renamed in 2.13
    gather(out, values.to(state.device).contiguous(), group=state.world_group)
    return out.cpu().view(state.world_size, values.numel())


def first_problem(problem: str | None, state: ParallelState) -> str | None:
    """The first rank's problem (a one-line message, or None for none) as every rank sees it: a
    collective in place of a barrier after work some ranks may fail, so that all of them raise the
    same error together instead of the others waiting on a rank that is gone. When there is one, the
    ranks :func:`settle` before it is returned."""
    if state.world_group is None:
        return problem
    problems: list[str | None] = [None] * state.world_size
    dist.all_gather_object(problems, problem, group=state.world_group)
    agreed = next((p for p in problems if p is not None), None)
    if agreed is not None:
        settle(state)
    return agreed


def settle(state: ParallelState) -> None:
    """Meet every rank once more before all of them raise the same error and tear their groups down.

    A collective's work is released by the backend's worker thread after the caller has its result;
    on gloo, releasing an ``all_gather_object``'s tensors takes the GIL. A rank that raised at once
    could reach interpreter shutdown first, and the worker thread taking the GIL then aborts the
    process ('terminate called without an active exception', pytorch/pytorch#190489). The barrier
    waits without the GIL, which gives the worker time to finish; it narrows the window without
    closing it, so the launcher's ranks also leave without the interpreter's shutdown after a
    failure (``launch.rank_errors``).
    """
    barrier(state)


def barrier(state: ParallelState) -> None:
    if state.world_group is not None:
        dist.barrier(group=state.world_group)


def shutdown(owned: bool) -> None:
    """Destroy the default process group when this job created it (``owned``)."""
    if owned and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
