"""A model's tensors to and from a Hugging Face folder's safetensors (``files`` names the folder's files).

**Loading** fills a model built on the meta device and materialized (``materialize``), one tensor at a
time, each rank only its part (:func:`local_region`: a model sharded with FSDP2 reads its slices of the
safetensors files, so no rank ever holds a whole tensor it does not own). What fills what is the
model's checkpoint conversion (``model.checkpoint_transforms``: transformers' own renames and fused
tensors for a transformers model, ``hf_conversion``; none for the own decoder, whose names are Hugging
Face's): a renamed tensor is read slice by slice like any other, a converted one (per-expert tensors
stacked into one parameter) is assembled whole, one parameter at a time, and then sliced. Every
parameter must be filled with its exact shape and no unknown tensor may be stored: all names and
shapes (converted ones by running the conversion on meta tensors) are checked before anything is
read. Persistent buffers stored in the checkpoint are loaded too; RoPE frequencies (``*inv_freq``) never
are (they come from the config), nor a tied output head (the embedding is stored).

**Saving** writes full tensors under the names ``save_pretrained`` would write
(``model.checkpoint_tensors``) and the ``config.json`` last.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import Tensor, nn

from longctx.core.atomic import atomic_path
from longctx.trainer.models.files import CONFIG_NAME, stored_names, weight_files
from longctx.trainer.models.hf_conversion import Load, convert, plan_loads

DEFAULT_MAX_SHARD_SIZE = "5GB"

_SAFETENSORS_FLOATS = {
    "F32": torch.float32,
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F64": torch.float64,
}


def local_region(param: Tensor) -> tuple[slice, ...]:
    """The part of the full parameter this rank holds: everything for a plain tensor, the rank's
    rows for an FSDP2 (DTensor) shard."""
    if not hasattr(param, "device_mesh"):
        return tuple(slice(0, n) for n in param.shape)
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset  # stable 2.6-2.13

    shape, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
    return tuple(slice(o, o + n) for o, n in zip(offset, shape))


def loadable_tensors(model: nn.Module) -> dict[str, Tensor]:
    """The model's tensors a checkpoint fills, by name: its parameters (a tied one once, under its
    first name) and its persistent buffers other than RoPE frequencies."""
    tensors: dict[str, Tensor] = dict(model.named_parameters())
    for prefix, module in model.named_modules():
        for name, buffer in module.named_buffers(recurse=False):
            persistent = name not in module._non_persistent_buffers_set
            if buffer is not None and persistent and not name.endswith("inv_freq"):
                tensors[f"{prefix}.{name}" if prefix else name] = buffer
    return tensors


def _ignored(name: str, model: nn.Module) -> bool:
    """Stored tensors no model tensor is made from, by design: RoPE frequencies saved by old
    conversions, and the output head of a tied model."""
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    return name.endswith("inv_freq") or (tied and name == "lm_head.weight")


def _check_shapes(
    loads: list[Load],
    tensors: Mapping[str, Tensor],
    shapes: Mapping[str, tuple[int, ...]],
    model: nn.Module,
    config: Any,
) -> None:
    """Every load gives its targets their exact shapes (converted loads run on meta tensors)."""
    for load in loads:
        if load.converter is None:
            got = {load.targets[0]: shapes[load.sources[0][0]]}
        else:
            made = convert(load, lambda key: torch.empty(shapes[key], device="meta"), model, config)
            got = {name: tuple(value.shape) for name, value in made.items()}
        for name, shape in got.items():
            if name not in tensors:
                raise ValueError(f"the checkpoint's {', '.join(s for s, _ in load.sources)} make {name}")
            if tuple(shape) != tuple(tensors[name].shape):
                sources = ", ".join(s for s, _ in load.sources[:3]) + ("..." if len(load.sources) > 3 else "")
                raise ValueError(
                    f"{name}: checkpoint shape {tuple(shape)} (from {sources}), model shape "
                    f"{tuple(tensors[name].shape)}"
                )


def _copy_into(tensor: Tensor, value: Any) -> None:
    """Write this rank's part of ``value`` (a full tensor, or a safetensors slice) into ``tensor``."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    if local.numel():
        local.copy_(value[local_region(tensor)])


def load_weights(model: nn.Module, directory: str | os.PathLike[str]) -> None:
    """Fill ``model``'s parameters and persistent buffers from the checkpoint in ``directory`` (see the
    module docstring). ``model``: a :class:`~longctx.trainer.models.decoder.Transformer` or an
    :class:`~longctx.trainer.models.hf.HFCausalLM`, materialized (uninitialized is fine). Raises
    ``ValueError`` naming what does not match."""
    tensors = loadable_tensors(model)
    where = stored_names(weight_files(directory))
    transforms = getattr(model, "checkpoint_transforms", [])
    prefix = getattr(model, "base_model_prefix", "model")
    loads, unexpected = plan_loads(where, tensors, transforms, prefix)
    unexpected = sorted(name for name in unexpected if not _ignored(name, model))
    filled = {name for load in loads for name in load.targets}
    buffers = {name for name, _ in model.named_buffers()}
    missing = sorted(set(tensors) - filled - buffers)  # a buffer the checkpoint lacks keeps its value
    if missing or unexpected:
        raise ValueError(
            f"checkpoint {directory} does not match a {model.config.model_type} model of this config: "
            f"missing {missing[:8]}{'...' if len(missing) > 8 else ''}, "
            f"unexpected {unexpected[:8]}{'...' if len(unexpected) > 8 else ''}"
        )
    config = getattr(model.config, "transformers_config", model.config)
    with ExitStack() as stack:
        handles = {
            file: stack.enter_context(safe_open(file, framework="pt")) for file in sorted(set(where.values()))
        }
        shapes = {
            key: tuple(handles[where[key]].get_slice(key).get_shape())
            for load in loads
            for key, _ in load.sources
        }
        _check_shapes(loads, tensors, shapes, model, config)
        with torch.no_grad():
            for load in loads:
                if load.converter is None:
                    key = load.sources[0][0]
                    _copy_into(tensors[load.targets[0]], handles[where[key]].get_slice(key))
                else:
                    made = convert(load, lambda key: handles[where[key]].get_tensor(key), model, config)
                    for name, value in made.items():
                        _copy_into(tensors[name], value)


def stored_dtype(directory: str | os.PathLike[str]) -> torch.dtype:
    """The dtype of the checkpoint's floating-point tensors (the first one found), e.g. bf16 for Llama-3."""
    for file in weight_files(directory):
        with safe_open(file, framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open is not iterable
                dtype = handle.get_slice(name).get_dtype()
                if dtype in _SAFETENSORS_FLOATS:
                    return _SAFETENSORS_FLOATS[dtype]
    return torch.float32


def materialize(model: nn.Module, device: torch.device | str, dtype: torch.dtype | None = None) -> None:
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


def write_checkpoint(
    hf_config: Mapping[str, Any],
    tensors: Mapping[str, Tensor],
    folder: Path,
    *,
    dtype: torch.dtype | None = None,
    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
) -> None:
    """Write the full ``tensors`` (checkpoint names) and then ``config.json`` (``hf_config`` with the
    storage dtype) into the existing, empty ``folder``.

    Floating-point tensors are cast to ``dtype`` when given and written by
    ``huggingface_hub.save_torch_state_dict``: one ``model.safetensors``, or
    ``model-0000i-of-0000N.safetensors`` files with ``model.safetensors.index.json`` above
    ``max_shard_size`` (bytes, or a string such as ``"5GB"``).
    """
    from huggingface_hub import save_torch_state_dict

    def stored(tensor: Tensor) -> Tensor:
        cast = dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype
        return tensor.detach().to(device="cpu", dtype=cast).contiguous()

    written = {name: stored(tensor) for name, tensor in tensors.items()}
    if not written:
        raise ValueError("no tensors to write")
    floats = [t.dtype for t in written.values() if t.is_floating_point()]
    saved_dtype = dtype or (floats[0] if floats else torch.float32)
    save_torch_state_dict(written, folder, max_shard_size=max_shard_size, metadata={"format": "pt"})
    umask = os.umask(0)
    os.umask(umask)
    for weights in folder.glob("model*.safetensors"):  # safetensors writes 0600 whatever the umask
        weights.chmod(0o666 & ~umask)
    config = {**hf_config, "torch_dtype": str(saved_dtype).removeprefix("torch.")}
    (folder / CONFIG_NAME).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def save_model(
    model: nn.Module,
    directory: str | os.PathLike[str],
    *,
    dtype: torch.dtype | None = None,
    max_shard_size: int | str = DEFAULT_MAX_SHARD_SIZE,
) -> None:
    """Save an unsharded ``model`` as a Hugging Face folder that ``from_pretrained`` loads, written under a
    temporary name beside ``directory`` and renamed into place (``longctx.core.atomic``), so
    ``directory`` (which must not exist, or be empty) never holds a partial checkpoint."""
    target = Path(directory)
    if target.exists() and (not target.is_dir() or any(target.iterdir())):
        raise FileExistsError(f"{target} already exists and is not an empty directory")
    tensors = model.checkpoint_tensors(dict(loadable_tensors(model)))
    with atomic_path(target) as staging:
        staging.mkdir()
        write_checkpoint(model.config.to_hf(), tensors, staging, dtype=dtype, max_shard_size=max_shard_size)
