"""Position coverage: a context-extension run must train positions beyond the old window.

Two guards. Before the first step, :func:`check_shard_coverage` reads the shard manifest and
refuses when the largest packed position is below the required one (``train.coverage.required_position``
as given, default the windows' last position). While training, :class:`CoverageTracker` keeps a
histogram of the positions of trained (loss-masked) tokens and raises :class:`CoverageError` when too
many steps pass without a token at or beyond the original context (in windows long enough to hold
one).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from longctx.core.buckets import bucket_edges
from longctx.core.errors import ConfigError


class CoverageError(ConfigError):
    """The run would not (or did not) train the extended positions (reported like a config error:
    a message and a non-zero exit, no traceback)."""


def required_position(target: int, configured: int | None) -> int:
    """The largest position the shards must reach: ``configured`` as given, else ``target - 1`` (the
    last position of the run's windows)."""
    return configured if configured is not None else target - 1


def check_shard_coverage(
    max_position: int,
    per_source_max: dict[str, int],
    required: int,
    original: int,
    *,
    configured: int | None,
    allow_short: bool,
) -> None:
    """Raise :class:`CoverageError` with a readable diagnosis unless ``max_position >= required``; its
    advice names the settings that would change the verdict, from ``configured``
    (``train.coverage.required_position``) and ``allow_short`` as they are."""
    if max_position >= required:
        return
    lines = [
        f"the shards' largest position is {max_position}, below the required {required} "
        f"(context.original is {original}): training on them would not teach the extended positions.",
        "Largest position per source:",
    ]
    lines += [f"  {name}: {pos}" for name, pos in sorted(per_source_max.items())]
    verb = "lower" if configured is not None else "set"
    options = [
        "pack longer windows (pack.seq_lens) from longer documents",
        f"{verb} train.coverage.required_position to {max_position} or below",
    ]
    if not allow_short:
        options.append("set train.coverage.allow_short: true to train anyway")
    advice = ", ".join(options[:-1]) + " or " + options[-1]
    lines.append(advice[0].upper() + advice[1:] + ".")
    raise CoverageError("\n".join(lines))


def position_edges(seq_len: int, original: int) -> list[int]:
    """Lower edges of the power-of-two position buckets of ``seq_len``-token windows (0, 1, 2, 4, ...;
    ``longctx.core.buckets``), plus ``original`` so that "at or beyond the original context" is
    exactly a set of buckets: bucket ``b`` holds positions in ``[edge_b, edge_{b+1})``."""
    return bucket_edges(seq_len, extra=(original,))


@dataclass
class CoverageTracker:
    """Running histogram of trained positions and the streak of steps without long positions."""

    original: int
    seq_len: int
    max_steps_without_long: int
    edges: list[int] = field(init=False)
    histogram: list[int] = field(init=False)
    max_position: int = -1
    steps_without_long: int = 0
    long_tokens: int = 0

    def __post_init__(self) -> None:
        self.edges = position_edges(self.seq_len, self.original)
        self.histogram = [0] * len(self.edges)

    def bucket_of(self, positions: torch.Tensor) -> torch.Tensor:
        """Bucket index of each position."""
        return torch.bucketize(positions, torch.tensor(self.edges[1:], device=positions.device), right=True)

    def local_counts(self, positions: torch.Tensor, loss_mask: torch.Tensor) -> torch.Tensor:
        """Per-bucket counts of this rank's trained (loss-masked) positions, int64; sum them over
        ranks before :meth:`add`."""
        trained = positions[loss_mask.bool()]
        return torch.bincount(self.bucket_of(trained), minlength=len(self.edges)).to(torch.int64)

    def add(self, counts: list[int], max_position: int) -> None:
        """Record one optimizer step: bucket counts over all ranks and the largest trained position."""
        self.histogram = [a + b for a, b in zip(self.histogram, counts)]
        self.max_position = max(self.max_position, max_position)
        long = sum(c for e, c in zip(self.edges, counts) if e >= self.original)
        self.long_tokens += long
        self.steps_without_long = 0 if long else self.steps_without_long + 1

    def check(self) -> None:
        """Raise :class:`CoverageError` after ``max_steps_without_long`` steps in a row without a token
        at or beyond ``original``; windows of ``original`` tokens or fewer (a stage at
        ``context.original``) cannot hold one, and are not checked."""
        if self.seq_len > self.original and self.steps_without_long >= self.max_steps_without_long:
            raise CoverageError(
                f"{self.steps_without_long} optimizer steps trained no token at or beyond position "
                f"{self.original} (context.original): the data does not reach the extended positions "
                f"(largest trained position so far: {self.max_position}). Raise "
                "train.coverage.max_steps_without_long or pack longer documents."
            )

    def summary(self) -> dict[str, object]:
        return {
            "max_position": self.max_position,
            "long_tokens": self.long_tokens,
            "histogram": {str(e): c for e, c in zip(self.edges, self.histogram)},
        }
