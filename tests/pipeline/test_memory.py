"""Memory per document stays within a small multiple of the document's size.

A 50 MB book on one line (no line breaks at all, as some scanned books come) is curated in a child
process; its peak resident memory (``VmHWM``, the interpreter and its imports included, about
150 MB) must stay under 40x the book's size. It measures about 14x (670-730 MB). Tokenizing such a
text whole used to take about 150x its size, which the bound still catches.

The child reads its own ``VmHWM``, not ``ru_maxrss``: Linux carries ``ru_maxrss`` across ``exec``, so
a child started by a large process (a pytest worker that has run the trainer's tests, 2 GB) reports
its parent's size, which failed this test under xdist.

The tokenizer is trained on the book's words so that a token holds about 5 characters, as English
prose with a real tokenizer (4-5): most of the memory left is per token (the ids, and about 21 bytes
per id while pyarrow writes one row's ``list<uint32>`` column to Parquet).
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from longctx.pipeline.bpe import train_bpe

BOOK_MB = 50
MAX_MULTIPLE = 40
"""Peak memory allowed, as a multiple of the book's size (see the module docstring)."""

_CURATE_AND_MEASURE = """
import json, resource, sys, yaml
from longctx import jobs
from longctx.config import parse_config
summary = jobs.curate(parse_config(yaml.safe_load(open(sys.argv[1]))))
own_kb = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
peak_kb = max(own_kb, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
print(json.dumps({"peak_mb": peak_kb / 1024, "kept": summary["totals"]["kept"]}))
"""


def one_line_book(path: Path, megabytes: int) -> int:
    """Random words separated by single spaces, no line break; returns its size in bytes."""
    rng = random.Random(0)
    words = [
        "".join(rng.choice("etaoinshrdlucmfwyp") for _ in range(rng.randint(1, 7))) for _ in range(5_000)
    ]
    block = " ".join(rng.choices(words, k=200_000)) + " "
    with open(path, "w", encoding="ascii") as f:
        while f.tell() < megabytes * 1_000_000:
            f.write(block)
    return path.stat().st_size


@pytest.mark.slow
def test_one_line_book_peak_memory_is_a_small_multiple_of_its_size(tmp_path: Path) -> None:
    books = tmp_path / "input" / "books"
    books.mkdir(parents=True)
    size = one_line_book(books / "one_line.txt", BOOK_MB)
    tokenizer = tmp_path / "tokenizer.json"
    train_bpe([(books / "one_line.txt").open().read(1_000_000)], 8192, tokenizer)
    config = tmp_path / "curate.yaml"
    output = tmp_path / "out"
    config.write_text(
        yaml.safe_dump(
            {
                "output": str(output),
                "context": {"original": 64, "target": 256},
                "tokenizer": {"path": str(tokenizer)},
                "curate": {"input": str(tmp_path / "input"), "executor": {"tasks": 1, "workers": 1}},
            }
        )
    )
    done = subprocess.run(
        [sys.executable, "-c", _CURATE_AND_MEASURE, str(config)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    # the book was kept whole, its ids stored
    assert result["kept"] == 1
    (stored,) = list((output / "documents").rglob("*.parquet"))
    row = pq.read_table(stored, columns=["text", "token_count"]).to_pylist()[0]
    assert len(row["text"]) == size
    assert size // 8 < row["token_count"] < size // 3
    print(f"peak RSS {result['peak_mb']:.0f} MB for a {size / 1e6:.0f} MB one-line book")
    assert result["peak_mb"] * 2**20 <= MAX_MULTIPLE * size, (
        f"peak RSS {result['peak_mb']:.0f} MB for a {size / 1e6:.0f} MB book"
    )
