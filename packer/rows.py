"""Windows of a :class:`~longctx.packer.binpack.Packing` as shard rows (columns in ``packer/FORMAT.md``).

Every window is its document segments followed, when they leave room, by one padding segment.
Positions restart at 0 in every segment; the loss mask is 0 on each segment's first token (it has
no earlier token of its document to be predicted from) and on padding. Everything is computed with
whole-array numpy operations over all windows at once.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from longctx.packer.binpack import Packing
from longctx.packer.format import shard_schema
from longctx.packer.pool import DocumentPool

INT32_INDEX_MAX = np.iinfo(np.int32).max
"""Pools and windows up to this many tokens are indexed with int32 in :func:`build_rows` (int64 above)."""


def build_rows(pool: DocumentPool, packing: Packing, seq_len: int, pad_id: int) -> pa.RecordBatch:
    """One row per window of ``packing`` (whose ``doc`` indices refer to ``pool``)."""
    rows = packing.num_windows
    seg_window = np.repeat(np.arange(rows), np.diff(packing.window_ptr))
    padding = seq_len - np.bincount(seg_window, weights=packing.length, minlength=rows).astype(np.int64)
    if (padding < 0).any():
        raise ValueError(f"a window holds more than seq_len={seq_len} tokens")

    # all segments, padding included, in row order: a window's documents, then its padding
    padded = np.flatnonzero(padding)
    window = np.concatenate([seg_window, padded])
    is_doc = np.concatenate([np.ones(len(seg_window), bool), np.zeros(len(padded), bool)])
    order = np.argsort(window * 2 + ~is_doc, kind="stable")
    window, is_doc = window[order], is_doc[order]
    length = np.concatenate([packing.length, padding[padded]])[order]
    doc = np.concatenate([packing.doc, np.full(len(padded), -1)])[order]
    offset = np.concatenate([packing.offset, np.zeros(len(padded), np.int64)])[order]

    seg_start = np.zeros(len(length), dtype=np.int64)  # in the flat rows * seq_len token array
    np.cumsum(length[:-1], out=seg_start[1:])
    # per token: its position in its segment, and where a document token is in pool.tokens (each a
    # value repeated over its segment plus the position: few whole-array passes, no per-token gathers),
    # as int32 unless a value could exceed it: half the memory to write (and for the OS to provide)
    index = np.int32 if max(len(pool.tokens), rows * seq_len) <= INT32_INDEX_MAX else np.int64
    position = np.arange(rows * seq_len, dtype=index)
    position -= np.repeat(seg_start.astype(index), length)
    doc_token = np.repeat(is_doc, length)
    src = np.repeat(np.where(is_doc, pool.start[doc] + offset, 0).astype(index), length)
    src += position
    input_ids = pool.tokens.take(src, mode="clip").astype(np.int32, copy=False)  # clip: padding's src
    input_ids[~doc_token] = pad_id
    loss_mask = doc_token.astype(np.uint8)
    loss_mask[seg_start] = 0

    # per-row segment lists: cu_seqlens has a leading 0, provenance one entry per segment
    segs_per_row = np.bincount(window, minlength=rows)
    seg_offsets = np.zeros(rows + 1, dtype=np.int32)
    np.cumsum(segs_per_row, out=seg_offsets[1:])
    ends_in_row = (seg_start + length - window * seq_len).astype(np.int32)
    cu_values = np.insert(ends_in_row, seg_offsets[:-1], 0)
    cu_offsets = seg_offsets + np.arange(rows + 1, dtype=np.int32)

    null_for_padding = arrow_array(np.where(is_doc, doc, 0), valid=is_doc)
    segment_lists = {
        "doc_id": string_array(pool.ids).take(null_for_padding),
        "doc_source": string_array(pool.sources).take(null_for_padding),
        "doc_offset": arrow_array(offset.astype(np.int64), valid=is_doc),
        "doc_length": arrow_array(pool.length.astype(np.int64)).take(null_for_padding),
    }
    seg_offsets_arr = arrow_array(seg_offsets)
    columns = {
        "input_ids": pa.FixedSizeListArray.from_arrays(arrow_array(input_ids), seq_len),
        "position_ids": pa.FixedSizeListArray.from_arrays(
            arrow_array(position.astype(np.int32, copy=False)), seq_len
        ),
        "loss_mask": pa.FixedSizeListArray.from_arrays(arrow_array(loss_mask), seq_len),
        "cu_seqlens": pa.ListArray.from_arrays(arrow_array(cu_offsets), arrow_array(cu_values)),
    } | {name: pa.ListArray.from_arrays(seg_offsets_arr, values) for name, values in segment_lists.items()}
    return pa.RecordBatch.from_pydict(columns, schema=shard_schema(seq_len))


def arrow_array(values: np.ndarray, valid: np.ndarray | None = None) -> pa.Array:
    """A 1-D numpy array of numbers as an Arrow array over the same memory, null where ``valid`` is
    False. (``pa.array`` would do, but it imports pandas, 0.3-0.5 s of CPU in every pack worker, to
    check whether it was given a pandas object.)"""
    values = np.ascontiguousarray(values)
    if values.dtype.kind not in "iuf":  # Arrow's booleans are bits, not numpy's bytes
        raise TypeError(f"arrow_array takes numbers, not {values.dtype}")
    bitmap, nulls = None, 0
    if valid is not None:
        bitmap, nulls = pa.py_buffer(np.packbits(valid, bitorder="little")), len(valid) - int(valid.sum())
    return pa.Array.from_buffers(
        pa.from_numpy_dtype(values.dtype), len(values), [bitmap, pa.py_buffer(values)], null_count=nulls
    )


def string_array(values: list[str]) -> pa.Array:
    """Python strings as an Arrow ``string`` array, built from one UTF-8 buffer (as :func:`arrow_array`,
    without ``pa.array``'s pandas import)."""
    encoded = [v.encode("utf-8") for v in values]
    offsets = np.zeros(len(encoded) + 1, dtype=np.int32)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    data = pa.py_buffer(b"".join(encoded))
    return pa.Array.from_buffers(pa.string(), len(values), [None, pa.py_buffer(offsets), data])
