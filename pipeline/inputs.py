"""A curation's input files are part of the run: recorded when it starts, compared when it runs again.

Every file under the run's sources (every entry but folders, links not followed; for JSONL and
Parquet sources the files their glob selects) is recorded in the run record
(:data:`~longctx.core.run_record.INPUTS`) with its size and modification time as the file system
gives them, and a content tag where one is cheap: S3's ETag (GCS's MD5) from the listing, or, for a
local file modified within :data:`RACY_SECONDS` of the listing (whose modification time could still
be that of a rewrite to come), the xxh3-128 of its bytes, taken again at every comparison.

A later run compares the inputs of the moment with the record, whether the first run finished or
was killed (even after its read stage). A difference is refused in one line naming the first
changed file; with ``longctx curate --update`` the run is curated again over the new inputs (all of
the work is redone: deduplication and the ledger span every input) and the ledger's ``change``
column marks the units that were added or changed since the last curation (or whose outcome
changed, as a duplicate of an added document), while ``stats.json`` (``update``) lists those, the
ones removed, and the files. The record then holds the new inputs.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from longctx.core import remote
from longctx.core.atomic import discard, write_json
from longctx.core.errors import ConfigError
from longctx.core.layout import RunLayout
from longctx.core.run_record import InputChanges, compare_inputs, record_inputs, recorded_inputs
from longctx.pipeline.config import SourceConfig
from longctx.pipeline.parquet import read_parquet
from longctx.pipeline.publish import file_xxh3
from longctx.pipeline.readers.listing import list_tree, open_folder

RACY_SECONDS = 2.0
"""A local file modified this recently when listed gets a content hash (its time may not change)."""
GLOB_KINDS = {"jsonl": "**/*.jsonl*", "parquet": "**/*.parquet"}
"""Sources whose reader takes the files a glob selects, and datatrove's default glob for each."""
CHANGE_COLUMN = pa.field("change", pa.string())
"""The ledger column marking what an update changed: ``added``, ``changed``, ``outcome_changed`` or
``""`` (see :func:`mark_changes`)."""
UNCHANGED_WORK = frozenset({"run.json", ".lock", "update.json"})
"""What an update keeps of the job's work folder (the rest is resume state of the old inputs)."""


def _local_files(root: str) -> list[tuple[str, int, int, bool]]:
    """Every entry but folders under the local folder ``root``, links not followed: relative path,
    size, modification time (ns) and whether it is a regular file. (``os.scandir``: about 4x as fast
    as fsspec's walk, 2.5 s for 50,000 files on the 2-core machine; the readers list with fsspec.)"""
    found, stack = [], [root]
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:  # unreadable: the readers record it as such
            continue
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)
                continue
            try:
                stat = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            rel = os.path.relpath(entry.path, root).replace(os.sep, "/")
            found.append((rel, stat.st_size, stat.st_mtime_ns, entry.is_file(follow_symlinks=False)))
    return found


def list_inputs(sources: list[SourceConfig], rehash: set[str] = frozenset()) -> list[list[Any]]:
    """Every input file of ``sources`` as a record entry ``[source/path, size, mtime, hash]``, sorted;
    ``rehash``: paths hashed in the record, which are hashed again to be compared."""
    listed_at_ns = time.time_ns()
    found = []
    for source in sources:
        folder = open_folder(source.path, source.storage_options)
        with remote.remote_errors(source.path, "listing the input"):
            selected = None
            if source.kind in GLOB_KINDS:
                glob = source.glob or GLOB_KINDS[source.kind]
                selected = set(folder.list_files(recursive=True, glob_pattern=glob))
            if folder.is_local():
                root = folder.resolve_paths("")
                for rel, size, mtime_ns, regular in _local_files(root):
                    if selected is not None and rel not in selected:
                        continue
                    path = f"{source.name}/{rel}"
                    recent = mtime_ns >= listed_at_ns - RACY_SECONDS * 1e9
                    digest = file_xxh3(Path(root) / rel) if regular and (recent or path in rehash) else ""
                    found.append([path, size, str(mtime_ns), digest])
                continue
            folder.fs.invalidate_cache()  # fsspec keeps listings per file system, file systems per process
            for entry in list_tree(folder):
                if entry.kind != "dir" and (selected is None or entry.path in selected):
                    found.append([f"{source.name}/{entry.path}", entry.size, entry.mtime, entry.etag])
    return sorted(found)


def input_location(sources: list[SourceConfig], path: str) -> str:
    """Where the recorded input ``path`` (``source/relative path``) is: a local path or a URL."""
    name, _, rel = path.partition("/")
    for source in sources:
        if source.name == name:
            return open_folder(source.path, source.storage_options).resolve_paths(rel)
    return path


def check_inputs(
    layout: RunLayout, sources: list[SourceConfig], inputs: list[list[Any]], *, update: bool
) -> InputChanges:
    """Compare the run's inputs of the moment with its record: nothing to do when they are the same
    (or nothing is recorded); refused in one line naming the first changed file, unless ``update``,
    which records the new inputs and sets the run up to curate them anew (:func:`start_update`)."""
    before = recorded_inputs(layout)
    changes = compare_inputs(before, inputs) if before is not None else InputChanges()
    if not changes:
        return changes
    path, how = changes.first()
    if not update:
        raise ConfigError(
            f"{input_location(sources, path)} was {how} since {layout.root} was curated from its inputs "
            f"({changes.counts()}); run `longctx curate --update` to curate the changes, or choose "
            "another output"
        )
    start_update(layout, changes, sources)
    record_inputs(layout, inputs)
    return changes


def _update_state(layout: RunLayout) -> Path:
    return layout.work / "update.json"


def start_update(layout: RunLayout, changes: InputChanges, sources: list[SourceConfig]) -> None:
    """Set the run up to be curated anew over changed inputs: note what changed and the units of the
    last curation (its ledger; a killed update's note when that ledger is gone), then remove the
    outputs and the resume state of the old inputs. The note is written first, so an update killed
    meanwhile is taken up again by the next ``--update``."""
    state = _update_state(layout)
    if layout.ledger.is_file():
        columns = ["id", "path", "outcome", "reason", "duplicate_of", "chars", "tokens"]
        previous: dict[str, Any] = {
            "units": read_parquet(layout.ledger).select(columns).to_pylist(),
            "files": {},
        }
    elif state.is_file():
        previous = json.loads(state.read_text(encoding="utf-8"))
    else:  # the last curation never finished: every unit is new to the ledger
        previous = {"units": [], "files": {}}
    files = dict(previous["files"])
    for kind in ("added", "removed", "changed"):
        for path in getattr(changes, kind):
            files[path] = [kind, input_location(sources, path)]
    write_json(state, {"units": previous["units"], "files": dict(sorted(files.items()))}, indent=1)
    for path in (layout.documents, layout.ledger, layout.stats, layout.plot, layout.curation_manifest):
        if path.is_dir():
            shutil.rmtree(path)
        else:
            discard(path)
    for path in layout.work.iterdir():
        if path.name not in UNCHANGED_WORK:
            shutil.rmtree(path) if path.is_dir() else path.unlink()


def _inside(unit: str, paths: set[str]) -> bool:
    """Whether one of ``paths`` is the unit ``unit`` (a file) or lies inside it (a folder)."""
    return unit in paths or any(p.startswith(unit.rstrip("/") + "/") for p in paths)


def mark_changes(layout: RunLayout, ledger: pa.Table) -> tuple[pa.Table, dict[str, Any] | None]:
    """The ledger with its :data:`CHANGE_COLUMN` (what the run's last update changed; all ``""``
    when it had none), and the update's summary for ``stats.json`` (None without one).

    A unit is ``added`` when the last curation had no row for it, ``changed`` when one of its input
    files was added, removed or changed (its ledger id or its location holds the file) or its text
    is not as long as it was (a row of a JSONL or Parquet file), and ``outcome_changed`` when its
    files are the same but what became of it is not (it is now a duplicate of an added document, or
    no longer one of a removed one)."""
    state = _update_state(layout)
    rows = ledger.select(["id", "path", "outcome", "reason", "duplicate_of", "chars", "tokens"]).to_pylist()
    if not state.is_file():
        return ledger.append_column(CHANGE_COLUMN, pa.array([""] * len(rows), pa.string())), None
    note = json.loads(state.read_text(encoding="utf-8"))
    before = {u["id"]: u for u in note["units"]}
    paths = set(note["files"])
    locations = {location for _, location in note["files"].values()}
    marks = []
    for row in rows:
        old = before.get(row["id"])
        if old is None:
            marks.append("added")
        elif (
            _inside(row["id"], paths)
            or (row["path"] and _inside(row["path"], locations))
            or any(old.get(k, row[k]) != row[k] for k in ("chars", "tokens"))
        ):
            marks.append("changed")
        elif any(old[k] != row[k] for k in ("outcome", "reason", "duplicate_of")):
            marks.append("outcome_changed")
        else:
            marks.append("")
    ids = [row["id"] for row in rows]
    summary = {
        "files": {
            kind: sorted(p for p, (k, _) in note["files"].items() if k == kind)
            for kind in ("added", "removed", "changed")
        },
        "units": {
            kind: [i for i, m in zip(ids, marks) if m == kind]
            for kind in ("added", "changed", "outcome_changed")
        }
        | {"removed": sorted(before.keys() - set(ids))},
    }
    return ledger.append_column(CHANGE_COLUMN, pa.array(marks, pa.string())), summary
