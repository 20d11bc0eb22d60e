"""Run records: a job refuses to resume into an output that a different configuration started.

When a job first runs in an output folder it records what determines its output (its
*fingerprint*: resolved settings, input files, tokenizer) in ``work/<job>/run.json``. Running the
job again with the same fingerprint resumes; with a different one it is refused, naming the keys
that changed, so two configurations never mix their outputs in one folder.

A job may also record its input files (:data:`INPUTS`: each file's path, size, modification time
and, where one was taken, a content hash), which the job compares with its inputs of the moment
(:func:`compare_inputs`): inputs changed since the run started are refused or, when the job is told
to, curated anew and recorded again (:func:`record_inputs`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from longctx.core.atomic import write_json
from longctx.core.errors import ConfigError
from longctx.core.layout import RunLayout

INPUTS = "inputs"
"""Key of the run record holding the input files: a sorted list of ``[path, size, mtime, hash]``
(``hash`` ``""`` where none was taken)."""


@dataclass(frozen=True)
class InputChanges:
    """Input files (paths as recorded) added, removed and changed since the run was recorded."""

    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed)

    def first(self) -> tuple[str, str]:
        """The first changed path (in path order) and what became of it."""
        found = [(p, "added") for p in self.added] + [(p, "removed") for p in self.removed]
        found += [(p, "changed") for p in self.changed]
        return min(found)

    def counts(self) -> str:
        """``2 added, 1 removed, 1 changed`` (kinds without files left out)."""
        parts = [(len(self.added), "added"), (len(self.removed), "removed"), (len(self.changed), "changed")]
        return ", ".join(f"{n} {kind}" for n, kind in parts if n)


def _same_file(before: list[Any], now: list[Any]) -> bool:
    """Same size and modification time, and the same content hash where both have one."""
    if before[1] != now[1] or before[2] != now[2]:
        return False
    return not (before[3] and now[3]) or before[3] == now[3]


def compare_inputs(before: list[list[Any]], now: list[list[Any]]) -> InputChanges:
    """What differs between two lists of input files (:data:`INPUTS` entries)."""
    old, new = {e[0]: e for e in before}, {e[0]: e for e in now}
    return InputChanges(
        added=sorted(new.keys() - old.keys()),
        removed=sorted(old.keys() - new.keys()),
        changed=sorted(p for p in old.keys() & new.keys() if not _same_file(old[p], new[p])),
    )


def recorded_inputs(layout: RunLayout) -> list[list[Any]] | None:
    """The input files the run recorded; None before its first run (or in a record without them)."""
    if not layout.run_record.exists():
        return None
    return json.loads(layout.run_record.read_text(encoding="utf-8")).get(INPUTS)


def record_inputs(layout: RunLayout, inputs: list[list[Any]]) -> None:
    """Replace the input files of the run's record (a run that curates changed inputs anew)."""
    record = json.loads(layout.run_record.read_text(encoding="utf-8"))
    write_json(layout.run_record, record | {INPUTS: inputs}, indent=1)


def config_hash(data: Any) -> str:
    """sha256 (hex) of the canonical JSON of ``data`` (sorted keys): the one hash of settings."""
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def changed_keys(layout: RunLayout, fingerprint: dict[str, Any]) -> list[str] | None:
    """Keys of ``fingerprint`` that differ from the recorded run; None when nothing is recorded."""
    if not layout.run_record.exists():
        return None
    previous = json.loads(layout.run_record.read_text(encoding="utf-8"))
    previous.pop(INPUTS, None)  # compared on their own (compare_inputs)
    return sorted(k for k in set(previous) | set(fingerprint) if previous.get(k) != fingerprint.get(k))


def check_same_run(
    layout: RunLayout,
    fingerprint: dict[str, Any],
    output: Path,
    *,
    fresh: bool = True,
    inputs: list[list[Any]] | None = None,
) -> None:
    """Record ``fingerprint`` (and ``inputs``, the job's input files, when given) on the job's first
    run; on later runs refuse a different fingerprint (the inputs are the caller's to compare).

    ``output`` is what the job writes (named in the message). ``fresh`` says whether ``output``
    must be absent or empty on the first run: false when it may hold what an earlier job of the
    run wrote (curation writes beside the run's other outputs). A refused run changes nothing.
    """
    changed = changed_keys(layout, fingerprint)
    if changed:
        stale = output if layout.work.is_relative_to(output) else f"{output} and {layout.work}"
        raise ConfigError(
            f"{output} holds a {layout.job} run made with a different configuration (different "
            f"{', '.join(changed)}); delete {stale} or choose another output"
        )
    if changed is None:
        if fresh and output.is_dir() and any(output.iterdir()):
            raise ConfigError(
                f"{output} exists but was not written by this {layout.job} run; "
                "delete it or choose another output"
            )
        write_json(
            layout.run_record, fingerprint | ({INPUTS: inputs} if inputs is not None else {}), indent=1
        )
