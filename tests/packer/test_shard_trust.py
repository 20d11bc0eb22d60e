"""The loader never serves data it has not checked: shards damaged in the test, each refused by
``PackedDataset`` with one ShardError naming the file, the row and the field.

Two kinds of damage: bytes changed behind the manifest's back (caught by the checksum when the
shard is first opened), and shards rewritten with a matching manifest entry, as a buggy or hostile
writer would leave them (caught by the per-row invariants of ``longctx.packer.rowcheck``).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from longctx.packer import PackedDataset, PackedLoader, ShardError
from longctx.packer.format import ShardHeader, open_shard, write_shard
from tests.packer.test_pack_helpers import PackedRun

pytest_plugins = ["tests.packer.test_pack_helpers"]  # the shared packed_run fixture

SEQ_LEN = 256
SHARD = 1  # the manifest's second shard: rows of the first shard are served fine before it


def copy_folder(run: PackedRun, tmp_path: Path) -> tuple[Path, dict]:
    folder = tmp_path / "seq"
    shutil.copytree(run.folder(SEQ_LEN), folder)
    return folder, json.loads((folder / "manifest.json").read_text())


def rewrite(folder: Path, change: Callable[[dict[str, np.ndarray]], None], shard: int = SHARD) -> str:
    """Rewrite shard ``shard`` with its token columns changed by ``change`` (a dict of
    ``[rows, seq_len]`` arrays and ``cu_seqlens`` lists), and its manifest entry to match."""
    manifest = json.loads((folder / "manifest.json").read_text())
    entry = manifest["shards"][shard]
    path = folder / entry["file"]
    meta, table = open_shard(path)
    columns = {
        name: table.column(name).combine_chunks().flatten().to_numpy().reshape(-1, SEQ_LEN).copy()
        for name in ("input_ids", "position_ids", "loss_mask")
    }
    change(columns)
    arrays = {name: table.column(name).combine_chunks() for name in table.column_names}
    for name, values in columns.items():
        arrays[name] = pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), SEQ_LEN)
    batch = pa.RecordBatch.from_pydict(arrays, schema=table.schema)
    entry.update(write_shard(path, batch, ShardHeader(**meta.model_dump(exclude={"rows"}))).model_dump())
    (folder / "manifest.json").write_text(json.dumps(manifest))
    return entry["file"]


def serve_all(folder: Path, run: PackedRun, **kwargs: object) -> None:
    ds = PackedDataset(folder, tokenizer=run.tokenizer_path, shuffle=False, **kwargs)
    for _ in ds:
        pass


def test_the_undamaged_folder_is_served(packed_run: PackedRun, tmp_path: Path) -> None:
    folder, _ = copy_folder(packed_run, tmp_path)
    serve_all(folder, packed_run)


def test_flipped_bytes_are_refused_by_the_checksum(packed_run: PackedRun, tmp_path: Path) -> None:
    folder, manifest = copy_folder(packed_run, tmp_path)
    path = folder / manifest["shards"][SHARD]["file"]
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one token id, somewhere in the middle: still a readable shard
    path.write_bytes(bytes(data))
    with pytest.raises(ShardError, match=rf"{path.name}: xxh3_128 differs from the manifest"):
        serve_all(folder, packed_run)


def test_random_ids_are_refused(packed_run: PackedRun, tmp_path: Path) -> None:
    rng = np.random.default_rng(0)

    def randomize(c: dict[str, np.ndarray]) -> None:
        c["input_ids"][:] = rng.integers(0, 2**31 - 1, c["input_ids"].shape, dtype=np.int32)

    folder, manifest = copy_folder(packed_run, tmp_path)
    before = manifest["shards"][SHARD]["xxh3_128"]
    file = rewrite(folder, randomize)
    # behind the manifest's back: the checksum
    (folder / "manifest.json").write_text(
        (folder / "manifest.json")
        .read_text()
        .replace(json.loads((folder / "manifest.json").read_text())["shards"][SHARD]["xxh3_128"], before)
    )
    with pytest.raises(ShardError, match=rf"{file}: xxh3_128 differs"):
        serve_all(folder, packed_run)
    # with a matching manifest: the vocabulary check of the first row
    folder2, _ = copy_folder(packed_run, tmp_path / "2")
    rewrite(folder2, randomize)
    with pytest.raises(
        ShardError, match=rf"{file} row 0: input_ids: token 0 has id \d+, outside the vocabulary \[0, 320\)"
    ):
        serve_all(folder2, packed_run)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (
            lambda c: c["loss_mask"].fill(1),
            r"row 0: loss_mask: 1 at token 0, the start of segment 0; a segment's "
            r"first token is never a target",
        ),
        (
            lambda c: c["position_ids"].__iadd__(100_000),
            r"row 0: position_ids: segment 0 starts at token 0 with position 100000, expected 0",
        ),
        (
            lambda c: c["input_ids"][3].__setitem__(17, 320),
            r"row 3: input_ids: token 17 has id 320, outside the vocabulary \[0, 320\)",
        ),
        (
            lambda c: c["input_ids"][2].__setitem__(5, -4),
            r"row 2: input_ids: token 5 has id -4, outside the vocabulary",
        ),
        (
            lambda c: c["position_ids"][4].__setitem__(9, c["position_ids"][4][9] + 1),
            r"row 4: position_ids: token 9 has position \d+ after \d+; positions must rise by 1",
        ),
        (
            lambda c: c["loss_mask"][1].__setitem__(7, 2),
            r"row 1: loss_mask: token 7 is 2; the mask holds 0 or 1",
        ),
    ],
    ids=[
        "loss_mask_all_ones",
        "positions_shifted",
        "id_equal_to_vocab",
        "negative_id",
        "position_gap",
        "mask_value",
    ],
)
def test_rows_breaking_an_invariant_are_refused(
    packed_run: PackedRun, tmp_path: Path, damage: Callable[[dict[str, np.ndarray]], None], message: str
) -> None:
    folder, _ = copy_folder(packed_run, tmp_path)
    file = rewrite(folder, damage)
    with pytest.raises(ShardError, match=rf"{folder / file} {message}") as caught:
        serve_all(folder, packed_run)
    assert "\n" not in str(caught.value)
    # through DataLoader workers too: the worker's error reaches the training process
    with pytest.raises(Exception, match=message):
        for _ in PackedLoader(
            PackedDataset(folder, tokenizer=packed_run.tokenizer_path, shuffle=False), num_workers=1
        ):
            pass


def test_padding_marked_as_a_target_is_refused(packed_run: PackedRun, tmp_path: Path) -> None:
    folder, _ = copy_folder(packed_run, tmp_path)
    ds = PackedDataset(folder, tokenizer=packed_run.tokenizer_path)
    row = next(r for r in range(len(ds.shards)) if ds.shards.row(r).doc_id[-1] is None)
    shard, padded = ds.shards.locate(row)
    last_start = int(ds.shards.row(row).cu_seqlens[-2])

    def mark(c: dict[str, np.ndarray]) -> None:
        c["loss_mask"][padded, last_start + 1 :] = 1

    rewrite(folder, mark, shard)
    with pytest.raises(
        ShardError, match=rf"row {padded}: loss_mask: 1 at token {last_start + 1}, inside the padding segment"
    ):
        serve_all(folder, packed_run)


def test_ids_beyond_the_models_vocabulary_are_refused(packed_run: PackedRun, tmp_path: Path) -> None:
    folder, _ = copy_folder(packed_run, tmp_path)
    with pytest.raises(
        ShardError, match=r"row \d+: input_ids: token \d+ has id \d+, outside the vocabulary \[0, 100\)"
    ):
        serve_all(folder, packed_run, vocab_size=100)


def test_workers_share_what_was_verified(
    packed_run: PackedRun, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each shard is hashed and each block of rows checked once, by whichever process reads it
    first: the workers of a later pass (forked again) and the training process reuse it."""
    import longctx.packer.format as format_module
    import longctx.packer.reader as reader_module

    folder, manifest = copy_folder(packed_run, tmp_path)
    calls = tmp_path / "calls.txt"  # appended to by the worker processes too

    def counted(name: str, function: Callable) -> Callable:
        def wrapper(*args: object) -> object:
            with calls.open("a") as log:
                log.write(name + "\n")
            return function(*args)

        return wrapper

    monkeypatch.setattr(format_module, "checksum", counted("hash", format_module.checksum))
    monkeypatch.setattr(reader_module, "rows_are_valid", counted("check", reader_module.rows_are_valid))
    ds = PackedDataset(folder, tokenizer=packed_run.tokenizer_path, shuffle=False)
    blocks = sum(
        -(-entry["rows"] // max(1, reader_module.CHECK_BLOCK_TOKENS // SEQ_LEN))
        for entry in manifest["shards"]
    )
    first = [batch["input_ids"] for batch in PackedLoader(ds, num_workers=1)]
    logged = calls.read_text().split()
    assert logged.count("hash") == len(manifest["shards"]) and logged.count("check") == blocks
    second = [batch["input_ids"] for batch in PackedLoader(ds, num_workers=2)]
    in_process = [ds[row]["input_ids"] for row in range(len(ds.shards))]
    assert calls.read_text().split() == logged  # nothing hashed or checked again
    assert all(a.equal(b) for a, b in zip(first, second, strict=True))
    assert all(a[0].equal(b) for a, b in zip(first, in_process, strict=True))


def test_a_file_replaced_after_it_was_verified_is_hashed_again(packed_run: PackedRun, tmp_path: Path) -> None:
    """What was verified is trusted only for the very file that was hashed: a copy of the ShardSet
    (made through the same __getstate__/__setstate__ a spawned worker's copy goes through) hashes a
    shard again when the file was rewritten, even with the same size and modification time, and
    refuses it when its bytes changed."""
    import copy as copying

    folder, manifest = copy_folder(packed_run, tmp_path)
    ds = PackedDataset(folder, tokenizer=packed_run.tokenizer_path, shuffle=False)
    ds.shards.verify()
    path = folder / manifest["shards"][SHARD]["file"]
    row = manifest["shards"][0]["rows"]  # the first row of shard SHARD
    stat = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # one token id changed, still inside the vocabulary or not: the hash decides
    path.write_bytes(bytes(data))
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size and path.stat().st_mtime_ns == stat.st_mtime_ns
    copy = copying.deepcopy(ds.shards)
    copy.tokens(0)  # shard 0 is unchanged: served without hashing it again
    with pytest.raises(ShardError, match=rf"{path.name}: xxh3_128 differs from the manifest"):
        copy.tokens(row)
