"""Random access to the rows of one output folder (``shards/seq<N>/``) through memory maps.

:class:`ShardSet` trusts nothing it has not checked: the folder must have a manifest whose format
version (and, when the caller says, tokenizer fingerprint) is the one expected; every shard's bytes
are hashed against the manifest's ``xxh3_128`` and its header compared with the manifest's when it
is first opened; and :meth:`ShardSet.tokens`, what the training loader reads, returns only rows that
passed the cheap row invariants (:mod:`longctx.packer.rowcheck`), checked a block of about
:data:`CHECK_BLOCK_TOKENS` tokens at a time when a block is first read. Rows come back as numpy views
of the mapped files. Every file access goes through :meth:`ShardSet._read`, the one place a remote
storage backend has to replace.

What has been verified (shards hashed, blocks checked) is kept in memory shared with the processes
forked from the one holding the ShardSet, such as DataLoader workers: a shard one worker hashed, or a
block it checked, is not hashed or checked again by the others, nor by the workers of the next pass,
as long as the file is provably the one that was hashed (same device, inode, size, modification and
change times before and after it is mapped).
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from longctx.core.remote import is_remote
from longctx.core.text import plural
from longctx.core.tokenizer import tokenizer_fingerprint
from longctx.packer.format import FORMAT_VERSION, ShardError, ShardMetadata, open_shard
from longctx.packer.manifest import Manifest, load_manifest
from longctx.packer.remote import fetch_shards
from longctx.packer.rowcheck import RowTokens, check_row, rows_are_valid

CHECK_BLOCK_TOKENS = 1 << 20
"""Rows are checked in blocks of consecutive rows of about this many tokens (at least one row): big
enough that numpy's cost per call vanishes, small enough that a shard's first row is served without
checking the whole shard, and that the checks' temporary arrays stay a few megabytes."""

_UNCHECKED, _VALID, _ROW_BY_ROW = 0, 1, 2  # states of a block of rows


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


def _single_chunk(column: pa.ChunkedArray) -> pa.Array:
    """The column as one array: its only chunk (a shard holds one record batch) without a copy;
    ``combine_chunks`` would copy even a single chunk out of the memory map."""
    return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()


def _values(array: pa.Array, name: str) -> np.ndarray:
    """The values of a primitive ``array`` as a numpy view of its data buffer (zero-copy); refuses
    nulls, which a shard's token columns never hold. pyarrow's ``to_numpy`` would import pandas on
    its first call (0.15-0.3 s of CPU, in every DataLoader worker forked from a training process
    that has not imported it)."""
    if array.null_count:
        raise ShardError(f"column {name} holds null values; the shard is damaged, re-pack it")
    dtype = np.dtype(array.type.to_pandas_dtype())
    if not len(array):  # an empty array may have no data buffer
        return np.empty(0, dtype)
    return np.frombuffer(array.buffers()[1], dtype, len(array), array.offset * dtype.itemsize)


def _is_null(array: pa.Array, index: np.ndarray) -> np.ndarray:
    """Whether the entries ``index`` of ``array`` are null, read from its validity bitmap."""
    bitmap = array.buffers()[0]
    if bitmap is None:
        return np.zeros(len(index), bool)
    at = index + array.offset
    return (np.frombuffer(bitmap, np.uint8)[at >> 3] >> (at & 7)) & 1 == 0


class ShardColumns:
    """Numpy views of one shard's columns (zero-copy from the memory map), read without importing
    pandas or ``pyarrow.compute`` (see :func:`_values`): a DataLoader worker forked from a training
    process that never read a shard would import them on its first shard."""

    def __init__(self, meta: ShardMetadata, table: pa.Table) -> None:
        self.meta = meta
        self.table = table
        seq_len = meta.seq_len
        self.input_ids = self._tokens("input_ids", seq_len)
        self.position_ids = self._tokens("position_ids", seq_len)
        self.loss_mask = self._tokens("loss_mask", seq_len)
        cu = _single_chunk(table.column("cu_seqlens"))
        self.cu_offsets = _values(cu.offsets, "cu_seqlens")
        self.cu_values = _values(cu.values, "cu_seqlens")
        doc_id = _single_chunk(table.column("doc_id"))
        ends = _values(doc_id.offsets, "doc_id").astype(np.int64)
        # whether each row's last segment is padding (a null doc_id), read once per shard
        self.last_is_pad = np.zeros(table.num_rows, bool)
        filled = ends[1:] > ends[:-1]
        self.last_is_pad[filled] = _is_null(doc_id.values, ends[1:][filled] - 1)

    def _tokens(self, name: str, seq_len: int) -> np.ndarray:
        windows = _single_chunk(self.table.column(name))
        if windows.null_count:
            raise ShardError(f"column {name} holds null rows; the shard is damaged, re-pack it")
        # the child values of the array's rows (``flatten`` would import pyarrow.compute: 50 ms)
        first = windows.offset * seq_len
        return _values(windows.values, name)[first : first + len(windows) * seq_len].reshape(-1, seq_len)

    @property
    def block_rows(self) -> int:
        """Rows per block of :meth:`block_is_valid`."""
        return max(1, CHECK_BLOCK_TOKENS // self.meta.seq_len)

    def block_is_valid(self, block: int, vocab_size: int) -> bool:
        """Whether every row of block ``block`` passes :func:`~longctx.packer.rowcheck.check_row`."""
        first = block * self.block_rows
        end = min(first + self.block_rows, self.table.num_rows)
        offsets = self.cu_offsets[first : end + 1]
        return rows_are_valid(
            self.input_ids[first:end],
            self.position_ids[first:end],
            self.loss_mask[first:end],
            self.cu_values[offsets[0] : offsets[-1]],
            offsets,
            self.last_is_pad[first:end],
            vocab_size,
        )

    def segment_lengths(self) -> np.ndarray:
        """Lengths of every segment (padding included), row after row."""
        steps = np.diff(self.cu_values.astype(np.int64))
        inside = np.ones(len(steps), bool)
        inside[self.cu_offsets[1:-1] - 1] = False  # the step from one row's end to the next row's 0
        return steps[inside]

    def tokens(self, i: int) -> RowTokens:
        """The token columns of row ``i`` (views, no provenance: what training reads)."""
        return RowTokens(
            input_ids=self.input_ids[i],
            position_ids=self.position_ids[i],
            loss_mask=self.loss_mask[i],
            cu_seqlens=self.cu_values[self.cu_offsets[i] : self.cu_offsets[i + 1]],
            padded=bool(self.last_is_pad[i]),
        )

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


def _identity(path: Path) -> list[int] | None:
    """What tells a file apart from one written in its place: device, inode, size, modification and
    change times (the change time moves on any write or metadata change and cannot be set back), as
    unsigned 64-bit values; None when the file cannot be seen."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return [
        v & 0xFFFF_FFFF_FFFF_FFFF for v in (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    ]


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
    ``vocab_size`` (e.g. the model's embedding rows) bounds the token ids :meth:`tokens` accepts,
    besides the tokenizer's vocabulary from the header.

    ``folder`` may be an fsspec URL (``s3://bucket/run/shards/seq65536``): the folder is then copied
    into ``cache`` first (default: the user's cache, ``~/.cache/longctx``; see
    :func:`longctx.packer.remote.fetch_shards`), reusing the cached shards that are still intact;
    ``storage_options`` are fsspec's (credentials, endpoint). :attr:`source` keeps the URL.

    Processes forked from the one holding a ShardSet (DataLoader workers) share what it has
    verified (see the module's docstring). A ShardSet can also be pickled (e.g. to a DataLoader
    worker started with ``spawn``): the memory maps are not sent, the worker maps the files again,
    and what was verified before pickling is not verified again (files unchanged); what the copy
    verifies afterwards stays its own.
    """

    def __init__(
        self,
        folder: str | os.PathLike,
        *,
        tokenizer: str | os.PathLike | None = None,
        format_version: int = FORMAT_VERSION,
        vocab_size: int | None = None,
        cache: str | os.PathLike | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.source = os.fspath(folder)
        if is_remote(folder):
            folder = fetch_shards(os.fspath(folder), cache, storage_options)
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
        if vocab_size is not None and vocab_size <= 0:
            raise ValueError(f"vocab_size must be positive, got {vocab_size}")
        self.vocab_size = min(header.tokenizer.vocab_size, vocab_size or header.tokenizer.vocab_size)
        rows = [shard.rows for shard in self.manifest.shards]
        self._starts = np.concatenate([[0], np.cumsum(rows, dtype=np.int64)])
        self._open: dict[int, ShardColumns] = {}
        block_rows = max(1, CHECK_BLOCK_TOKENS // header.seq_len)
        blocks = [-(-r // block_rows) for r in rows]
        self._first_block = np.concatenate([[0], np.cumsum(blocks, dtype=np.int64)])
        self._share_state(None)

    def _share_state(self, verified: bytes | None) -> None:
        """Keep what is verified in an anonymous shared mapping (inherited by forked processes, no
        file to clean up): per shard the identity of the file as hashed (:func:`_identity`, then 1
        once hashed), then one state byte per block of rows."""
        shards, blocks = len(self.manifest.shards), int(self._first_block[-1])
        self._state = mmap.mmap(-1, 48 * shards + blocks + 1)
        if verified is not None:
            self._state[: len(verified)] = verified
        self._hashed_as = np.ndarray((shards, 6), np.uint64, self._state)
        self._blocks = np.ndarray(blocks, np.uint8, self._state, 48 * shards)

    def __getstate__(self) -> dict:
        shared = ("_state", "_hashed_as", "_blocks")
        state = {key: value for key, value in self.__dict__.items() if key not in shared}
        return {**state, "_open": {}, "_verified": bytes(self._state)}

    def __setstate__(self, state: dict) -> None:
        verified = state.pop("_verified")
        self.__dict__.update(state)
        self._share_state(verified)

    @property
    def seq_len(self) -> int:
        return self.manifest.header.seq_len

    def __len__(self) -> int:
        return int(self._starts[-1])

    def _read(self, index: int) -> tuple[ShardMetadata, pa.Table]:
        """Map shard ``index`` and check its bytes against the manifest's checksum, unless the file
        is the one this ShardSet (or a process sharing its state) already hashed, with the same
        identity before and after mapping it. The only place that touches the shard files."""
        entry = self.manifest.shards[index]
        path = self.folder / entry.file
        known = self._hashed_as[index]
        if known[5] == 1 and _identity(path) == known[:5].tolist():
            meta, table = open_shard(path)
            if _identity(path) == known[:5].tolist():
                return meta, table
        before = _identity(path)
        meta, table = open_shard(path, entry.xxh3_128)
        if before is not None and _identity(path) == before:  # the file mapped is the file hashed
            known[5] = 0
            known[:5] = before
            known[5] = 1
        return meta, table

    def shard(self, index: int) -> ShardColumns:
        """Shard ``index`` of the manifest, opened (and checked against the manifest) on first use."""
        if index not in self._open:
            entry = self.manifest.shards[index]
            meta, table = self._read(index)
            shared = meta.model_dump(exclude={"rows"})
            if shared != self.manifest.header.model_dump() or meta.rows != entry.rows:
                raise ShardError(f"{self.folder / entry.file}: header or row count differs from the manifest")
            try:
                self._open[index] = ShardColumns(meta, table)
            except ShardError as error:
                raise ShardError(f"{self.folder / entry.file}: {error}") from None
        return self._open[index]

    def locate(self, row: int) -> tuple[int, int]:
        """``(shard index, row inside it)`` of a global row index."""
        if not 0 <= row < len(self):
            raise IndexError(f"row {row} out of range: {self.folder} has {plural(len(self), 'row')}")
        index = int(np.searchsorted(self._starts, row, side="right")) - 1
        return index, row - int(self._starts[index])

    def row(self, row: int) -> PackedRow:
        """Row ``row`` with its provenance (for inspection; not checked row by row)."""
        index, local = self.locate(row)
        return self.shard(index).row(local)

    def tokens(self, row: int) -> RowTokens:
        """The token columns of row ``row``, after checking its row invariants; a violation raises
        :class:`ShardError` naming the file, the row inside it and the field.

        Rows are checked a block at a time (:meth:`ShardColumns.block_is_valid`) when their block is
        first read; only in a block that fails is each row checked as it is served, so the rows
        before a damaged one are served and the error names the damaged row."""
        index, local = self.locate(row)
        shard = self.shard(index)
        block = int(self._first_block[index]) + local // shard.block_rows
        state = self._blocks[block]
        if state == _UNCHECKED:
            valid = shard.block_is_valid(local // shard.block_rows, self.vocab_size)
            state = self._blocks[block] = _VALID if valid else _ROW_BY_ROW
        tokens = shard.tokens(local)
        if state != _VALID:
            check_row(tokens, self.vocab_size, self.manifest.shards[index].file, local, self.folder)
        return tokens

    def verify(self) -> None:
        """Hash every shard and check every row now, as reading them all would (e.g. before starting
        DataLoader workers, which then share the result); raises :class:`ShardError` at the first
        violation, naming the file, and for a row invariant the row and the field."""
        for index in range(len(self.manifest.shards)):
            shard, start = self.shard(index), int(self._starts[index])
            for first in range(0, shard.table.num_rows, shard.block_rows):
                self.tokens(start + first)  # checks the block
                if self._blocks[int(self._first_block[index]) + first // shard.block_rows] != _VALID:
                    for local in range(first + 1, min(first + shard.block_rows, shard.table.num_rows)):
                        self.tokens(start + local)
