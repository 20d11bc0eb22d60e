"""What each context-parallel mode (``train.cp_mode``) costs one rank, and which to use.

A window of ``L`` tokens is split over ``cp`` ranks, ``n = L / cp`` tokens each. The four modes of
``longctx.trainer.attention.modes`` compute the same attention and differ in what travels. Per layer
and per training step (forward + backward), with ``q`` and ``k`` the query and key/value widths
(``longctx.trainer.planning.flops``), ``d`` the head dimension, ``g`` key/value heads, and bf16 (2
bytes) for everything but the ring's fp32 dK/dV accumulators (4 bytes):

* ``ring``: ``cp - 1`` steps, each sending one K/V block ``2 n k`` forward (bf16) and the block plus
  its fp32 dK/dV accumulator backward, ``16 (cp - 1) n k`` bytes in all. Each step's transfer overlaps
  that step's attention, so only what the compute does not cover is exposed
  (``longctx.trainer.planning.plan.ring_step``).
* ``allgather`` (Llama 3): one all-gather of the window's K and V forward, one reduce-scatter of
  their gradients backward, each sending ``(cp - 1) x 2 n k`` elements: ``8 (cp - 1) n k`` bytes, not
  overlapped. Every rank holds the whole window's K and V, ``4 L k`` bytes per layer.
* ``ulysses`` (DeepSpeed-Ulysses, all-to-all degree ``u = cp``): one all-to-all of q, k and v (key/value
  heads fewer than ``u`` copied up to ``g' = max(g, u)``) and one of the attention output, each rank
  sending ``(u - 1) / u`` of its share; the same two reversed in backward:
  ``8 (u - 1) / u x n (q + g' d)`` bytes, not overlapped. Between them each rank attends over the
  whole window for ``a / u`` heads.
* ``hybrid`` (USP, LoongTrain): ulysses over ``u`` ranks (``1 < u < cp``, a divisor of ``cp``), then a
  ring of ``r = cp / u`` ranks whose blocks are ``L / r`` tokens of ``a / u`` query and ``g' / u``
  key/value heads: the all-to-alls as above, plus a ring of the model with those heads.

Every mode does the same attention work per rank: ``2 L^2 q / cp`` FLOPs forward (causal) and
:data:`~longctx.trainer.planning.plan.ATTENTION_BACKWARD_FACTOR` times that backward.

Links: a group of ranks that fits in one node (``RunSettings.gpus_per_node``; a ring's neighbours,
an all-to-all's members are consecutive ranks) talks over the node's link
(``RunSettings.node_link_bytes_per_s``, NVLink); a larger group over ``RunSettings.link_bytes_per_s``
(the network), which its slowest hop sets. An all-to-all or a gather takes the bytes a rank sends
over that bandwidth.

Activation checkpointing (``longctx.trainer.models.checkpointing``) re-runs communication in backward:
``full`` recomputes the whole block, so every mode's forward communication runs again (the ring's again
overlapped with the recomputed attention); ``selective`` keeps the attention operator's output, so the
ring exchanges nothing more, but the all-gather and the all-to-alls, outside that operator, run again.
The same recomputation frees what those collectives produced between forward and backward, so their
extra memory is one layer's rather than every layer's.

Dividing heads and windows is the mesh's rule (``longctx.trainer.parallel.mesh.MeshShape``), read
here, never restated. Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from longctx.core.errors import ConfigError
from longctx.trainer.models.shape import ModelShape
from longctx.trainer.parallel.mesh import CP_MODES, MeshShape
from longctx.trainer.planning.memory import ACTIVATION_BYTES, GRAD_ACCUM_BYTES, kv_block_bytes
from longctx.trainer.planning.plan import RingStep, RunSettings, checkpointing_at, ring_step

TIE_FRACTION = 0.01
"""Exposed communication within this fraction of the least counts as a tie (:func:`recommend_mode`)."""


@dataclass(frozen=True)
class ModeCost:
    """One context-parallel mode at one window length and ``cp``: per rank, per layer, per training
    step (forward + backward, with what activation checkpointing re-runs). A refused mode has zeros."""

    mode: str
    ulysses: int
    """Ranks of one all-to-all group (``MeshShape.ulysses_degree``): 1 for ring and allgather."""
    refused: str | None
    """Why the mode cannot run here (one line), or None."""
    bytes_per_step: float
    """Bytes each rank sends."""
    comm_s: float
    """Time of all that communication at its links."""
    exposed_s: float
    """The part of :attr:`comm_s` that no attention compute overlaps."""
    hidden: bool
    """Whether all communication hides behind compute (nothing exposed)."""
    extra_memory_bytes: float
    """Memory a rank holds beyond what the ring holds (see :func:`mode_costs`)."""
    compute_s: float
    """Attention compute, forward and backward (and the forward again under full checkpointing)."""
    ring: int = 1
    """Ranks of the ring (or of the gather): ``cp / ulysses`` for ring, allgather and hybrid."""

    @property
    def train_ulysses(self) -> int | None:
        """What ``train.ulysses`` must be for this mode: the degree for ``hybrid``, else unset."""
        return self.ulysses if self.mode == "hybrid" else None


def group_link(settings: RunSettings, ranks: int) -> float:
    """Bytes/s one rank of a group of ``ranks`` consecutive ranks sends at: the node's link when the
    group fits in one node (``ranks <= gpus_per_node``), else the network's."""
    return settings.node_link_bytes_per_s if ranks <= settings.gpus_per_node else settings.link_bytes_per_s


def head_share(model: ModelShape, degree: int) -> ModelShape:
    """The model one rank of an all-to-all group of ``degree`` ranks attends for: ``a / degree`` query
    heads and ``g' / degree`` key/value heads, ``g'`` being the key/value heads after copying
    (``MeshShape.kv_head_copies``). The caller checks ``MeshShape.heads_problem`` first."""
    if degree == 1:
        return model
    kv_heads = model.num_kv_heads * MeshShape.kv_head_copies(model.num_kv_heads, degree)
    return replace(
        model,
        name=f"{model.name} ({model.num_heads // degree} of {model.num_heads} heads)",
        num_heads=model.num_heads // degree,
        num_kv_heads=kv_heads // degree,
    )


@dataclass(frozen=True)
class _Part:
    """One part of a mode's communication: bytes sent, their time, and the exposed share."""

    bytes: float = 0.0
    comm_s: float = 0.0
    exposed_s: float = 0.0


def _ring_part(
    model: ModelShape, length: int, ranks: int, settings: RunSettings, recompute: bool
) -> tuple[_Part, float]:
    """A ring of ``ranks`` over the whole window for ``model``'s heads, and its attention compute.

    ``ranks - 1`` steps each pass (``ring_step``): forward the bf16 K/V block, backward the block and
    its fp32 dK/dV accumulator, each overlapping that step's attention; under full checkpointing
    (``recompute``) the forward pass runs again in backward. Compute is ``ranks`` steps per pass.
    """
    link = group_link(settings, ranks)
    step: RingStep = ring_step(
        model, length, ranks, link_bytes_per_s=link, achieved_flops=settings.achieved_flops
    )
    forward_passes = 2 if recompute else 1
    backward_bytes = step.send_bytes * (ACTIVATION_BYTES + GRAD_ACCUM_BYTES) / ACTIVATION_BYTES
    transfers = ranks - 1
    exposed = transfers * (
        forward_passes * max(0.0, step.forward_comm_s - step.forward_compute_s)
        + max(0.0, step.backward_comm_s - step.backward_compute_s)
    )
    part = _Part(
        bytes=transfers * (forward_passes * step.send_bytes + backward_bytes),
        comm_s=transfers * (forward_passes * step.forward_comm_s + step.backward_comm_s),
        exposed_s=exposed,
    )
    compute = ranks * (forward_passes * step.forward_compute_s + step.backward_compute_s)
    return part, compute


def _all_to_all_part(
    model: ModelShape, tokens: int, degree: int, settings: RunSettings, recompute: bool
) -> _Part:
    """Ulysses' all-to-alls over ``degree`` ranks holding ``tokens`` tokens each, none overlapped.

    Forward: q, k and v (key/value heads copied up to ``degree`` when fewer), then the attention output;
    each rank keeps ``1 / degree`` of what it holds and sends the rest. Backward: the gradients of the
    same tensors (bf16), the other way. ``recompute``: the forward pair runs again in backward.
    """
    kv_heads = model.num_kv_heads * MeshShape.kv_head_copies(model.num_kv_heads, degree)
    elements = tokens * (model.q_dim + 2 * kv_heads * model.head_dim + model.q_dim)
    forward = (degree - 1) / degree * elements * ACTIVATION_BYTES
    sent = forward * (3 if recompute else 2)
    seconds = sent / group_link(settings, degree)
    return _Part(bytes=sent, comm_s=seconds, exposed_s=seconds)


def _refused(mode: str, reason: str) -> ModeCost:
    return ModeCost(mode, 1, reason, 0.0, 0.0, 0.0, False, 0.0, 0.0)


def hybrid_degrees(cp: int) -> list[int]:
    """All-to-all degrees the mesh accepts for ``hybrid`` on ``cp`` ranks (``MeshShape.check_mode``)."""
    degrees = []
    for degree in range(2, cp):
        try:
            MeshShape.check_mode("hybrid", cp, degree, mode_key="cp_mode", ulysses_key="ulysses")
        except ConfigError:
            continue
        degrees.append(degree)
    return degrees


def _ring_cost(model: ModelShape, length: int, cp: int, settings: RunSettings, held: str) -> ModeCost:
    part, compute = _ring_part(model, length, cp, settings, recompute=held == "full")
    return ModeCost(
        "ring", 1, None, part.bytes, part.comm_s, part.exposed_s, part.exposed_s == 0, 0.0, compute, cp
    )


def _allgather_cost(model: ModelShape, length: int, cp: int, settings: RunSettings, held: str) -> ModeCost:
    """The gather and the reduce-scatter each send ``(cp - 1)`` K/V blocks of ``n`` tokens (bf16);
    selective and full checkpointing gather again in backward. Extra memory: the window's K and V,
    ``4 L k`` bytes per layer, held by every layer without checkpointing and by one layer (the one
    being backpropagated, the gather recomputed) with selective or full checkpointing."""
    recompute = held != "none"
    block = kv_block_bytes(model, length // cp)
    sent = (cp - 1) * block * (3 if recompute else 2)
    seconds = sent / group_link(settings, cp)
    _, compute = _ring_part(model, length, cp, settings, recompute=held == "full")
    layers = model.num_layers if held == "none" else 1
    memory = layers * kv_block_bytes(model, length)
    return ModeCost("allgather", 1, None, sent, seconds, seconds, seconds == 0, memory, compute, cp)


def _ulysses_cost(
    mode: str, model: ModelShape, length: int, cp: int, degree: int, settings: RunSettings, held: str
) -> ModeCost:
    """Ulysses over ``degree`` ranks and, when ``degree < cp`` (hybrid), a ring of ``cp / degree``
    ranks over the same window for a rank's share of the heads.

    Extra memory: with copied key/value heads each rank's keys and values grow from ``g`` to ``g'`` heads
    (``2 n (g' - g) d`` elements), and the attention output exists twice (the operator's, in heads
    layout, and the all-to-all's, the output projection's input: ``n q`` more); held by every layer
    without checkpointing, by one with selective or full (the all-to-alls recomputed). One layer's
    transients (the ring's buffers, larger with copied heads in a hybrid) are left out, as for every mode.
    """
    tokens = length // cp
    share = head_share(model, degree)
    a2a = _all_to_all_part(model, tokens, degree, settings, recompute=held != "none")
    ring, compute = _ring_part(share, length, cp // degree, settings, recompute=held == "full")
    copies = MeshShape.kv_head_copies(model.num_kv_heads, degree)
    extra_kv = 2 * tokens * (copies - 1) * model.kv_dim
    layers = model.num_layers if held == "none" else 1
    memory = layers * ACTIVATION_BYTES * (extra_kv + tokens * model.q_dim)
    exposed = a2a.exposed_s + ring.exposed_s
    return ModeCost(
        mode,
        degree,
        None,
        a2a.bytes + ring.bytes,
        a2a.comm_s + ring.comm_s,
        exposed,
        exposed == 0,
        memory,
        compute,
        cp // degree,
    )


def _hybrid_cost(model: ModelShape, length: int, cp: int, settings: RunSettings, held: str) -> ModeCost:
    """The best ``hybrid``: among the degrees the mesh accepts whose heads split, those within a node
    (``<= gpus_per_node``) if any, the one with the least exposed communication (then the least extra
    memory, then the fewest bytes)."""
    degrees = hybrid_degrees(cp)
    if not degrees:
        return _refused("hybrid", f"no all-to-all degree between 1 and cp {cp} divides it")
    fitting = [u for u in degrees if MeshShape.heads_problem(model.num_heads, model.num_kv_heads, u) is None]
    if not fitting:
        problems = "; ".join(
            f"{MeshShape.heads_problem(model.num_heads, model.num_kv_heads, u)}" for u in degrees
        )
        return _refused(
            "hybrid", f"no degree among {', '.join(map(str, degrees))} splits the heads: {problems}"
        )
    in_node = [u for u in fitting if u <= settings.gpus_per_node] or fitting
    costs = [_ulysses_cost("hybrid", model, length, cp, u, settings, held) for u in in_node]
    return min(costs, key=lambda c: (c.exposed_s, c.extra_memory_bytes, c.bytes_per_step))


def mode_costs(model: ModelShape, length: int, cp: int, settings: RunSettings) -> list[ModeCost]:
    """Every mode of :data:`~longctx.trainer.parallel.mesh.CP_MODES`, in that order, at windows of
    ``length`` tokens over ``cp`` ranks (see the module docstring for the formulas).

    ``extra_memory_bytes`` counts what a mode holds beyond the ring: allgather's gathered keys and values,
    ulysses' and hybrid's copied key/value heads and second attention output. A mode that cannot run
    (``cp`` 1: every mode is the ring's local call; heads that do not split; no hybrid degree) is
    refused with the reason. Raises :class:`ConfigError` when the window does not split over ``cp``
    (``MeshShape.check_window``).
    """
    MeshShape.check_window(length, cp, length_key="length", cp_key="cp")
    held = checkpointing_at(model, length, cp, settings)
    ring = _ring_cost(model, length, cp, settings, held)
    if cp == 1:
        alone = "cp 1: one rank holds the window, so every mode is the ring's local call"
        return [ring] + [_refused(mode, alone) for mode in CP_MODES if mode != "ring"]
    costs = {"ring": ring, "allgather": _allgather_cost(model, length, cp, settings, held)}
    problem = MeshShape.heads_problem(model.num_heads, model.num_kv_heads, cp)
    if problem is None:
        costs["ulysses"] = _ulysses_cost("ulysses", model, length, cp, cp, settings, held)
    else:
        costs["ulysses"] = _refused("ulysses", problem)
    costs["hybrid"] = _hybrid_cost(model, length, cp, settings, held)
    return [costs[mode] for mode in CP_MODES]


def choose(costs: list[ModeCost]) -> ModeCost:
    """The mode to use among ``costs`` (:func:`mode_costs`): the least exposed communication. Within
    :data:`TIE_FRACTION` of the least (or all hidden), the ring wins (it holds no extra memory and is
    the simplest), so allgather never beats a ring that hides; among the others, the least extra
    memory, then the fewest bytes."""
    applicable = [c for c in costs if c.refused is None]
    least = min(c.exposed_s for c in applicable)
    close = [c for c in applicable if c.exposed_s <= least * (1 + TIE_FRACTION)]
    for cost in close:
        if cost.mode == "ring":
            return cost
    return min(close, key=lambda c: (c.extra_memory_bytes, c.bytes_per_step, CP_MODES.index(c.mode)))


def recommend_mode(model: ModelShape, length: int, cp: int, settings: RunSettings) -> ModeCost:
    """The mode ``train.cp_mode: auto`` uses and ``longctx plan`` recommends (:func:`choose` over
    :func:`mode_costs`); the ring when ``cp`` is 1."""
    return choose(mode_costs(model, length, cp, settings))
