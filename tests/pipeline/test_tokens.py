"""Encoding in pieces equals encoding the whole text, for every tokenizer layout the encoder splits.

The reference is ``Tokenizer.encode(text, add_special_tokens=False).ids`` on the whole text. Small
BPE models are trained here with each pre-tokenizer (GPT-2 byte-level, the Llama 3 / Qwen 2 / GPT-4o
split regexes, SentencePiece-style Metaspace, whitespace) and texts dense in the characters where
pre-tokenization is subtle (spaces before and after punctuation, line breaks, digits, contractions,
non-ASCII spaces and marks).
"""

from __future__ import annotations

import itertools
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tokenizers import AddedToken, Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

from longctx.pipeline.bpe import train_bpe
from longctx.pipeline.tokens import (
    LLAMA3_PATTERN,
    O200K_PATTERN,
    QWEN2_PATTERN,
    TokenEncoder,
    piece_bounds,
    pieces_are_exact,
    tokenizer_threads,
)

WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "that",
    "was",
    "his",
    "it's",
    "I'm",
    "we'll",
    "don't",
    "2024",
    "3.14",
    "x_1",
    "def",
    "f(x):",
    "return",
    "{a:",
    "b}",
    "Größe",
    "naïve",
    "ΣΑΣ",
    "中文",
    "😀",
]
SEPS = [
    " ",
    "  ",
    "\n",
    "\n\n",
    " \n",
    ".\n",
    ",\r\n",
    "\t",
    " \t ",
    "\u00a0",
    "\u3000 ",
    " - ",
    "'",
    "'s ",
    "...",
    " 12 ",
    "\u0301 ",
]


def sample_text(seed: int, n: int) -> str:
    rng = random.Random(seed)
    return "".join(rng.choice(WORDS) + rng.choice(SEPS) for _ in range(n))


TRAINING = [sample_text(s, 400) for s in range(6)]


def _bpe(pre_tokenizer, normalizer=None, decoder=None, vocab: int = 400) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizer
    if normalizer is not None:
        tok.normalizer = normalizer
    if decoder is not None:
        tok.decoder = decoder
    alphabet = pre_tokenizers.ByteLevel.alphabet() if "ByteLevel" in repr(pre_tokenizer) else []
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, initial_alphabet=alphabet, show_progress=False, special_tokens=["<|endoftext|>"]
    )
    tok.train_from_iterator(TRAINING, trainer=trainer)
    return tok


def _split(pattern: str) -> pre_tokenizers.PreTokenizer:
    return pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory) -> dict[str, Tokenizer]:
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    train_bpe(TRAINING, 400, path)  # the project's own (GPT-2 byte-level)
    return {
        "project": Tokenizer.from_file(str(path)),
        "bytelevel_prefix_space": _bpe(pre_tokenizers.ByteLevel(add_prefix_space=True)),
        "llama3": _bpe(_split(LLAMA3_PATTERN)),
        "qwen2": _bpe(_split(QWEN2_PATTERN)),
        "o200k": _bpe(_split(O200K_PATTERN)),
        "metaspace": _bpe(pre_tokenizers.Metaspace(), normalizer=normalizers.NFKC()),
        "whitespace_digits": _bpe(
            pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Digits(True)])
        ),
    }


NAMES = ["project", "bytelevel_prefix_space", "llama3", "qwen2", "o200k", "metaspace", "whitespace_digits"]


def whole(tok: Tokenizer, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False).ids


@pytest.mark.parametrize("name", NAMES)
def test_layouts_that_split_are_recognized(tokenizers, name: str) -> None:
    assert pieces_are_exact(tokenizers[name])


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("piece_chars", [1, 3, 16, 200])
def test_pieces_equal_whole_text_on_mixed_text(tokenizers, name: str, piece_chars: int) -> None:
    tok = tokenizers[name]
    texts = [sample_text(100 + s, 300) for s in range(3)] + [
        "",
        " ",
        "a",
        "a b",
        "  lead",
        "trail  ",
        "x\n\n y",
    ]
    encoder = TokenEncoder(tok, piece_chars=piece_chars, call_chars=97)
    got = encoder.encode(texts)
    assert all(a.dtype == np.uint32 for a in got)
    assert [a.tolist() for a in got] == [whole(tok, t) for t in texts]
    assert len(piece_bounds(texts[0], piece_chars)) > 3  # the text really was cut


TEXT_CHARS = st.sampled_from(
    list("ab Z9'.,;-_\n\r\t")
    + ["  ", "'s", "é", "e\u0301", "\u00a0", "\u3000", "Σ", "中", "😀", "１", "\u200b"]
)


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(parts=st.lists(TEXT_CHARS, max_size=80), piece_chars=st.integers(1, 6))
def test_pieces_equal_whole_text_on_arbitrary_text(
    tokenizers, name: str, parts: list[str], piece_chars: int
) -> None:
    tok = tokenizers[name]
    text = "".join(parts)
    assert TokenEncoder(tok, piece_chars=piece_chars, call_chars=5).encode([text])[0].tolist() == whole(
        tok, text
    )


def test_a_cut_elsewhere_would_change_the_ids(tokenizers) -> None:
    """The test above can fail: cutting Llama 3's pre-tokens at a line break after punctuation (or
    before a word's leading space in any layout) changes the ids, which is why cuts are only made
    before a space that follows a non-whitespace character."""
    tok = tokenizers["llama3"]
    text = "return {a: b}.\n\nthe of"
    cut = text.index("\n")
    assert whole(tok, text[:cut]) + whole(tok, text[cut:]) != whole(tok, text)
    text = "the of and"
    cut = text.index("of")  # after the space, not before it
    assert whole(tok, text[:cut]) + whole(tok, text[cut:]) != whole(tok, text)


def test_piece_bounds_cut_only_before_a_space_after_non_whitespace() -> None:
    text = sample_text(7, 500)
    bounds = piece_bounds(text, 50)
    assert bounds[0] == 0 and bounds[-1] == len(text) and bounds == sorted(set(bounds))
    for cut in bounds[1:-1]:
        assert text[cut] == " " and not text[cut - 1].isspace()
    assert all(b - a >= 50 for a, b in itertools.pairwise(bounds[:-1]))
    assert piece_bounds("x" * 100, 10) == [0, 100]  # no safe cut: one piece
    assert piece_bounds("   " * 40, 10) == [0, 120]


def _without(tok: Tokenizer, **changes) -> Tokenizer:
    clone = Tokenizer.from_str(tok.to_str())
    for key, value in changes.items():
        setattr(clone, key, value)
    return clone


def test_layouts_that_could_merge_across_a_cut_are_encoded_whole(tokenizers) -> None:
    base = tokenizers["project"]
    unsafe = {
        "no pre-tokenizer": _without(base, pre_tokenizer=None),
        "unknown split regex": _without(
            base, pre_tokenizer=pre_tokenizers.Split(Regex(r"[a-z]+ ?"), behavior="isolated")
        ),
        "prepend normalizer": _without(base, normalizer=normalizers.Prepend("▁")),
        "strip normalizer": _without(base, normalizer=normalizers.Strip()),
        "metaspace without split": _without(base, pre_tokenizer=pre_tokenizers.Metaspace(split=False)),
    }
    rstrip = Tokenizer.from_str(base.to_str())
    rstrip.add_special_tokens([AddedToken("<sep>", rstrip=True)])
    unsafe["added token stripping on its right"] = rstrip
    spaced = Tokenizer.from_str(base.to_str())
    spaced.add_tokens(["of the"])
    unsafe["added token across a space"] = spaced
    text = sample_text(3, 200) + " <sep> of the end"
    for name, tok in unsafe.items():
        assert not pieces_are_exact(tok), name
        assert TokenEncoder(tok, piece_chars=4).encode([text])[0].tolist() == whole(tok, text), name
    # an added token made of a word, without right stripping, keeps pieces exact
    plain = Tokenizer.from_str(base.to_str())
    plain.add_special_tokens([AddedToken("<sep>", lstrip=True)])
    assert pieces_are_exact(plain)
    assert TokenEncoder(plain, piece_chars=4).encode([text])[0].tolist() == whole(plain, text)


def test_real_book_in_default_pieces_equals_whole(tokenizers, shared_corpus: Path) -> None:
    """A whole book (with its BOM, CRLF line endings and curly quotes), default piece size."""
    book = next(p for p in sorted((shared_corpus / "books").glob("*.txt")) if "jane_eyre" in p.name)
    text = book.read_text(encoding="utf-8")[:600_000]
    for name in ("project", "llama3"):
        tok = tokenizers[name]
        encoder = TokenEncoder(tok)
        assert len(piece_bounds(text, encoder.piece_chars)) > 3
        assert encoder.encode([text])[0].tolist() == whole(tok, text)


def test_threads_divide_the_cores_among_tasks_run_at_once() -> None:
    from longctx.core.config import ExecutorConfig
    from longctx.core.executors import concurrent_tasks

    assert [tokenizer_threads(n, cores=8) for n in (1, 2, 3, 8, 16)] == [8, 4, 2, 1, 1]
    assert concurrent_tasks(ExecutorConfig(tasks=4), 4) == 4  # workers: -1, all at once
    assert concurrent_tasks(ExecutorConfig(tasks=4, workers=2), 4) == 2
    assert concurrent_tasks(ExecutorConfig(tasks=4, workers=8), 4) == 4
    assert concurrent_tasks(ExecutorConfig(kind="slurm", tasks=4, slurm={"partition": "p"}), 4) == 1


_COUNT_THREADS = """
import os, sys
from datatrove.data import Document
from longctx.pipeline.filters import TokenLengthFilter
step = TokenLengthFilter(sys.argv[1], {"books": (0, None)}, concurrent_tasks=int(sys.argv[2]))
docs = [Document(text=sys.argv[3] * (200 + i), id=str(i), metadata={"source": "books"}) for i in range(16)]
before = len(os.listdir("/proc/self/task"))
assert all(r is True for r in step.filter_batch(docs))
print(len(os.listdir("/proc/self/task")) - before)
"""


def threads_started(tmp_path: Path, script: str, tasks: int) -> int:
    """Runs ``script`` (argv: a small trained tokenizer's path, ``tasks``, a sample text) on 2 cores,
    without this environment's tokenizer thread settings; the new threads it reports."""
    path = tmp_path / "tokenizer.json"
    train_bpe(TRAINING, 400, path)
    env = {k: v for k, v in os.environ.items() if k not in ("RAYON_NUM_THREADS", "TOKENIZERS_PARALLELISM")}
    two = set(sorted(os.sched_getaffinity(0))[:2])
    out = subprocess.run(
        [sys.executable, "-c", script, str(path), str(tasks), sample_text(0, 50)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        preexec_fn=lambda: os.sched_setaffinity(0, two),
    )
    return int(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores to share")
@pytest.mark.parametrize("tasks, threads", [(1, 2), (2, 0), (3, 0)])
def test_tasks_times_tokenizer_threads_never_exceed_the_cores(
    tmp_path: Path, tasks: int, threads: int
) -> None:
    """A task process on 2 cores runs the tokenizer's own pool of 2 threads when alone, and encodes on
    its calling thread (no pool thread at all) when 2 or more tasks run at once; threads are counted
    in /proc, the tokenizer's pool being the only source of new ones."""
    assert threads_started(tmp_path, _COUNT_THREADS, tasks) == threads
