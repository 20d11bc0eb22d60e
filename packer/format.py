"""The shard file format: Arrow IPC streams of fixed-length windows (specified in ``packer/FORMAT.md``).

A shard is an uncompressed Arrow IPC *stream* holding one record batch, so it can be memory-mapped
and read without copying, and ``datasets.Dataset.from_file`` opens it directly. Its schema metadata
(key ``longctx``) is a JSON :class:`ShardHeader` naming the format version, the tokenizer, the
window length and the config that produced it. A second key, ``huggingface``, declares the columns
as ``datasets`` features and carries the same header as the ``id`` of the ``input_ids`` feature:
``datasets`` replaces the schema metadata with its own but keeps the features, so the header
survives ``Dataset.from_file`` and ``load_dataset("arrow", ...)`` (``longctx.packer.hf.read_header``). Files
are written under a temporary name and renamed, so a reader never sees half a shard.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import xxhash
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from longctx.core.atomic import atomic_file
from longctx.core.errors import LongctxError
from longctx.core.text import plural

FORMAT_NAME = "longctx-packed-windows"
FORMAT_VERSION = 2
METADATA_KEY = b"longctx"
HF_METADATA_KEY = b"huggingface"
SHARD_SUFFIX = ".arrow"


class ShardError(LongctxError):
    """A shard or shard folder is missing, truncated, corrupt, or not what the caller expects."""


class FrozenModel(BaseModel):
    """Immutable record that rejects unknown keys (format records are read from files)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class TokenizerInfo(FrozenModel):
    """The tokenizer the windows were encoded with."""

    sha256: str = Field(description="sha256 of the tokenizer.json bytes")
    vocab_size: int = Field(gt=0, description="including added tokens")
    eos_id: int = Field(ge=0, description="ends every document")
    bos_id: int | None = Field(ge=0, description="starts every document, when BOS is used")
    pad_id: int = Field(ge=0, description="fills the padding segment")


class ShardHeader(FrozenModel):
    """What every shard of one output shares (the manifest repeats it)."""

    format: Literal["longctx-packed-windows"] = FORMAT_NAME
    format_version: int = FORMAT_VERSION
    seq_len: int = Field(gt=1)
    original_context: int = Field(gt=0)
    target_context: int = Field(gt=0)
    strategy: Literal["bfd", "concat"]
    tokenizer: TokenizerInfo
    config_sha256: str


class ShardMetadata(ShardHeader):
    """A shard's schema metadata: the shared header and the file's own row count."""

    rows: int = Field(ge=0)


class ShardFile(FrozenModel):
    """One shard as the manifest lists it."""

    file: str
    rows: int
    bytes: int
    xxh3_128: str


def shard_schema(seq_len: int) -> pa.Schema:
    """Columns of a shard with windows of ``seq_len`` tokens (no metadata)."""
    return pa.schema(
        [
            ("input_ids", pa.list_(pa.int32(), seq_len)),
            ("position_ids", pa.list_(pa.int32(), seq_len)),
            ("loss_mask", pa.list_(pa.uint8(), seq_len)),
            ("cu_seqlens", pa.list_(pa.int32())),
            ("doc_id", pa.list_(pa.string())),
            ("doc_source", pa.list_(pa.string())),
            ("doc_offset", pa.list_(pa.int64())),
            ("doc_length", pa.list_(pa.int64())),
        ]
    )


def hf_features(seq_len: int, header_json: str) -> dict[str, Any]:
    """The shard's columns as ``datasets`` features (``Features.to_dict()`` layout), with
    ``header_json`` as the ``id`` of the ``input_ids`` values, where ``datasets`` keeps it."""

    def values(dtype: str, length: int | None = None, id_: str | None = None) -> dict[str, Any]:
        feature: dict[str, Any] = {"dtype": dtype, "_type": "Value"}
        if id_ is not None:
            feature["id"] = id_
        listed: dict[str, Any] = {"feature": feature}
        if length is not None:
            listed["length"] = length
        return {**listed, "_type": "List"}

    return {
        "input_ids": values("int32", seq_len, header_json),
        "position_ids": values("int32", seq_len),
        "loss_mask": values("uint8", seq_len),
        "cu_seqlens": values("int32"),
        "doc_id": values("string"),
        "doc_source": values("string"),
        "doc_offset": values("int64"),
        "doc_length": values("int64"),
    }


def checksum(data: bytes | memoryview) -> str:
    """xxh3-128 of a file's bytes, as hex (fast enough to verify terabytes)."""
    return xxhash.xxh3_128_hexdigest(data)


def write_shard(path: Path, batch: pa.RecordBatch, header: ShardHeader) -> ShardFile:
    """Write ``batch`` as a shard at ``path`` atomically and return its manifest entry."""
    meta = ShardMetadata(**header.model_dump(), rows=batch.num_rows)
    header_json = meta.model_dump_json()
    hf = {"info": {"features": hf_features(header.seq_len, header_json)}}
    schema = shard_schema(header.seq_len).with_metadata(
        {METADATA_KEY: header_json.encode(), HF_METADATA_KEY: json.dumps(hf).encode()}
    )
    if not batch.schema.equals(schema, check_metadata=False):
        raise ValueError(
            f"batch schema does not match the shard schema:\n{batch.schema}\nexpected:\n{schema}"
        )
    with atomic_file(path, fsync=True) as f:  # streamed: no copy of the whole shard in memory
        with pa.ipc.new_stream(f, schema) as writer:
            writer.write_batch(batch.replace_schema_metadata(schema.metadata))
        size = f.tell()
    return ShardFile(file=path.name, rows=batch.num_rows, bytes=size, xxh3_128=file_checksum(path))


def check_version(header: Any, origin: str) -> None:
    """Refuse a header (parsed JSON) written in a format version this code cannot read, before its
    fields are validated, so the error names the version rather than a field."""
    version = header.get("format_version") if isinstance(header, dict) else None
    if version != FORMAT_VERSION:
        raise ShardError(
            f"{origin}: written in format version {version}; this version of longctx reads {FORMAT_VERSION}"
        )


def _read_metadata(schema: pa.Schema, origin: str) -> ShardMetadata:
    """Parse a shard schema's ``longctx`` metadata; :class:`ShardError` when absent or malformed."""
    raw = (schema.metadata or {}).get(METADATA_KEY)
    if raw is None:
        raise ShardError(f"{origin}: not a longctx shard (no '{METADATA_KEY.decode()}' schema metadata)")
    try:
        data = json.loads(raw)
        check_version(data, origin)
        return ShardMetadata.model_validate(data)
    except (json.JSONDecodeError, ValidationError) as err:
        raise ShardError(f"{origin}: malformed shard metadata: {err}") from None


def open_shard(path: Path, xxh3_128: str | None = None) -> tuple[ShardMetadata, pa.Table]:
    """Memory-map a shard and check that it is complete: the table's buffers point into the map,
    nothing is copied. With ``xxh3_128`` (the manifest's checksum) the mapped bytes are hashed first,
    so a modified file is refused before any of its rows is read. Raises :class:`ShardError` naming
    the file when it is modified, truncated, corrupt, of another format, or holds a different number
    of rows than its metadata says."""
    try:
        source = pa.memory_map(str(path))
        data = source.read_buffer()
        if xxh3_128 is not None and checksum(memoryview(data)) != xxh3_128:
            raise ShardError(
                f"{path}: xxh3_128 differs from the manifest's checksum (the file was modified or damaged "
                "after packing); re-pack it, or restore the file"
            )
        table = pa.ipc.open_stream(data).read_all()
    except FileNotFoundError:
        raise ShardError(f"{path}: shard file not found") from None
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as err:
        raise ShardError(f"{path}: truncated or corrupt shard ({err})") from None
    meta = _read_metadata(table.schema, str(path))
    if table.num_rows != meta.rows:
        raise ShardError(
            f"{path}: truncated shard: holds {plural(table.num_rows, 'row')}, its metadata says {meta.rows}"
        )
    expected = shard_schema(meta.seq_len)
    if not table.schema.equals(expected, check_metadata=False):
        raise ShardError(f"{path}: unexpected columns or types:\n{table.schema}\nexpected:\n{expected}")
    return meta, table


def file_checksum(path: Path) -> str:
    """:func:`checksum` of a file on disk, read through a memory map."""
    with pa.memory_map(str(path)) as source:
        return checksum(memoryview(source.read_buffer()))
