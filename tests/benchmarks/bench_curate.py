"""Throughput of the whole curation run over ../shared/corpus against the tokenizer alone.

The tokenizer bounds what curation can do: every document must be tokenized once to be length
filtered. This prints documents/s and MB/s of ``run_curation`` (read, clean, count tokens, MinHash,
dedup, write, ledger) and of ``Tokenizer.encode_batch`` over the same raw text, and their ratio.

    .venv/bin/python tests/benchmarks/bench_curate.py [--corpus ../shared/corpus] [--tasks 2]
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from longctx import jobs
from longctx.config import parse_config
from longctx.core.tokenizer import load_tokenizer
from longctx.pipeline.bpe import train_bpe
from longctx.pipeline.readers.base import walk_files

DEFAULT_CORPUS = Path(__file__).resolve().parents[2].parent / "shared" / "corpus"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--tasks", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=8192)
    args = parser.parse_args()
    if not (args.corpus / "books").is_dir():
        print(f"corpus not found at {args.corpus}; pass --corpus", file=sys.stderr)
        return 1
    files = [f for sub in ("books", "papers", "code") for f in walk_files(args.corpus / sub, (".txt", ".tex", ".md"))]
    texts = [f.read_bytes().decode("utf-8-sig", errors="replace") for f in files]
    n_bytes = sum(f.stat().st_size for f in files)
    work = Path(tempfile.mkdtemp(prefix="bench_curate_"))
    try:
        tok_path = work / "tokenizer.json"
        train_bpe(texts, args.vocab, tok_path)  # not timed: a real run brings its tokenizer

        tokenizer = load_tokenizer(tok_path)
        start = time.perf_counter()
        n_tokens = sum(len(e.ids) for e in tokenizer.encode_batch(texts, add_special_tokens=False))
        t_tok = time.perf_counter() - start

        cfg = parse_config({
            "output": str(work / "out"),
            "context": {"original": 1024, "target": 4096},
            "tokenizer": {"path": str(tok_path)},
            "curate": {"input": str(args.corpus), "executor": {"tasks": args.tasks, "workers": args.tasks}},
        })
        start = time.perf_counter()
        summary = jobs.curate(cfg)
        t_cur = time.perf_counter() - start
    finally:
        shutil.rmtree(work, ignore_errors=True)

    mb = n_bytes / 1e6
    print(f"\ncorpus: {len(files)} documents, {mb:.1f} MB, {n_tokens:,} tokens (vocab {args.vocab})")
    print(f"{'':<28}{'seconds':>9}{'docs/s':>9}{'MB/s':>8}")
    print(f"{'tokenizer alone':<28}{t_tok:>9.2f}{len(files) / t_tok:>9.1f}{mb / t_tok:>8.2f}")
    print(f"{'curate (' + str(args.tasks) + ' tasks)':<28}{t_cur:>9.2f}{len(files) / t_cur:>9.1f}{mb / t_cur:>8.2f}")
    print(f"ratio curate / tokenizer-alone time: {t_cur / t_tok:.1f}x")
    print(f"kept {summary['totals']['kept']}, duplicates {summary['totals']['duplicate']}, filtered {summary['totals']['filtered']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
