"""The pack run record (``<output>/work/pack/run.json``): what the run's outputs were made from.

The outputs of a run (one ``shards/seq<N>/`` per window length) share their *data*: the curated
documents, the tokenizer, the context, and the settings that decide which tokens every window holds
(the mix, its total and seed, the special tokens). Each output also has its own *window settings*:
the strategy, pool and shard sizes, and task count. The record keeps both::

    {"data": {"documents": [...], "tokenizer_sha256": "...", "context": {...}, "pack.mix": ..., ...},
     "outputs": {"1024": {"strategy": "bfd", "pool_tokens": ..., "shard_tokens": ..., "tasks": 2}, ...}}

and :func:`plan_outputs` decides from it what a new run may do:

* other data than recorded: refused, naming what changed (the outputs would disagree);
* a window length whose output is finished (its manifest is written): kept as it is, never
  rewritten, whatever the window settings are now;
* a recorded length not yet finished (a killed run): resumed, if its window settings are unchanged;
  refused otherwise, naming the setting (half the folder would be packed one way, half another);
* a new length: packed (its folder must be empty), and added to the record.

So adding a length to a finished run packs only that length. Every check happens before the record
is written: a refused run changes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from longctx.core.atomic import write_json
from longctx.core.errors import ConfigError
from longctx.core.layout import RunLayout
from longctx.packer.manifest import MANIFEST_NAME

DATA = "data"
OUTPUTS = "outputs"


@dataclass(frozen=True)
class OutputPlan:
    """Which requested window lengths this run packs, which finished ones it keeps, and the run
    record to write before packing (:func:`write_record`)."""

    to_pack: list[int]
    kept: list[int]
    record: dict[str, Any]


def write_record(layout: RunLayout, plan: OutputPlan) -> None:
    """Record the outputs about to be packed (nothing to do when none is)."""
    if plan.to_pack:
        write_json(layout.run_record, plan.record, indent=1)


def _folder_holds_files(folder: Path) -> bool:
    return folder.is_dir() and any(folder.iterdir())


def _differences(before: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    return sorted(k for k in set(before) | set(now) if before.get(k) != now.get(k))


def read_record(layout: RunLayout) -> dict[str, Any] | None:
    """The run record, or None before the run's first pack."""
    if not layout.run_record.is_file():
        return None
    try:
        record = json.loads(layout.run_record.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ConfigError(f"{layout.run_record}: damaged run record ({err}); delete {layout.work}") from None
    if not isinstance(record, dict) or DATA not in record or OUTPUTS not in record:
        raise ConfigError(
            f"{layout.run_record} was written by an older version of longctx pack; delete "
            f"{layout.shards} and {layout.work} and pack again"
        )
    return record


def plan_outputs(
    layout: RunLayout, data: dict[str, Any], windows: Mapping[int, dict[str, Any]]
) -> OutputPlan:
    """Check the requested outputs (``windows``: seq_len -> window settings) against the record and
    say which to pack and which are finished (see the module docstring). Writes nothing."""
    record = read_record(layout)
    if record is None:
        if _folder_holds_files(layout.shards):
            raise ConfigError(
                f"{layout.shards} exists but was not written by this pack run; "
                "delete it or choose another output"
            )
        record = {DATA: data, OUTPUTS: {}}
    changed = _differences(record[DATA], data)
    if changed:
        raise ConfigError(
            f"{layout.shards} holds pack outputs made from other data (different {', '.join(changed)}); "
            f"delete {layout.shards} and {layout.work}, or choose another output"
        )
    recorded: dict[str, Any] = record[OUTPUTS]
    to_pack, kept = [], []
    for seq_len, settings in sorted(windows.items()):
        folder = layout.shard_folder(seq_len)
        before = recorded.get(str(seq_len))
        if before is not None and (folder / MANIFEST_NAME).is_file():
            kept.append(seq_len)
            continue
        if before is None and _folder_holds_files(folder):
            raise ConfigError(f"{folder} exists but was not written by this pack run; delete it")
        if before is not None and before != settings:
            keys = ", ".join(
                f"pack.{k}" if k != "tasks" else "pack.executor.tasks" for k in _differences(before, settings)
            )
            raise ConfigError(
                f"{folder} is half packed with other settings (different {keys}); run again with its "
                f"settings to finish it, or delete {folder} to pack it anew"
            )
        to_pack.append(seq_len)
    new_record = {DATA: data, OUTPUTS: recorded | {str(n): windows[n] for n in to_pack}}
    return OutputPlan(to_pack, kept, new_record)


def documents_fingerprint(documents: Path, files: Iterable[Path]) -> list[list[Any]]:
    """The curated files (path under ``documents`` and size): a changed input changes the data."""
    return [[f.relative_to(documents).as_posix(), f.stat().st_size] for f in files]
