"""Tokenize, mix and pack curated documents into self-describing Arrow shards, and read them back.

The reading side is importable from the package root (imported on first use, so that
``import longctx.packer`` stays cheap for the CLI)::

    from longctx.packer import PackedDataset, PackedLoader, collate_packed
    from longctx.packer import PackedCollator, read_header, to_transformers  # transformers / datasets

Splitting a window over context-parallel ranks is the trainer's job
(``longctx.trainer.parallel.zigzag``).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "PackedDataset": "longctx.packer.dataset",
    "PackedLoader": "longctx.packer.loader",
    "collate_packed": "longctx.packer.dataset",
    "row_to_sample": "longctx.packer.dataset",
    "IGNORE_INDEX": "longctx.packer.dataset",
    "ShardSet": "longctx.packer.reader",
    "PackedRow": "longctx.packer.reader",
    "FORMAT_VERSION": "longctx.packer.format",
    "ShardError": "longctx.packer.format",
    "run_pack": "longctx.packer.run",
    "read_header": "longctx.packer.hf",
    "to_transformers": "longctx.packer.hf",
    "PackedCollator": "longctx.packer.hf",
}

__all__ = [  # noqa: RUF022 - grouped like _EXPORTS
    "PackedDataset",
    "PackedLoader",
    "collate_packed",
    "row_to_sample",
    "IGNORE_INDEX",
    "ShardSet",
    "PackedRow",
    "FORMAT_VERSION",
    "ShardError",
    "run_pack",
    "read_header",
    "to_transformers",
    "PackedCollator",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'longctx.packer' has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
