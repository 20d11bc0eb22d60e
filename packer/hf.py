"""Packed batches in the form Hugging Face ``transformers`` (and TRL) models take, and shard
headers read back through ``datasets``.

A packed row holds several documents. A transformers model keeps them apart only when it is told
where they end, and how it must be told depends on its attention implementation:

- **flash attention** (``flash_attention_2``/``_3`` and hub kernels): the varlen kwargs
  ``cu_seq_lens_q/k`` and ``max_length_q/k`` with restarted ``position_ids``; the batch is flattened to
  one row of ``batch x seq_len`` tokens (the layout of ``DataCollatorWithFlattening``);
- **sdpa and eager**: a 4-D block-diagonal causal mask ``[batch, 1, seq_len, seq_len]``, additive:
  0 where a token may attend, the dtype's minimum elsewhere (the convention both accept; a bool mask
  is silently wrong on eager). It costs ``seq_len**2`` elements per row (16 GiB in float32 for one
  64K row), so it is for short windows (tests, CPU): a mask above ``max_mask_bytes`` (1 GiB by
  default) is refused before it is allocated; long windows want flash attention or flex attention;
- **flex attention**: a ``BlockMask`` of the same document-causal pattern.

transformers' own detection of packing from ``position_ids`` is not relied on: it is switched off by
any 2-D mask and by the KV cache that ``use_cache=True`` (the Llama default) creates, and then
documents see each other silently. ``use_cache=False`` is passed as well.

Labels follow transformers' convention: **unshifted** (``labels[i]`` is token ``i`` itself, or -100),
the model shifts them inside its loss. A token is a label exactly when the shard's ``loss_mask`` says
it is a target, so a segment's first token, padding, and (therefore) every token that would be
predicted across a document boundary are -100, and the model's mean loss over a batch equals the
token-weighted mean of each document's own loss.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from longctx.core.errors import ConfigError, LongctxError
from longctx.core.text import plural
from longctx.packer.dataset import IGNORE_INDEX, collate_packed, tokens_to_sample
from longctx.packer.format import ShardError, ShardHeader, ShardMetadata
from longctx.packer.rowcheck import RowTokens

FLASH = ("flash_attention_2", "flash_attention_3")
DENSE_MASK = ("sdpa", "eager")
MAX_MASK_BYTES = 1 << 30
"""The largest dense sdpa/eager mask :func:`to_transformers` builds by default (1 GiB: 16K tokens in
float32 for one row; one 64K row would take 16 GiB)."""


class MaskTooLarge(ConfigError):
    """A dense attention mask for packed rows would exceed the allowed size."""


def _is_flash(implementation: str) -> bool:
    return implementation in FLASH or "flash" in implementation.split("/")[-1]


def unshifted_labels(batch: Mapping[str, Any]) -> torch.Tensor:
    """transformers' labels from a :func:`~longctx.packer.collate_packed` batch: the batch's
    (shifted) ``labels`` moved one position right, -100 at position 0."""
    shifted = batch["labels"]
    labels = torch.full_like(shifted, IGNORE_INDEX)
    labels[:, 1:] = shifted[:, :-1]
    return labels


def document_ids(batch: Mapping[str, Any]) -> torch.Tensor:
    """``[batch, seq_len]`` ids of the segment each token belongs to (unique over the batch)."""
    rows, seq_len = batch["input_ids"].shape
    cu = batch["cu_seqlens"].to(torch.int64)
    starts = torch.zeros(rows * seq_len, dtype=torch.int64)
    starts[cu[:-1]] = 1
    return (torch.cumsum(starts, 0) - 1).view(rows, seq_len)


def _gib(size: int) -> str:
    return f"{size / (1 << 30):.3g} GiB"


def check_mask_size(rows: int, seq_len: int, dtype: torch.dtype, max_mask_bytes: int | None) -> None:
    """Refuse (:class:`MaskTooLarge`) a dense ``[rows, 1, seq_len, seq_len]`` mask of ``dtype`` larger
    than ``max_mask_bytes`` (None: no limit), saying what to use instead."""
    size = rows * seq_len * seq_len * dtype.itemsize
    if max_mask_bytes is not None and size > max_mask_bytes:
        raise MaskTooLarge(
            f"a dense sdpa/eager attention mask for {plural(rows, 'row')} of {seq_len:,} tokens takes "
            f"{_gib(size)} ({rows} x {seq_len}^2 x {dtype.itemsize} bytes, {dtype}), above "
            f"max_mask_bytes={_gib(max_mask_bytes)}: load the model with "
            "attn_implementation='flash_attention_2' (varlen kwargs, no mask) or 'flex_attention' (a "
            "block-sparse mask), or train with `longctx train` (ring attention); or raise max_mask_bytes"
        )


def causal_document_mask(
    batch: Mapping[str, Any],
    dtype: torch.dtype = torch.float32,
    *,
    max_mask_bytes: int | None = MAX_MASK_BYTES,
) -> torch.Tensor:
    """Additive ``[batch, 1, seq_len, seq_len]`` mask: 0 where query ``i`` may see key ``j`` (same
    segment, ``j <= i``), ``torch.finfo(dtype).min`` elsewhere. Refused (:class:`MaskTooLarge`) above
    ``max_mask_bytes`` (None: no limit), before anything is allocated."""
    check_mask_size(*batch["input_ids"].shape, dtype, max_mask_bytes)
    doc = document_ids(batch)
    seq_len = doc.shape[1]
    causal = torch.ones(seq_len, seq_len, dtype=torch.bool).tril()
    keep = causal & (doc[:, :, None] == doc[:, None, :])
    mask = torch.zeros(keep.shape, dtype=dtype)
    return mask.masked_fill_(~keep, torch.finfo(dtype).min)[:, None]


def _flex_block_mask(batch: Mapping[str, Any]) -> Any:
    from torch.nn.attention.flex_attention import create_block_mask

    doc = document_ids(batch)
    rows, seq_len = doc.shape

    def document_causal(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        return (doc[b, q] == doc[b, kv]) & (kv <= q)

    return create_block_mask(document_causal, rows, None, seq_len, seq_len, device=str(doc.device))


def to_transformers(
    batch: Mapping[str, Any],
    attn_implementation: str,
    *,
    mask_dtype: torch.dtype = torch.float32,
    max_mask_bytes: int | None = MAX_MASK_BYTES,
) -> dict[str, Any]:
    """The keyword arguments of a transformers causal LM's ``forward`` for a packed batch (from
    :func:`~longctx.packer.collate_packed`), such that no document attends to another on
    ``attn_implementation`` (the model's ``config._attn_implementation``), with labels in
    transformers' unshifted convention. ``mask_dtype`` (sdpa/eager): the model's dtype;
    ``max_mask_bytes`` (sdpa/eager): the largest dense mask built (:data:`MAX_MASK_BYTES`, None: no
    limit), refused with :class:`MaskTooLarge` before anything is allocated.
    """
    labels = unshifted_labels(batch)
    # input_ids first: Trainer/accelerate take the batch size from the first value
    if _is_flash(attn_implementation):
        cu = batch["cu_seqlens"].to(torch.int32)
        max_length = int(batch["max_seqlen"])
        return {
            "input_ids": batch["input_ids"].reshape(1, -1),
            "position_ids": batch["position_ids"].reshape(1, -1),
            "labels": labels.reshape(1, -1),
            "cu_seq_lens_q": cu,
            "cu_seq_lens_k": cu,
            "max_length_q": max_length,
            "max_length_k": max_length,
            "use_cache": False,
        }
    out = {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"], "labels": labels}
    if attn_implementation in DENSE_MASK:
        mask = causal_document_mask(batch, mask_dtype, max_mask_bytes=max_mask_bytes)
        return out | {"attention_mask": mask, "use_cache": False}
    if attn_implementation == "flex_attention":
        return out | {"attention_mask": _flex_block_mask(batch), "use_cache": False}
    raise ValueError(
        f"attn_implementation {attn_implementation!r}: longctx knows how to keep documents apart on "
        f"{', '.join((*FLASH, *DENSE_MASK, 'flex_attention'))} (and hub flash kernels)"
    )


class PackedRowError(LongctxError, ValueError):
    """A packed row reached the collator without the columns it needs, or cut: columns missing, or of
    different lengths."""


ROW_COLUMNS = ("input_ids", "position_ids", "loss_mask", "cu_seqlens")
"""The shard columns a packed row needs in the collator (``labels`` follow from ``loss_mask``)."""


def _check_whole(lengths: Mapping[str, int], cu_end: int) -> None:
    """Every token column of a row has the length its ``cu_seqlens`` ends at; else one line naming
    each column's length (the usual cause: a trainer that truncated ``input_ids`` only)."""
    if all(n == cu_end for n in lengths.values()):
        return
    listed = ", ".join(f"{name} {n}" for name, n in lengths.items())
    raise PackedRowError(
        f"a packed row's columns disagree: {listed} tokens, cu_seqlens ends at {cu_end}; something cut the "
        "rows before the collator (TRL's SFTTrainer truncates input_ids to max_length unless given "
        "SFTConfig(dataset_kwargs={'skip_prepare_dataset': True}))"
    )


def _sample(item: Mapping[str, Any]) -> dict[str, torch.Tensor]:
    """A :class:`~longctx.packer.PackedDataset` item as is, or a raw shard row (e.g. from
    ``datasets``: ``input_ids``, ``position_ids``, ``loss_mask`` and ``cu_seqlens`` as lists, arrays
    or tensors; a ``labels`` column a trainer added is ignored) turned into one. Either must be whole."""
    missing = sorted(set(ROW_COLUMNS) - set(item))
    if missing:
        raise PackedRowError(
            f"packed samples lost {', '.join(missing)} before the collator (transformers.Trainer "
            "and TRL drop columns the model's forward does not name): set "
            "TrainingArguments(remove_unused_columns=False)"
        )
    if isinstance(item.get("labels"), torch.Tensor):  # a PackedDataset item: labels made from loss_mask
        names = ("input_ids", "labels", "position_ids", "loss_mask")
        _check_whole({name: len(item[name]) for name in names}, int(item["cu_seqlens"][-1]))
        return dict(item)
    arrays = {
        name: np.asarray(item[name], dtype=dtype)
        for name, dtype in zip(ROW_COLUMNS, (np.int32, np.int32, np.uint8, np.int32), strict=True)
    }
    cu = arrays.pop("cu_seqlens")
    _check_whole({name: len(array) for name, array in arrays.items()}, int(cu[-1]) if len(cu) else 0)
    return tokens_to_sample(RowTokens(**arrays, cu_seqlens=cu, padded=False))


class PackedCollator:
    """A data collator for ``transformers.Trainer`` and TRL's trainers over packed windows.

    Takes a list of :class:`~longctx.packer.PackedDataset` items (or raw shard rows from
    ``datasets``) and returns :func:`to_transformers` of their :func:`~longctx.packer.collate_packed`
    batch for the model's attention implementation::

        args = TrainingArguments(..., max_steps=N, remove_unused_columns=False)
        trainer = Trainer(model=model, args=args, train_dataset=PackedDataset(...),
                          data_collator=PackedCollator(model.config._attn_implementation,
                                                       mask_dtype=model.dtype))

    ``remove_unused_columns=False`` keeps the columns the collator needs (``cu_seqlens``, ``loss_mask``),
    which the trainers otherwise drop because the model's ``forward`` does not name them. Rows whose
    columns were cut to different lengths (TRL's dataset preparation truncates ``input_ids``) are
    refused in one line naming each column's length. ``max_mask_bytes``: see :func:`to_transformers`.
    """

    def __init__(
        self,
        attn_implementation: str,
        *,
        mask_dtype: torch.dtype = torch.float32,
        max_mask_bytes: int | None = MAX_MASK_BYTES,
    ) -> None:
        self.attn_implementation = attn_implementation
        self.mask_dtype = mask_dtype
        self.max_mask_bytes = max_mask_bytes

    def __call__(self, features: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        batch = collate_packed([_sample(f) for f in features])
        return to_transformers(
            batch, self.attn_implementation, mask_dtype=self.mask_dtype, max_mask_bytes=self.max_mask_bytes
        )


def read_header(dataset: Any) -> ShardHeader:
    """The shard header (tokenizer fingerprint and vocabulary, ``seq_len``, contexts, format
    version...) of shards loaded with ``datasets`` (``Dataset.from_file`` or
    ``load_dataset("arrow", ...)``, and datasets made from them by ``map``/``select``), a
    ``datasets.Features``, or a pyarrow schema.

    ``datasets`` drops the shard's own schema metadata but keeps its features, where the header is
    stored as the ``id`` of the ``input_ids`` values (``packer/FORMAT.md``). That stored header is one
    file's, with that file's row count: for a dataset, the :class:`ShardMetadata` returned counts the
    dataset's own rows instead (of every file it was loaded from, after any ``select``); for a
    pyarrow schema it is its file's count; a bare ``Features`` gives a :class:`ShardHeader`, without
    a count.
    """
    features = getattr(dataset, "features", dataset)
    raw: str | bytes | None = None
    if hasattr(features, "metadata") and hasattr(features, "field"):  # a pyarrow schema
        raw = (features.metadata or {}).get(b"longctx")
    else:
        try:
            raw = features["input_ids"].feature.id
        except (KeyError, TypeError, AttributeError):
            raw = None
    if not raw:
        raise ShardError(
            "no longctx shard header in these features: not longctx shards, or "
            "written before format version 2"
        )
    try:
        stored = ShardMetadata.model_validate(json.loads(raw))
    except ValueError as err:
        raise ShardError(f"malformed longctx shard header: {err}") from None
    if features is dataset:  # a Features or a schema
        return stored if hasattr(features, "field") else ShardHeader(**stored.model_dump(exclude={"rows"}))
    return stored.model_copy(update={"rows": len(dataset)})
