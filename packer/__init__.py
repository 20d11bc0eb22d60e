"""Tokenize, mix and pack curated documents into self-describing Arrow shards, and read them back.

The reading side is importable from the package root (imported on first use, so that
``import packer`` stays cheap for the CLI)::

    from packer import PackedDataset, collate_packed, zigzag_split
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "PackedDataset": "packer.dataset",
    "collate_packed": "packer.dataset",
    "row_to_sample": "packer.dataset",
    "IGNORE_INDEX": "packer.dataset",
    "ShardSet": "packer.reader",
    "PackedRow": "packer.reader",
    "ContextParallelShard": "packer.cp",
    "zigzag_split": "packer.cp",
    "zigzag_indices": "packer.cp",
    "FORMAT_VERSION": "packer.format",
    "ShardError": "packer.format",
    "run_pack": "packer.run",
}

__all__ = [  # noqa: RUF022 - grouped like _EXPORTS
    "PackedDataset",
    "collate_packed",
    "row_to_sample",
    "IGNORE_INDEX",
    "ShardSet",
    "PackedRow",
    "ContextParallelShard",
    "zigzag_split",
    "zigzag_indices",
    "FORMAT_VERSION",
    "ShardError",
    "run_pack",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'packer' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
