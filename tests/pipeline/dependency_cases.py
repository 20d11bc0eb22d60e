"""Documents with and without long-range dependencies, for the dependency score's tests and its
benchmark (``tests/benchmarks/bench_dependency.py``): built here, independently of the code under
test, from generated text, the standard library's packages and the shared corpus' books.

Holds no tests.
"""

from __future__ import annotations

import json
import random
import re
import sysconfig
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from longctx.pipeline.readers.code import FILE_HEADER, reading_key, scan_repo
from longctx.pipeline.readers.code_order import file_dependencies, order_files
from longctx.pipeline.readers.gutenberg import strip_gutenberg
from longctx.pipeline.readers.listing import Tree

_COMMON_TEXT = (
    "the of and to in a is that for it as was with be by on not he this are or his from at which but "
    "have an they you were her she there one all we their been has when who will more no if out so said "
    "what up its about into than them can only other new some could time these two may then do first any "
    "my now such like our over man me even most made after also did many before must through back years "
    "where much your way well down should because each just those people how too little state good very "
    "make world still own see men work long get here between both life being under never day same another"
)
COMMON = tuple(_COMMON_TEXT.split())
"""Common English words: what unrelated texts share."""


def invented_word(rng: random.Random) -> str:
    """A capitalized made-up word of 2-4 syllables (a name no other document has, with luck)."""
    syllables = ["".join(rng.choice(part) for part in ("bdfgklmnprstvz", "aeiou", "lnrs")) for _ in range(4)]
    return "".join(syllables[: rng.randint(2, 4)]).capitalize()


def _sentence(rng: random.Random, names: Sequence[str]) -> str:
    words = [rng.choice(COMMON) for _ in range(rng.randint(8, 16))]
    for _ in range(rng.randint(0, 2)):
        words.insert(rng.randrange(len(words) + 1), rng.choice(names))
    return " ".join(words).capitalize() + "."


def referring_halves(seed: int, words_per_half: int = 2000) -> tuple[str, str]:
    """A document in two halves whose second refers back to the first: the first half tells of
    invented people and places, each sentence some common words and some of its names, with a few
    facts (a name and a phrase of its own); the second tells of new names and, every third sentence,
    repeats one of the first half's facts. Joined, the halves share names and facts across the
    document; the first half of one seed joined to the second of another shares only common words."""
    rng = random.Random(seed)
    names = [invented_word(rng) for _ in range(10)]
    facts = [
        f"{name} kept the {invented_word(rng).lower()} of {rng.choice(names)} in {invented_word(rng)}"
        for name in names
    ]
    first: list[str] = []
    while sum(len(s.split()) for s in first) < words_per_half:
        first.append(_sentence(rng, names))
        if rng.random() < 0.3:
            first.append(rng.choice(facts).capitalize() + ".")
    new_names = [invented_word(rng) for _ in range(10)]
    second: list[str] = []
    while sum(len(s.split()) for s in second) < words_per_half:
        second.append(_sentence(rng, new_names))
        if len(second) % 3 == 0:
            second.append(f"As {rng.choice(names)} had said, {rng.choice(facts)}.")
    return " ".join(first) + "\n\n", " ".join(second) + "\n"


def auc(positives: Sequence[float], negatives: Sequence[float]) -> float:
    """Probability that a positive outscores a negative (ties count half): the area under the ROC
    curve, by counting every pair."""
    wins = sum((p > n) + 0.5 * (p == n) for p in positives for n in negatives)
    return wins / (len(positives) * len(negatives))


# --- code repositories ----------------------------------------------------------------------------


def stdlib_repositories(min_bytes: int = 0, max_bytes: int | None = None) -> list[Path]:
    """The standard-library packages the embedded default corpus takes as code repositories
    (:mod:`longctx.pipeline.default_corpus`), those whose kept files hold ``min_bytes`` to
    ``max_bytes`` bytes."""
    from longctx.pipeline.default_corpus import EXCLUDED_PACKAGES

    root = Path(sysconfig.get_paths()["stdlib"])
    found = []
    for package in sorted(root.iterdir()):
        if package.is_dir() and (package / "__init__.py").is_file() and package.name not in EXCLUDED_PACKAGES:
            size = sum(len(t.encode()) for t in repository_files(package).values())
            if size >= min_bytes and (max_bytes is None or size <= max_bytes):
                found.append(package)
    return found


def repository_files(package: Path) -> dict[str, str]:
    """The files the code reader keeps of a repository folder, by path (caches left out)."""
    texts, _ = scan_repo(Tree.of(str(package.parent), package.name))
    return {path: text for path, text in texts.items() if "__pycache__" not in path}


def repository_blocks(package: Path) -> tuple[list[str], dict[str, str]]:
    """A repository's files in the code reader's dependency order, and each file's block of the
    document (its header line, its text, the blank line after it), so that any order of the same
    files is the same blocks rearranged."""
    texts = repository_files(package)
    order = order_files(file_dependencies(texts, package.name), key=reading_key)
    blocks = {
        path: FILE_HEADER.format(path=path) + text + ("" if text.endswith("\n") else "\n") + "\n"
        for path, text in texts.items()
    }
    return order, blocks


# --- books ------------------------------------------------------------------------------------------

CHAPTER = re.compile(r"^[ \t]*(?:CHAPTER|Chapter)\b.*$", re.MULTILINE)
MIN_CHAPTER_CHARS = 2000
"""Shorter pieces between two headings (a table of contents' lines) join the piece before them."""


def book_chapters(text: str) -> list[str]:
    """A book's chapters: the text from each "CHAPTER"/"Chapter" heading line to the next (what comes
    before the first heading left out), pieces shorter than :data:`MIN_CHAPTER_CHARS` joined to the
    one before."""
    starts = [m.start() for m in CHAPTER.finditer(text)]
    chapters: list[str] = []
    for start, end in zip(starts, starts[1:] + [len(text)]):
        if chapters and len(chapters[-1]) < MIN_CHAPTER_CHARS:
            chapters[-1] += text[start:end]
        else:
            chapters.append(text[start:end])
    return chapters


def corpus_books(corpus: Path, min_chapters: int = 10) -> dict[str, list[str]]:
    """The shared corpus' books with at least ``min_chapters`` chapters (one copy of each book its
    manifest lists as duplicated), Gutenberg boilerplate removed, as lists of chapters."""
    manifest = json.loads((corpus / "manifest.json").read_text(encoding="utf-8"))
    seen: set[str] = set()
    books = {}
    for item in sorted(manifest["books"], key=lambda item: item["file"]):
        group = item.get("dup_group")
        if group is not None and group in seen:
            continue
        seen.add(group)
        raw = (corpus / item["file"]).read_bytes().decode("utf-8-sig", errors="replace").replace("\r\n", "\n")
        chapters = book_chapters(strip_gutenberg(raw)[0])
        if len(chapters) >= min_chapters:
            books[item["file"]] = chapters
    return books


def deal_across(parts: dict[str, list[np.ndarray]], seed: int = 0) -> dict[str, list[np.ndarray]]:
    """The same documents with their parts shuffled across documents: every part of every document
    pooled, shuffled, and dealt back, each document receiving as many parts as it had."""
    pool = [part for name in sorted(parts) for part in parts[name]]
    random.Random(seed).shuffle(pool)
    dealt, taken = {}, 0
    for name in sorted(parts):
        dealt[name] = pool[taken : taken + len(parts[name])]
        taken += len(parts[name])
    return dealt


def joined(parts: Sequence[np.ndarray]) -> np.ndarray:
    """Token ids of parts, one after another."""
    return np.concatenate(parts).astype(np.uint32)


def encoder(tokenizer) -> Callable[[list[str]], list[np.ndarray]]:
    """Texts to uint32 id arrays with a ``tokenizers.Tokenizer`` (no special tokens)."""

    def encode(texts: list[str]) -> list[np.ndarray]:
        return [
            np.asarray(e.ids, dtype=np.uint32)
            for e in tokenizer.encode_batch_fast(texts, add_special_tokens=False)
        ]

    return encode


def score_documents(documents: dict[str, np.ndarray], background: Sequence[np.ndarray]) -> dict[str, float]:
    """The model-free dependency score of each document long enough to have one, against the chance
    similarity of the ``background`` documents' segments (as curation measures it on a source's
    documents)."""
    from longctx.pipeline.dependency import background_similarity, dependency_score, document_sharing

    chance = background_similarity([document_sharing(ids, background=True)[1] for ids in background])
    scores = {}
    for name, ids in documents.items():
        sharing, _ = document_sharing(ids)
        if sharing is not None:
            scores[name] = dependency_score(sharing, chance)
    return scores
