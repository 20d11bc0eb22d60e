"""Exact ring attention (context parallelism) for causal, document-masked packed sequences.

Typical use, once per micro-batch and then in every attention layer::

    plan = build_ring_plan(q_index, q_segment, group=cp_group)   # global indices, segment ids
    out = ring_attention(q, k, v, plan)                          # [tokens, heads, head_dim]
    plan.stats.compute_fraction                                  # share of block pairs computed

Which tokens each rank holds is ``longctx.trainer.parallel.layout``'s (zigzag or balanced); masks
depend only on global indices, so any layout is exact. Modules: ``masks`` (masks from indices and
segment ids), ``plan`` (ring schedule and block skipping), ``comm`` (asynchronous step transfers),
``merge`` (log-sum-exp merging), ``kernels``/``cuda_kernels`` (local block attention), ``select``
(which kernels run on a device), ``ring`` (the autograd function), ``modes`` (``train.cp_mode``: the
ring, an all-gather, Ulysses all-to-alls and the hybrid, each bound once per row).
"""

from longctx.trainer.attention.comm import RingCommError
from longctx.trainer.attention.plan import RingPlan, RingStats, build_ring_plan
from longctx.trainer.attention.ring import ring_attention

__all__ = ["RingCommError", "RingPlan", "RingStats", "build_ring_plan", "ring_attention"]
