"""Run records: a job refuses to resume into an output that a different configuration started.

When a job first runs in an output folder it records what determines its output (its
*fingerprint*: resolved settings, input files, tokenizer) in ``work/<job>/run.json``. Running the
job again with the same fingerprint resumes; with a different one it is refused, naming the keys
that changed, so two configurations never mix their outputs in one folder.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from longctx.core.atomic import write_json
from longctx.core.errors import ConfigError
from longctx.core.layout import RunLayout


def config_hash(data: Any) -> str:
    """sha256 (hex) of the canonical JSON of ``data`` (sorted keys): the one hash of settings."""
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def changed_keys(layout: RunLayout, fingerprint: dict[str, Any]) -> list[str] | None:
    """Keys of ``fingerprint`` that differ from the recorded run; None when nothing is recorded."""
    if not layout.run_record.exists():
        return None
    previous = json.loads(layout.run_record.read_text(encoding="utf-8"))
    return sorted(k for k in set(previous) | set(fingerprint) if previous.get(k) != fingerprint.get(k))


def check_same_run(
    layout: RunLayout, fingerprint: dict[str, Any], output: Path, *, fresh: bool = True
) -> None:
    """Record ``fingerprint`` on the job's first run; on later runs refuse a different one.

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
        write_json(layout.run_record, fingerprint, indent=1)
