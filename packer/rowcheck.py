"""The row invariants the training loader checks on every row it serves (``packer/FORMAT.md``).

These are the checks cheap enough to run on each row at load time, each a few vectorized numpy
passes over the row: segment boundaries, positions, token ids and the loss mask. Together with the
shard checksum verified when a file is first opened, they mean the trainer never trains on bytes
nobody checked. The complete, whole-folder validation (provenance, special tokens, manifest totals)
is :mod:`longctx.packer.validate` (``longctx inspect --validate``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from longctx.packer.format import ShardError


@dataclass(frozen=True)
class RowTokens:
    """The token columns of one window (numpy views of the shard) and whether its last segment is
    padding."""

    input_ids: np.ndarray
    position_ids: np.ndarray
    loss_mask: np.ndarray
    cu_seqlens: np.ndarray
    padded: bool


def _refuse(folder: str | os.PathLike, file: str, row: int, field: str, message: str) -> ShardError:
    return ShardError(f"{os.path.join(folder, file)} row {row}: {field}: {message}; the shard is damaged, re-pack it")


def check_row(tokens: RowTokens, vocab_size: int, file: str, row: int, folder: str | os.PathLike = "") -> None:
    """Raise :class:`ShardError` (naming ``folder/file``, the row inside the file and the field) unless:

    - ``cu_seqlens`` rises strictly from 0 to ``seq_len``;
    - ``position_ids`` is 0 at every segment start and rises by 1 inside every segment;
    - every id of ``input_ids`` is in ``[0, vocab_size)``;
    - ``loss_mask`` is 0 or 1, 0 at every segment start and 0 on the padding segment.
    """
    ids, positions, mask, cu = tokens.input_ids, tokens.position_ids, tokens.loss_mask, tokens.cu_seqlens
    if not _row_is_valid(ids, positions, mask, cu, tokens.padded, vocab_size):
        _name_violation(tokens, vocab_size, file, row, folder)


def _row_is_valid(
    ids: np.ndarray, positions: np.ndarray, mask: np.ndarray, cu: np.ndarray, padded: bool, vocab_size: int
) -> bool:
    """Whether every invariant of :func:`check_row` holds, in as few numpy calls as possible: this runs
    on every row served, where a 16K window's checks cost more in calls than in arithmetic. Whole-row
    passes: one subtraction and two reductions over the positions, one reduction each over the ids and
    the mask; everything else touches only the segment boundaries."""
    seq_len = len(ids)
    if len(cu) < 2 or cu[0] != 0 or cu[-1] != seq_len or positions[0] != 0:
        return False
    lengths = cu[1:] - cu[:-1]
    if lengths.min() <= 0 or mask[cu[:-1]].any():
        return False
    # Positions rise by 1 inside a segment: every step is 1, except from a segment's last token to the
    # next segment's first, which is minus (previous length - 1) when the next segment starts at 0.
    # Adding the previous length there makes every step 1 exactly when every segment starts at 0
    # (by induction from positions[0] == 0), without indexing the segment starts separately.
    steps = np.subtract(positions[1:], positions[:-1])
    steps[cu[1:-1] - 1] += lengths[:-1]
    if steps.min() != 1 or steps.max() != 1:
        return False
    # one unsigned max catches negative ids too (they wrap to above any vocabulary)
    if int(ids.view(np.uint32).max()) >= vocab_size or mask.max() > 1:
        return False
    return not (padded and mask[cu[-2] :].any())


def _name_violation(tokens: RowTokens, vocab_size: int, file: str, row: int, folder: str | os.PathLike) -> None:
    """Raise the :class:`ShardError` of the first violated invariant (run only for a failing row)."""
    ids, positions, mask, cu = tokens.input_ids, tokens.position_ids, tokens.loss_mask, tokens.cu_seqlens
    seq_len = len(ids)
    lengths = np.diff(cu)
    if len(cu) < 2 or cu[0] != 0 or cu[-1] != seq_len or lengths.min() <= 0:
        shown = cu[:8].tolist() + (["..."] if len(cu) > 8 else [])
        raise _refuse(folder, file, row, "cu_seqlens", f"must rise strictly from 0 to {seq_len}, got {shown}")
    starts = cu[:-1]
    at_start = positions[starts]
    if at_start.any():
        k = int(np.flatnonzero(at_start)[0])
        message = f"segment {k} starts at token {starts[k]} with position {at_start[k]}, expected 0"
        raise _refuse(folder, file, row, "position_ids", message)
    steps = positions[1:] - positions[:-1]
    steps[starts[1:] - 1] = 1  # a new segment restarts at 0 (checked above)
    if steps.min() != 1 or steps.max() != 1:
        t = int(np.flatnonzero(steps != 1)[0]) + 1
        message = f"token {t} has position {positions[t]} after {positions[t - 1]}; positions must rise by 1 inside a segment"
        raise _refuse(folder, file, row, "position_ids", message)
    # one unsigned max catches negative ids too (they wrap to above any vocabulary)
    if int(ids.view(np.uint32).max()) >= vocab_size:
        t = int(np.flatnonzero((ids < 0) | (ids >= vocab_size))[0])
        raise _refuse(folder, file, row, "input_ids", f"token {t} has id {ids[t]}, outside the vocabulary [0, {vocab_size})")
    if mask.max() > 1:
        t = int(np.flatnonzero(mask > 1)[0])
        raise _refuse(folder, file, row, "loss_mask", f"token {t} is {mask[t]}; the mask holds 0 or 1")
    if mask[starts].any():
        k = int(np.flatnonzero(mask[starts])[0])
        message = f"1 at token {starts[k]}, the start of segment {k}; a segment's first token is never a target"
        raise _refuse(folder, file, row, "loss_mask", message)
    if tokens.padded and mask[starts[-1] :].any():
        t = int(starts[-1]) + int(np.flatnonzero(mask[starts[-1] :])[0])
        raise _refuse(folder, file, row, "loss_mask", f"1 at token {t}, inside the padding segment")
    raise AssertionError(f"{file} row {row}: the fast row check failed but no invariant is violated")
