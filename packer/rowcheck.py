"""The row invariants the training loader checks on every row it serves (``packer/FORMAT.md``).

These are the checks cheap enough to run on each row at load time, each a few vectorized numpy
passes: segment boundaries, positions, token ids and the loss mask. Together with the shard checksum
verified when a file is first opened, they mean the trainer never trains on bytes nobody checked.
The complete, whole-folder validation (provenance, special tokens, manifest totals) is
:mod:`longctx.packer.validate` (``longctx inspect --validate``).

:func:`rows_are_valid` decides for a block of consecutive rows at once (a few whole-block passes:
at 16K tokens a row's checks cost more in numpy calls than in arithmetic); :func:`check_row` checks
one row and, when it fails, names the file, the row and the field. The loader checks blocks and
falls back to :func:`check_row` row by row only in a block that fails.
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
    return ShardError(
        f"{os.path.join(folder, file)} row {row}: {field}: {message}; the shard is damaged, re-pack it"
    )


def check_row(
    tokens: RowTokens, vocab_size: int, file: str, row: int, folder: str | os.PathLike = ""
) -> None:
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


def rows_are_valid(
    ids: np.ndarray,
    positions: np.ndarray,
    mask: np.ndarray,
    cu_values: np.ndarray,
    cu_offsets: np.ndarray,
    padded: np.ndarray,
    vocab_size: int,
) -> bool:
    """Whether :func:`check_row` accepts every row of a block of consecutive rows, in a constant
    number of numpy calls.

    ``ids``, ``positions`` and ``mask`` are the block's ``[rows, seq_len]`` token columns
    (C-contiguous, as a shard's columns are); ``cu_values`` the rows' ``cu_seqlens`` one after the
    other, and ``cu_offsets`` (``rows + 1`` entries) where each row's entries start in it;
    ``padded`` whether each row's last segment is padding. Flattened, the block is one long packed
    sequence whose segments are the rows' segments shifted by ``row * seq_len`` (a row ends where the
    next starts), so the per-row invariants become the same whole-array passes as for one row."""
    rows, seq_len = ids.shape
    offsets = cu_offsets.astype(np.int64) - int(cu_offsets[0])
    counts = offsets[1:] - offsets[:-1]
    if counts.min() < 2 or offsets[-1] != len(cu_values):
        return False
    cu = cu_values.astype(np.int64)
    last = offsets[1:] - 1  # each row's last entry, which must be seq_len
    if cu[offsets[:-1]].any() or (cu[last] != seq_len).any():
        return False
    rises = cu[1:] - cu[:-1]
    rises[last[:-1]] = 1  # from one row's end to the next row's 0
    if rises.min() <= 0:
        return False
    # every entry but a row's last is a segment start; row r's entries are shifted by r * seq_len
    inner = np.ones(len(cu), bool)
    inner[last] = False
    starts = (cu + np.repeat(np.arange(rows, dtype=np.int64) * seq_len, counts))[inner]
    lengths = np.diff(starts, append=rows * seq_len)
    flat_pos, flat_mask = positions.reshape(-1), mask.reshape(-1)
    if flat_pos[0] != 0 or flat_mask[starts].any():
        return False
    # the shortcut of _row_is_valid over the whole block: every step is 1 once the previous
    # segment's length is added at each boundary, exactly when every segment starts at 0
    steps = np.subtract(flat_pos[1:], flat_pos[:-1])
    steps[starts[1:] - 1] += lengths[:-1]
    if steps.min() != 1 or steps.max() != 1:
        return False
    if int(ids.reshape(-1).view(np.uint32).max()) >= vocab_size or flat_mask.max() > 1:
        return False
    if padded.any():
        # the largest mask value of every segment; a padding segment (a padded row's last) must be 0
        largest = np.maximum.reduceat(flat_mask, starts)
        if largest[np.cumsum(counts - 1)[padded] - 1].any():
            return False
    return True


def _name_violation(
    tokens: RowTokens, vocab_size: int, file: str, row: int, folder: str | os.PathLike
) -> None:
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
        message = (
            f"token {t} has position {positions[t]} after {positions[t - 1]}; positions "
            "must rise by 1 inside a segment"
        )
        raise _refuse(folder, file, row, "position_ids", message)
    # one unsigned max catches negative ids too (they wrap to above any vocabulary)
    if int(ids.view(np.uint32).max()) >= vocab_size:
        t = int(np.flatnonzero((ids < 0) | (ids >= vocab_size))[0])
        raise _refuse(
            folder,
            file,
            row,
            "input_ids",
            f"token {t} has id {ids[t]}, outside the vocabulary [0, {vocab_size})",
        )
    if mask.max() > 1:
        t = int(np.flatnonzero(mask > 1)[0])
        raise _refuse(folder, file, row, "loss_mask", f"token {t} is {mask[t]}; the mask holds 0 or 1")
    if mask[starts].any():
        k = int(np.flatnonzero(mask[starts])[0])
        message = (
            f"1 at token {starts[k]}, the start of segment {k}; a segment's first token is never a target"
        )
        raise _refuse(folder, file, row, "loss_mask", message)
    if tokens.padded and mask[starts[-1] :].any():
        t = int(starts[-1]) + int(np.flatnonzero(mask[starts[-1] :])[0])
        raise _refuse(folder, file, row, "loss_mask", f"1 at token {t}, inside the padding segment")
    raise AssertionError(f"{file} row {row}: the fast row check failed but no invariant is violated")
