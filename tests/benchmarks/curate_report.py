"""``bench_curate.py``'s figures against its two baselines, its JSON report, and the check of a new run
against a recorded report (a change that costs more than :data:`TOLERANCE` fails loudly).

The baselines tokenize exactly the texts curation tokenizes, on the same two cores, in the same run:

* ``whole``: the bare ``Tokenizer.encode_batch_fast`` on whole documents, one process on 2 cores
  (the tokenizer's own threads);
* ``pieces``: curation's own calls (``TokenEncoder``: pieces cut at safe positions, the same ids), as
  curation's tasks run them: 2 processes of one thread, each pinned to a core, half the texts each,
  with the ``malloc`` curation runs with (``longctx.core.allocator``). Pieces are kinder to the caches
  than whole documents, so this baseline is the faster, and the tighter bound;
* ``whole_allocator``, only when curation preloads an allocator: ``whole`` with that allocator too,
  so that what the allocator does for the tokenizer alone is seen apart from what curation adds.

``whole`` runs as a plain Python process does, on the system's ``malloc``: the goals are against it.
A report records the allocator curation ran with (``allocator``: the library's file name, or
``system``); reports of different allocators are not compared.

A figure is a throughput: the baseline's wall seconds over curate + pack's, for the whole run at each
size, and per extra megabyte between the smallest and the largest size (each repetition's slopes).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

BASELINES = {
    "whole": "tokenizer, 2 cores",
    "pieces": "tokenizer in pieces, 2 processes of 1 thread",
    "whole_allocator": "tokenizer, 2 cores, curation's allocator",
}
"""Baseline name -> the contender that measures it (``whole_allocator`` only in a run whose curation
preloaded an allocator)."""
END_TO_END = "curate + pack, 2 tasks on 2 cores"
GOALS = {"whole_run": 0.75, "per_extra_mb": 0.85}
"""Throughput of curate + pack against the ``whole`` baseline: the whole run at the largest size, and
each extra megabyte (issue 38)."""
TOLERANCE = 0.05
"""A guarded figure more than this fraction below the recorded one fails the check."""
GUARDED_BASELINE = "pieces"
"""The baseline of the guarded figures. Against the other, the same code measured 5-8% apart in two
runs 40 minutes apart (the whole-document tokenizer's own two threads scale differently from run to
run); against this one, which splits its work as curation's tasks do, within 4%."""

Rows = dict[str, dict[str, list[float]]]
"""Contender -> ``{"cpu": [...], "wall": [...]}``, one value per repetition."""


def summary(values: list[float]) -> dict[str, float]:
    """Median, min and max of repeated values."""
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def throughputs(rows: Rows, baseline: str) -> list[float]:
    """Per repetition: the baseline's wall seconds over curate + pack's."""
    return [b / e for b, e in zip(rows[BASELINES[baseline]]["wall"], rows[END_TO_END]["wall"], strict=True)]


def whole_run(rows: Rows) -> dict[str, dict[str, float]]:
    """Per baseline the run measured: :func:`throughputs`, summarized."""
    return {
        name: summary(throughputs(rows, name)) for name, contender in BASELINES.items() if contender in rows
    }


def slopes(
    small: tuple[float, Rows], large: tuple[float, Rows], contender: str, kind: str = "wall"
) -> list[float]:
    """Seconds per extra megabyte of ``contender`` between two sizes, per repetition."""
    (mb1, rows1), (mb2, rows2) = small, large
    return [
        (b - a) / (mb2 - mb1) for a, b in zip(rows1[contender][kind], rows2[contender][kind], strict=True)
    ]


def per_extra_mb(small: tuple[float, Rows], large: tuple[float, Rows]) -> dict[str, dict[str, float]]:
    """Per baseline: its seconds per extra megabyte over curate + pack's, per repetition (summarized)."""
    e2e = slopes(small, large, END_TO_END)
    return {
        name: summary([b / e for b, e in zip(slopes(small, large, contender), e2e, strict=True)])
        for name, contender in BASELINES.items()
        if contender in small[1]
    }


def allocator_kind(report: dict[str, Any]) -> str:
    """``mimalloc``, ``jemalloc`` or ``system``: the allocator curation ran with in a report (reports
    from before the field ran on the system's)."""
    library = str(report.get("allocator", "system"))
    return next((kind for kind in ("mimalloc", "jemalloc", "tcmalloc") if kind in library), library)


def guarded(report: dict[str, Any]) -> dict[str, dict[str, float]]:
    """The figures a change must not lower, by name (sizes named by rank, so that two runs of the
    same input compare even where its size differs slightly): the whole-run throughput at every size
    and the per-megabyte one, against :data:`GUARDED_BASELINE` (their :func:`summary`)."""
    out = {}
    sizes = sorted(report["sizes"], key=lambda s: s["megabytes"])
    for k, size in enumerate(sizes):
        out[f"whole run, size {k + 1} of {len(sizes)}, against {GUARDED_BASELINE}"] = size["throughput"][
            GUARDED_BASELINE
        ]
    if "per_extra_mb" in report:
        out[f"per extra MB against {GUARDED_BASELINE}"] = report["per_extra_mb"][GUARDED_BASELINE]
    return out


def goal_lines(report: dict[str, Any]) -> list[str]:
    """One line per goal of :data:`GOALS`: the figure, and whether it is met."""
    largest = max(report["sizes"], key=lambda s: s["megabytes"])
    figures = {"whole_run": largest["throughput"]["whole"]["median"]}
    if "per_extra_mb" in report:
        figures["per_extra_mb"] = report["per_extra_mb"]["whole"]["median"]
    same = {"whole_run": largest["throughput"].get("whole_allocator")}
    if "per_extra_mb" in report:
        same["per_extra_mb"] = report["per_extra_mb"].get("whole_allocator")
    lines = []
    for goal, value in figures.items():
        what = f"whole run at {largest['megabytes']:.1f} MB" if goal == "whole_run" else "per extra MB"
        met = "met" if value >= GOALS[goal] else "NOT MET"
        lines.append(
            f"goal: {what} at least {GOALS[goal]:.2f}x of the whole-document tokenizer: {value:.2f}x, {met}"
        )
        if same.get(goal):
            lines.append(
                f"  (against the whole-document tokenizer with curation's allocator, "
                f"{allocator_kind(report)}: {same[goal]['median']:.2f}x)"
            )
    return lines


def regressions(recorded: dict[str, Any], current: dict[str, Any], tolerance: float = TOLERANCE) -> list[str]:
    """What got slower: one line per :func:`guarded` figure whose median in ``current`` is more than
    ``tolerance`` below the recorded median, and whose best repetition does not reach it either (one
    slow repetition on a loaded machine moves a median of 3; a slower change moves them all). Raises
    ValueError when the two did not measure the same input (sizes that differ by more than 1%, or
    figures one of them lacks, or curation ran with different allocators): their figures cannot be
    compared."""
    if allocator_kind(recorded) != allocator_kind(current):
        raise ValueError(
            f"the recorded report ran curation with the {allocator_kind(recorded)} allocator, this run with "
            f"{allocator_kind(current)} (see longctx.core.allocator)"
        )
    old_mb = sorted(s["megabytes"] for s in recorded["sizes"])
    new_mb = sorted(s["megabytes"] for s in current["sizes"])
    if len(old_mb) != len(new_mb) or any(abs(a - b) > 0.01 * a for a, b in zip(old_mb, new_mb)):
        raise ValueError(
            f"the recorded report measured {', '.join(f'{m:.1f}' for m in old_mb)} MB, this run "
            f"{', '.join(f'{m:.1f}' for m in new_mb)} MB: run it with the report's --input and --copies"
        )
    old, new = guarded(recorded), guarded(current)
    if set(old) != set(new):
        raise ValueError(f"the figures differ: recorded {sorted(old)}, this run {sorted(new)}")
    lines = []
    for name, before in old.items():
        now = new[name]
        if now["median"] < before["median"] * (1 - tolerance) and now["max"] < before["median"]:
            lines.append(
                f"{name}: {now['median']:.3f}x [{now['min']:.3f}-{now['max']:.3f}], recorded "
                f"{before['median']:.3f}x ({now['median'] / before['median'] - 1:+.1%})"
            )
    return lines


def newest_comparable(folder: Path, current: dict[str, Any]) -> tuple[Path | None, list[str]]:
    """The newest ``*-curate.json`` report in ``folder`` (by name: they start with their date) that
    measured the same input as ``current`` with the same allocator, and :func:`regressions` against it;
    ``(None, [])`` when there is none. Reports that do not parse are passed over."""
    for path in sorted(folder.glob("*-curate.json"), reverse=True):
        try:
            return path, regressions(json.loads(path.read_text()), current)
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None, []
