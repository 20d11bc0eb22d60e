"""Point-to-point exchanges of one ring step, launched asynchronously and waited with clear errors.

Each ring step posts its sends and receives as one ``batch_isend_irecv`` call before computing, so the
transfer of the next block overlaps the attention on the current one. Operations are posted in a
fixed order of message kind (key/value blocks before dk/dv accumulators): NCCL matches the messages
between two ranks by order and gloo by tag, and both then agree.

A dead or stalled peer surfaces when the step is waited on: gloo raises once the process group's
timeout expires (or at once if the connection drops), NCCL's watchdog aborts after it. Set ``timeout``
when creating the context-parallel group. The error is re-raised as ``RingCommError`` naming the
phase, step, message and peer.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch.distributed as dist
from torch import Tensor

TAG_KV = 0
TAG_DKV = 1


class WaitClock:
    """Seconds this process has spent blocked in ring transfers (for the trainer's
    communication-wait metric). Only waits count: transfers that finished while the block was being
    computed cost nothing here, which is the point of overlapping them."""

    def __init__(self) -> None:
        self.seconds = 0.0


WAIT_CLOCK = WaitClock()


class RingCommError(RuntimeError):
    """A ring-attention transfer failed or timed out (typically a dead or stuck rank)."""


@dataclass(frozen=True)
class _Transfer:
    op: dist.P2POp
    description: str


class StepExchange:
    """The sends and receives of one ring step, posted together and waited together."""

    def __init__(self, group: dist.ProcessGroup | None, phase: str, step: int, n_steps: int) -> None:
        self._group = group
        self._label = f"ring attention {phase} step {step} of {n_steps}"
        self._transfers: list[_Transfer] = []
        self._works: list[tuple[dist.Work, str]] = []

    def send(self, tensor: Tensor, peer_global_rank: int, tag: int, what: str) -> None:
        """Queue sending ``tensor`` (``what`` names it in errors) to a global rank."""
        op = dist.P2POp(dist.isend, tensor, peer_global_rank, group=self._group, tag=tag)
        self._transfers.append(_Transfer(op, f"sending {what} to rank {peer_global_rank}"))

    def recv(self, tensor: Tensor, peer_global_rank: int, tag: int, what: str) -> None:
        """Queue receiving into ``tensor`` from a global rank."""
        op = dist.P2POp(dist.irecv, tensor, peer_global_rank, group=self._group, tag=tag)
        self._transfers.append(_Transfer(op, f"receiving {what} from rank {peer_global_rank}"))

    def start(self) -> None:
        """Post every queued operation without blocking."""
        if not self._transfers:
            return
        ordered = sorted(self._transfers, key=lambda transfer: transfer.op.tag)
        summary = "; ".join(transfer.description for transfer in ordered)
        try:
            works = dist.batch_isend_irecv([transfer.op for transfer in ordered])
        except RuntimeError as exc:  # a peer already gone: name the transfers, as a failed wait does
            raise RingCommError(f"{self._label}: posting transfers failed ({summary}): {exc}") from exc
        # NCCL returns one work for the whole coalesced batch, gloo one per operation.
        if len(works) == len(ordered):
            self._works = [
                (work, transfer.description) for work, transfer in zip(works, ordered, strict=True)
            ]
        else:
            self._works = [(work, summary) for work in works]

    def wait(self) -> None:
        """Block until every posted operation is complete; raise ``RingCommError`` on failure."""
        start = time.perf_counter()
        for work, description in self._works:
            try:
                work.wait()
            except RuntimeError as exc:
                raise RingCommError(f"{self._label}: {description} failed: {exc}") from exc
        self._works = []
        WAIT_CLOCK.seconds += time.perf_counter() - start
