"""Distributed checkpoints that resume at any world size, verified before they are trusted.

Layout of ``<checkpoints>/step_<N>/``:

- ``dcp/``: model and optimizer state written by ``torch.distributed.checkpoint`` (each rank writes its
  own shards; ``.metadata`` describes the global tensors, so a checkpoint saved on one mesh loads on
  any other, e.g. 4 ranks as DP 2 x CP 2 into 2 ranks as CP 2, or into one process);
- ``trainer.json``: step, learning-rate scheduler, data position (in global rows), coverage state,
  and the run's settings (``meta``, compared on resume, and the training config, for people);
- ``rng/rank_<r>.pt``: each rank's Python / torch RNG states;
- ``manifest.json``, written last: every file with its size and xxh3-128 checksum.

All of it is written into ``step_<N>.tmp/`` and renamed into place once complete, so a killed
writer never leaves a folder that looks like a checkpoint. The manifest catches later damage (a
truncated or missing file, flipped bytes): DCP itself has no checksums and loads flipped bytes
silently. Resume takes the newest checkpoint whose files all match their manifest entry (every rank
checks a share of the files); a damaged one is reported by name and skipped, and kept as
``step_<N>.damaged`` (never deleted) once the run goes ahead.
With no intact checkpoint but some present, training refuses to start over unless asked to
(``--restart``). Files are read with ``torch.load(weights_only=True)``: no pickled code runs on resume.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import xxhash

from longctx.core.atomic import TEMP_SUFFIX, commit, discard, temporary_path, write_json
from longctx.core.errors import LongctxError, OutputError
from longctx.trainer.parallel.state import ParallelState, barrier, first_problem, settle

MANIFEST = "manifest.json"
TRAINER_STATE = "trainer.json"
DCP_FOLDER = "dcp"
RNG_FOLDER = "rng"
DAMAGED_SUFFIX = ".damaged"
_STEP_NAME = re.compile(r"^step_(\d+)$")
_HASH_BLOCK = 8 * 1024 * 1024


class CheckpointError(LongctxError):
    """No checkpoint to resume from where one was expected, or a checkpoint that cannot be used."""


@dataclass(frozen=True)
class Checkpoint:
    folder: Path
    step: int


def checkpoint_folder(root: Path, step: int) -> Path:
    return root / f"step_{step:07d}"


def list_checkpoints(root: Path) -> list[Checkpoint]:
    """Folders named ``step_<N>`` under ``root`` (complete or damaged), newest first."""
    if not root.is_dir():
        return []
    found = [
        Checkpoint(p, int(m.group(1)))
        for p in root.iterdir()
        if p.is_dir() and (m := _STEP_NAME.match(p.name))
    ]
    return sorted(found, key=lambda c: c.step, reverse=True)


def file_digest(path: Path) -> str:
    """xxh3-128 of a file's bytes, read in blocks (several GB/s: cheap next to writing the file)."""
    digest = xxhash.xxh3_128()
    with open(path, "rb") as handle:
        while block := handle.read(_HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def _describe(folder: Path, relative: str) -> dict[str, Any]:
    path = folder / relative
    return {"bytes": path.stat().st_size, "xxh3_128": file_digest(path)}


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


def _gather(obj: Any, state: ParallelState) -> list[Any]:
    """Every rank's ``obj`` (small, trusted Python objects between this job's own ranks)."""
    if state.world_group is None:
        return [obj]
    out: list[Any] = [None] * state.world_size
    dist.all_gather_object(out, obj)
    return out


def _state_dicts(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(model, optimizer)
    return {"model": model_state, "optim": optim_state}


def state_tensor_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the whole model and optimizer state a checkpoint holds (every rank's shards together;
    a replicated copy counted once, as DCP writes it once): its size, less DCP's per-tensor overhead."""
    from longctx.trainer.parallel.sharding import optimizer_tensors

    tensors = [*model.parameters(), *optimizer_tensors(optimizer)]
    return sum(t.numel() * t.element_size() for t in tensors)


def _disk_problem(err: BaseException, where: Path, needed: int, what: str) -> str | None:
    """The one-line message of a disk fault (full, read-only...) met while writing ``what``; None
    for any other error. DCP's :class:`CheckpointException` carries each failed rank's error."""
    from torch.distributed.checkpoint.api import CheckpointException

    from longctx.core.preflight import space_fault

    errors = (
        [e for e, _ in getattr(err, "failures", {}).values()]
        if isinstance(err, CheckpointException)
        else [err]
    )
    for error in errors:
        if isinstance(error, OSError) and (fault := space_fault(error, where, needed, what)) is not None:
            return str(fault)
    return None


def save_checkpoint(
    root: Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    trainer_state: dict[str, Any],
    state: ParallelState,
    keep: int,
) -> Path:
    """Write checkpoint ``step`` collectively (every rank calls this); returns its folder.

    ``trainer_state`` (JSON: scheduler, data position, coverage, run settings) is written by rank 0.
    After the rename, intact checkpoints beyond the ``keep`` newest are removed.

    A disk that cannot take the checkpoint is an :class:`OutputError` on every rank, naming the folder
    and the space the checkpoint takes: before anything is written when too little is free
    (:func:`state_tensor_bytes`), or when a write fails (a full disk, ``ENOSPC``). The ranks agree
    on it through a collective after each part some of them write, so none is left waiting on
    another; the partial checkpoint is removed, and the run resumes from the previous one.
    """
    import torch.distributed.checkpoint as dcp

    from longctx.core.preflight import check_free_space

    final = checkpoint_folder(root, step)
    tmp = temporary_path(final)
    needed = state_tensor_bytes(model, optimizer)
    what = f"checkpoint step {step}"

    def agree(problem: str | None) -> None:
        """Raise the first rank's problem on every rank (the partial checkpoint removed first)."""
        problem = first_problem(problem, state)
        if problem is not None:
            if state.is_main:
                discard(tmp)
            raise OutputError(problem)

    def attempt(work: Callable[[], Any]) -> tuple[Any, str | None]:
        """``work()`` and None, or None and the message of the disk fault it met."""
        try:
            return work(), None
        except OSError as err:
            problem = _disk_problem(err, root, needed, what)
            if problem is None:
                raise
            return None, problem

    def prepare() -> None:
        check_free_space(root, needed, what)
        discard(tmp)
        (tmp / RNG_FOLDER).mkdir(parents=True)

    try:
        agree(attempt(prepare)[1] if state.is_main else None)
        try:
            with warnings.catch_warnings():  # one process without a process group is what we mean
                warnings.filterwarnings("ignore", message=r"torch\.distributed is .*uninitialized, assuming")
                dcp.save(
                    _state_dicts(model, optimizer), storage_writer=dcp.FileSystemWriter(str(tmp / DCP_FOLDER))
                )
        except BaseException as err:  # DCP's CheckpointException, raised on every rank alike
            problem = _disk_problem(err, root, needed, what)
            if problem is None:
                raise
            settle(state)
            raise OutputError(problem) from None

        def own_files() -> dict[str, Any]:
            rng_name = f"{RNG_FOLDER}/rank_{state.rank:05d}.pt"
            torch.save(rng_state(), tmp / rng_name)
            own = [rng_name] + sorted(
                f"{DCP_FOLDER}/{p.name}" for p in (tmp / DCP_FOLDER).glob(f"__{state.rank}_*.distcp")
            )
            return {name: _describe(tmp, name) for name in own}

        described, problem = attempt(own_files)
        agree(problem)
        described = _gather(described, state)

        def finish() -> None:
            write_json(tmp / TRAINER_STATE, trainer_state | {"step": step})
            files: dict[str, Any] = {}
            for part in described:
                files.update(part)
            for name in (f"{DCP_FOLDER}/.metadata", TRAINER_STATE):
                files[name] = _describe(tmp, name)
            write_json(tmp / MANIFEST, {"format": 1, "step": step, "files": dict(sorted(files.items()))})
            commit(tmp, final)
            for old in [c for c in list_checkpoints(root) if c.step < step][max(0, keep - 1) :]:
                shutil.rmtree(old.folder, ignore_errors=True)

        agree(attempt(finish)[1] if state.is_main else None)
    except BaseException:
        if state.is_main:
            discard(tmp)
        raise
    return final


def _check_file(folder: Path, name: str, expected: dict[str, Any], hashes: bool) -> str | None:
    path = folder / name
    if not path.is_file():
        return f"{name} is missing"
    size = path.stat().st_size
    if size != expected.get("bytes"):
        return f"{name} has {size} bytes, the manifest says {expected.get('bytes')}"
    if hashes and file_digest(path) != expected.get("xxh3_128"):
        return f"{name} does not match its checksum"
    return None


def damage(folder: Path, state: ParallelState, *, hashes: bool = True) -> str | None:
    """Why checkpoint ``folder`` cannot be trusted, or None when every file matches the manifest.

    Collective when ``state`` has several ranks: each rank checks every ``world``-th file.
    """
    manifest_path = folder / MANIFEST
    problem: str | None = None
    files: dict[str, Any] = {}
    try:
        manifest = json.loads(manifest_path.read_text())
        files = manifest["files"]
        if not isinstance(files, dict) or not files:
            raise ValueError("no files listed")
    except FileNotFoundError:
        problem = f"{MANIFEST} is missing (the checkpoint was never completed)"
    except (OSError, ValueError, KeyError, TypeError) as err:
        problem = f"{MANIFEST} is unreadable ({err})"
    if problem is None:
        names = sorted(files)[state.rank :: state.world_size]
        problems = [p for name in names if (p := _check_file(folder, name, files[name], hashes))]
        problem = first_problem(problems[0] if problems else None, state)
    return problem


def find_resume_checkpoint(
    root: Path, state: ParallelState, *, restart: bool, report: Callable[[str], None] = print
) -> Checkpoint | None:
    """The newest intact checkpoint under ``root`` (damaged newer ones reported and skipped).

    Returns None when there is none to resume from: no checkpoint at all, or only damaged ones and
    ``restart`` is set. Raises :class:`CheckpointError` when checkpoints exist but none is intact
    and ``restart`` is not set, and when ``restart`` is set although an intact one exists (starting
    over would later delete it).
    """
    if state.is_main:
        for leftover in root.glob(f"step_*{TEMP_SUFFIX}"):  # a writer killed mid-save
            discard(leftover)
    damaged: list[tuple[Checkpoint, str]] = []
    found: Checkpoint | None = None
    for candidate in list_checkpoints(root):
        problem = damage(candidate.folder, state)
        if problem is None:
            found = candidate
            break
        damaged.append((candidate, problem))
        if state.is_main:
            report(f"warning: checkpoint {candidate.folder} is damaged: {problem}; skipping it")
    if found is not None and restart:
        raise CheckpointError(
            f"--restart refused: {found.folder} is an intact checkpoint (step {found.step}); "
            "resume from it (drop --restart) or train into a new output folder"
        )
    if damaged and found is None and not restart:
        listed = "; ".join(f"{c.folder.name} ({problem})" for c, problem in damaged)
        raise CheckpointError(
            f"no intact checkpoint in {root}: {listed}. Pass --restart to train from step 0 "
            "(the damaged checkpoints are kept), or restore a checkpoint"
        )
    if state.is_main:  # the run goes ahead: keep the damaged ones, out of the way of new checkpoints
        for candidate, _ in damaged:
            aside = candidate.folder.with_name(candidate.folder.name + DAMAGED_SUFFIX)
            discard(aside)
            candidate.folder.rename(aside)
            report(f"kept the damaged checkpoint as {aside}")
    barrier(state)
    return found


def latest_checkpoint(root: Path) -> Checkpoint | None:
    """The newest checkpoint whose files have the sizes its manifest lists (no checksums; one process)."""
    single = ParallelState.single()
    return next((c for c in list_checkpoints(root) if damage(c.folder, single, hashes=False) is None), None)


def manifest_digest(folder: Path) -> str | None:
    """xxh3-128 of checkpoint ``folder``'s manifest, which lists every file with its checksum: what
    identifies the checkpoint's contents (a stage records the one it started from); None without a
    readable manifest."""
    try:
        return file_digest(folder / MANIFEST)
    except OSError:
        return None


def read_trainer_state(folder: Path) -> dict[str, Any]:
    return json.loads((folder / TRAINER_STATE).read_text())


def load_checkpoint(
    checkpoint: Checkpoint,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    state: ParallelState,
    *,
    restore_rng: bool = True,
) -> dict[str, Any]:
    """Load model (and optimizer) state into this rank's shards, at any mesh, and (with
    ``restore_rng``) this rank's RNG state when the checkpoint has one for it; returns
    ``trainer.json``."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

    folder = checkpoint.folder
    if optimizer is None:
        from torch.distributed.checkpoint.state_dict import get_model_state_dict

        target: dict[str, Any] = {"model": get_model_state_dict(model)}
    else:
        target = _state_dicts(model, optimizer)
    try:
        with warnings.catch_warnings():  # one process without a process group is what we mean: no warning
            warnings.filterwarnings("ignore", message=r"torch\.distributed is .*uninitialized, assuming")
            dcp.load(target, storage_reader=dcp.FileSystemReader(str(folder / DCP_FOLDER)))
    except CheckpointException as err:  # a BaseException subclass: name the folder, keep the cause
        causes = "; ".join(
            f"rank {r}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            for r, (e, _) in getattr(err, "failures", {}).items()
        )
        raise CheckpointError(f"cannot load {folder}: {causes or err}") from None
    if optimizer is None:
        set_model_state_dict(model, target["model"])
    else:
        set_state_dict(model, optimizer, model_state_dict=target["model"], optim_state_dict=target["optim"])
    if restore_rng:
        rng = folder / RNG_FOLDER / f"rank_{state.rank:05d}.pt"
        if not rng.is_file():
            rng = folder / RNG_FOLDER / "rank_00000.pt"
        set_rng_state(torch.load(rng, weights_only=True))
    return read_trainer_state(folder)
