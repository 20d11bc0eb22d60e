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
  rewritten. Its window settings must be the ones asked for now, unless this run packs a new length
  with the new settings (a longer window may need a larger pool): a rerun whose settings match no
  output it asks for (a changed ``strategy`` or ``shard_tokens`` alone) is refused, naming the
  setting, like a change of the data, instead of keeping outputs that the config no longer describes;
* a recorded length not yet finished (a killed run): resumed, if its window settings are unchanged;
  refused otherwise, naming the setting (half the folder would be packed one way, half another);
* a new length, or a recorded one whose folder holds nothing (deleted to be packed anew): packed,
  and recorded with the settings asked for.

So adding a length to a finished run packs only that length. Every check happens before the record
is written: a refused run changes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
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
    """Which requested window lengths this run packs (``fresh``: those of them recorded earlier
    whose folder was emptied, whose resume state must go), which finished ones it keeps (``changed``:
    those of them packed with other window settings than asked for now, described), and the run
    record to write before packing (:func:`write_record`)."""

    to_pack: list[int]
    kept: list[int]
    record: dict[str, Any]
    fresh: list[int] = field(default_factory=list)
    changed: dict[int, str] = field(default_factory=dict)


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
    to_pack, kept, fresh, changed = [], [], [], {}
    for seq_len, settings in sorted(windows.items()):
        folder = layout.shard_folder(seq_len)
        before = recorded.get(str(seq_len))
        if before is not None and (folder / MANIFEST_NAME).is_file():
            kept.append(seq_len)
            if before != settings:
                changed[seq_len] = _setting_changes(before, settings)
            continue
        if before is not None and not _folder_holds_files(folder):
            fresh.append(seq_len)  # deleted to be packed anew (or never started): packed as new
        elif before is None and _folder_holds_files(folder):
            raise ConfigError(f"{folder} exists but was not written by this pack run; delete it")
        elif before is not None and before != settings:
            raise ConfigError(
                f"{folder} is half packed with other settings ({_setting_changes(before, settings)}); run "
                f"again with its settings to finish it, or delete {folder} to pack it anew"
            )
        to_pack.append(seq_len)
    if changed and not to_pack and len(changed) == len(kept):
        first = min(changed)
        raise ConfigError(
            f"{layout.shard_folder(first)} was packed with other settings ({changed[first]}); run with its "
            f"settings, or delete {layout.shard_folder(first)} to pack it anew"
        )
    new_record = {DATA: data, OUTPUTS: recorded | {str(n): windows[n] for n in to_pack}}
    return OutputPlan(to_pack, kept, new_record, fresh, changed)


def _setting_changes(before: Mapping[str, Any], now: Mapping[str, Any]) -> str:
    """``pack.strategy: bfd, now concat; ...`` for each window setting that differs."""
    return "; ".join(
        f"{'pack.executor.tasks' if k == 'tasks' else f'pack.{k}'}: {before.get(k)}, now {now.get(k)}"
        for k in _differences(before, now)
    )


def documents_fingerprint(documents: Path, files: Iterable[Path]) -> list[list[Any]]:
    """The curated files (path under ``documents`` and size): a changed input changes the data."""
    return [[f.relative_to(documents).as_posix(), f.stat().st_size] for f in files]
