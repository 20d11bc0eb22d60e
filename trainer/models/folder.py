"""Load and save Hugging Face checkpoints: ``config.json`` plus safetensors, one file or sharded.

Only safetensors are read: pickle-based ``pytorch_model.bin`` files can execute code when loaded
and are refused with a message. Parameter names are the model's own (``longctx.trainer.models.decoder`` uses
Hugging Face's names), so the only translations are the ones transformers makes too: a tied model
stores no ``lm_head.weight`` (one present anyway is ignored), and ``rotary_emb.inv_freq`` buffers
saved by old Llama conversions are skipped (frequencies always come from the config).

A sharded checkpoint is ``model-00001-of-0000N.safetensors`` files plus ``model.safetensors.index.json``
mapping every tensor name to its file, exactly as ``save_pretrained`` writes it.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from torch import Tensor

from longctx.core.atomic import atomic_path
from longctx.core.errors import LongctxError
from longctx.trainer.models.decoder import Attention, ModelConfig, Transformer

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
DEFAULT_MAX_SHARD_SIZE = "5GB"
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")


class ModelFolderError(LongctxError):
    """A Hugging Face checkpoint folder that cannot be read: a missing, unreadable or truncated file."""


def check_model_folder(directory: str | os.PathLike[str]) -> None:
    """Refuse, in one line naming the file, a checkpoint folder whose ``config.json`` is missing or
    unreadable (what it says is for the implementation that reads it: ``build.check_training_model``),
    whose index names missing shards, or whose safetensors files do not hold what their
    headers describe (a truncated copy): safetensors checks that when it opens a file, which reads
    only the header. Run before any weight is read, so a damaged folder is not met halfway."""
    root = Path(directory)
    config = root / CONFIG_NAME
    try:
        settings = config_json(root)
    except FileNotFoundError:
        raise ModelFolderError(
            f"{config} is missing: {root} is not a Hugging Face checkpoint folder"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ModelFolderError(f"{config} cannot be read ({err})") from None
    if not isinstance(settings, dict):
        raise ModelFolderError(f"{config}: not a JSON object")
    try:
        files = weight_files(root)
    except json.JSONDecodeError as err:
        raise ModelFolderError(f"{root / INDEX_NAME} cannot be read ({err})") from None
    except (OSError, ValueError) as err:
        raise ModelFolderError(str(err)) from None
    for file in files:
        try:
            with safe_open(file, framework="pt"):
                pass
        except SafetensorError as err:
            reason = str(err).removeprefix("Error while deserializing header: ")
            raise ModelFolderError(
                f"{file}: not a complete safetensors file ({reason}); the folder is damaged: export or copy "
                "it again"
            ) from None
    try:
        _stored_names(files)
    except ValueError as err:
        raise ModelFolderError(f"{root}: {err}") from None


def config_json(directory: str | os.PathLike[str]) -> dict:
    """The ``config.json`` dict of the checkpoint in ``directory``."""
    path = Path(directory) / CONFIG_NAME
    if not path.is_file():
        raise FileNotFoundError(f"no {CONFIG_NAME} in {directory}")
    return json.loads(path.read_text())


def load_config(directory: str | os.PathLike[str]) -> ModelConfig:
    """The :class:`ModelConfig` of the checkpoint in ``directory`` (its ``config.json``)."""
    return ModelConfig.from_hf(config_json(directory))


def weight_files(directory: str | os.PathLike[str]) -> list[Path]:
    """The safetensors files of the checkpoint in ``directory``: the shards of the index, or the single file.

    Raises ``ValueError`` when the directory only holds pickle weights, and ``FileNotFoundError``
    when it holds none (or the index names a missing shard).
    """
    root = Path(directory)
    index = root / INDEX_NAME
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ValueError(f"{index} has no weight_map")
        files = []
        for name in sorted(set(weight_map.values())):
            if Path(name).name != name:
                raise ValueError(f"{index} names a shard outside the checkpoint directory: {name!r}")
            if not (root / name).is_file():
                raise FileNotFoundError(f"{index} names {name}, which is missing")
            files.append(root / name)
        return files
    if (root / WEIGHTS_NAME).is_file():
        return [root / WEIGHTS_NAME]
    pickles = sorted(p.name for p in root.glob("*") if p.suffix in _PICKLE_SUFFIXES)
    if pickles:
        raise ValueError(
            f"{directory} holds only pickle weights ({', '.join(pickles)}); longctx loads safetensors only, "
            "because unpickling can run arbitrary code. Convert the checkpoint to safetensors from a trusted "
            "environment (e.g. save_pretrained(..., safe_serialization=True))."
        )
    raise FileNotFoundError(f"no {WEIGHTS_NAME} or {INDEX_NAME} in {directory}")


def _skipped(name: str, config: Any) -> bool:
    """Stored tensors the model has no parameter for, by design (see the module docstring)."""
    return name.endswith("rotary_emb.inv_freq") or (config.tie_word_embeddings and name == "lm_head.weight")


def _stored_names(files: Iterable[Path]) -> dict[str, Path]:
    """Tensor name -> file holding it, across all files; a name stored twice is an error."""
    where: dict[str, Path] = {}
    for file in files:
        with safe_open(file, framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open is not iterable
                if name in where:
                    raise ValueError(f"tensor {name} is stored in both {where[name].name} and {file.name}")
                where[name] = file
    return where


def local_region(param: Tensor) -> tuple[slice, ...]:
    """The part of the full parameter this rank holds: everything for a plain tensor, the rank's
    rows for an FSDP2 (DTensor) shard."""
    if not hasattr(param, "device_mesh"):
        return tuple(slice(0, n) for n in param.shape)
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset  # stable 2.6-2.13

    shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    return tuple(slice(o, o + n) for o, n in zip(offset, shape))


def load_weights(model: torch.nn.Module, directory: str | os.PathLike[str]) -> None:
    """Copy the checkpoint's tensors in ``directory`` into ``model``'s parameters (converting dtype).

    ``model`` has Hugging Face parameter names and a ``config`` with ``model_type`` and
    ``tie_word_embeddings``: a :class:`Transformer` or a transformers model on the ring attention
    path (``hf.HFCausalLM``).

    Every parameter must be present with its exact shape and no unknown tensor may be stored;
    all names and shapes are checked before anything is copied. Each parameter receives only the
    part this rank holds (:func:`local_region`): a model sharded with FSDP2 reads its slices of the
    safetensors files, so no rank ever holds a whole tensor it does not own, and an unsharded model
    reads whole tensors one at a time (memory beyond the model is one tensor).
    """
    params = dict(model.named_parameters())
    where = {
        name: file
        for name, file in _stored_names(weight_files(directory)).items()
        if not _skipped(name, model.config)
    }
    missing = sorted(set(params) - set(where))
    unexpected = sorted(set(where) - set(params))
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {directory} does not match a {model.config.model_type} model of this config: "
            f"missing {missing[:8]}{'...' if len(missing) > 8 else ''}, "
            f"unexpected {unexpected[:8]}{'...' if len(unexpected) > 8 else ''}"
        )
    by_file: dict[Path, list[str]] = {}
    for name, file in where.items():
        by_file.setdefault(file, []).append(name)
    for file, names in by_file.items():
        with safe_open(file, framework="pt") as handle:
            for name in names:
                shape = tuple(handle.get_slice(name).get_shape())
                if shape != tuple(params[name].shape):
                    raise ValueError(
                        f"{name}: checkpoint shape {shape}, model shape {tuple(params[name].shape)}"
                    )
    with torch.no_grad():
        for file, names in by_file.items():
            with safe_open(file, framework="pt") as handle:
                for name in names:
                    param = params[name]
                    local = param.to_local() if hasattr(param, "to_local") else param
                    if local.numel():
                        local.copy_(handle.get_slice(name)[local_region(param)])


def stored_dtype(directory: str | os.PathLike[str]) -> torch.dtype:
    """The dtype of the checkpoint's floating-point tensors (the first one found), e.g. bf16 for Llama-3."""
    for file in weight_files(directory):
        with safe_open(file, framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open is not iterable
                dtype = handle.get_slice(name).get_dtype()
                if dtype in _SAFETENSORS_FLOATS:
                    return _SAFETENSORS_FLOATS[dtype]
    return torch.float32


_SAFETENSORS_FLOATS = {
    "F32": torch.float32,
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F64": torch.float64,
}


def materialize(model: torch.nn.Module, device: torch.device | str, dtype: torch.dtype | None = None) -> None:
    """Allocate a meta-device ``model``'s parameters on ``device`` (``to_empty``; in ``dtype`` when
    given), uninitialized, keeping tied parameters one object (parameters are swapped in place, not
    replaced) and buffers (a transformers model's RoPE frequencies) their values."""
    buffers = {name: buffer.detach().clone() for name, buffer in model.named_buffers()}
    swap = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        if dtype is not None:
            model.to(dtype)
        model.to_empty(device=device)  # leaves buffers uninitialized too
    finally:
        torch.__future__.set_swap_module_params_on_conversion(swap)
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            buffer.copy_(buffers[name])


def load_model(
    directory: str | os.PathLike[str],
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    attention: Attention | None = None,
    activation_checkpointing: str | bool = "none",
    seq_len: int | None = None,
) -> Transformer:
    """Build the model a Hugging Face checkpoint describes and load its weights.

    Parameters are allocated directly in ``dtype`` on ``device`` (no random init) and filled from
    the safetensors files. With ``seq_len`` (the training window length), checkpoints whose
    sliding-window attention is shorter than it are refused (:meth:`ModelConfig.check_context_length`).
    """
    config = load_config(directory)
    if seq_len is not None:
        config.check_context_length(seq_len)
    with torch.device("meta"):
        model = Transformer(config, attention=attention, activation_checkpointing=activation_checkpointing)
    materialize(model, device, dtype)
    load_weights(model, directory)
    return model


def write_checkpoint(
    config: ModelConfig,
    state_dict: Mapping[str, Tensor],
    folder: Path,
    *,
    dtype: torch.dtype | None = None,
    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
) -> None:
    """Write ``config.json`` and the tensors into the existing, empty ``folder``.

    Tensors are cast to ``dtype`` when given and written by ``huggingface_hub.save_torch_state_dict``:
    one ``model.safetensors``, or ``model-0000i-of-0000N.safetensors`` files with
    ``model.safetensors.index.json`` above ``max_shard_size`` (bytes, or a string such as ``"5GB"``).
    """
    from huggingface_hub import save_torch_state_dict

    tensors = {
        name: tensor.detach().to(device="cpu", dtype=dtype or tensor.dtype).contiguous()
        for name, tensor in state_dict.items()
    }
    if not tensors:
        raise ValueError("state_dict is empty")
    stored_dtype = dtype or next(iter(tensors.values())).dtype
    save_torch_state_dict(tensors, folder, max_shard_size=max_shard_size, metadata={"format": "pt"})
    umask = os.umask(0)
    os.umask(umask)
    for weights in folder.glob("model*.safetensors"):  # safetensors writes 0600 whatever the umask
        weights.chmod(0o666 & ~umask)
    hf_config = {**config.to_hf(), "torch_dtype": str(stored_dtype).removeprefix("torch.")}
    (folder / CONFIG_NAME).write_text(json.dumps(hf_config, indent=2, sort_keys=True) + "\n")


def save_checkpoint(
    config: ModelConfig,
    state_dict: Mapping[str, Tensor],
    directory: str | os.PathLike[str],
    *,
    dtype: torch.dtype | None = None,
    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
) -> None:
    """Write ``config.json`` and the tensors as a Hugging Face checkpoint that ``from_pretrained`` loads.

    ``state_dict`` holds full tensors under Hugging Face names (``Transformer.state_dict()``); see
    :func:`write_checkpoint`. The checkpoint is written under a temporary name beside ``directory``
    and renamed into place (``longctx.core.atomic``), so ``directory`` (which must not exist, or be
    empty) never holds a partial checkpoint.
    """
    target = Path(directory)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise FileExistsError(f"{target} already exists and is not an empty directory")
    with atomic_path(target) as staging:
        staging.mkdir()
        write_checkpoint(config, state_dict, staging, dtype=dtype, max_shard_size=max_shard_size)


def save_model(
    model: Transformer,
    directory: str | os.PathLike[str],
    *,
    dtype: torch.dtype | None = None,
    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
) -> None:
    """Save an unsharded ``model`` as a Hugging Face checkpoint (see :func:`save_checkpoint`)."""
    save_checkpoint(model.config, model.state_dict(), directory, dtype=dtype, max_shard_size=max_shard_size)
