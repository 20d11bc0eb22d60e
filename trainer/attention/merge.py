"""Combining partial attention results computed over disjoint sets of keys.

Attention over a union of key blocks is recovered exactly from each block's normalised output ``o_b``
and log-sum-exp ``lse_b``: ``lse = log(sum_b exp(lse_b))`` and ``o = sum_b exp(lse_b - lse) * o_b``,
applied one block at a time.
Everything here runs in the accumulator dtype (fp32, or fp64 for fp64 inputs).

A query row that sees no key of a block contributes nothing, which is ``lse_b = -inf``. Kernels do not
agree on what they return for such rows (FlashAttention-2: ``+inf``; PyTorch's CPU flash kernel: ``0``
with a zero output; others may give NaN), so ``normalize_empty_rows`` rewrites them from the mask before
merging rather than trusting the values.
"""

from __future__ import annotations

import torch
from torch import Tensor


def normalize_empty_rows(out: Tensor, lse: Tensor, row_has_key: Tensor) -> tuple[Tensor, Tensor]:
    """Force rows with no visible key to ``out = 0`` and ``lse = -inf``.

    ``out`` is ``[rows, heads, dim]``, ``lse`` is ``[heads, rows]`` and ``row_has_key`` is ``[rows]``.
    """
    out = torch.where(row_has_key[:, None, None], out, torch.zeros((), dtype=out.dtype, device=out.device))
    lse = torch.where(
        row_has_key[None, :], lse, torch.full((), float("-inf"), dtype=lse.dtype, device=lse.device)
    )
    return out, lse


def merge_into(out: Tensor, lse: Tensor, block_out: Tensor, block_lse: Tensor) -> None:
    """Fold one block's normalised result into the running ``(out, lse)`` in place.

    ``out``/``block_out`` are ``[rows, heads, dim]``, ``lse``/``block_lse`` are ``[heads, rows]``; the
    running tensors may be views into larger accumulators. The block's weight is
    ``sigmoid(block_lse - lse)``, computed from the difference of the two log-sum-exps rather than from
    exponentials shifted by the merged value, so large log-sum-exps lose no precision and nothing
    overflows. A block row at ``-inf`` gets weight 0 (also when the running row is ``-inf``: no NaN),
    and a running row at ``-inf`` takes the block row as is.
    """
    block_out = block_out.to(out.dtype)
    block_lse = block_lse.to(lse.dtype)
    gap = torch.where(torch.isneginf(block_lse), block_lse, block_lse - lse)
    weight = torch.sigmoid(gap).transpose(0, 1).unsqueeze(-1)
    out.lerp_(block_out, weight)
    lse.copy_(torch.logaddexp(lse, block_lse))
