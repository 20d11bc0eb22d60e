"""Exact ring attention (context parallelism) for causal, document-masked packed sequences.

Typical use, once per micro-batch and then in every attention layer::

    plan = build_ring_plan(q_index, q_segment, group=cp_group)   # global indices, segment ids
    out = ring_attention(q, k, v, plan)                          # [tokens, heads, head_dim]
    plan.stats.compute_fraction                                  # share of block pairs computed

The zigzag layout (rank ``r`` holds chunks ``r`` and ``2P-1-r`` of ``2P``) comes from ``zigzag``,
which splits the trainer's packed rows too. Modules: ``zigzag`` (a window's share per rank),
``masks`` (masks from indices and segment ids), ``plan`` (ring schedule and block skipping), ``comm``
(asynchronous step transfers), ``merge`` (log-sum-exp merging), ``kernels``/``cuda_kernels`` (local
block attention), ``select`` (which kernels run on a device), ``ring`` (the autograd function).
"""

from longctx.trainer.attention.comm import RingCommError
from longctx.trainer.attention.plan import RingPlan, RingStats, build_ring_plan
from longctx.trainer.attention.ring import ring_attention

__all__ = ["RingCommError", "RingPlan", "RingStats", "build_ring_plan", "ring_attention"]
