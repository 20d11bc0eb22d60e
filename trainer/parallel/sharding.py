"""FSDP2 for the decoder: every block and the root sharded over the mesh, gradients summed exactly.

``fully_shard`` is applied to each decoder block (the own decoder's, or a transformers model's
``_no_split_modules`` blocks), to the embedding when it is not tied to the output projection, and to
the root (which then owns the final norm, the output projection and a tied
embedding), over ``dp_shard x cp`` ranks; with ``dp_replicate > 1`` the 2-D mesh replicates the shards
(HSDP). The ranks of one ring hold the same weights, so they shard them too, as torchtitan does.

Gradients must be the *sum* over ranks: the trainer normalizes by the token count of the whole
batch itself. FSDP2 averages by default; torch 2.8+ turns that off per module
(``set_gradient_divide_factor(1)`` with ``set_force_sum_reduction_for_comms``, which gloo needs since
it has no PREMUL_SUM). On 2.6/2.7 the average stays and :func:`shard_model` returns the factor
(the world size) to multiply the loss by instead, exact when it is a power of two.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from torch import nn

from longctx.trainer.parallel.state import ParallelState

if TYPE_CHECKING:
    from longctx.trainer.models.decoder import Transformer
    from longctx.trainer.models.hf import HFCausalLM


def _fsdp():
    """``torch.distributed.fsdp`` (public from 2.6) or the older composable path."""
    try:
        from torch.distributed import fsdp

        fsdp.fully_shard  # noqa: B018 - raises AttributeError before 2.6
        return fsdp
    except (ImportError, AttributeError):  # pragma: no cover - torch < 2.6
        from torch.distributed._composable import fsdp

        return fsdp


def mixed_precision(bf16: bool, *, cast_inputs: bool = True):
    """bf16 parameters for compute with float32 gradient reductions, or float32 throughout.

    Blocks are given ``cast_inputs=False``: their float inputs are the RoPE tables, kept in float32.
    """
    policy = _fsdp().MixedPrecisionPolicy
    if not bf16:
        return policy(cast_forward_inputs=cast_inputs)
    return policy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32, cast_forward_inputs=cast_inputs)


def shard_model(model: Transformer | HFCausalLM, state: ParallelState, *, bf16: bool) -> float:
    """Shard ``model`` (the own decoder or a transformers model, through their ``decoder_layers``,
    ``input_embedding`` and ``tied``) in place over ``state.fsdp_mesh``; returns the loss multiplier
    for exact sums (1.0, or the world size on torch < 2.8, see the module docstring)."""
    fsdp = _fsdp()
    mesh = state.fsdp_mesh
    tied = model.tied
    for layer in model.decoder_layers:
        fsdp.fully_shard(
            layer, mesh=mesh, reshard_after_forward=True, mp_policy=mixed_precision(bf16, cast_inputs=False)
        )
    if not tied:  # a tied embedding must live in one group: the root's
        fsdp.fully_shard(
            model.input_embedding, mesh=mesh, reshard_after_forward=True, mp_policy=mixed_precision(bf16)
        )
    # The root's parameters (final norm, output projection) are used at the end of forward and first in
    # backward: keeping them gathered in between saves one all-gather per micro-batch.
    fsdp.fully_shard(model, mesh=mesh, reshard_after_forward=False, mp_policy=mixed_precision(bf16))
    modules = [m for m in model.modules() if isinstance(m, fsdp.FSDPModule)]
    if not hasattr(fsdp.FSDPModule, "set_gradient_divide_factor"):  # torch 2.6 / 2.7
        return float(state.world_size)
    for module in modules:  # per module, not recursive
        module.set_gradient_divide_factor(1.0)
        module.set_force_sum_reduction_for_comms(True)
    return 1.0


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a (DTensor) parameter, gradient or optimizer state; the tensor itself
    when it is not sharded."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if to_local is not None else tensor


def local_bytes(tensors: Iterator[torch.Tensor]) -> int:
    """Bytes of this rank's shards of ``tensors``."""
    return sum(local_tensor(t).numel() * local_tensor(t).element_size() for t in tensors)


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> Iterator[torch.Tensor]:
    """Every tensor of the optimizer's state (AdamW: step, exp_avg, exp_avg_sq)."""
    for per_param in optimizer.state.values():
        yield from (v for v in per_param.values() if isinstance(v, torch.Tensor))


def scale_gradients(parameters: list[nn.Parameter], factor: float) -> None:
    """Multiply every gradient (sharded or not) by ``factor``, in place."""
    grads = [local_tensor(p.grad) for p in parameters if p.grad is not None]
    if grads:
        torch._foreach_mul_(grads, factor)
