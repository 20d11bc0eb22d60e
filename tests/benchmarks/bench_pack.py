"""Benchmark of the packer on the shared corpus (books and papers).

Measures, on the same text:

* the bare tokenizer: ``Tokenizer.encode_batch`` (and ``encode_batch_fast``, which the packer calls)
  over every document at once, nothing else;
* the whole pack job (read Parquet, tokenize, pack, write shards, manifest) under the local
  datatrove executor, for one and for several window lengths, and its throughput relative to the
  bare tokenizer;
  the documents are written without stored token ids, so this is pack's tokenizing path
  (``bench_curate.py`` measures curate + pack reusing the ids curation stored);
* best-fit decreasing against concatenate-and-chunk: efficiency, whether padding is the lowest any
  lossless packing could reach, and pieces of documents that would have fit one window but were cut.

Contenders run in interleaved rounds (``--repeats``), so load from other programs hits all of them
alike; each is reported as the median and min-max of its rounds, wall time and CPU time (this process
and every worker process it started), and ratios use medians. Run::

    python tests/benchmarks/bench_pack.py [--corpus ../shared/corpus] [--seq-lens 16384 65536]
    TOKENIZERS_PARALLELISM=false python tests/benchmarks/bench_pack.py   # one thread: per-core cost
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchtools import CORPUS, Samples, become_subreaper, require_corpus
from datatrove.data import Document

from longctx import jobs
from longctx.config import parse_config
from longctx.core.tokenizer import load_tokenizer
from longctx.packer.manifest import Manifest
from longctx.pipeline.bpe import train_bpe
from longctx.pipeline.docstore import DocumentWriter
from longctx.pipeline.readers.base import read_text_file


def interleaved(
    contenders: dict[str, Callable[[], Any]], rounds: int
) -> tuple[dict[str, Samples], dict[str, Any]]:
    """Run every contender once per round, round after round, so that load from other programs
    hits all of them alike; every round's times and the last results per contender."""
    timings = {name: Samples() for name in contenders}
    results: dict[str, Any] = {}
    for _ in range(rounds):
        for name, fn in contenders.items():
            results[name] = timings[name].run(fn)
    return timings, results


def write_curated(root: Path, texts: dict[str, list[str]]) -> None:
    """The documents in the layout curation writes: ``documents/<source>/<rank>.parquet``."""
    with DocumentWriter(root / "documents", "${source}/${rank}.parquet") as writer:
        for source, docs in texts.items():
            for i, text in enumerate(docs):
                writer.write(Document(text=text, id=f"{source}/{i}", metadata={"source": source}), rank=0)


def pack_once(root: Path, seq_lens: list[int], strategy: str, original: int) -> dict[int, Manifest]:
    """One complete, fresh pack job into ``root`` (curated documents and tokenizer already there)."""
    for sub in ("shards", "work"):
        shutil.rmtree(root / sub, ignore_errors=True)
    cfg = parse_config(
        {
            "output": str(root),
            "context": {"original": original, "target": max(seq_lens)},
            "pack": {"seq_lens": seq_lens, "strategy": strategy, "executor": {"tasks": 1, "workers": 1}},
        }
    )
    return jobs.pack(cfg)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[16384, 65536])
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--original", type=int, default=4096, help="context.original (for coverage figures)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    require_corpus(args.corpus, "bench_pack")
    become_subreaper("bench_pack")
    texts = {
        source: [read_text_file(p) for p in sorted((args.corpus / source).iterdir()) if p.is_file()]
        for source in ("books", "papers")
    }
    all_texts = [t for docs in texts.values() for t in docs]
    print(f"corpus: {len(all_texts)} documents, {sum(map(len, all_texts)) / 1e6:.1f} M characters")

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        train_bpe(all_texts, args.vocab, root / "tokenizer.json")
        write_curated(root, texts)
        tokenizer = load_tokenizer(root / "tokenizer.json")

        contenders: dict[str, Callable[[], Any]] = {
            "encode_batch": lambda: tokenizer.encode_batch(all_texts, add_special_tokens=False),
            "encode_batch_fast": lambda: tokenizer.encode_batch_fast(all_texts, add_special_tokens=False),
        }
        runs = [[n] for n in args.seq_lens] + ([args.seq_lens] if len(args.seq_lens) > 1 else [])
        for seq_lens in runs:
            contenders[f"pack {seq_lens}"] = lambda seq_lens=seq_lens: pack_once(
                root, seq_lens, "bfd", args.original
            )
        timings, results = interleaved(contenders, args.repeats)
        tokens = sum(len(e.ids) for e in results["encode_batch"]) + len(all_texts)  # + one EOS per document
        bare, fast = timings["encode_batch"], timings["encode_batch_fast"]
        print(
            f"\n{tokens:,} tokens; {args.repeats} interleaved rounds: median [min-max]; "
            f"load {os.getloadavg()[0]:.1f}"
        )
        print(f"  bare encode_batch:      {bare}, {tokens / bare.median_wall / 1e6:.3f} M tokens/s wall")
        print(
            f"  bare encode_batch_fast: {fast}, {tokens / fast.median_wall / 1e6:.3f} M tokens/s wall "
            "(what pack calls on text without stored ids)"
        )
        print("whole pack job (read Parquet, tokenize, pack, write shards and manifest; 1 local task):")
        bfd: dict[int, Manifest] = {}
        for seq_lens in runs:
            job = timings[f"pack {seq_lens}"]
            bfd.update(results[f"pack {seq_lens}"])
            print(
                f"  seq_lens {seq_lens}: {job}, {tokens / job.median_wall / 1e6:.3f} M tokens/s wall; "
                f"throughput relative to encode_batch {bare.median_wall / job.median_wall:.2f} (wall) "
                f"{bare.median_cpu / job.median_cpu:.2f} (CPU), to encode_batch_fast "
                f"{fast.median_wall / job.median_wall:.2f} (wall) "
                f"{fast.median_cpu / job.median_cpu:.2f} (CPU)"
            )

        print("\npacking efficiency (non-padding tokens / all tokens):")
        print(
            f"  {'seq_len':>8} {'strategy':>8} {'rows':>6} {'efficiency':>11} {'lowest padding':>15} "
            f"{'short-doc pieces':>17}"
        )
        for seq_len in args.seq_lens:
            for strategy in ("bfd", "concat"):
                manifest = (
                    bfd[seq_len]
                    if strategy == "bfd"
                    else pack_once(root, [seq_len], strategy, args.original)[seq_len]
                )
                lowest = -manifest.tokens % seq_len
                print(
                    f"  {seq_len:>8} {strategy:>8} {manifest.rows:>6} {manifest.efficiency:>11.4%} "
                    f"{'yes' if manifest.padding == lowest else 'no':>15} "
                    f"{manifest.short_document_pieces:>17}"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
