"""Token ids of documents, in bounded pieces that the tokenizer encodes in parallel.

Curation tokenizes every document once: the ids give the length filter its count and are stored
beside the text for ``pack`` (see ``token_ids`` in :mod:`longctx.pipeline.documents`). Encoding a
long document whole has two costs: ``tokenizers`` holds per-byte alignments and per-token strings
for the whole text (about 150x the text's size for a 56 MB one-line book), and one document is one
unit of work, so a large repository is tokenized on a single thread.

:class:`TokenEncoder` therefore cuts long texts into pieces of about ``piece_chars`` characters and
encodes a bounded number of characters per ``encode_batch_fast`` call (which runs the pieces on the
tokenizer's threads). A piece ends just before a space (U+0020) that follows a non-whitespace
character. For the pre-tokenizers that :func:`pieces_are_exact` accepts, no pre-token contains a
non-whitespace character followed by a space, so such a position is a pre-token boundary of the
whole text, and the pre-tokens on either side, hence the ids, are the same as when encoding the
whole text (``tests/pipeline/test_tokens.py`` checks this against whole-text encoding). Other
tokenizers encode each document whole.

The tokenizer's threads (a process-wide pool, sized when first used) are set per task by
:func:`limit_tokenizer_threads` to :func:`tokenizer_threads`: the cores this process may run on divided
by the tasks that run at once, so that tasks x threads never exceed the cores given.
"""

from __future__ import annotations

import array
import itertools
import json
import os
import re
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
from tokenizers import Tokenizer

PIECE_CHARS = 1 << 13
"""Characters per piece of a long document (at least; a piece ends at the next safe cut). Small
enough that the tokenizer's temporaries for one piece (about 150 bytes per character) stay in a core's
L2 cache: one thread encodes the same texts in about 0.8x of the CPU time that pieces of 128K characters
take, and 0.87x of what whole documents take (``tests/benchmarks/bench_tokenizer_pieces.py``)."""

CALL_CHARS = 1 << 21
"""Characters per ``encode_batch_fast`` call: bounds the tokenizer's temporary memory."""

_U32 = next(code for code in "IL" if array.array(code).itemsize == 4)
"""The :mod:`array` type code of a 32-bit unsigned integer on this platform."""

_CUT = re.compile(r"(?<=\S) ")
"""A space right after a non-whitespace character (Python's whitespace includes every Unicode
White_Space character, so this is never inside a run of whitespace in the tokenizer's sense)."""

# Pre-tokenizer regexes (tokenizers' ``Split`` with ``Isolated`` behaviour) whose matches never hold a
# non-whitespace character followed by a space. Each alternative is a run of one class, optionally
# *preceded* by one space or non-letter character, or whitespace only, or punctuation followed by
# line breaks only.
GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_PATTERN = (  # also GPT-4's cl100k
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
QWEN2_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
O200K_PATTERN = (  # GPT-4o
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
SAFE_SPLIT_PATTERNS = frozenset({GPT2_PATTERN, LLAMA3_PATTERN, QWEN2_PATTERN, O200K_PATTERN})
# Normalizers that act on characters (and, for Unicode normalization, on combining sequences, which
# a space never joins): they keep a "non-whitespace, then space" position in place.
_SAFE_NORMALIZERS = frozenset({"NFC", "NFD", "NFKC", "NFKD", "Lowercase"})
# Pre-tokenizers that only add splits between runs of one character class (never across a space
# that follows a non-whitespace character), or only map bytes.
_NEUTRAL_PRE_TOKENIZERS = frozenset({"Digits", "Punctuation"})


def _safe_normalizer(spec: dict[str, Any] | None) -> bool:
    if spec is None:
        return True
    if spec.get("type") == "Sequence":
        return all(_safe_normalizer(n) for n in spec.get("normalizers", []))
    return spec.get("type") in _SAFE_NORMALIZERS


def _pre_tokenizer_kind(spec: dict[str, Any]) -> str:
    """``splits`` for a pre-tokenizer that ends a pre-token at every safe cut, ``neutral`` for one
    that keeps cuts in place without making them, ``unsafe`` otherwise."""
    kind = spec.get("type")
    if kind == "ByteLevel":
        return "splits" if spec.get("use_regex", True) else "neutral"
    if kind == "Split":
        pattern = spec.get("pattern", {})
        regex = pattern.get("Regex") if isinstance(pattern, dict) else None
        if regex in SAFE_SPLIT_PATTERNS and spec.get("behavior") == "Isolated" and not spec.get("invert"):
            return "splits"
        return "unsafe"
    if kind in ("Whitespace", "WhitespaceSplit", "BertPreTokenizer"):
        return "splits"
    if kind == "Metaspace":
        return "splits" if spec.get("split", True) else "unsafe"
    if kind in _NEUTRAL_PRE_TOKENIZERS:
        return "neutral"
    return "unsafe"


def _safe_pre_tokenizer(spec: dict[str, Any] | None) -> bool:
    if spec is None:
        return False  # the whole text is one pre-token: a model may merge across spaces
    parts = spec.get("pretokenizers", []) if spec.get("type") == "Sequence" else [spec]
    kinds = [_pre_tokenizer_kind(p) for p in parts]
    return "unsafe" not in kinds and "splits" in kinds


def _safe_added_tokens(specs: list[dict[str, Any]]) -> bool:
    """Added tokens are matched in the text before pre-tokenization. One that strips the whitespace
    on its right, or that holds a non-whitespace character followed by whitespace, could reach
    across a cut."""
    for token in specs:
        content = token.get("content", "")
        if token.get("rstrip") or re.search(r"\S\s", content):
            return False
    return True


def pieces_are_exact(tokenizer: Tokenizer) -> bool:
    """Whether encoding a text in pieces cut by :func:`piece_bounds` gives exactly the ids of
    encoding it whole, judged from the tokenizer's configuration (see the module docstring)."""
    spec = json.loads(tokenizer.to_str())
    return (
        _safe_normalizer(spec.get("normalizer"))
        and _safe_pre_tokenizer(spec.get("pre_tokenizer"))
        and _safe_added_tokens(spec.get("added_tokens") or [])
    )


def tokenizer_threads(concurrent_tasks: int, cores: int | None = None) -> int:
    """Tokenizer threads for one of ``concurrent_tasks`` tasks sharing ``cores`` (default: the cores
    this process may run on, which Slurm and ``taskset`` restrict): at least one."""
    if cores is None:
        cores = len(os.sched_getaffinity(0))
    return max(1, cores // max(1, concurrent_tasks))


def limit_tokenizer_threads(threads: int) -> None:
    """Sizes the tokenizer's thread pool of this process to ``threads``; one thread encodes on the
    calling thread (``TOKENIZERS_PARALLELISM=false``: no pool threads waiting beside it).

    ``tokenizers`` sizes its pool (``RAYON_NUM_THREADS``) when it first encodes in parallel, so this
    must come before the process's first encode: curation's pool workers are started fresh by a
    forkserver, so it does. A single worker runs its task in the calling process, which may already
    have a pool; that task is alone and may use every core anyway.
    """
    os.environ["RAYON_NUM_THREADS"] = str(threads)
    if threads == 1:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"


def piece_bounds(text: str, piece_chars: int) -> list[int]:
    """Cut positions ``[0, c1, ..., len(text)]``: each piece has at least ``piece_chars`` characters
    (the last may be shorter) and ends just before a space that follows a non-whitespace character.
    A text without such a space is one piece."""
    bounds = [0]
    n = len(text)
    while n - bounds[-1] > piece_chars:
        match = _CUT.search(text, bounds[-1] + piece_chars)
        if match is None:
            break
        bounds.append(match.start())
    bounds.append(n)
    return bounds


class TokenEncoder:
    """Encodes texts to token ids (uint32, without special tokens) in bounded, parallel pieces.

    ``encode_batch_fast`` (no offsets) runs the pieces of one call on the tokenizer's threads (their
    number is set per task, see :func:`limit_tokenizer_threads`). Memory is the ids plus about
    ``call_chars`` worth of the tokenizer's temporaries, whatever the size of a text.
    """

    def __init__(
        self, tokenizer: Tokenizer, piece_chars: int = PIECE_CHARS, call_chars: int = CALL_CHARS
    ) -> None:
        self.tokenizer = tokenizer
        self.piece_chars = piece_chars if pieces_are_exact(tokenizer) else None
        self.call_chars = call_chars

    def _pieces(self, texts: Sequence[str]) -> Iterator[tuple[int, str]]:
        """``(index of the text, piece)`` in order."""
        for i, text in enumerate(texts):
            if self.piece_chars is None or len(text) <= self.piece_chars:
                yield i, text
                continue
            bounds = piece_bounds(text, self.piece_chars)
            for start, end in itertools.pairwise(bounds):
                yield i, text[start:end]

    def _calls(self, texts: Sequence[str]) -> Iterator[tuple[list[int], list[str]]]:
        owners: list[int] = []
        pieces: list[str] = []
        size = 0
        for owner, piece in self._pieces(texts):
            if pieces and size + len(piece) > self.call_chars:
                yield owners, pieces
                owners, pieces, size = [], [], 0
            owners.append(owner)
            pieces.append(piece)
            size += len(piece)
        if pieces:
            yield owners, pieces

    def encode(self, texts: Sequence[str]) -> list[np.ndarray]:
        """The ids of each text, equal to ``tokenizer.encode(text, add_special_tokens=False).ids``."""
        parts: list[list[np.ndarray]] = [[] for _ in texts]
        for owners, pieces in self._calls(texts):
            encodings = self.tokenizer.encode_batch_fast(pieces, add_special_tokens=False)
            for owner, encoding in zip(owners, encodings):
                ids = encoding.ids
                # through array.array: 2.6x faster than np.fromiter, 3x faster than np.array
                parts[owner].append(np.frombuffer(array.array(_U32, ids), np.uint32))
            del encodings  # before the next call: the tokenizer's temporaries are the bulk of its memory
        return [p[0] if len(p) == 1 else np.concatenate(p) if p else np.empty(0, np.uint32) for p in parts]
