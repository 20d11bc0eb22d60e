"""Pre-extracted text (JSONL, Parquet, ``datasets.save_to_disk`` folders) through datatrove's readers.

datatrove's readers silently skip rows without text; here the adapter turns such rows into
placeholder documents with a ``skip_reason`` so that the ledger records them. Ids are
``"{source}/{row id}"`` when rows carry an id column (``id_key``), else ``"{source}/{file}/{row}"``;
the curation ledger refuses ids that are not unique.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from datatrove.pipeline.readers import HuggingFaceDatasetReader, JsonlReader, ParquetReader
from datatrove.pipeline.readers.base import BaseReader

from longctx.pipeline.readers.base import normalize_newlines

_PLACEHOLDER = " "  # datatrove drops documents whose text is falsy; the ReadableFilter drops this one


def _adapter(self: BaseReader, data: dict, path: str, id_in_file: int | str) -> dict[str, Any]:
    source = self.default_metadata["source"]
    text = data.pop(self.text_key, None)
    original_id = data.pop(self.id_key, None)
    metadata: dict[str, Any] = {"path": str(path), "skip_reason": ""}
    if not isinstance(text, str):
        metadata["skip_reason"] = "missing_text" if text is None else "text_not_a_string"
        text = _PLACEHOLDER
    elif not text.strip():
        metadata["skip_reason"] = "empty"
        text = _PLACEHOLDER
    else:
        text = normalize_newlines(text)
    if not metadata["skip_reason"]:
        del metadata["skip_reason"]
    doc_id = f"{source}/{original_id}" if original_id is not None else f"{source}/{path}/{id_in_file}"
    return {"text": text, "id": doc_id, "metadata": metadata}


def make_tabular_reader(
    kind: str,
    path: str | os.PathLike,
    source: str,
    text_key: str = "text",
    id_key: str = "id",
    glob: str | None = None,
    limit: int = -1,
) -> BaseReader:
    """A datatrove reader for ``kind`` in ``{"jsonl", "parquet", "hf_dataset"}`` that tags every
    document with ``source`` and records unusable rows instead of dropping them."""
    common = {
        "adapter": _adapter,
        "text_key": text_key,
        "id_key": id_key,
        "default_metadata": {"source": source},
        "limit": limit,
    }
    if kind == "jsonl":
        return JsonlReader(str(path), glob_pattern=glob or "**/*.jsonl*", recursive=True, **common)
    if kind == "parquet":
        return ParquetReader(str(path), glob_pattern=glob or "**/*.parquet", recursive=True, **common)
    if kind == "hf_dataset":
        if not (Path(path) / "dataset_info.json").exists() and not (Path(path) / "state.json").exists():
            raise ValueError(
                f"{path} is not a datasets.save_to_disk folder (no dataset_info.json/state.json)"
            )
        return HuggingFaceDatasetReader(str(path), load_from_disk=True, **common)
    raise ValueError(f"unknown tabular kind {kind!r}")
