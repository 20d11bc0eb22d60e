"""Exact ring attention (context parallelism) for causal, document-masked packed sequences.

Typical use, once per micro-batch and then in every attention layer::

    plan = build_ring_plan(q_index, q_segment, group=cp_group)   # global indices, segment ids
    out = ring_attention(q, k, v, plan)                          # [tokens, heads, head_dim]
    plan.stats.compute_fraction                                  # share of block pairs computed

The zigzag layout (rank ``r`` holds chunks ``r`` and ``2P-1-r`` of ``2P``) comes from
``packer.cp.zigzag_indices``, which the trainer's data path uses too. Modules: ``masks`` (masks
from indices and segment ids), ``plan`` (ring schedule and block skipping), ``comm`` (asynchronous
step transfers), ``merge`` (log-sum-exp merging), ``kernels``/``cuda_kernels`` (local block
attention), ``ring`` (the autograd function).
"""

from trainer.attention.comm import RingCommError
from trainer.attention.plan import RingPlan, RingStats, build_ring_plan
from trainer.attention.ring import ring_attention

__all__ = ["RingCommError", "RingPlan", "RingStats", "build_ring_plan", "ring_attention"]
