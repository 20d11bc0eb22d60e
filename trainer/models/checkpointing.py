"""Activation checkpointing of one decoder block: what its forward keeps for backward, by mode.

* ``none``: everything the block's backward reads (no recomputation).
* ``selective``: a per-op policy in the style of PyTorch's selective activation checkpointing
  (``torch.utils.checkpoint.create_selective_checkpoint_contexts``): the outputs of the matrix
  multiplications (the q/k/v/o projections, the MLP's gate, up and down) and of the ring attention
  operator (its output and log-sum-exp) are kept; everything else, the cheap pointwise work (RMSNorms,
  RoPE, SiLU and the gating product, residual additions, autocast's casts), is recomputed in backward.
  No matmul and no attention runs twice, and the ring exchanges nothing more in backward; the block
  keeps ``r h + c (2q + 2k + 2h + 2i) + 4a`` bytes per token (``longctx.trainer.planning.memory``) against
  everything's ``~ 4rh + c (3q + 2k + 4i + 5h)`` (bf16 autocast over float32 weights).
* ``full``: only the block's input; the whole block, attention included, runs again in backward.

Gradients are those of ``none`` in every mode (tests/trainer/test_checkpointing.py): recomputation
replays the same operations on the same inputs. The checkpoint wraps the block's computation, not the
module call, so FSDP2's hooks (all-gathers) stay outside the recomputed region, as in torchtitan.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from longctx.trainer.attention.ring import RING_OP

SAVED_OPS = frozenset({torch.ops.aten.mm.default, torch.ops.aten.addmm.default, RING_OP})
"""Operators whose outputs ``selective`` keeps: matrix multiplications (``nn.Linear`` with and without
bias) and the ring attention operator."""


def selective_policy(ctx: Any, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    """Keep the outputs of :data:`SAVED_OPS`; recompute everything else."""
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


_selective_contexts = functools.partial(create_selective_checkpoint_contexts, selective_policy)


def run_block(block: Callable[..., torch.Tensor], mode: str, *args: Any) -> torch.Tensor:
    """``block(*args)``, keeping for backward what ``mode`` says (see the module docstring). Without
    gradients (evaluation) nothing is kept, so every mode runs the block plainly."""
    if mode == "none" or not torch.is_grad_enabled():
        return block(*args)
    if mode == "full":
        return checkpoint(block, *args, use_reentrant=False)
    if mode == "selective":
        return checkpoint(block, *args, use_reentrant=False, context_fn=_selective_contexts)
    raise ValueError(f"activation checkpointing must be none, selective or full, got {mode!r}")
