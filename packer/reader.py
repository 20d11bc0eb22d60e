"""Random access to the rows of one output folder (``shards/seq<N>/``) through memory maps.

:class:`ShardSet` trusts nothing it has not checked: the folder must have a manifest whose format
version (and, when the caller says, tokenizer fingerprint) is the one expected, and every shard is
checked against the manifest when first opened. Rows come back as numpy views of the mapped files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from longctx.core.tokenizer import tokenizer_fingerprint
from longctx.packer.format import FORMAT_VERSION, ShardError, ShardMetadata, open_shard
from longctx.packer.manifest import Manifest, load_manifest


@dataclass(frozen=True)
class PackedRow:
    """One window. Token arrays have ``seq_len`` entries; ``cu_seqlens`` has one more entry than
    there are segments, and the ``doc_*`` lists one per segment (None for padding)."""

    input_ids: np.ndarray
    position_ids: np.ndarray
    loss_mask: np.ndarray
    cu_seqlens: np.ndarray
    doc_id: list[str | None]
    doc_source: list[str | None]
    doc_offset: list[int | None]
    doc_length: list[int | None]


class ShardColumns:
    """Numpy views of one shard's columns (zero-copy from the memory map)."""

    def __init__(self, meta: ShardMetadata, table: pa.Table) -> None:
        self.meta = meta
        self.table = table
        seq_len = meta.seq_len
        self.input_ids = self._tokens("input_ids", seq_len)
        self.position_ids = self._tokens("position_ids", seq_len)
        self.loss_mask = self._tokens("loss_mask", seq_len)
        cu = table.column("cu_seqlens").combine_chunks()
        self.cu_offsets = cu.offsets.to_numpy()
        self.cu_values = cu.values.to_numpy()

    def _tokens(self, name: str, seq_len: int) -> np.ndarray:
        array = self.table.column(name).combine_chunks()
        return array.flatten().to_numpy(zero_copy_only=True).reshape(-1, seq_len)

    def segment_lengths(self) -> np.ndarray:
        """Lengths of every segment (padding included), row after row."""
        steps = np.diff(self.cu_values.astype(np.int64))
        inside = np.ones(len(steps), bool)
        inside[self.cu_offsets[1:-1] - 1] = False  # the step from one row's end to the next row's 0
        return steps[inside]

    def row(self, i: int) -> PackedRow:
        segments = {
            name: self.table.column(name)[i].as_py()
            for name in ("doc_id", "doc_source", "doc_offset", "doc_length")
        }
        return PackedRow(
            input_ids=self.input_ids[i],
            position_ids=self.position_ids[i],
            loss_mask=self.loss_mask[i],
            cu_seqlens=self.cu_values[self.cu_offsets[i] : self.cu_offsets[i + 1]],
            **segments,
        )


def expected_fingerprint(tokenizer: str | os.PathLike) -> str:
    """A tokenizer fingerprint from a ``tokenizer.json`` path or a sha256 hex digest."""
    if Path(tokenizer).is_file():
        return tokenizer_fingerprint(tokenizer)
    text = str(tokenizer)
    if len(text) == 64 and all(c in "0123456789abcdef" for c in text):
        return text
    raise ValueError(f"expected a tokenizer.json path or a sha256 hex digest, got {text!r}")


class ShardSet:
    """The rows of an output folder, in manifest order (task by task, shard by shard).

    ``tokenizer`` (a ``tokenizer.json`` path or its sha256) is the tokenizer the caller will train
    with; shards encoded with another one are refused, as are shards of another format version.
    """

    def __init__(
        self,
        folder: str | os.PathLike,
        *,
        tokenizer: str | os.PathLike | None = None,
        format_version: int = FORMAT_VERSION,
    ) -> None:
        self.folder = Path(folder)
        self.manifest: Manifest = load_manifest(self.folder)
        header = self.manifest.header
        if header.format_version != format_version:
            raise ShardError(
                f"{self.folder}: shards are format version {header.format_version}, this reader expects "
                f"{format_version}; re-pack them with this version of longctx"
            )
        if tokenizer is not None and header.tokenizer.sha256 != expected_fingerprint(tokenizer):
            raise ShardError(
                f"{self.folder}: shards were encoded with tokenizer {header.tokenizer.sha256[:12]}…, not the "
                f"expected {expected_fingerprint(tokenizer)[:12]}…; re-pack with the tokenizer you train with"
            )
        rows = [shard.rows for shard in self.manifest.shards]
        self._starts = np.concatenate([[0], np.cumsum(rows, dtype=np.int64)])
        self._open: dict[int, ShardColumns] = {}

    @property
    def seq_len(self) -> int:
        return self.manifest.header.seq_len

    def __len__(self) -> int:
        return int(self._starts[-1])

    def shard(self, index: int) -> ShardColumns:
        """Shard ``index`` of the manifest, opened (and checked against the manifest) on first use."""
        if index not in self._open:
            entry = self.manifest.shards[index]
            meta, table = open_shard(self.folder / entry.file)
            shared = meta.model_dump(exclude={"rows"})
            if shared != self.manifest.header.model_dump() or meta.rows != entry.rows:
                raise ShardError(f"{self.folder / entry.file}: header or row count differs from the manifest")
            self._open[index] = ShardColumns(meta, table)
        return self._open[index]

    def locate(self, row: int) -> tuple[int, int]:
        """``(shard index, row inside it)`` of a global row index."""
        if not 0 <= row < len(self):
            raise IndexError(f"row {row} out of range: {self.folder} has {len(self)} rows")
        index = int(np.searchsorted(self._starts, row, side="right")) - 1
        return index, row - int(self._starts[index])

    def row(self, row: int) -> PackedRow:
        index, local = self.locate(row)
        return self.shard(index).row(local)
