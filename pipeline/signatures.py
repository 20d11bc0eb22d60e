"""Per-document dedup signatures at array speed: the exact-text hash and the MinHash signature.

**MinHash.** :func:`minhash_signature` equals datatrove's ``MinhashDedupSignature`` with the
project's ``\\w+`` word splitter (:class:`RegexWordTokenizer`), bit for bit. datatrove, per
document: ``simplify_text`` (lowercase, numbers to ``0``, punctuation to spaces, whitespace runs to
one space, NFD without non-spacing marks), the word split, one xxhash per n-gram of the joined
string ``" ".join(words[i:i+n])``, then for each of the ``num_buckets * hashes_per_bucket``
permutations ``min((h * a + b) % (2**61 - 1))`` in numpy uint64 arithmetic (``h * a + b`` wraps
modulo 2**64 before the Mersenne reduction). Here the same numbers come from a fixed number of
C-level passes:

1. :func:`_words_piece`: the UTF-8 bytes of ``" ".join(words)`` of a piece of text. ASCII (most of a
   book) is handled as bytes (``bytes.lower``, one byte regex for numbers, ``bytes.translate``, a
   numpy compaction); only runs of non-ASCII characters go through NFD, mark removal and the
   Unicode ``\\w`` test, with the same ``unicodedata``/``re`` tables datatrove uses.
2. Shingle ``i`` is the byte span from the start of word ``i`` to the end of word ``i + n - 1``; no
   shingle string is built. The spans are hashed with numpy (:mod:`longctx.pipeline.xxhash_np`).
3. :func:`permuted_minima`: exact minima over a first block, then per permutation one screening
   pass of three array operations (multiply, add, argmin) that proves, for all but a handful of
   values, that they cannot lower the minimum; the handful get datatrove's arithmetic. A repeated
   shingle cannot change a minimum, and in prose repeats are a few percent: screening them costs
   less than sorting the hashes to drop them (the sort was ~20% of the signatures' CPU on the
   bench). Only a text that a sample shows to be repetitive (:func:`repetitive`) is sorted first.

A signature is a minimum over shingles, so a long text is processed in pieces of about
:data:`PIECE_CHARS` characters (cut after whitespace; each piece carries the previous piece's last
``n - 1`` words so that every n-gram is seen once) and the minima are combined: memory stays bounded
by the piece size, not the document's.

**Exact hash.** :func:`exact_hash` is the xxh3-128 of :func:`normalize_for_exact`'s output (NFKC,
whitespace runs to one space, trimmed), computed piece by piece into a streaming hasher.

Fast paths cover datatrove's default ``TextNormConfig`` and ``hash_fc="xxhash"`` (what curation
uses); another normalization config uses datatrove's own ``simplify_text`` and ``hash_fc="sha1"``
hashes span by span with hashlib (exact, slower).
"""

from __future__ import annotations

import os
import re
import unicodedata
from collections.abc import Iterator, Sequence
from functools import lru_cache

import numpy as np
import regex
import xxhash
from datatrove.pipeline.dedup.minhash import MinhashConfig, MinhashDedupSignature
from datatrove.utils.text import (
    DEF_TEXT_NORM_CONFIG,
    NUMBERS_PATTERN,
    PUNCTUATION,
    TextNormConfig,
    simplify_text,
)
from datatrove.utils.word_tokenizers import WordTokenizer

from longctx.pipeline.xxhash_np import span_hashes

U64 = np.uint64
MERSENNE = U64((1 << 61) - 1)
MAX64 = np.iinfo(np.uint64).max
MAX_INT64, MERSENNE_INT = (1 << 64) - 1, (1 << 61) - 1
PIECE_CHARS = 1 << 22
"""Characters of a document normalized and hashed at a time."""
PERM_BLOCK = 1 << 16  # shingle hashes per screening pass (512 KiB of uint64 scratch)
FIRST_BLOCK = 2048  # shingle hashes whose minima are computed in full, in one 2-D pass

_SP = 0x20
_WORD = re.compile(r"\w+")
_WHITESPACE = re.compile(r"\s+")
# NUMBERS_PATTERN (``\p{Nd}+([.,،٫⎖⎗⎘]\p{Nd}+)?``) on text whose digits and separators are ASCII.
_NUM_ASCII = regex.compile(rb"[0-9]+(?:[.,][0-9]+)?")
_NUM_NON_ASCII = regex.compile(r"[\p{Nd}،٫⎖⎗⎘]")  # non-ASCII characters NUMBERS_PATTERN can match
# After mark removal, every non-ASCII character that \w does not match becomes a separator, so
# that afterwards each byte >= 0x80 belongs to a word character.
_NON_ASCII_NON_WORD = re.compile(r"[^\x00-\x7f\w]+")
# ASCII letters and digits are word bytes. "_" matches \w, but datatrove's punctuation table has
# turned it into a space first, so it separates. Bytes >= 0x80 are word bytes (see above).
_TO_SPACE = bytes(b if (chr(b).isalnum() or b >= 0x80) else _SP for b in range(256))
# str.isspace (which is also what re's \s tests): ASCII whitespace to a space byte, and the UTF-8
# of the non-ASCII whitespace characters.
_WS_TO_SPACE = bytes(_SP if chr(b).isspace() else b for b in range(128)) + bytes(range(128, 256))
# Those are written out: finding them by testing every code point costs ~90 ms in each process that
# imports this module (tests/pipeline/test_signatures.py checks the list against that scan).
_WIDE_WS = [
    chr(c).encode("utf-8")
    for c in (0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F, 0x3000)
]
_WIDE_WS_RE = re.compile(b"|".join(map(re.escape, _WIDE_WS)))  # one scan, not one per character


class RegexWordTokenizer(WordTokenizer):
    """Language-agnostic word splitter (``\\w+``) for MinHash shingles.

    datatrove's default word tokenizers need spaCy or NLTK models; code and mixed-language books
    are served as well by a plain regex, and it needs no download. :func:`minhash_signature`
    reproduces datatrove's stage with this splitter.
    """

    def __init__(self) -> None:
        super().__init__("regex")

    def word_tokenize(self, text: str) -> list[str]:
        return _WORD.findall(text)

    def sent_tokenize(self, text: str) -> list[str]:
        return [line for line in text.split("\n") if line.strip()]

    def span_tokenize(self, text: str) -> list[tuple[int, int]]:
        return [m.span() for m in re.finditer(r"[^\n]+", text)]


# --- text pieces and byte helpers -----------------------------------------------------------------


def text_pieces(text: str, size: int) -> Iterator[str]:
    """Consecutive slices of about ``size`` characters, each ending just after a space or newline
    (or at the end of the text). Every normalization step here is local within such a piece:
    numbers and combining sequences hold no whitespace, no canonical composition starts with a
    whitespace character, and the final-sigma rule of ``lower()`` does not look across whitespace
    (it is neither cased nor case-ignorable)."""
    start, n = 0, len(text)
    while start < n:
        end = start + size
        if end >= n:
            yield text[start:] if start else text
            return
        cut = max(text.rfind(" ", start, end), text.rfind("\n", start, end))
        if cut < start:
            cut = min((i for i in (text.find(" ", end), text.find("\n", end)) if i >= 0), default=n - 1)
        yield text[start : cut + 1]
        start = cut + 1


def _squeeze(data: bytes) -> bytes:
    """``data`` with each run of spaces (0x20) made one space, and none at either end."""
    arr = np.frombuffer(data, np.uint8)
    if arr.size == 0:
        return b""
    solid = arr != _SP
    keep = np.empty_like(solid)
    keep[0] = solid[0]
    np.logical_or(solid[1:], solid[:-1], out=keep[1:])  # a space right after a non-space stays
    out = arr[keep]
    if out.size and out[-1] == _SP:
        out = out[:-1]
    return out.tobytes()


# --- exact hash -------------------------------------------------------------------------------------


def normalize_for_exact(text: str) -> str:
    """NFKC, all whitespace runs to one space, trimmed: two copies of a text that differ only in
    line wrapping, line endings or Unicode compatibility forms normalize to the same string.
    (The definition; :func:`exact_hash` computes it piece by piece, as bytes.)"""
    return _WHITESPACE.sub(" ", unicodedata.normalize("NFKC", text)).strip()


def _spaced(piece: str) -> bytes:
    """UTF-8 of NFKC(piece) with every whitespace character made a space (ASCII is NFKC-invariant)."""
    if piece.isascii():
        data = piece.encode("ascii")
    else:
        normalized = unicodedata.normalize("NFKC", piece).encode("utf-8")  # lone surrogates raise
        data = _WIDE_WS_RE.sub(b" ", normalized)
    return data.translate(_WS_TO_SPACE)


def exact_hash(text: str) -> str:
    """128-bit hash (xxh3, hex) of :func:`normalize_for_exact` of the text, in bounded memory: pieces
    cut after whitespace are normalized on their own (NFKC never joins across whitespace) and fed to
    a streaming hasher, with one space wherever whitespace separated two pieces' words."""
    hasher = xxhash.xxh3_128()
    started = gap = False
    for piece in text_pieces(text, PIECE_CHARS):
        data = _spaced(piece)
        core = _squeeze(data)
        if core:
            if started and (gap or data[0] == _SP):
                hasher.update(b" ")
            hasher.update(core)
            started, gap = True, data[-1] == _SP
        elif data:
            gap = True
    return hasher.hexdigest()


# --- MinHash: words ---------------------------------------------------------------------------------


_IS_MARK: dict[str, bool] = {}
"""Per character seen so far: whether it is a non-spacing mark (``unicodedata.category == "Mn"``)."""


def marks_in(text: str) -> dict[int, None]:
    """``str.translate`` table deleting exactly the characters of ``text`` that datatrove drops
    after NFD (``unicodedata.category(c) == "Mn"``). Only the distinct characters of the text are
    looked up (and remembered), not every code point: a table of all of them costs ~0.1 s to build
    in every process that signs a document."""
    table: dict[int, None] = {}
    for char in set(text):
        mark = _IS_MARK.get(char)
        if mark is None:
            mark = _IS_MARK[char] = unicodedata.category(char) == "Mn"
        if mark:
            table[ord(char)] = None
    return table


def _non_ascii_runs(data: bytes) -> tuple[list[int], list[int]]:
    """Start and end offsets of the maximal runs of non-ASCII bytes in UTF-8 ``data``."""
    arr = np.frombuffer(data, np.uint8)
    edges = np.diff((arr >= 0x80).view(np.int8), prepend=np.int8(0), append=np.int8(0))
    return np.flatnonzero(edges == 1).tolist(), np.flatnonzero(edges == -1).tolist()


def _joined_runs(data: bytes, starts: list[int], ends: list[int]) -> str:
    """The runs, decoded and joined by NUL (which no run contains)."""
    return b"\x00".join([data[s:e] for s, e in zip(starts, ends)]).decode("utf-8", "surrogatepass")


def _splice_non_ascii(data: bytes, runs: str) -> bytes:
    """NFD, mark removal and non-word-to-space applied to the non-ASCII runs of UTF-8 ``data``
    (``runs``: their :func:`_joined_runs`); ASCII bytes stay as they are (NFD keeps them, and its
    reordering never crosses them)."""
    starts, ends = _non_ascii_runs(data)
    if not starts:  # e.g. the only non-ASCII characters were digits, now "0"
        return data
    runs = unicodedata.normalize("NFD", runs)
    runs = runs.translate(marks_in(runs))
    done = _NON_ASCII_NON_WORD.sub(" ", runs).encode("utf-8").split(b"\x00")
    gaps = [data[e:s] for e, s in zip([0] + ends, starts + [len(data)])]
    pieces = [b""] * (2 * len(gaps) - 1)
    pieces[0::2] = gaps
    pieces[1::2] = done
    return b"".join(pieces)


def _words_piece(text: str) -> bytes:
    """UTF-8 of ``" ".join(re.findall(r"\\w+", simplify_text(text)))`` for the default config."""
    if text.isascii():
        data = _NUM_ASCII.sub(b"0", text.encode("ascii").lower())
    else:
        lowered = text.lower()
        data = lowered.encode("utf-8", "surrogatepass")
        runs = _joined_runs(data, *_non_ascii_runs(data))
        if _NUM_NON_ASCII.search(runs):
            data = NUMBERS_PATTERN.sub("0", lowered).encode("utf-8", "surrogatepass")
            del lowered
            runs = _joined_runs(data, *_non_ascii_runs(data))
        else:  # every match is ASCII (UTF-8 multi-byte sequences hold no ASCII bytes): runs unchanged
            del lowered
            data = _NUM_ASCII.sub(b"0", data)
        data = _splice_non_ascii(data, runs)
    return _squeeze(data.translate(_TO_SPACE))


# What the fast path assumes of datatrove's simplify_text (checked here, so that a datatrove
# release that changes it falls back to simplify_text instead of silently differing): the steps
# and their order for the default config, the number pattern, and that the only \w characters
# its punctuation table turns into spaces are "_" and the fullwidth digit one (always already "0").
_FAST_PATH = (
    TextNormConfig(True, True, True, True, True, False, False) == DEF_TEXT_NORM_CONFIG
    and NUMBERS_PATTERN.pattern == r"\p{Nd}+([.,،٫⎖⎗⎘]{1}\p{Nd}+)?"
    and {c for c in PUNCTUATION if _WORD.match(c)} <= {"_", "\uff11"}
    and simplify_text("A_b ２.５ Ἀ\u0301 x—y") == "a b 0 α x y"
)


def word_pieces(text: str, norm_config: TextNormConfig = DEF_TEXT_NORM_CONFIG) -> Iterator[bytes]:
    """UTF-8 of ``" ".join(re.findall(r"\\w+", simplify_text(text, norm_config)))``, as consecutive
    non-empty parts whose concatenation with single spaces is the whole (pieces of the text cut at
    whitespace; one part with another ``norm_config``, through datatrove's own ``simplify_text``)."""
    if norm_config != DEF_TEXT_NORM_CONFIG or not _FAST_PATH:
        words = " ".join(_WORD.findall(simplify_text(text, norm_config))).encode("utf-8")
        if words:
            yield words
        return
    for piece in text_pieces(text, PIECE_CHARS):
        words = _words_piece(piece)
        if words:
            yield words


# --- MinHash: shingles and permutations ---------------------------------------------------------------


def _separators(buf: bytes) -> np.ndarray:
    """-1, the offsets of the spaces between words, and ``len(buf)``: word ``k`` is
    ``buf[sp[k] + 1 : sp[k + 1]]``. int32 when the buffer allows."""
    dtype = np.int32 if len(buf) < 2**31 - 1 else np.int64
    inner = np.flatnonzero(np.frombuffer(buf, np.uint8) == _SP)
    sp = np.empty(inner.size + 2, dtype)
    sp[0], sp[-1] = -1, len(buf)
    sp[1:-1] = inner
    return sp


def shingle_hashes(buf: bytes, config: MinhashConfig) -> np.ndarray:
    """datatrove's shingle hash of every n-gram of the space-separated words in ``buf``, in order."""
    if not buf:
        return np.empty(0, U64)
    sp = _separators(buf)
    count = max(sp.size - 1 - config.n_grams + 1, 0)  # n-grams of sp.size - 1 words
    starts = sp[:count] + 1
    lengths = sp[config.n_grams : config.n_grams + count] - starts
    if config.hash_config.hash_fc == "xxhash":
        return span_hashes(buf, starts, lengths, config.hash_config.precision)
    from datatrove.utils.hashing import create_hash_func

    fn = create_hash_func(config.hash_config, bytes)
    view = memoryview(buf)
    return np.fromiter((fn(view[s : s + n]) for s, n in zip(starts.tolist(), lengths.tolist())), U64, count)


@lru_cache(maxsize=8)
def _parameters(seed: int, num_hashes: int) -> tuple[np.ndarray, np.ndarray]:
    """datatrove's ``MinhashDedupSignature.parameters``, as (num_hashes, 1) columns."""
    gen = np.random.RandomState(seed)
    a = gen.randint(1, MERSENNE, dtype=np.uint64, size=(1, num_hashes))
    b = gen.randint(0, MERSENNE, dtype=np.uint64, size=(1, num_hashes))
    return a.reshape(-1, 1), b.reshape(-1, 1)


def distinct(values: np.ndarray) -> np.ndarray:
    """Sorted distinct values, by sort."""
    s = np.sort(values)
    if s.size < 2:
        return s
    keep = np.empty(s.size, bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return s[keep]


def repetitive(hashes: np.ndarray) -> bool:
    """Whether a sample of :data:`FIRST_BLOCK` hashes spread over ``hashes`` repeats one in eight of
    its values or more: a text made of a few lines or phrases over and over (logs, tables), whose
    distinct hashes are far fewer than its shingles and worth a sort before the permutations. Prose
    samples show no repeat."""
    sample = hashes[:: max(1, hashes.size // FIRST_BLOCK)]
    return distinct(sample).size * 8 < sample.size * 7


def _reference_minima(hashes: np.ndarray, a: np.ndarray, b: np.ndarray, precision: int) -> np.ndarray:
    """datatrove's arithmetic, literally, in bounded blocks."""
    mins = np.full(a.shape[0], MAX64, U64)
    for s in range(0, hashes.size, 4096):
        phv = (hashes[None, s : s + 4096] * a + b) % MERSENNE
        if precision == 32:
            phv &= U64(0xFFFFFFFF)
        np.minimum(mins, phv.min(axis=1), out=mins)
    return mins


def _ordered_residues(h: np.ndarray, a: np.ndarray, b: np.ndarray, precision: int) -> np.ndarray:
    """A (permutations x hashes) array ordered like the residues ``(h * a + b) mod 2**64 mod p``
    within each row, in a few in-place passes (see :func:`_first_block` for how it maps back).

    With ``x = hi * 2**61 + lo`` (``hi`` < 8): ``s = lo + hi`` is ``x mod p`` unless ``s >= p``, in
    which case the residue is ``s - p`` (0..7). For 32-bit precision the array holds the masked
    residues themselves. For 64-bit precision it holds ``g = s - p`` (mod 2**64), which orders like the
    residue within each case; a minimum ``g <= 7`` shows the rare case occurred (about 2**-58 per
    value), and a residue is then ``g + p`` (mod 2**64) only where it did not.
    """
    x = h[None, :] * a
    x += b
    y = x >> U64(61)
    x &= MERSENNE
    x += y
    if precision == 32:
        np.subtract(x, MERSENNE, out=y)
        np.minimum(x, y, out=x)  # s - p wraps high when s < p
        x &= U64(0xFFFFFFFF)
        return x
    x -= MERSENNE
    return x


def _first_block(h: np.ndarray, a: np.ndarray, b: np.ndarray, precision: int) -> np.ndarray:
    """Exact minima over a small block, all permutations in one 2-D pass (:func:`_ordered_residues`);
    for 64-bit precision, a block where the rare case shows is redone with datatrove's arithmetic."""
    mins = _ordered_residues(h, a, b, precision).min(axis=1)
    if precision == 32:
        return mins
    if mins.min() <= 7:
        return _reference_minima(h, a, b, precision)
    return mins + MERSENNE  # every g wrapped: residue = g + p (mod 2**64)


def permuted_minima(hashes: np.ndarray, config: MinhashConfig) -> np.ndarray:
    """Per permutation, ``min over shingles of ((h * a + b) mod 2**64) mod (2**61 - 1)``
    (masked to 32 bits for 32-bit precision), exactly as datatrove computes it.

    A first block gives exact minima ``m``. For the rest, each permutation makes one screening
    pass of three array operations: ``y = h * (a << k) + ((b + 8) << k)`` (mod 2**64) is
    ``lo' << k`` with ``lo' = (x + 8) mod 2**61`` (k = 3), or ``mod 2**32`` for 32-bit precision
    (k = 32), and the residue of every value with ``lo' >= 8`` is at least ``lo' - 8``. So only
    values with ``y < (m + 8) << k`` can lower ``m`` (the rare near-wrap values are among them);
    those few get datatrove's arithmetic.
    """
    num_hashes = config.num_buckets * config.hashes_per_bucket
    a, b = _parameters(config.seed, num_hashes)
    precision = config.hash_config.precision
    shift = 3 if precision == 64 else 32
    with np.errstate(over="ignore"):
        mins = _first_block(hashes[:FIRST_BLOCK], a, b, precision)
        rest = hashes[FIRST_BLOCK:]
        if rest.size == 0:
            return mins
        big_a = [U64(v) for v in (a << U64(shift)).ravel()]
        big_b = [U64(v) for v in ((b + U64(8)) << U64(shift)).ravel()]
        best = mins.tolist()
        a_int, b_int = a.ravel().tolist(), b.ravel().tolist()
        mask = (1 << 64) - 1 if precision == 64 else 0xFFFFFFFF
        y = np.empty(min(PERM_BLOCK, rest.size), U64)
        for s in range(0, rest.size, PERM_BLOCK):
            h = rest[s : s + PERM_BLOCK]
            yy = y[: h.size]
            for j in range(num_hashes):
                bound = (best[j] + 8) << shift
                if bound > MAX64:  # everything is a candidate (only after a tiny first block)
                    r = int(_reference_minima(h, a[j : j + 1], b[j : j + 1], precision)[0])
                    best[j] = min(best[j], r)
                    continue
                np.multiply(h, big_a[j], out=yy)
                np.add(yy, big_b[j], out=yy)
                i = int(yy.argmin())
                seen = -1
                for _ in range(16):  # candidates one by one, with datatrove's arithmetic
                    if int(yy[i]) >= bound:
                        break
                    value = int(h[i])
                    if value == seen:  # a repeat: same hash, same residue; drop all its copies
                        yy[h == h[i]] = MAX64
                    else:
                        r = (((value * a_int[j] + b_int[j]) & MAX_INT64) % MERSENNE_INT) & mask
                        if r < best[j]:
                            best[j] = r
                            bound = (r + 8) << shift
                        yy[i] = MAX64
                        seen = value
                    i = int(yy.argmin())
                else:  # unusually many candidates: all of them at once
                    cand = h[yy < U64(bound)]
                    if cand.size:
                        best[j] = min(
                            best[j], int(_reference_minima(cand, a[j : j + 1], b[j : j + 1], precision)[0])
                        )
    return np.array(best, U64)


def _last_words(buf: bytes, k: int) -> bytes:
    """The last ``k`` space-separated words of ``buf`` (all of it when it has fewer)."""
    if k <= 0:
        return b""
    cut = len(buf)
    for _ in range(k):
        cut = buf.rfind(b" ", 0, cut)
        if cut < 0:
            return buf
    return buf[cut + 1 :]


BATCH_COLUMNS = 1 << 13
"""Shingle hashes of small sets whose permuted minima are computed in one 2-D pass (8 MB of uint64
scratch for 120 permutations)."""


def minima_of_sets(sets: Sequence[np.ndarray], config: MinhashConfig) -> list[np.ndarray | None]:
    """:func:`permuted_minima` of each set of shingle hashes (None for an empty one), for many sets at
    once: the sets of at most :data:`FIRST_BLOCK` hashes, a source file's usual size, go through
    :func:`_ordered_residues` together, a batch of them side by side, and are reduced per set
    (``np.minimum.reduceat``), instead of a few numpy calls per set; larger sets one at a time."""
    num_hashes = config.num_buckets * config.hashes_per_bucket
    a, b = _parameters(config.seed, num_hashes)
    precision = config.hash_config.precision
    out: list[np.ndarray | None] = [None] * len(sets)
    batch: list[int] = []
    columns = 0

    def flush() -> None:
        bounds = np.cumsum([0] + [sets[k].size for k in batch[:-1]])
        with np.errstate(over="ignore"):
            values = _ordered_residues(np.concatenate([sets[k] for k in batch]), a, b, precision)
            mins = np.minimum.reduceat(values, bounds, axis=1)
        for col, k in enumerate(batch):
            m = mins[:, col]
            if precision == 32:
                out[k] = m.copy()
            elif m.min() <= 7:  # the rare case (see _ordered_residues): datatrove's arithmetic
                with np.errstate(over="ignore"):
                    out[k] = _reference_minima(sets[k], a, b, precision)
            else:
                out[k] = m + MERSENNE
        batch.clear()

    for k, values in enumerate(sets):
        if values.size == 0:
            continue
        if values.size > FIRST_BLOCK:
            out[k] = permuted_minima(values, config)
            continue
        batch.append(k)
        columns += values.size
        if columns >= BATCH_COLUMNS:
            flush()
            columns = 0
    if batch:
        flush()
    return out


def shingle_sets(texts: Sequence[str], config: MinhashConfig) -> list[tuple[int, np.ndarray]]:
    """:func:`shingle_set` of each text, hashed together: the words of texts of at most
    :data:`PIECE_CHARS` characters (one piece each) are joined into one buffer, their n-grams (none
    across two texts) hashed in one :func:`~longctx.pipeline.xxhash_np.span_hashes` call, and made
    distinct per text by one sort. Many small texts (a repository's files) cost a few array passes
    rather than a few dozen numpy calls each."""
    out: list[tuple[int, np.ndarray] | None] = [None] * len(texts)
    batched: list[int] = []
    words: list[bytes] = []
    fast = (
        config.hash_config.hash_fc == "xxhash" and config.norm_config == DEF_TEXT_NORM_CONFIG and _FAST_PATH
    )
    for k, text in enumerate(texts):
        if not fast or len(text) > PIECE_CHARS:
            out[k] = shingle_set(text, config)
            continue
        piece = _words_piece(text) if text else b""
        if not piece or piece.count(b" ") + 1 < config.n_grams:  # fewer words than one n-gram
            out[k] = (0, np.empty(0, U64))
            continue
        batched.append(k)
        words.append(piece)
    if batched:
        buf = b" ".join(words)
        sp = _separators(buf)  # word w of the buffer is buf[sp[w] + 1 : sp[w + 1]]
        n = config.n_grams
        counts = np.array([w.count(b" ") + 1 for w in words], np.int64)  # words per text
        shingles = counts - n + 1  # per text, all >= 1
        first_word = np.cumsum(counts) - counts
        owner = np.repeat(np.arange(len(words)), shingles)
        ends = np.cumsum(shingles)
        word = np.arange(int(ends[-1])) + np.repeat(first_word - (ends - shingles), shingles)
        starts = sp[word].astype(np.int64) + 1
        hashes = span_hashes(
            buf, starts, sp[word + n].astype(np.int64) - starts, config.hash_config.precision
        )
        bounds = np.concatenate([[0], ends])
        if config.hash_config.precision == 32:  # (text, hash) pairs as one sortable key
            uniq = distinct((owner.astype(U64) << U64(32)) | hashes)
            hashes = uniq & U64(0xFFFFFFFF)
            bounds = np.searchsorted(uniq >> U64(32), np.arange(len(words) + 1))
            parts = [hashes[bounds[j] : bounds[j + 1]] for j in range(len(words))]
        else:
            parts = [distinct(hashes[bounds[j] : bounds[j + 1]]) for j in range(len(words))]
        for j, k in enumerate(batched):
            out[k] = (int(shingles[j]), parts[j])
    return out  # type: ignore[return-value]


def minhash_minima(text: str, config: MinhashConfig) -> np.ndarray | None:
    """The ``num_hashes`` permuted minima of the text's shingles (uint64), or None when it has
    fewer than ``n_grams`` words (datatrove writes no signature then). Pieces of the text are
    hashed one at a time, each starting with the previous one's last ``n_grams - 1`` words."""
    mins: np.ndarray | None = None
    carry = b""
    for words in word_pieces(text, config.norm_config):
        buf = carry + b" " + words if carry else words
        hashes = shingle_hashes(buf, config)
        if hashes.size:
            piece_mins = permuted_minima(distinct(hashes) if repetitive(hashes) else hashes, config)
            mins = piece_mins if mins is None else np.minimum(mins, piece_mins)
        del hashes
        carry = _last_words(buf, config.n_grams - 1)
    return mins


def shingle_set(text: str, config: MinhashConfig) -> tuple[int, np.ndarray]:
    """The number of shingles (word n-grams, repeats included) datatrove's ``get_shingles`` gives
    the text, and their distinct hashes (sorted), from the same pieces as :func:`minhash_minima`.
    For texts such as source files, whose distinct n-grams are counted as well as hashed."""
    count = 0
    parts: list[np.ndarray] = []
    carry = b""
    for words in word_pieces(text, config.norm_config):
        buf = carry + b" " + words if carry else words
        hashes = shingle_hashes(buf, config)
        count += int(hashes.size)
        parts.append(distinct(hashes))
        carry = _last_words(buf, config.n_grams - 1)
    if not parts:
        return 0, np.empty(0, U64)
    return count, parts[0] if len(parts) == 1 else distinct(np.concatenate(parts))


def minhash_signature(text: str, config: MinhashConfig | None = None) -> list[list[int]] | None:
    """datatrove's ``get_signature(get_shingles(text))`` with :class:`RegexWordTokenizer`:
    ``num_buckets`` lists of ``hashes_per_bucket`` ints; None for fewer than ``n_grams`` words."""
    config = config or MinhashConfig()
    mins = minhash_minima(text, config)
    if mins is None:
        return None
    return mins.astype(config.hash_config.np_dtype).reshape(config.num_buckets, -1).tolist()


class MinhashSignature(MinhashDedupSignature):
    """datatrove's MinHash stage 1 (signature files per bucket, sorted), with signatures from
    :func:`minhash_minima`: the same values, about 10x faster, in memory bounded per piece.

    datatrove's ``run`` calls ``get_shingles(text)`` and, when that is not empty,
    ``get_signature(...)`` on its result. Here ``get_shingles`` returns the document's permuted
    minima already reduced over all its shingles (a (1, num_hashes) array; empty for fewer than
    ``n_grams`` words), and ``get_signature`` splits them into buckets.
    """

    def __init__(
        self, output_folder: str | os.PathLike, config: MinhashConfig, skip_existing_sigs: bool = False
    ) -> None:
        super().__init__(
            str(output_folder),
            config=config,
            language=RegexWordTokenizer(),
            skip_existing_sigs=skip_existing_sigs,
        )

    def get_shingles(self, text: str) -> np.ndarray:
        mins = minhash_minima(text, self.config)
        return np.empty((0, 1), U64) if mins is None else mins.reshape(1, -1)

    def get_signature(self, shingles: np.ndarray) -> list[list[int]]:
        mins = shingles.reshape(-1).astype(self.config.hash_config.np_dtype)
        return mins.reshape(self.config.num_buckets, -1).tolist()
