"""Curation against the bare tokenizer on the same text: books and papers of the shared corpus plus
code repositories from the running interpreter's standard library.

The tokenizer bounds what curation can do: every document must be tokenized once to be length
filtered (and its ids are stored for ``pack``). Measured in one run, several repetitions each,
printed as median [min-max] of CPU and wall seconds:

* ``tokenizer``: ``Tokenizer.encode_batch_fast`` (the fastest call: no offsets, no special tokens)
  over the texts the readers produce, i.e. exactly the text curation tokenizes; once on one thread
  (its CPU time is the work itself: waiting pool threads spin and inflate CPU otherwise) and once on
  all the cores given; and as two processes of one thread each, each pinned to its own core and
  given half the texts (split by length with curation's own ``assign_by_size``): curation's two
  tasks doing nothing but tokenize, the bound for the scaling of two tasks over one;
* ``curate``: ``longctx curate`` (read, clean, tokenize and store ids, MinHash, exact hash, dedup,
  write, ledger) with 2 tasks on the cores given, and with 1 task on 1 core: the scaling of two tasks
  on two cores over one task on one;
* ``tokenizer in pieces``: curation's own tokenizer calls (``TokenEncoder``: pieces cut at safe
  positions, the same ids) as its two tasks make them, two one-thread processes pinned to a core each,
  half the texts each, with the ``malloc`` curation runs with: the second baseline (see
  ``curate_report.py``);
* ``tokenizer, 2 cores, curation's allocator``: when curation preloads a faster ``malloc``
  (``longctx.core.allocator``: mimalloc or jemalloc, when installed; ``LONGCTX_ALLOCATOR``), the
  whole-document tokenizer with it too, so that what the allocator does for the tokenizer alone shows
  apart from curation (the other whole-document contenders run as a plain Python process does);
* ``curate + pack``: ``longctx pack`` (windows of 4096, reusing the ids curation stored) after the
  two-task curation, end to end against both baselines (goals against the whole-document tokenizer
  on 2 cores: 0.75x its throughput for the whole run, 0.85x per extra megabyte);
* ``signatures``: MinHash signatures plus exact hashes of the same texts, against the one-thread
  tokenizer (goal: at most 0.15x);
* ``dependency``: the model-free long-range dependency score (``longctx.pipeline.dependency``) of
  the same texts' token ids, against the one-thread tokenizer (goal: at most 0.10x; the ids are made
  first and not timed, as curation's length filter hands them over);
* optionally (``--one-line-mb``) the peak memory of curating one generated one-line book.

Every child process is timed from outside (``resource.getrusage(RUSAGE_CHILDREN)``, so worker
processes count), with its CPU affinity set to the cores it is given. Ratios are of medians.

With several ``--copies`` (e.g. ``--copies 1 4``), every size is measured in the same run and the
cost of the megabytes between the smallest and the largest is printed too: each contender's seconds
per extra MB and its fixed cost (the intercept at 0 MB), the marginal throughput of curate + pack
against the tokenizer's (what a curation of gigabytes runs at) and the size from which it reaches
0.75x; and the CPU seconds per extra MB of curate + pack against the one-thread tokenizer's, which
the load of a shared machine moves far less than wall time.

    .venv/bin/python tests/benchmarks/bench_curate.py [--reps 3] [--corpus DIR] [--copies 1 4]
        [--input corpus|mixed] [--one-line-mb 50] [--report FILE.json] [--check RECORDED.json | --no-check]

``--report`` writes every repetition's seconds and the throughputs against both baselines as JSON
(``tests/benchmarks/results/<date>-curate.json``). Every run then compares its throughputs with the
newest recorded report of the same input (or the one ``--check`` names; ``--no-check``: none) and
exits with status 1, naming each figure, when a throughput against curation's own tokenizer calls is
more than 5% below the recorded one (``curate_report.regressions``): a change that costs more than
that fails loudly.

``--input mixed`` grows the code with the books and papers (installed Python packages as
repositories, see :func:`build_input`): an input unlike the shared corpus alone, on which code
order, file-level deduplication and many small files weigh in the marginal cost too.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import yaml
from benchtools import CORPUS, become_subreaper, commit, fmt, require_corpus
from curate_report import (
    BASELINES,
    END_TO_END,
    goal_lines,
    newest_comparable,
    per_extra_mb,
    regressions,
    throughputs,
    whole_run,
)
from curate_report import slopes as marginal_slopes

from longctx.core.allocator import MARKER, allocator_to_preload
from longctx.core.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "tests" / "benchmarks" / "results"
"""Where recorded reports are kept (``<date>-curate.json``), the default reference of the check."""
DEPENDENCY = "dependency score, 1 core"
"""The model-free dependency score's measures of every document (its ids made beforehand)."""
TOKENIZER_PIECES = BASELINES["pieces"]
"""Curation's own tokenizer calls, split and pinned as :data:`TOKENIZER_PROCESSES`."""
TOKENIZER_PROCESSES = "tokenizer, 2 processes of 1 thread"
"""The tokenizer as curation's tasks run it: one process per core, one thread each, half the texts
each (split by length as curation splits its inputs)."""
CODE_PACKAGES = (
    "asyncio",
    "email",
    "json",
    "logging",
    "multiprocessing",
    "unittest",
    "xml",
    "urllib",
    "http",
    "importlib",
    "sqlite3",
    "concurrent",
    "ctypes",
    "tomllib",
    "zoneinfo",
)


# --- inputs ----------------------------------------------------------------------------------------


def build_input(corpus: Path, dest: Path, copies: int = 1, kind: str = "corpus") -> Path:
    """``dest`` with ``books/`` and ``papers/`` copied from the corpus and ``code/`` holding code
    repositories, one folder each. With ``copies`` > 1, each book and paper also comes ``copies - 1``
    more times with the words of every line shuffled (:func:`shuffled_copy`): the same words and
    characters to tokenize, but no n-grams in common, so that no copy is a duplicate and curation
    keeps and stores them all (a larger input than the corpus, on which fixed costs such as process
    start weigh less).

    ``kind`` says what the code is: ``corpus``, some standard-library packages (:data:`CODE_PACKAGES`,
    the same at every size, so the extra megabytes of a larger size are books and papers only);
    ``mixed``, about ``copies`` x :data:`MIXED_CODE_BYTES` of installed Python packages
    (:func:`mixed_repositories`), so that code grows with the books and papers and every extra megabyte
    is about a third code."""
    import sysconfig

    for sub in ("books", "papers"):
        shutil.copytree(corpus / sub, dest / sub, symlinks=False)
        for copy in range(1, copies):
            for path in sorted(p for p in (corpus / sub).iterdir() if p.is_file()):
                shuffled_copy(
                    path,
                    dest / sub / f"{path.stem}_copy{copy}{path.suffix}",
                    random.Random(f"{path.name}{copy}"),
                )
    if kind == "mixed":
        for repo in mixed_repositories(copies * MIXED_CODE_BYTES):
            shutil.copytree(repo, dest / "code" / repo.name, ignore=_not_source, symlinks=True)
        return dest
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for name in CODE_PACKAGES:
        if (stdlib / name).is_dir():
            shutil.copytree(
                stdlib / name,
                dest / "code" / name,
                ignore=shutil.ignore_patterns("__pycache__", "test", "tests"),
            )
    return dest


MIXED_CODE_BYTES = 8_000_000
"""Bytes of source files per copy in the ``mixed`` input."""
MIXED_REPO_BYTES = (20_000, 6_000_000)
"""The sizes of source (in bytes) of the packages the ``mixed`` input takes as repositories: no
package so large that one document holds most of a task's work (``torch``, ``transformers``)."""
MIXED_LEFT_OUT = frozenset(
    {"site-packages", "test", "idlelib", "pip", "setuptools", "httpcore2", "httpx2", "multiprocess"}
)
"""Folders the ``mixed`` input never takes: the interpreter's own site-packages and tests, and
packages that are (or vendor) copies of others (file-level deduplication would drop their files
before curation tokenizes them, but not before the bare tokenizer does)."""


def _source_names(folder: Path, names: list[str]) -> set[str]:
    """The entries of ``folder`` a repository copy leaves out: tests, caches, and files that the
    code reader would skip by their name or size (binaries, large data)."""
    from longctx.pipeline.readers.code import DEFAULT_MAX_FILE_BYTES, name_skip_reason, size_skip_reason

    def skipped(name: str) -> bool:
        path = folder / name
        if path.is_dir():
            return False
        return bool(
            name_skip_reason(name) or size_skip_reason(name, path.lstat().st_size, DEFAULT_MAX_FILE_BYTES)
        )

    return {name for name in names if name in ("__pycache__", "test", "tests") or skipped(name)}


def _not_source(folder: str, names: list[str]) -> set[str]:
    return _source_names(Path(folder), names)


def source_bytes(package: Path) -> int:
    """The bytes of the files a repository copy of ``package`` takes (see :func:`_source_names`)."""
    total = 0
    for folder, dirs, files in os.walk(package):
        dropped = _source_names(Path(folder), dirs + files)
        dirs[:] = [d for d in dirs if d not in dropped]
        total += sum(os.path.getsize(os.path.join(folder, f)) for f in files if f not in dropped)
    return total


def mixed_repositories(budget: int) -> list[Path]:
    """Installed Python packages read as code repositories (never imported or run): the standard
    library's top-level packages and those of this environment's site-packages whose source is within
    :data:`MIXED_REPO_BYTES`, in a fixed shuffled order (one name once), taken until their source
    reaches ``budget`` bytes. A larger budget takes the same packages first, then more."""
    import sysconfig

    seen: set[str] = set()
    candidates: list[Path] = []
    for root in (Path(sysconfig.get_paths()["stdlib"]), Path(sysconfig.get_paths()["purelib"])):
        for path in sorted(root.iterdir()):
            name = path.name
            if (
                not path.is_dir()
                or path.is_symlink()
                or name in seen
                or name in MIXED_LEFT_OUT
                or name.startswith(("_", "."))
                or "." in name
                or "-" in name
            ):
                continue
            seen.add(name)
            candidates.append(path)
    random.Random(0).shuffle(candidates)
    taken, total = [], 0
    for path in candidates:
        if total >= budget:
            break
        size = source_bytes(path)
        if MIXED_REPO_BYTES[0] <= size <= MIXED_REPO_BYTES[1]:
            taken.append(path)
            total += size
    if total < budget:
        sys.exit(f"bench: the installed packages hold {total} bytes of source, fewer than the {budget} asked")
    return taken


def shuffled_copy(source: Path, dest: Path, rng: random.Random) -> None:
    """``source`` with the words (split at single spaces) of each line of more than three words put
    in a random order; lines that start with a backslash (LaTeX commands) are left as they are. A
    file that is not UTF-8 is copied unchanged (its reader skips it either way)."""
    try:
        text = source.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        shutil.copyfile(source, dest)
        return
    lines = []
    for line in text.split("\n"):
        words = line.split(" ")
        if len(words) > 3 and not line.lstrip().startswith("\\"):
            rng.shuffle(words)
        lines.append(" ".join(words))
    dest.write_text("\n".join(lines), encoding="utf-8")


def curate_config(input_dir: Path, output: Path, tokenizer: Path | None, tasks: int) -> dict:
    return {
        "output": str(output),
        "context": {"original": 1024, "target": 4096},
        "tokenizer": {"path": str(tokenizer)} if tokenizer else {},
        "curate": {"input": str(input_dir), "executor": {"tasks": tasks, "workers": tasks}},
        "pack": {"seq_lens": [4096], "executor": {"tasks": tasks, "workers": tasks}},
    }


def reader_texts(input_dir: Path, work: Path) -> list[str]:
    """The texts curation tokenizes: every readable document the readers produce."""
    return [text for _, text in reader_documents(input_dir, work)]


def reader_documents(input_dir: Path, work: Path) -> list[tuple[str, str]]:
    """``(source, text)`` of every readable document the readers produce."""
    from longctx.config import parse_config
    from longctx.core.layout import RunLayout
    from longctx.pipeline.curate import make_reader, resolve_sources

    cfg = parse_config(curate_config(input_dir, work / "probe", None, 1))
    documents = []
    for source in resolve_sources(cfg.curate, RunLayout(work / "probe", "curate")):
        for doc in make_reader(source, cfg.curate).run(None, 0, 1):
            if not doc.metadata.get("skip_reason"):
                documents.append((source.name, doc.text))
    return documents


def train_tokenizer(texts: list[str], path: Path, vocab: int) -> Path:
    """A byte-level BPE like the demo's, trained on a 4 MB sample (not timed)."""
    from longctx.pipeline.bpe import train_bpe

    rng = random.Random(0)
    sample = [t[i : i + 20_000] for t in texts for i in range(0, len(t), 20_000) if rng.random() < 0.1]
    train_bpe(sample, vocab, path)
    return path


# --- children --------------------------------------------------------------------------------------


def child_tokenize(texts_file: str, tokenizer: str) -> None:
    """Child: one ``encode_batch_fast`` over the texts (read before tokenizing). Prints the tokens."""
    from tokenizers import Tokenizer

    texts = pa.ipc.open_file(texts_file).read_all().column("text").to_pylist()
    tok = Tokenizer.from_file(tokenizer)
    tokens = sum(len(e.ids) for e in tok.encode_batch_fast(texts, add_special_tokens=False))
    print(json.dumps({"tokens": tokens}))


def child_pieces(texts_file: str, tokenizer: str) -> None:
    """Child: curation's ``TokenEncoder`` over the texts (read before tokenizing). Prints the tokens."""
    from tokenizers import Tokenizer

    from longctx.pipeline.tokens import TokenEncoder

    texts = pa.ipc.open_file(texts_file).read_all().column("text").to_pylist()
    tokens = sum(len(ids) for ids in TokenEncoder(Tokenizer.from_file(tokenizer)).encode(texts))
    print(json.dumps({"tokens": tokens}))


def child_signatures(texts_file: str) -> None:
    """Child: MinHash signatures and exact hashes of the texts (curation's defaults)."""
    from datatrove.pipeline.dedup.minhash import MinhashConfig

    from longctx.pipeline.signatures import exact_hash, minhash_signature

    texts = pa.ipc.open_file(texts_file).read_all().column("text").to_pylist()
    minhash_signature("é warm up the tables", MinhashConfig())
    cpu, wall = time.process_time(), time.perf_counter()
    for text in texts:
        minhash_signature(text, MinhashConfig())
        exact_hash(text)
    print(json.dumps({"cpu": time.process_time() - cpu, "wall": time.perf_counter() - wall}))


def child_dependency(texts_file: str, tokenizer: str) -> None:
    """Child: the dependency score's measures of the texts' token ids (made first, not timed), every
    document's background segments taken too, as for the first documents of a source in a task."""
    import numpy as np
    from tokenizers import Tokenizer

    from longctx.pipeline.dependency import SEGMENT_TOKENS, document_sharing

    texts = pa.ipc.open_file(texts_file).read_all().column("text").to_pylist()
    encoded = Tokenizer.from_file(tokenizer).encode_batch_fast(texts, add_special_tokens=False)
    ids = [np.asarray(e.ids, dtype=np.uint32) for e in encoded]
    del encoded
    document_sharing(np.arange(8 * SEGMENT_TOKENS, dtype=np.uint32), background=True)  # warm up
    cpu, wall = time.process_time(), time.perf_counter()
    for one in ids:
        document_sharing(one, background=True)
    print(json.dumps({"cpu": time.process_time() - cpu, "wall": time.perf_counter() - wall}))


def run_child(args: list[str], cores: set[int], env: dict | None = None) -> tuple[float, float, str]:
    """CPU (this child and all its descendants, reaped here) and wall seconds of a command on
    ``cores``, and its stdout."""
    cpu, wall, (out,) = run_children([(args, cores)], env)
    return cpu, wall, out


def run_children(
    commands: list[tuple[list[str], set[int]]], env: dict | None = None
) -> tuple[float, float, list[str]]:
    """Commands started together, each on its own cores: their CPU (with all their descendants,
    reaped here), the wall seconds until the last one ended, and each one's stdout."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    procs = [
        subprocess.Popen(
            args,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            preexec_fn=lambda cores=cores: os.sched_setaffinity(0, cores),
        )
        for args, cores in commands
    ]
    outputs = [proc.communicate() for proc in procs]
    while True:  # descendants orphaned on the way (datatrove's forkserver and its workers) came to us
        try:
            os.wait()
        except ChildProcessError:
            break
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    for (args, _), proc, (_, err) in zip(commands, procs, outputs):
        if proc.returncode != 0:
            sys.exit(f"bench: {' '.join(args[:4])} failed:\n{err[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, [out for out, _ in outputs]


def peak_memory(one_line_mb: float, tokenizer: Path, work: Path) -> tuple[float, float]:
    """Peak RSS (MB) of ``longctx curate`` on one generated one-line book, and on a 1 MB one."""
    peaks = []
    for size in (1.0, one_line_mb):
        root = work / f"mem{size:g}"
        books = root / "in" / "books"
        books.mkdir(parents=True)
        rng = random.Random(0)
        words = ["".join(rng.choice("etaoinshrdlu") for _ in range(rng.randint(1, 9))) for _ in range(5000)]
        with open(books / "one_line.txt", "w") as f:
            written = 0
            while written < size * 1e6:
                chunk = " ".join(rng.choices(words, k=10_000)) + " "
                written += f.write(chunk)
        config = root / "c.yaml"
        config.write_text(yaml.safe_dump(curate_config(root / "in", root / "out", tokenizer, 1)))
        script = (
            "import resource, runpy, sys; sys.argv = ['longctx', 'curate', '--config', sys.argv[1]]\n"
            "try:\n    runpy.run_module('longctx.cli', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            # VmHWM, not RUSAGE_SELF: Linux carries ru_maxrss across exec (the parent's size)
            "own = next(int(l.split()[1]) for l in open('/proc/self/status') if l.startswith('VmHWM:'))\n"
            "print(max(own, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))"
        )
        _, _, out = run_child([sys.executable, "-c", script, str(config)], os.sched_getaffinity(0))
        peaks.append(int(out.strip().splitlines()[-1]) / 1024)
    return peaks[0], peaks[1]


# --- report ----------------------------------------------------------------------------------------


def machine() -> dict[str, object]:
    """What ran the benchmark: the CPU model, the cores given, Python."""
    with open("/proc/cpuinfo") as f:
        model = next(
            (line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "unknown"
        )
    return {"cpu": model, "cores": len(os.sched_getaffinity(0)), "python": sys.version.split()[0]}


def write_texts(texts: list[str], path: Path) -> Path:
    """``texts`` as an Arrow file of one column, ``text``, for the tokenizer and signature children."""
    table = pa.table({"text": pa.array(texts, pa.large_string())})
    with pa.ipc.new_file(path, table.schema) as writer:
        writer.write_table(table)
    return path


def prepare_size(
    corpus: Path, work: Path, copies: int, kind: str = "corpus"
) -> tuple[Path, Path, list[Path], int, int, str]:
    """The input folder for ``copies`` (see :func:`build_input`), the file of the texts its readers
    produce, that file in two halves (split by length with curation's own split of its inputs among
    tasks, ``assign_by_size``; made here so that the timed children import nothing for it), the
    texts' characters and UTF-8 bytes, and what they are (MB per source)."""
    from longctx.pipeline.readers.listing import assign_by_size

    input_dir = build_input(corpus, work / f"input{copies}", copies, kind)
    documents = reader_documents(input_dir, work)
    texts = [text for _, text in documents]
    by_source: dict[str, float] = {}
    for source, text in documents:
        by_source[source] = by_source.get(source, 0.0) + len(text.encode("utf-8")) / 1e6
    repos = len(list((input_dir / "code").iterdir()))
    what = ", ".join(f"{name} {mb:.1f} MB" for name, mb in by_source.items()) + (
        f" ({repos} repositories of {'installed packages' if kind == 'mixed' else 'the standard library'})"
    )
    texts_file = write_texts(texts, work / f"texts{copies}.arrow")
    owners = assign_by_size([len(t) for t in texts], 2)
    halves = [
        write_texts([t for t, o in zip(texts, owners) if o == k], work / f"texts{copies}_half{k}.arrow")
        for k in range(2)
    ]
    n_bytes = sum(len(t.encode("utf-8")) for t in texts)
    return input_dir, texts_file, halves, sum(map(len, texts)), n_bytes, what


def record(rows: dict[str, dict[str, list[float]]], name: str, cpu: float, wall: float) -> None:
    """Add one repetition's CPU and wall seconds to ``rows[name]``."""
    rows.setdefault(name, {"cpu": [], "wall": []})
    rows[name]["cpu"].append(cpu)
    rows[name]["wall"].append(wall)


def print_size(rows: dict[str, dict[str, list[float]]], reps: int) -> None:
    """The table and ratios of one input size."""
    print(f"seconds, median [min-max] of {reps}:")
    print(f"{'':46s}{'CPU':>26s}{'wall':>26s}")
    for name, v in rows.items():
        print(f"{name:46s}{fmt(v['cpu']):>26s}{fmt(v['wall']):>26s}")
    med = {name: {k: statistics.median(x) for k, x in v.items()} for name, v in rows.items()}
    tok1, tok2 = med["tokenizer, 1 thread on 1 core"], med["tokenizer, 2 cores"]
    cur2, cur1 = med["curate, 2 task(s) on 2 core(s)"], med["curate, 1 task(s) on 1 core(s)"]
    sig = med["MinHash + exact hash, 1 core"]
    print("ratios of medians                                            CPU     wall")
    print(
        f"curate (2 tasks, 2 cores) / tokenizer (2 cores)            {cur2['cpu'] / tok2['cpu']:6.2f}  "
        f"{cur2['wall'] / tok2['wall']:6.2f}"
    )
    print(f"curate (2 tasks, 2 cores) / tokenizer (1 thread)           {cur2['cpu'] / tok1['cpu']:6.2f}")
    print(
        "  throughput of curate relative to the bare tokenizer (wall, 2 cores): "
        f"{tok2['wall'] / cur2['wall']:.2f}x"
    )
    e2e = med[END_TO_END]
    print(
        f"curate + pack (2 tasks, 2 cores) / tokenizer (2 cores)     {e2e['cpu'] / tok2['cpu']:6.2f}  "
        f"{e2e['wall'] / tok2['wall']:6.2f}"
    )
    print(
        "  throughput of curate + pack relative to the bare tokenizer (wall, 2 cores; goal 0.75), per "
        f"repetition: {fmt(throughputs(rows, 'whole'))}x"
    )
    print(
        "  ... relative to curation's own tokenizer calls in pieces, 2 processes of 1 thread (the tighter "
        f"bound): {fmt(throughputs(rows, 'pieces'))}x"
    )
    if BASELINES["whole_allocator"] in rows:
        print(
            "  ... relative to the bare tokenizer with curation's allocator (wall, 2 cores): "
            f"{fmt(throughputs(rows, 'whole_allocator'))}x"
        )
    print(
        "  ... relative to the one-thread tokenizer's wall time halved (perfect use of 2 cores, which the "
        f"tokenizer's own threads do not reach): {tok1['wall'] / 2 / e2e['wall']:.2f}x"
    )
    print(
        "scaling: curate 1 task on 1 core / 2 tasks on 2 cores (wall; goal 1.8): "
        f"{cur1['wall'] / cur2['wall']:.2f}x"
    )
    procs = med[TOKENIZER_PROCESSES]["wall"]
    print(
        f"  the tokenizer's own, 1 thread on 1 core / 2 processes of 1 thread (curation's tasks without "
        f"the rest): {tok1['wall'] / procs:.2f}x; / 1 process of 2 threads: "
        f"{tok1['wall'] / tok2['wall']:.2f}x"
    )
    print(f"MinHash + exact hash / tokenizer (1 thread, CPU): {sig['cpu'] / tok1['cpu']:.3f}")
    # per repetition: the score and the tokenizer ran on the same texts one after the other
    ratios = [d / t for d, t in zip(rows[DEPENDENCY]["cpu"], rows["tokenizer, 1 thread on 1 core"]["cpu"])]
    print(
        f"dependency score / tokenizer (1 thread, CPU; goal at most 0.10), per repetition: "
        f"{statistics.median(ratios):.4f} [{min(ratios):.4f}-{max(ratios):.4f}]"
    )


def print_marginal(
    small: tuple[float, dict[str, dict[str, list[float]]]],
    large: tuple[float, dict[str, dict[str, list[float]]]],
) -> None:
    """What the megabytes between two input sizes cost, each contender against itself: the
    per-megabyte cost, without the fixed costs (process starts, imports, pools, the code files, the
    stats figure) that a larger input spreads thinner. A curation of gigabytes runs at the marginal
    throughput; the fixed cost is the intercept at 0 MB. Each repetition ran both sizes one after
    the other, so every figure is computed per repetition and printed as median [min-max]."""
    (mb1, rows1), (mb2, _) = small, large

    def slopes(name: str, kind: str = "wall") -> list[float]:
        return marginal_slopes(small, large, name, kind)

    def fixed(name: str) -> list[float]:
        return [a - s * mb1 for a, s in zip(rows1[name]["wall"], slopes(name))]

    def ratios(num: str, den: str) -> list[float]:
        return [n / d for n, d in zip(slopes(num), slopes(den))]

    tok2, tok1 = "tokenizer, 2 cores", "tokenizer, 1 thread on 1 core"
    e2e, cur2, cur1 = (
        END_TO_END,
        "curate, 2 task(s) on 2 core(s)",
        "curate, 1 task(s) on 1 core(s)",
    )
    print(f"\nmarginal, from {mb1:.1f} MB to {mb2:.1f} MB (wall; per repetition, median [min-max]):")
    for name in (tok2, BASELINES["whole_allocator"], BASELINES["pieces"], e2e):
        if name not in rows1:
            continue
        print(
            f"  {name:46s} {fmt(slopes(name))} s per extra MB; fixed cost (intercept "
            f"at 0 MB) {fmt(fixed(name))} s"
        )
    print(
        "  marginal throughput of curate + pack relative to the bare tokenizer (goal 0.85): "
        f"{fmt(ratios(tok2, e2e))}x; curate alone {fmt(ratios(tok2, cur2))}x"
    )
    print(
        "  ... relative to curation's own tokenizer calls in pieces, 2 processes of 1 thread: "
        f"{fmt(ratios(BASELINES['pieces'], e2e))}x"
    )
    if BASELINES["whole_allocator"] in rows1:
        print(
            "  ... relative to the bare tokenizer with curation's allocator: "
            f"{fmt(ratios(BASELINES['whole_allocator'], e2e))}x"
        )
    print(
        "  marginal scaling, curate 1 task on 1 core / 2 tasks on 2 cores (goal 1.8): "
        f"{fmt(ratios(cur1, cur2))}x; the tokenizer's own, 1 thread / 2 processes of 1 thread: "
        f"{fmt(ratios(tok1, TOKENIZER_PROCESSES))}x, "
        f"1 thread / 1 process of 2 threads: {fmt(ratios(tok1, tok2))}x"
    )
    # CPU seconds are what the work costs, whatever else runs on the cores; wall seconds swing with the
    # load of a shared machine. The extra CPU over the one-thread tokenizer's is what curation adds.
    cpu_ratios = [t / e for t, e in zip(slopes(tok1, "cpu"), slopes(e2e, "cpu"))]
    print(
        f"  CPU per extra MB: tokenizer (1 thread) {fmt(slopes(tok1, 'cpu'))} s, curate + pack (2 tasks) "
        f"{fmt(slopes(e2e, 'cpu'))} s; tokenizer's CPU / curate + pack's: {fmt(cpu_ratios)}x"
    )
    # The same work split as curation splits it: two one-thread processes on two cores, half the
    # texts each (two processes cost more CPU per MB than one: they share the cores' caches).
    procs = slopes(TOKENIZER_PROCESSES, "cpu")
    split = [t / e for t, e in zip(procs, slopes(e2e, "cpu"))]
    print(
        f"  ... against the tokenizer as 2 processes of 1 thread ({fmt(procs)} s per extra MB, "
        f"curation's split of the texts): {fmt(split)}x"
    )
    # the size S from which tok(S) >= 0.75 e2e(S), with each repetition's line; none if it never does
    crossing = [
        max(0.0, (0.75 * f_e - f_t) / (s_t - 0.75 * s_e)) if s_t > 0.75 * s_e else float("inf")
        for s_t, s_e, f_t, f_e in zip(slopes(tok2), slopes(e2e), fixed(tok2), fixed(e2e))
    ]
    print(
        f"  input size from which curate + pack reaches 0.75x of the tokenizer's throughput: {fmt(crossing)} "
        "MB (inf: never, in that repetition)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument(
        "--copies",
        type=int,
        nargs="+",
        default=[1],
        help="books and papers this many times (copies with shuffled words; see build_input); "
        "several values measure each size and the marginal cost between the smallest and largest",
    )
    parser.add_argument(
        "--input",
        choices=("corpus", "mixed"),
        default="corpus",
        help="the code beside the books and papers: a few standard-library packages, the same at every "
        "size (corpus), or installed packages that grow with --copies (mixed; see build_input)",
    )
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument(
        "--one-line-mb", type=float, default=0, help="also measure peak memory on a one-line book"
    )
    parser.add_argument("--report", type=Path, help="write the figures as JSON to this file")
    parser.add_argument(
        "--check",
        type=Path,
        help="a recorded report of the same input: exit with status 1 when a figure is more than 5%% "
        "below it (default: the newest report of the same input in tests/benchmarks/results)",
    )
    parser.add_argument("--no-check", action="store_true", help="compare with no recorded report")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        children = {
            "tokenize": child_tokenize,
            "pieces": child_pieces,
            "signatures": child_signatures,
            "dependency": child_dependency,
        }
        children[args.child[0]](*args.child[1:])
        return 0
    require_corpus(args.corpus, "bench_curate")
    try:  # the allocator `longctx curate` and `longctx pack` will execute themselves with
        library = allocator_to_preload(
            {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", MARKER)}
        )
    except ConfigError as err:
        print(f"bench_curate: {err}", file=sys.stderr)
        return 2
    print(f"curation's malloc: {library or 'the system allocator'}")
    recorded = None
    if args.check is not None:
        try:
            recorded = json.loads(args.check.read_text())
        except (OSError, ValueError) as err:
            print(f"bench_curate: --check {args.check}: {err}", file=sys.stderr)
            return 2
    if min(args.copies) < 1:
        print("bench_curate: --copies must be at least 1", file=sys.stderr)
        return 2
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        print("bench_curate: needs at least 2 cores for the scaling measure", file=sys.stderr)
        return 2
    two, one = set(cores[:2]), {cores[0]}
    become_subreaper("bench_curate")
    work = Path(tempfile.mkdtemp(prefix="bench_curate_"))
    try:
        sizes = sorted(set(args.copies))
        inputs = {copies: prepare_size(args.corpus, work, copies, args.input) for copies in sizes}
        texts = pa.ipc.open_file(inputs[sizes[0]][1]).read_all().column("text").to_pylist()
        tokenizer = train_tokenizer(texts, work / "tokenizer.json", args.vocab)
        del texts

        py = [sys.executable, __file__, "--child"]
        plain = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", MARKER)}
        one_thread = dict(plain, TOKENIZERS_PARALLELISM="false", RAYON_NUM_THREADS="1")
        # curation's own processes (and the baselines that run as they do) with its allocator
        preload = {} if library is None else {"LD_PRELOAD": str(library)}
        rows: dict[int, dict[str, dict[str, list[float]]]] = {copies: {} for copies in sizes}
        tokens: dict[int, int] = {}

        # interleaved (each repetition runs every contender on every size), so that load from others
        # hits every contender alike
        for rep in range(args.reps):
            for copies in sizes:
                input_dir, texts_file, halves, _, _, _ = inputs[copies]

                cpu, wall, out = run_child(
                    py + ["tokenize", str(texts_file), str(tokenizer)], one, one_thread
                )
                record(rows[copies], "tokenizer, 1 thread on 1 core", cpu, wall)
                tokens[copies] = json.loads(out)["tokens"]
                cpu, wall, _ = run_child(py + ["tokenize", str(texts_file), str(tokenizer)], two, plain)
                record(rows[copies], "tokenizer, 2 cores", cpu, wall)
                if preload:
                    cpu, wall, _ = run_child(
                        py + ["tokenize", str(texts_file), str(tokenizer)], two, plain | preload
                    )
                    record(rows[copies], BASELINES["whole_allocator"], cpu, wall)
                pinned = [(py + ["tokenize", str(h), str(tokenizer)], {core}) for h, core in zip(halves, two)]
                cpu, wall, outs = run_children(pinned, one_thread)
                if sum(json.loads(out)["tokens"] for out in outs) != tokens[copies]:
                    sys.exit("bench: the two halves of the texts do not hold all of their tokens")
                record(rows[copies], TOKENIZER_PROCESSES, cpu, wall)
                pinned = [(py + ["pieces", str(h), str(tokenizer)], {core}) for h, core in zip(halves, two)]
                cpu, wall, outs = run_children(pinned, one_thread | preload)
                if sum(json.loads(out)["tokens"] for out in outs) != tokens[copies]:
                    sys.exit("bench: curation's tokenizer calls do not give the tokens of the whole texts")
                record(rows[copies], TOKENIZER_PIECES, cpu, wall)
                for tasks, given in ((2, two), (1, one)):
                    output = work / f"out{tasks}"
                    shutil.rmtree(output, ignore_errors=True)
                    config = work / f"curate{tasks}.yaml"
                    config.write_text(yaml.safe_dump(curate_config(input_dir, output, tokenizer, tasks)))
                    cpu, wall, _ = run_child(
                        [sys.executable, "-m", "longctx.cli", "curate", "--config", str(config)], given, plain
                    )
                    record(rows[copies], f"curate, {tasks} task(s) on {len(given)} core(s)", cpu, wall)
                    if tasks == 2:
                        pcpu, pwall, out = run_child(
                            [sys.executable, "-m", "longctx.cli", "pack", "--config", str(config)],
                            given,
                            plain,
                        )
                        record(rows[copies], "pack (stored ids), 2 tasks on 2 cores", pcpu, pwall)
                        record(rows[copies], END_TO_END, cpu + pcpu, wall + pwall)
                        logs = "".join(
                            p.read_text(errors="replace") for p in (output / "work").rglob("*.log")
                        )
                        if "re-tokenized" in logs:
                            print("  warning: pack re-tokenized some documents (see its logs)")
                _, _, out = run_child(py + ["signatures", str(texts_file)], one)
                inner = json.loads(out)  # timed inside: without reading the texts and importing
                record(rows[copies], "MinHash + exact hash, 1 core", inner["cpu"], inner["wall"])
                _, _, out = run_child(py + ["dependency", str(texts_file), str(tokenizer)], one, one_thread)
                inner = json.loads(out)  # timed inside: without tokenizing, reading and importing
                record(rows[copies], DEPENDENCY, inner["cpu"], inner["wall"])
            print(f"  repetition {rep + 1}/{args.reps} done", flush=True)

        with open("/proc/loadavg") as f:
            load = f.read().split()[:3]
        megabytes: dict[int, float] = {}
        for copies in sizes:
            _, _, _, n_chars, n_bytes, what = inputs[copies]
            print(
                f"\ntext: {n_chars / 1e6:.1f} M chars, {n_bytes / 1e6:.1f} MB: {what}; books and papers of "
                f"{args.corpus}{f' and {copies - 1} shuffled copies of each' if copies > 1 else ''}; "
                f"{tokens[copies] / 1e6:.2f} M tokens, byte-level BPE vocab {args.vocab}; "
                f"load average {' '.join(load)}"
            )
            megabytes[copies] = n_bytes / 1e6
            print_size(rows[copies], args.reps)
        report = {
            "what": "curate + pack against the tokenizer on the same texts",
            "date": time.strftime("%Y-%m-%d"),
            "command": " ".join(["tests/benchmarks/bench_curate.py", *sys.argv[1:]]),
            "commit": commit(),
            "machine": machine(),
            "load_average": load,
            "allocator": library.name if library is not None else "system",
            "reps": args.reps,
            "sizes": [
                {
                    "copies": copies,
                    "megabytes": megabytes[copies],
                    "tokens": tokens[copies],
                    "what": inputs[copies][5],
                    "seconds": rows[copies],
                    "throughput": whole_run(rows[copies]),
                }
                for copies in sizes
            ],
        }
        if len(sizes) > 1:
            ends = [(megabytes[c], rows[c]) for c in (sizes[0], sizes[-1])]
            print_marginal(*ends)
            report["per_extra_mb"] = per_extra_mb(*ends)
        print()
        for line in goal_lines(report):
            print(line)
        if args.one_line_mb:
            small, big = peak_memory(args.one_line_mb, tokenizer, work)
            print(
                f"\npeak RSS of curate on a {args.one_line_mb:g} MB one-line book: {big:.0f} MB "
                f"({(big - small) / args.one_line_mb:.1f}x its size above the {small:.0f} MB of a 1 MB book)"
            )
        if args.report is not None:
            args.report.write_text(json.dumps(report, indent=1) + "\n")
            print(f"report: {args.report}")
        against, slower = args.check, []
        if recorded is not None:
            try:
                slower = regressions(recorded, report)
            except ValueError as err:
                print(f"bench_curate: --check {args.check}: {err}", file=sys.stderr)
                return 2
        elif not args.no_check:
            against, slower = newest_comparable(RESULTS, report)
        if against is None and not args.no_check:
            print(f"check: no report of this input in {RESULTS} to compare with (--report records one)")
        elif against is not None and slower:
            print(f"\nbench_curate: SLOWER than {against} by more than 5%:", file=sys.stderr)
            for line in slower:
                print(f"  {line}", file=sys.stderr)
            return 1
        elif against is not None:
            print(f"check: no figure more than 5% below {against}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
