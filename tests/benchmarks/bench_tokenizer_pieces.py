"""Curation's tokenizer calls against the bare tokenizer on whole documents, by piece size.

Curation encodes a long document in pieces cut at safe positions (:class:`TokenEncoder`, the same ids
as the whole text). The tokenizer's temporaries for one piece are about 150 bytes per character, so the
piece size decides whether they stay in a core's cache. Each repetition runs every contender once, in a
shuffled order, on one thread pinned to one core, over the same texts; many short repetitions, compared
within each one, see through a shared machine's load better than a few long ones:

* ``whole``: the bare ``Tokenizer.encode_batch_fast`` on whole documents, 16 per call (the baseline);
* ``pieces N``: :class:`TokenEncoder` with pieces of ``N`` characters (its default is marked).

Printed: CPU seconds per contender, median [min-max], and each contender's CPU over the baseline's in
the same repetition (median and quartiles); below 1 is faster than the bare tokenizer.

    .venv/bin/python tests/benchmarks/bench_tokenizer_pieces.py [--input mixed] [--reps 30]
        [--mb 2.5] [--vocab 8192] [--corpus DIR]

The texts are those the readers make of ``bench_curate.py``'s input (``--input mixed``: books and papers
of the shared corpus and installed Python packages as repositories), cut to at most 512K characters
each and sampled to about ``--mb`` megabytes; the tokenizer is a byte-level BPE trained on them (not
timed).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ["RAYON_NUM_THREADS"] = "1"  # one thread, before tokenizers starts its pool
os.environ["TOKENIZERS_PARALLELISM"] = "false"

from bench_curate import build_input, reader_texts, train_tokenizer
from benchtools import CORPUS, fmt, require_corpus

PIECES = (1 << 17, 1 << 15, 1 << 13, 1 << 11)


def sample_texts(texts: list[str], megabytes: float, seed: int = 0) -> list[str]:
    """Texts cut to at most 512K characters, taken in a seeded order until about ``megabytes``."""
    rng = random.Random(seed)
    order = list(range(len(texts)))
    rng.shuffle(order)
    out, size = [], 0
    for i in order:
        if size >= megabytes * 1e6:
            break
        text = texts[i][: 1 << 19]
        out.append(text)
        size += len(text)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--input", choices=["corpus", "mixed"], default="mixed")
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--mb", type=float, default=2.5)
    parser.add_argument("--vocab", type=int, default=8192)
    args = parser.parse_args()
    require_corpus(args.corpus, "bench_tokenizer_pieces")
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    from tokenizers import Tokenizer

    from longctx.pipeline.tokens import PIECE_CHARS, TokenEncoder

    work = Path(tempfile.mkdtemp(prefix="bench_tokenizer_pieces_"))
    try:
        texts = reader_texts(build_input(args.corpus, work / "input", 1, args.input), work / "read")
        tokenizer = Tokenizer.from_file(str(train_tokenizer(texts, work / "tok.json", args.vocab)))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    sample = sample_texts(texts, args.mb)
    chars = sum(map(len, sample)) / 1e6
    print(f"{len(sample)} texts, {chars:.1f} M chars, byte-level BPE vocab {args.vocab}")

    def whole() -> None:
        for i in range(0, len(sample), 16):
            tokenizer.encode_batch_fast(sample[i : i + 16], add_special_tokens=False)

    contenders = {"whole": whole}
    for size in PIECES:
        encoder = TokenEncoder(tokenizer, piece_chars=size)
        label = f"pieces {size}" + (" (default)" if size == PIECE_CHARS else "")
        contenders[label] = lambda encoder=encoder: encoder.encode(sample)
    cpu: dict[str, list[float]] = {name: [] for name in contenders}
    rng = random.Random(1)
    for rep in range(args.reps):
        names = list(contenders)
        rng.shuffle(names)
        for name in names:
            start = time.process_time()
            contenders[name]()
            cpu[name].append(time.process_time() - start)
        if (rep + 1) % 10 == 0:
            print(f"  repetition {rep + 1}/{args.reps} done", flush=True)
    print(f"CPU seconds, median [min-max] of {args.reps}; ratio to whole documents in the same repetition:")
    for name, values in cpu.items():
        ratios = [v / w for v, w in zip(values, cpu["whole"])]
        q1, q2, q3 = statistics.quantiles(ratios) if len(ratios) > 1 else ratios * 3
        print(f"  {name:22s} {fmt(values)} s   {q2:.3f}x (quartiles {q1:.3f}-{q3:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
