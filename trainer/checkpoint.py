"""Atomic checkpoints with everything a run needs to resume exactly.

Layout of ``<dir>/step_<N>/``: ``model.safetensors`` and ``optimizer.pt`` / ``scheduler.pt``
(written by rank 0: the model is replicated over the data- and context-parallel ranks),
``rank_<r>.pt`` for every rank (its dataloader position and RNG states), and ``meta.json``.
All ranks write into ``step_<N>.tmp/`` (``longctx.core.atomic``'s temporary name); after a barrier,
rank 0 renames it and then replaces the ``latest`` pointer file, so a crash at any moment leaves
either the old or the new checkpoint.
Files are read with ``torch.load(weights_only=True)``: no pickled code runs on resume.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from safetensors.torch import load_model, save_model

from longctx.core.atomic import TEMP_SUFFIX, commit, discard, temporary_path, write_text
from longctx.core.errors import ConfigError

LATEST = "latest"


def rng_state() -> dict[str, Any]:
    """Python and torch (CPU and, where present, CUDA) RNG states."""
    state: dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def save_checkpoint(
    root: Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    rank_state: dict[str, Any],
    meta: dict[str, Any],
    rank: int,
    keep: int,
) -> Path:
    """Write checkpoint ``step`` collectively (every rank calls this); returns its folder."""
    final = root / f"step_{step:07d}"
    tmp = temporary_path(final)
    try:
        if rank == 0:
            discard(tmp)
            tmp.mkdir(parents=True)
        _barrier()
        torch.save(rank_state | {"rng": rng_state()}, tmp / f"rank_{rank:05d}.pt")
        if rank == 0:
            save_model(model, str(tmp / "model.safetensors"))
            torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
            torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
            (tmp / "meta.json").write_text(json.dumps(meta | {"step": step}, indent=2))
        _barrier()
        if rank == 0:
            commit(tmp, final)
            write_text(root / LATEST, final.name + "\n")
            for old in sorted(p for p in root.glob("step_*") if p.is_dir() and not p.name.endswith(TEMP_SUFFIX))[:-keep]:
                shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        if rank == 0:
            discard(tmp)
        raise
    _barrier()
    return final


def latest_checkpoint(root: Path) -> Path | None:
    """The folder the ``latest`` pointer names, or None when there is no complete checkpoint."""
    pointer = root / LATEST
    if not pointer.is_file():
        return None
    folder = root / pointer.read_text().strip()
    return folder if (folder / "meta.json").is_file() else None


def load_checkpoint(
    folder: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    rank: int,
    expected_meta: dict[str, Any],
) -> tuple[int, dict[str, Any]]:
    """Restore a checkpoint into the given objects; returns ``(step, rank_state)``.

    Refuses a checkpoint whose ``meta.json`` disagrees with ``expected_meta`` (world layout,
    shards, model), since its dataloader positions would not mean the same thing.
    """
    meta = json.loads((folder / "meta.json").read_text())
    changed = sorted(k for k, v in expected_meta.items() if meta.get(k) != v)
    if changed:
        details = ", ".join(f"{k}: {meta.get(k)!r} -> {expected_meta[k]!r}" for k in changed)
        raise ConfigError(f"cannot resume from {folder}: the run changed ({details}); use a new output folder")
    load_model(model, str(folder / "model.safetensors"), device=str(next(model.parameters()).device))
    optimizer.load_state_dict(torch.load(folder / "optimizer.pt", weights_only=True, map_location="cpu"))
    scheduler.load_state_dict(torch.load(folder / "scheduler.pt", weights_only=True))
    rank_state = torch.load(folder / f"rank_{rank:05d}.pt", weights_only=True)
    set_rng_state(rank_state.pop("rng"))
    return int(meta["step"]), rank_state
