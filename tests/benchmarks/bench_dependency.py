"""Does the model-free dependency score (``longctx.pipeline.dependency``) tell documents with long-range
dependencies from documents without? Three cases, built independently of the score
(``tests/pipeline/dependency_cases.py``), each scored against the chance similarity of its own
documents, as curation measures it on a source:

* ``synthetic``: generated documents whose second half refers back to the first (its names and
  facts repeated among new text) against the same halves joined from unrelated documents: the AUC of
  the score over every (related, unrelated) pair.
* ``books``: the shared corpus' Gutenberg books with at least 10 chapters ("CHAPTER"/"Chapter"
  headings), against the same books with their chapters shuffled across books (every book's
  chapters pooled and dealt back at random, each book getting as many as it had): per book, both
  scores; the AUC; the shuffled books' median, which the score's design puts at 0 (chance).
* ``code``: the standard-library packages the embedded default corpus curates as repositories, files
  in the code reader's dependency order against the same files in random orders (``--shuffles``
  each), and against "repositories" of files dealt out at random across packages (each getting as
  many files as it had; one that gets a large file keeps that file's own long-range sharing, so
  these are not all at chance).

Also the score's CPU per megabyte against the tokenizer's, on the books' text, one thread each.
Prints the figures; ``--report PATH`` writes them as JSON.

    .venv/bin/python tests/benchmarks/bench_dependency.py [--corpus DIR] [--report PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchtools import CORPUS, REPO, commit, require_corpus

sys.path.insert(0, str(REPO))

from tests.pipeline.dependency_cases import (
    auc,
    corpus_books,
    deal_across,
    encoder,
    joined,
    referring_halves,
    repository_blocks,
    score_documents,
    stdlib_repositories,
)


def median(values: list[float]) -> float:
    return round(statistics.median(values), 4)


def spread(values: list[float], digits: int = 4) -> dict[str, float]:
    """Median, min and max of repeated figures."""
    return {
        k: round(f(values), digits) for k, f in (("median", statistics.median), ("min", min), ("max", max))
    }


def train(texts: list[str], vocab: int, folder: Path):
    """A byte-level BPE trained on 20,000-character pieces of every tenth of ``texts``' length."""
    from longctx.pipeline.bpe import train_bpe

    rng = random.Random(0)
    sample = [t[i : i + 20_000] for t in texts for i in range(0, len(t), 20_000) if rng.random() < 0.1]
    return train_bpe(sample, vocab, folder / "tokenizer.json")


def synthetic_case(pairs: int, tokenizer) -> dict:
    halves = [referring_halves(seed) for seed in range(pairs)]
    encode = encoder(tokenizer)
    firsts = encode([a for a, _ in halves])
    seconds = encode([b for _, b in halves])
    related = {i: joined([firsts[i], seconds[i]]) for i in range(pairs)}
    unrelated = {i: joined([firsts[i], seconds[(i + 1) % pairs]]) for i in range(pairs)}
    background = list(related.values())
    pos = list(score_documents(related, background).values())
    neg = list(score_documents(unrelated, background).values())
    return {
        "pairs": pairs,
        "auc": round(auc(pos, neg), 4),
        "related_median": median(pos),
        "unrelated_median": median(neg),
        "tokens_per_document": int(statistics.median(len(d) for d in related.values())),
    }


def books_case(corpus: Path, tokenizer) -> dict:
    books = corpus_books(corpus)
    encode = encoder(tokenizer)
    parts = {name: encode(chapters) for name, chapters in books.items()}
    real = {name: joined(p) for name, p in parts.items()}
    shuffled = {name: joined(p) for name, p in deal_across(parts).items()}
    background = list(real.values())
    scores = score_documents(real, background)
    across = score_documents(shuffled, background)
    return {
        "books": {
            name: {
                "chapters": len(parts[name]),
                "tokens": len(real[name]),
                "score": round(scores[name], 4),
                "chapters_shuffled_across_books": round(across[name], 4),
            }
            for name in sorted(books)
        },
        "auc": round(auc(list(scores.values()), list(across.values())), 4),
        "books_median": median(list(scores.values())),
        "shuffled_median": median(list(across.values())),
        "books_above_their_shuffle": sum(scores[n] > across[n] for n in books),
    }


def code_case(tokenizer, shuffles: int) -> dict:
    encode = encoder(tokenizer)
    repos = {}
    for package in stdlib_repositories():
        order, blocks = repository_blocks(package)
        encoded = dict(zip(order, encode([blocks[path] for path in order])))
        if sum(len(ids) for ids in encoded.values()) >= 8 * 512:
            repos[package.name] = (order, encoded)
    dependency = {name: joined([ids[p] for p in order]) for name, (order, ids) in repos.items()}
    background = list(dependency.values())
    scores = score_documents(dependency, background)
    random_scores: dict[str, list[float]] = {name: [] for name in repos}
    for seed in range(shuffles):
        shuffled = {}
        for name, (order, ids) in repos.items():
            paths = list(order)
            random.Random(f"{name}{seed}").shuffle(paths)
            shuffled[name] = joined([ids[p] for p in paths])
        for name, value in score_documents(shuffled, background).items():
            random_scores[name].append(value)
    dealt = deal_across({name: [ids[p] for p in order] for name, (order, ids) in repos.items()})
    across = score_documents({name: joined(parts) for name, parts in dealt.items()}, background)
    per_repo = {
        name: {
            "files": len(repos[name][0]),
            "tokens": len(dependency[name]),
            "dependency_order": round(scores[name], 4),
            "random_orders": spread(random_scores[name]),
            "files_dealt_across_repositories": round(across[name], 4) if name in across else None,
        }
        for name in sorted(repos)
    }
    differences = [scores[n] - statistics.mean(random_scores[n]) for n in repos]
    return {
        "repositories": per_repo,
        "shuffles": shuffles,
        "dependency_minus_random_mean": round(statistics.mean(differences), 4),
        "dependency_minus_random_median": median(differences),
        "dependency_at_least_random_mean": sum(d >= 0 for d in differences),
        "dependency_below_every_random_order": sum(scores[n] < min(random_scores[n]) for n in repos),
        "repositories_vs_dealt_auc": round(auc(list(scores.values()), list(across.values())), 4),
        "dependency_order_median": median(list(scores.values())),
        "dealt_median": median(list(across.values())),
    }


def child_cost(tokenizer_file: str, texts_file: str, reps: int) -> None:
    """Child, one thread: CPU seconds of the tokenizer over the texts, then of the score over their
    ids, ``reps`` times each (interleaved), as JSON."""
    from tokenizers import Tokenizer

    from longctx.pipeline.dependency import document_sharing

    texts = json.loads(Path(texts_file).read_text(encoding="utf-8"))
    tok = Tokenizer.from_file(tokenizer_file)
    encode = encoder(tok)
    ids = encode(texts)
    rows: dict[str, dict[str, list[float]]] = {
        "tokenizer": {"cpu": [], "wall": []},
        "score": {"cpu": [], "wall": []},
    }
    for _ in range(reps):
        for name, work in (
            ("tokenizer", lambda: encode(texts)),
            ("score", lambda: [document_sharing(i) for i in ids]),
        ):
            cpu, wall = time.process_time(), time.perf_counter()
            work()
            rows[name]["cpu"].append(time.process_time() - cpu)
            rows[name]["wall"].append(time.perf_counter() - wall)
    print(json.dumps(rows))


def cost_case(corpus: Path, tokenizer_file: Path, work: Path, reps: int) -> dict:
    books = corpus_books(corpus, min_chapters=0)
    texts = ["".join(chapters) or "" for chapters in books.values()]
    texts = [t for t in texts if t]
    texts_file = work / "texts.json"
    texts_file.write_text(json.dumps(texts), encoding="utf-8")
    env = dict(os.environ, TOKENIZERS_PARALLELISM="false", RAYON_NUM_THREADS="1")
    out = subprocess.run(
        [sys.executable, __file__, "--child", str(tokenizer_file), str(texts_file), str(reps)],
        env=env, check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    rows = json.loads(out)
    megabytes = sum(len(t.encode("utf-8")) for t in texts) / 1e6
    ratios = [s / t for s, t in zip(rows["score"]["cpu"], rows["tokenizer"]["cpu"])]
    return {
        "megabytes": round(megabytes, 2),
        "reps": reps,
        "tokenizer_cpu_s": spread(rows["tokenizer"]["cpu"], 3),
        "tokenizer_wall_s": spread(rows["tokenizer"]["wall"], 3),
        "score_cpu_s": spread(rows["score"]["cpu"], 3),
        "score_wall_s": spread(rows["score"]["wall"], 3),
        "score_over_tokenizer_cpu": spread(ratios),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--pairs", type=int, default=60, help="synthetic document pairs")
    parser.add_argument("--shuffles", type=int, default=8, help="random orders of each repository")
    parser.add_argument("--reps", type=int, default=5, help="repetitions of the cost measure")
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--report", type=Path, help="write the figures here as JSON")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child_cost(args.child[0], args.child[1], int(args.child[2]))
        return 0
    require_corpus(args.corpus, "bench_dependency")
    with tempfile.TemporaryDirectory(prefix="bench_dependency_") as tmp:
        work = Path(tmp)
        books = corpus_books(args.corpus, min_chapters=0)
        code = [t for package in stdlib_repositories() for t in repository_blocks(package)[1].values()]
        synthetic = [a + b for a, b in (referring_halves(seed) for seed in range(20))]
        tokenizer = train(["".join(c) for c in books.values()] + code + synthetic, args.vocab, work)
        started = time.perf_counter()
        report = {
            "what": "tests/benchmarks/bench_dependency.py: the model-free dependency score on documents "
            "with and without long-range dependencies (see the script's docstring)",
            "tokenizer": f"byte-level BPE, vocabulary {args.vocab}, trained on the cases' text",
            "synthetic": synthetic_case(args.pairs, tokenizer),
            "books": books_case(args.corpus, tokenizer),
            "code": code_case(tokenizer, args.shuffles),
            "cost": cost_case(args.corpus, work / "tokenizer.json", work, args.reps),
            "seconds": 0.0,
            "python": platform.python_version(),
            "commit": commit(),
        }
        report["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(report, indent=2))
    if args.report:
        args.report.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
