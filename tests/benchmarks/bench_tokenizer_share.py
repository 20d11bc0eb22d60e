"""What curation spends outside its own tokenizer calls, per extra megabyte, as a share of them.

``bench_curate.py`` times curation and the bare tokenizer in separate processes. On a shared machine
the CPU seconds of the same work then swing by a third or more within an hour, so the marginal
cost of a megabyte, a difference of two such timings, cannot resolve a 10% change. Here both parts
are measured in one process at the same time: ``longctx curate`` with one task on one core (in this
process), its calls to ``Tokenizer.encode_batch_fast`` timed apart from everything else. The
machine's speed moves both alike, so their ratio holds still.

For each input size, every repetition gives ``other / tokenizer`` (CPU seconds outside the
tokenizer's calls over CPU seconds in them); from the medians at the smallest and the largest size
comes the cost of the megabytes in between: ``v``, the extra megabytes' CPU outside the tokenizer
as a share of their tokenizer CPU, and ``1 / (1 + v)``, curation's marginal throughput against its
own tokenizer calls. ``pack`` is not included (``bench_curate.py`` measures it: about 0.04 of the
tokenizer's CPU per megabyte).

Curation's own calls are not the bare tokenizer's: they encode pieces of documents, which costs less
CPU than whole documents (``bench_tokenizer_pieces.py``). So the same process also times the bare
tokenizer as ``bench_curate.py``'s baseline runs it (one ``encode_batch_fast`` over the readers'
texts, on one thread), just before curating, and every repetition gives ``curate / bare`` too; its
marginal form is curation's throughput per extra megabyte against the bare tokenizer.

    .venv/bin/python tests/benchmarks/bench_tokenizer_share.py [--input mixed] [--copies 1 2]
        [--reps 3] [--corpus DIR]

The inputs are ``bench_curate.py``'s (``--input mixed``: installed Python packages as repositories,
about a third of every megabyte, with the shared corpus's books and papers and their shuffled copies).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from bench_curate import build_input, curate_config, reader_texts, train_tokenizer, write_texts
from benchtools import CORPUS, require_corpus


def child(config: str, texts_file: str, tokenizer_file: str) -> None:
    """Child: the bare tokenizer over the texts, then ``longctx curate`` in this process, its tokenizer
    calls timed apart. Prints ``bare <cpu> tokenizer <cpu> other <cpu>``."""
    os.environ["RAYON_NUM_THREADS"] = "1"
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    import pyarrow as pa
    from tokenizers import Tokenizer

    from longctx.cli import main
    from longctx.pipeline import tokens

    texts = pa.ipc.open_file(texts_file).read_all().column("text").to_pylist()
    bare = Tokenizer.from_file(tokenizer_file)
    start = time.process_time()
    bare.encode_batch_fast(texts, add_special_tokens=False)
    bare_cpu = time.process_time() - start
    del texts, bare

    spent = [0.0]

    class Timed:
        """The tokenizer, with the CPU time of its ``encode_batch_fast`` calls added up."""

        def __init__(self, tokenizer) -> None:
            self.tokenizer = tokenizer

        def encode_batch_fast(self, *args, **kwargs):
            start = time.process_time()
            try:
                return self.tokenizer.encode_batch_fast(*args, **kwargs)
            finally:
                spent[0] += time.process_time() - start

        def __getattr__(self, name: str):
            return getattr(self.tokenizer, name)

    encode = tokens.TokenEncoder.encode

    def timed_encode(self, texts):
        if not isinstance(self.tokenizer, Timed):
            self.tokenizer = Timed(self.tokenizer)
        return encode(self, texts)

    tokens.TokenEncoder.encode = timed_encode
    start = time.process_time()
    try:
        code = main(["curate", "--config", config])
    except SystemExit as exit_:
        code = exit_.code
    total = time.process_time() - start
    if code:
        sys.exit(f"bench_tokenizer_share: curate failed ({code})")
    print(f"bare {bare_cpu:.3f} tokenizer {spent[0]:.3f} other {total - spent[0]:.3f}")


def measure(input_dir: Path, texts_file: Path, tokenizer: Path, work: Path) -> tuple[float, float, float]:
    """CPU seconds of the bare tokenizer over ``texts_file``, and in curation's tokenizer calls and
    outside them, of one curation of ``input_dir``."""
    out = work / "out"
    shutil.rmtree(out, ignore_errors=True)
    config = work / "curate.yaml"
    config.write_text(yaml.safe_dump(curate_config(input_dir, out, tokenizer, 1)))
    core = {min(os.sched_getaffinity(0))}
    done = subprocess.run(
        [sys.executable, __file__, "--child", str(config), str(texts_file), str(tokenizer)],
        capture_output=True,
        text=True,
        preexec_fn=lambda: os.sched_setaffinity(0, core),
    )
    if done.returncode != 0:
        sys.exit(f"bench_tokenizer_share: curate failed:\n{done.stderr[-3000:]}")
    words = done.stdout.split()
    return float(words[-5]), float(words[-3]), float(words[-1])


def fmt(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}]"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--input", choices=["corpus", "mixed"], default="mixed")
    parser.add_argument("--copies", type=int, nargs=2, default=[1, 2])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(*args.child)
        return 0
    require_corpus(args.corpus, "bench_tokenizer_share")
    work = Path(tempfile.mkdtemp(prefix="bench_tokenizer_share_"))
    try:
        inputs = {c: build_input(args.corpus, work / f"input{c}", c, args.input) for c in args.copies}
        texts = {c: reader_texts(path, work / f"read{c}") for c, path in inputs.items()}
        megabytes = {c: sum(len(t.encode("utf-8")) for t in texts[c]) / 1e6 for c in texts}
        texts_files = {c: write_texts(texts[c], work / f"texts{c}.arrow") for c in texts}
        tokenizer = train_tokenizer(texts[args.copies[0]], work / "tok.json", args.vocab)
        del texts
        shares: dict[int, list[float]] = {c: [] for c in args.copies}
        against_bare: dict[int, list[float]] = {c: [] for c in args.copies}
        for rep in range(args.reps):
            for c in args.copies if rep % 2 == 0 else reversed(args.copies):
                bare, tok, other = measure(inputs[c], texts_files[c], tokenizer, work)
                shares[c].append(other / tok)
                against_bare[c].append((tok + other) / bare)
                print(
                    f"  {megabytes[c]:.1f} MB: bare tokenizer {bare:.2f} s; curation: tokenizer {tok:.2f} s, "
                    f"other {other:.2f} s CPU",
                    flush=True,
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    (c1, mb1), (c2, mb2) = sorted(megabytes.items())
    for c, mb in ((c1, mb1), (c2, mb2)):
        print(
            f"{mb:.1f} MB: CPU outside the tokenizer / in it, median [min-max] of {args.reps}: "
            f"{fmt(shares[c])}"
        )
    r1, r2 = statistics.median(shares[c1]), statistics.median(shares[c2])
    extra = (r2 * mb2 - r1 * mb1) / (mb2 - mb1)
    print(
        f"per extra MB from {mb1:.1f} to {mb2:.1f} MB: CPU outside the tokenizer {extra:.3f}x its CPU; "
        f"curation's marginal throughput against its own tokenizer {1 / (1 + extra):.3f}x"
    )
    for c, mb in ((c1, mb1), (c2, mb2)):
        print(f"{mb:.1f} MB: curation CPU / the bare tokenizer's, median [min-max]: {fmt(against_bare[c])}")
    b1, b2 = statistics.median(against_bare[c1]), statistics.median(against_bare[c2])
    extra_bare = (b2 * mb2 - b1 * mb1) / (mb2 - mb1)
    print(
        f"per extra MB: curation CPU {extra_bare:.3f}x the bare tokenizer's; curation's marginal "
        f"throughput against the bare tokenizer {1 / extra_bare:.3f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
