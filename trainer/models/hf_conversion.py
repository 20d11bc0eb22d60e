"""transformers' own checkpoint conversion, tensor by tensor: which stored tensors make each parameter.

A transformers 5 model's parameters are not always named or shaped as its checkpoints store them:
GPT-NeoX stores ``embed_out.weight`` for the ``lm_head.weight`` it builds, and mixture-of-experts models
(Mixtral, Qwen3-MoE, DeepSeek-V3...) store one tensor per expert and projection where the model holds
one fused ``[experts, ...]`` parameter. ``from_pretrained`` applies the model's *conversion mapping*
(``transformers.conversion_mapping``: key renames and converters such as "stack the experts, then
concatenate gate and up"), and ``save_pretrained`` applies it in reverse. This module uses that same
mapping, and only it, so that longctx reads and writes what transformers reads and writes:

* :func:`plan_loads` groups the stored names by the parameter they make (transformers' own
  ``rename_source_key``, applied in transformers' order), so the loader can check every name and shape
  before reading a byte, read a renamed tensor slice by slice (an FSDP2 rank reads only its rows), and
  run a converter one parameter at a time;
* :func:`convert` runs a converter's operations on the stored tensors of one parameter;
* :func:`to_checkpoint` reverts the conversion on full tensors, for the export.

Everything transformers-specific about checkpoint names lives here (``transformers.core_model_loading``
is the library's loading module; its names are stable across transformers 5 releases).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from copy import deepcopy
from dataclasses import dataclass
from typing import Any

from torch import Tensor, nn


@dataclass(frozen=True)
class Load:
    """The stored tensors that make some of the model's tensors.

    ``targets``: the model names filled (one, or several for a converter that splits, e.g. ``qkv``);
    ``sources``: ``(stored name, source pattern)`` in transformers' order; ``converter``: transformers'
    ``WeightConverter`` that turns them into the targets (None: ``targets[0]`` is ``sources[0]``
    renamed, or under its own name)."""

    targets: tuple[str, ...]
    sources: tuple[tuple[str, str], ...]
    converter: Any | None = None


def checkpoint_transforms(causal_lm: nn.Module) -> list[Any]:
    """The conversion mapping ``from_pretrained`` applies to ``causal_lm`` (renames and converters, with
    the legacy renames of old checkpoints)."""
    from transformers.conversion_mapping import get_model_conversion_mapping

    return list(get_model_conversion_mapping(causal_lm))


def _sort_key(name: str) -> Any:
    from transformers.core_model_loading import dot_natural_key

    return dot_natural_key(name)


def plan_loads(
    stored: Iterable[str], targets: Mapping[str, Any], transforms: list[Any], base_model_prefix: str
) -> tuple[list[Load], list[str]]:
    """How the stored names fill ``targets`` (the model's loadable tensors by name), as
    ``from_pretrained`` would map them: the loads, and the stored names that map to no target. Without
    transforms (the own decoder, whose names are Hugging Face's) every name stands for itself, and
    transformers is not needed."""
    if not transforms:
        names = sorted(stored)
        return [Load((n,), ((n, n),)) for n in names if n in targets], [n for n in names if n not in targets]
    from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

    renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
    converters = [t for t in transforms if isinstance(t, WeightConverter)]
    by_pattern = {pattern: c for c in converters for pattern in c.source_patterns}
    direct: dict[str, tuple[str, str]] = {}
    fused: dict[str, tuple[Any, list[tuple[str, str]]]] = {}
    unexpected = []
    for key in sorted(stored, key=_sort_key):  # transformers' order: expert 0, 1, ... 10
        name, pattern = rename_source_key(key, renamings, converters, base_model_prefix, targets)
        if name not in targets and key in targets:  # a name that needed no renaming
            name, pattern = key, None
        if name not in targets:
            unexpected.append(key)
        elif pattern is None:
            if name in direct:
                raise ValueError(f"{key} and {direct[name][0]} are both stored for {name}")
            direct[name] = (key, key)
        else:
            fused.setdefault(name, (by_pattern[pattern], []))[1].append((key, pattern))
    loads = [Load((name,), (source,)) for name, source in direct.items()]
    for name, (converter, sources) in fused.items():
        split = [name.replace(converter.target_patterns[0], t) for t in converter.target_patterns]
        loads.append(Load(tuple(split), tuple(sources), converter))
    return loads, unexpected


def convert(load: Load, fetch: Callable[[str], Tensor], model: nn.Module, config: Any) -> dict[str, Tensor]:
    """The target tensors of a converted ``load``, from the stored tensors ``fetch(name)`` returns
    (meta tensors give the shapes without reading anything). ``model`` (the one being filled; some
    operations read its parameters' shapes) and its transformers ``config`` are passed to the
    operations as ``from_pretrained`` passes them."""
    converter = deepcopy(load.converter)
    for key, pattern in load.sources:
        converter.add_tensor(load.targets[0], key, pattern, lambda key=key: fetch(key))
    realized = converter.convert(load.targets[0], model=model, config=config)
    return {name: value[0] if isinstance(value, list) else value for name, value in realized.items()}


def to_checkpoint(causal_lm: nn.Module, tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """Full tensors under the model's names -> the names and shapes ``save_pretrained`` writes (the
    conversion reverted: per-expert tensors, renamed keys)."""
    from transformers.core_model_loading import revert_weight_conversion

    reverted = revert_weight_conversion(causal_lm, tensors)
    # split tensors (one per expert) are views of the fused one; safetensors stores each on its own
    return {name: value if _owns_storage(value) else value.clone() for name, value in reverted.items()}


def _owns_storage(tensor: Tensor) -> bool:
    """Whether ``tensor`` is the whole of its storage (not a view into a larger one)."""
    return (
        tensor.is_contiguous() and tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size()
    )
