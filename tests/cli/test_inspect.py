"""``longctx inspect``: summary, --validate (naming file, row and field), --show, --plot, and clear
errors for truncated or corrupt shards."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest

from longctx.cli import main
from longctx.packer.format import ShardHeader, open_shard, write_shard
from tests.packer.test_pack_helpers import PackedRun

pytest_plugins = ["tests.packer.test_pack_helpers"]  # the shared packed_run fixture

SEQ_LEN = 256


@pytest.fixture()
def copy(packed_run: PackedRun, tmp_path: Path) -> Path:
    """A private copy of the packed run (shards and tokenizer) that a test may damage."""
    shutil.copytree(packed_run.root / "shards", tmp_path / "shards")
    shutil.copy(packed_run.tokenizer_path, tmp_path / "tokenizer.json")
    return tmp_path / "shards" / f"seq{SEQ_LEN}"


def test_summary(packed_run: PackedRun, capsys: pytest.CaptureFixture) -> None:
    assert main(["inspect", str(packed_run.folder(SEQ_LEN))]) == 0
    out = capsys.readouterr().out
    manifest = packed_run.manifests[SEQ_LEN]
    assert f"{manifest.rows:,} rows x 256 tokens" in out and f"padding {manifest.padding:,}" in out
    for name in ("books", "papers", "anchor"):
        assert f"  {name} " in out
    assert "position ids (tokens per power-of-two bucket)" in out and "[128, 256)" in out
    assert "segment lengths" in out


def test_full_window_segments_are_in_the_bucket_labelled_by_the_window(
    packed_run: PackedRun, capsys: pytest.CaptureFixture
) -> None:
    """Segment lengths run up to seq_len, so the last power-of-two bucket of 256-token windows holds
    exactly the full-window segments: labelled "256", not "[256, 512)", and counted as the rows say."""
    import numpy as np

    folder = packed_run.folder(SEQ_LEN)
    lengths = np.concatenate(
        [
            np.diff(cu)
            for f in sorted(folder.glob("*.arrow"))
            for cu in open_shard(f)[1]["cu_seqlens"].to_pylist()
        ]
    )
    doc_ids = [
        d
        for f in sorted(folder.glob("*.arrow"))
        for row in open_shard(f)[1]["doc_id"].to_pylist()
        for d in row
    ]
    full = sum(1 for n, d in zip(lengths, doc_ids, strict=True) if n == SEQ_LEN and d is not None)
    below = sum(1 for n, d in zip(lengths, doc_ids, strict=True) if 128 <= n < SEQ_LEN and d is not None)
    assert full > 0 and below > 0
    assert main(["inspect", str(folder)]) == 0
    out = capsys.readouterr().out
    segments = out[out.index("segment lengths") :].splitlines()[1:]
    assert segments[-1].split()[:2] == ["256", f"{full:,}"], segments
    assert segments[-2].split()[:3] == ["[128,", "256)", f"{below:,}"], segments
    assert "512" not in out[out.index("segment lengths") :]


def test_bucket_labels_end_where_the_values_can() -> None:
    from longctx.packer.report import bucket_label

    assert [bucket_label(k) for k in (0, 1, 2, 17)] == ["0", "1", "[2, 4)", "[64K, 128K)"]
    assert bucket_label(17, largest=65536) == "64K"  # segment lengths of 64K windows: full windows only
    assert bucket_label(16, largest=65536) == "[32K, 64K)"  # not cut
    assert bucket_label(16, largest=65535) == "[32K, 64K)"  # positions of 64K windows
    assert bucket_label(12, largest=3000) == "[2K, 3000]"


def test_validate_passes_on_every_output(packed_run: PackedRun, capsys: pytest.CaptureFixture) -> None:
    assert main(["inspect", str(packed_run.root / "shards"), "--validate"]) == 0
    out = capsys.readouterr().out
    assert out.count("valid (every invariant holds)") == 2


def test_validate_names_row_and_field(copy: Path, capsys: pytest.CaptureFixture) -> None:
    shard = copy / "00000_00001.arrow"
    meta, table = open_shard(shard)
    rows = table.to_pylist()
    rows[3]["position_ids"][5] += 1
    rows[4]["loss_mask"][0] = 1
    tampered = pa.Table.from_pylist(rows, schema=table.schema).to_batches()[0]
    write_shard(shard, tampered, ShardHeader(**meta.model_dump(exclude={"rows"})))
    assert main(["inspect", str(copy), "--validate"]) == 1
    out = capsys.readouterr().out
    assert "INVALID 00000_00001.arrow: xxh3_128: checksum differs from the manifest" in out
    assert "INVALID 00000_00001.arrow row 3: position_ids: token 5: expected 5, got 6" in out
    assert "INVALID 00000_00001.arrow row 4: loss_mask: token 0: expected 0, got 1" in out
    assert main(["inspect", str(shard), "--validate"]) == 1  # a single file: row checks alone
    assert "row 3: position_ids" in capsys.readouterr().out


@pytest.mark.parametrize("damage", ["truncate", "corrupt", "delete"])
def test_damaged_shards_are_clear_errors(copy: Path, capsys: pytest.CaptureFixture, damage: str) -> None:
    shard = copy / "00001_00000.arrow"
    data = shard.read_bytes()
    if damage == "truncate":
        shard.write_bytes(data[: len(data) // 2])
    elif damage == "corrupt":
        shard.write_bytes(b"\x00" * 16 + data[16:])
    else:
        shard.unlink()
    assert main(["inspect", str(copy), "--validate"]) == 1
    out = capsys.readouterr().out
    expected = {"truncate": "truncated or corrupt", "corrupt": "truncated or corrupt", "delete": "missing"}[
        damage
    ]
    assert "INVALID 00001_00000.arrow" in out and expected in out
    assert main(["inspect", str(copy)]) == 2
    assert "00001_00000.arrow" in capsys.readouterr().err


def test_show_marks_segments_and_provenance(packed_run: PackedRun, capsys: pytest.CaptureFixture) -> None:
    folder = packed_run.folder(SEQ_LEN)
    assert main(["inspect", str(folder), "--show", "0", "--max-chars", "80"]) == 0
    out = capsys.readouterr().out
    # the row only: its first line names it, and no summary or histogram comes before or after
    assert out.startswith(f"row 0 of {folder}: ") and "── segment 0: window tokens [0, " in out
    assert "rows x" not in out and "position ids" not in out and "segment lengths" not in out
    assert "· document " in out and "(source " in out and ") of " in out
    assert main(["inspect", str(packed_run.folder(SEQ_LEN)), "--show", "100000"]) == 2
    assert "out of range" in capsys.readouterr().err


def test_plot_and_single_file(packed_run: PackedRun, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    figure = tmp_path / "hist.png"
    assert main(["inspect", str(packed_run.folder(SEQ_LEN)), "--plot", str(figure)]) == 0
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    shard = packed_run.folder(SEQ_LEN) / "00000_00000.arrow"
    assert main(["inspect", str(shard), "--validate", "--show", "1"]) == 0
    out = capsys.readouterr().out
    assert "valid (every invariant holds)" in out and f"row 1 of {shard}: " in out


def test_help_describes_the_options(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        main(["inspect", "--help"])
    out = capsys.readouterr().out
    for option in ("--validate", "--show ROW", "--plot FILE.png"):
        assert option in out


def test_the_summary_counts_one_row_and_one_shard_in_the_singular(packed_run: PackedRun) -> None:
    from longctx.packer.report import format_manifest

    manifest = packed_run.manifests[SEQ_LEN]
    one = manifest.model_copy(update={"rows": 1, "shards": manifest.shards[:1]})
    text = format_manifest(one, "t")
    assert "  1 row x 256 tokens = " in text and "; 1 shard file" in text
    assert " rows x" not in text and "file(s)" not in text


@pytest.mark.parametrize("show", [False, True], ids=["summary", "show"])
def test_a_reader_that_stops_reading_ends_the_command_quietly(packed_run: PackedRun, show: bool) -> None:
    """``longctx inspect ... | head``: once the reader has gone, the command stops without a word and
    with the status of a Unix tool that SIGPIPE ended (128 + 13), as ``cat`` does (it was a
    BrokenPipeError traceback). Here the reader is gone before the first line: a pipe whose reading
    end is closed, so that the first write fails, whether it comes in the middle or at the last flush."""
    reading, writing = os.pipe()
    os.close(reading)
    command = [sys.executable, "-m", "longctx.cli", "inspect", str(packed_run.folder(SEQ_LEN))]
    try:
        done = subprocess.run(
            command + (["--show", "0"] if show else []), stdout=writing, stderr=subprocess.PIPE, timeout=300
        )
        reference = subprocess.run(["cat", "/proc/self/status"], stdout=writing, stderr=subprocess.PIPE)
    finally:
        os.close(writing)
    said = done.stderr.decode()  # the summary's progress bar may be there
    assert "Traceback" not in said and "Broken pipe" not in said and "Error" not in said, said
    assert reference.returncode == -signal.SIGPIPE  # cat died of SIGPIPE: what the shell shows as 141
    assert done.returncode == 128 + signal.SIGPIPE
