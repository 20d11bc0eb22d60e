"""The fast dedup signatures against their references: datatrove's own MinHash stage 1 (shingles,
signatures and the sorted signature files it writes) and the plain definition of the exact hash."""

from __future__ import annotations

import random
import unicodedata
from pathlib import Path

import numpy as np
import pytest
import xxhash
from datatrove.data import Document
from datatrove.pipeline.dedup.minhash import MinhashConfig, MinhashDedupSignature, _mersenne_prime
from datatrove.utils.hashing import HashConfig
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from longctx.pipeline import signatures as sg
from longctx.pipeline.signatures import (
    MinhashSignature,
    RegexWordTokenizer,
    distinct,
    exact_hash,
    minhash_signature,
    normalize_for_exact,
    permuted_minima,
    repetitive,
    shingle_hashes,
)
from longctx.pipeline.xxhash_np import span_hashes

CONFIGS = {
    "64": MinhashConfig(),
    "32": MinhashConfig(hash_config=HashConfig(precision=32)),
    "3g-seed7": MinhashConfig(n_grams=3, seed=7, num_buckets=4, hashes_per_bucket=3),
    "1g": MinhashConfig(n_grams=1),
}


@pytest.fixture(scope="module")
def sig_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("sigs")  # datatrove's stage wants an output folder


def datatrove_step(config: MinhashConfig, folder: Path) -> MinhashDedupSignature:
    return MinhashDedupSignature(str(folder), config=config, language=RegexWordTokenizer())


def all_shingle_hashes(text: str, config: MinhashConfig) -> np.ndarray:
    parts = list(sg.word_pieces(text, config.norm_config))
    return shingle_hashes(b" ".join(parts), config)


def assert_same(text: str, config: MinhashConfig, folder: Path) -> None:
    step = datatrove_step(config, folder)
    ref = step.get_shingles(text).ravel()
    assert np.array_equal(all_shingle_hashes(text, config), ref)  # same values, same order
    assert minhash_signature(text, config) == (step.get_signature(ref.reshape(-1, 1)) if ref.size else None)


UNICODE_SAMPLES = [
    "Café naïve résumé — “quoted” ‘single’ … Größe Straße ÆØÅ œuvre",
    "\ufeffBOM at start, NBSP\u00a0here, zero\u200bwidth, soft\u00adhyphen, e\u0301 "
    "combining, a\u0308\u0301 two marks",
    "ΟΔΥΣΣΕΥΣ ΣΟΦΟΣ: final sigma AΣ ΣA İstanbul ǅemal Kelvin \u212a ohm \u2126 Greek question\u037e ok",
    "fullwidth １２３ and ＡＢＣ, arabic-indic ١٢٣٫٤٥ and 3٫14, devanagari ०१२, "
    "numbers 3.14 1,000,000 1.2.3 x9y",
    "中文文本没有空格但是有标点。日本語のテキスト、カタカナ。한국어 텍스트 입니다",
    "code_with_underscores __init__ self.x_1 = f(a, b) # comment ↔ → ≠ ≤ ∑ ∀x∈ℝ",
    "emoji 😀👍🏽 family 👨‍👩‍👧 flags 🇫🇷 tabs\tand\r\nlines\x0bvt\x1cfs\x85nel\u2028ls\u2029ps",
    "thai ภาษาไทย hebrew עִבְרִית arabic العربية with harakat مُحَمَّد devanagari हिन्दी",
    "lone surrogate \ud800 inside \udfff text and controls \x00\x07\x7f\x9f here",
    "only non-ASCII digits here: ١٢٣ ٤ and ５ and ٫",
    "new digits 𑵐𑵑 (gunjala gondi) and unassigned-in-14 \U00011f50\U00011f51 kawi, mark \U0001171e ahom",
]


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("text", UNICODE_SAMPLES)
def test_unicode_text_matches_datatrove(text: str, name: str, sig_dir: Path) -> None:
    assert_same(text * 3, CONFIGS[name], sig_dir)


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize(
    "text", ["", " ", "\n\t ", "...!!! ---", "one", "two words", "a b c d", "a_b_c_d_e", "1 2 3 4"]
)
def test_empty_and_short_texts(text: str, name: str, sig_dir: Path) -> None:
    """Fewer words than n_grams: no shingles, no signature (datatrove skips the document)."""
    assert_same(text, CONFIGS[name], sig_dir)


def _random_text(rng: random.Random, n_words: int, alphabet: str) -> str:
    seps = [" ", "  ", "\n", ", ", ". ", "\r\n", " - ", "_", "\t", "'", " (", ") "]
    words = [
        "".join(rng.choice(alphabet) for _ in range(rng.choice([1, 2, 3, 5, 8, 13, 40, 90])))
        for _ in range(n_words)
    ]
    return "".join(w + rng.choice(seps) for w in words)


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("seed", range(3))
def test_random_texts_match_datatrove(seed: int, name: str, sig_dir: Path) -> None:
    rng = random.Random(seed)
    assert_same(
        _random_text(rng, 3000, "abcdefghijklmnopqrstuvwxyzABCXYZ0123456789.,"), CONFIGS[name], sig_dir
    )
    assert_same(_random_text(rng, 3000, "abcxyzéüßøÆ中文αβΣ١٢0123.,—\u0301"), CONFIGS[name], sig_dir)
    # many repeated shingles, and more distinct shingles than the first permutation block
    vocab = [f"w{i}" for i in range(400)]
    assert_same(" ".join(rng.choice(vocab) for _ in range(20000)), CONFIGS[name], sig_dir)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=300))
def test_arbitrary_unicode_matches_datatrove(text: str, sig_dir: Path) -> None:
    assert_same(text, MinhashConfig(n_grams=2), sig_dir)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(alphabet="ab1,. _é\u0301\u00a0\n", max_size=200))
def test_dense_edge_characters_match_datatrove(text: str, sig_dir: Path) -> None:
    assert_same(text, MinhashConfig(n_grams=2), sig_dir)


@pytest.mark.parametrize("fn,precision", [(xxhash.xxh64_intdigest, 64), (xxhash.xxh32_intdigest, 32)])
def test_span_hashes_equal_xxhash(fn, precision: int) -> None:
    rng = random.Random(precision)
    buf = bytes(rng.randrange(256) for _ in range(20000))
    starts = np.array([rng.randrange(0, 19000) for _ in range(4000)], np.int64)
    lengths = np.array(
        [rng.choice([0, 1, 3, 4, 7, 8, 15, 16, 31, 32, 33, 63, 64, 65, 200, 999]) for _ in range(4000)],
        np.int64,
    )
    lengths = np.minimum(lengths, len(buf) - starts)
    got = span_hashes(buf, starts, lengths, precision)
    assert got.tolist() == [fn(buf[s : s + n]) for s, n in zip(starts.tolist(), lengths.tolist())]


def test_sha1_hash_function_is_supported(sig_dir: Path) -> None:
    assert_same(
        " ".join(f"w{i % 97}" for i in range(500)),
        MinhashConfig(hash_config=HashConfig(hash_fc="sha1")),
        sig_dir,
    )


@pytest.mark.parametrize("precision", [64, 32])
def test_permutations_exact_at_the_mersenne_wrap(precision: int) -> None:
    """Shingle hashes built so that ``h * a + b`` lands where the shift-and-mask reduction and the
    screening bound need their special cases (lo + hi >= p, lo near 2**61, low 32 bits near
    2**32), in the first block and in the screened blocks; reference: datatrove's arithmetic."""
    config = MinhashConfig(hash_config=HashConfig(precision=precision))
    a, b = sg._parameters(config.seed, 112)
    rng = random.Random(precision)
    p = (1 << 61) - 1
    targets = []
    for j in range(112):
        aj, bj = int(a[j, 0]), int(b[j, 0])
        if aj % 2 == 0:  # only odd multipliers are invertible modulo 2**64
            continue
        inv = pow(aj, -1, 1 << 64)
        for hi in range(8):
            for lo in (p - 7, p - 3, p - 1, p, 0, 1, 5, (1 << 32) - 3, (1 << 32) - 9, (1 << 32) + 2):
                x = (hi << 61) | (lo & p)
                targets.append(((x - bj) * inv) % (1 << 64))
    rand = [rng.getrandbits(64) for _ in range(150_000)]
    repeats = rand[:100_000] + targets * 30  # every special value 30 times, in the screened blocks
    rng.shuffle(repeats)
    for values in (
        repeats,
        rand[:2100] * 40,
        targets + rand,
        rand[:3000] + targets,
        rand[:100] + targets[:50],
    ):
        unique = distinct(np.array(values, np.uint64))
        with np.errstate(over="ignore"):
            expected = np.full(112, np.iinfo(np.uint64).max, np.uint64)
            for s in range(0, unique.size, 8192):
                phv = (
                    unique[s : s + 8192].reshape(-1, 1) * a.reshape(1, -1) + b.reshape(1, -1)
                ) % _mersenne_prime
                if precision == 32:
                    phv &= np.uint64(0xFFFFFFFF)
                np.minimum(expected, phv.min(axis=0), out=expected)
        assert permuted_minima(unique, config).tolist() == expected.tolist()
        # repeats left in (minhash_minima screens them rather than sort them away) change nothing
        assert permuted_minima(np.array(values, np.uint64), config).tolist() == expected.tolist()
    assert np.min(expected) <= 7 or precision == 32  # the wrap case really occurred


LONG_TEXT = (
    " ".join(UNICODE_SAMPLES)
    + " 3.14 ΣΑΣ\nΟΔΟΣ e\u0301\u0301 "
    + "x" * 120
    + " 1,000 ٣٫١٤ "
    + _random_text(random.Random(5), 150, "abcé1.")
)


@pytest.mark.parametrize("size", [2, 40])
def test_long_texts_hashed_in_pieces(size: int, monkeypatch, sig_dir: Path) -> None:
    """Pieces cut at whitespace, each carrying the previous piece's last n-1 words, give the
    signature and the exact hash of the whole text (numbers, marks, final sigma across cuts)."""
    monkeypatch.setattr(sg, "PIECE_CHARS", size)
    clean = LONG_TEXT.replace("\ud800", "").replace("\udfff", "")
    for text in (LONG_TEXT, LONG_TEXT.encode("ascii", "ignore").decode("ascii")):
        assert len(list(sg.text_pieces(text, size))) > 10
        for config in CONFIGS.values():
            assert_same(text, config, sig_dir)
    for text in (
        clean,
        clean.encode("ascii", "ignore").decode("ascii"),
        "  lead\n\n",
        "a \u3000 b",
        "\u00a0" * 9,
    ):
        assert exact_hash(text) == reference_exact_hash(text)


def test_distinct_is_sorted_unique() -> None:
    values = np.array([5, 1, 5, 0, 2**64 - 1, 1], np.uint64)
    assert distinct(values).tolist() == [0, 1, 5, 2**64 - 1]
    assert distinct(np.array([], np.uint64)).size == 0


def test_marks_in_finds_exactly_the_non_spacing_marks() -> None:
    """Over a text holding every code point (twice: the second lookup comes from the cache), the
    table is the scan of ``unicodedata.category`` that datatrove's mark removal uses."""
    every = "".join(map(chr, range(0x110000)))
    scan = {c: None for c in range(0x110000) if unicodedata.category(chr(c)) == "Mn"}
    assert sg.marks_in(every) == scan
    assert sg.marks_in(every[::-1]) == scan
    assert sg.marks_in("e\u0301a\u0300") == {0x301: None, 0x300: None}
    assert sg.marks_in("plain ascii") == {}


def test_wide_whitespace_list_is_every_non_ascii_isspace_character() -> None:
    """The written-out list against the scan of every code point it replaces (in this Python's
    Unicode version), in the same order."""
    scan = [chr(c).encode("utf-8") for c in range(128, 0x110000) if chr(c).isspace()]
    assert scan == sg._WIDE_WS


def test_fast_path_assumptions_hold_for_this_datatrove() -> None:
    """If datatrove's simplify_text changes, word_pieces falls back to it; this flags the change."""
    assert sg._FAST_PATH


def test_regex_word_tokenizer_is_language_agnostic() -> None:
    tok = RegexWordTokenizer()
    assert tok.word_tokenize("def f(x): return x_1 + 2  # Größe") == [
        "def",
        "f",
        "x",
        "return",
        "x_1",
        "2",
        "Größe",
    ]


def test_stage_writes_the_signature_files_datatrove_writes(tmp_path: Path) -> None:
    """The pipeline step, run on documents, writes byte-identical (sorted) bucket files to
    datatrove's own MinHash stage 1 with the same word splitter, short documents skipped alike."""
    rng = random.Random(1)
    vocab = [f"w{i}" for i in range(300)] + ["Größe", "ΣΑΣ", "3.14"]
    texts = [" ".join(rng.choice(vocab) for _ in range(n)) for n in (2000, 3, 0, 700, 5000)] + UNICODE_SAMPLES
    docs = [Document(text=t, id=str(i)) for i, t in enumerate(texts)]
    config = MinhashConfig(num_buckets=3, hashes_per_bucket=4)
    for _folder, step in (
        ("ours", MinhashSignature(tmp_path / "ours", config)),
        ("theirs", datatrove_step(config, tmp_path / "theirs")),
    ):
        for _ in step.run(iter(docs), rank=0, world_size=1) or ():
            pass
    for bucket in range(3):
        ours = (tmp_path / "ours" / f"bucket_{bucket:03d}" / "00000.minhash.sig").read_bytes()
        assert (
            ours and ours == (tmp_path / "theirs" / f"bucket_{bucket:03d}" / "00000.minhash.sig").read_bytes()
        )


def test_signature_equals_datatrove_signature_on_repeated_shingles(sig_dir: Path) -> None:
    """The step's own get_shingles/get_signature pair, as datatrove's run calls it, against
    datatrove's on a text with many repeated shingles."""
    config = MinhashConfig()
    ours = MinhashSignature(sig_dir / "a", config=config)
    theirs = datatrove_step(config, sig_dir / "b")
    rng = random.Random(0)
    text = " ".join(f"w{rng.randint(0, 300)}" for _ in range(2000))
    shingles = theirs.get_shingles(text)
    assert np.unique(shingles).size < shingles.size  # repeated shingles were present
    assert ours.get_signature(ours.get_shingles(text)) == theirs.get_signature(shingles)


def test_repeated_phrases_in_prose_match_datatrove(sig_dir: Path) -> None:
    """A phrase repeated all through otherwise distinct prose: too few repeats for the sample to call
    the text repetitive, so its shingles are screened with their repeats (one of them is the
    minimum of some permutations, met again and again); a text of a few lines over and over is
    sorted first. Both against datatrove."""
    rng = random.Random(3)
    words = ["".join(rng.choice("abcdefghij") for _ in range(7)) for _ in range(20_000)]
    for i in sorted(rng.sample(range(len(words)), 400), reverse=True):
        words[i:i] = ["the", "same", "phrase", "once", "again"]
    prose = " ".join(words)
    hashes = all_shingle_hashes(prose, MinhashConfig())
    assert distinct(hashes).size < hashes.size - 300 and not repetitive(hashes)
    log = "".join(f"line {chr(97 + i)} of a log that repeats\n" for i in range(12)) * 400
    assert repetitive(all_shingle_hashes(log, MinhashConfig()))
    for text in (prose, log):
        for config in (CONFIGS["64"], CONFIGS["32"]):
            assert_same(text, config, sig_dir)


def test_real_book_matches_datatrove(shared_corpus: Path, sig_dir: Path) -> None:
    """A UTF-8 book with a BOM, curly quotes and accents (the non-ASCII path), and its ASCII part."""
    book = next(p for p in sorted((shared_corpus / "books").glob("*.txt")) if "jane_eyre" in p.name)
    text = book.read_text(encoding="utf-8")
    for config in (CONFIGS["64"], CONFIGS["32"]):
        assert_same(text, config, sig_dir)
    assert_same(text.encode("ascii", "ignore").decode("ascii"), CONFIGS["64"], sig_dir)
    assert exact_hash(text) == reference_exact_hash(text)
    assert exact_hash(text.replace("\n", "\r\n  ")) == exact_hash(text)


# --- exact hash -------------------------------------------------------------------------------------


def reference_exact_hash(text: str) -> str:
    """The definition: xxh3-128 of NFKC text with whitespace runs made one space, trimmed."""
    return xxhash.xxh3_128_hexdigest(normalize_for_exact(text).encode("utf-8"))


def test_normalization_ignores_wrapping_and_line_endings() -> None:
    a = "It is a truth universally\r\nacknowledged, that a single man"
    b = "It is a truth\nuniversally acknowledged,   that a single man\n"
    assert normalize_for_exact(a) == normalize_for_exact(b)
    assert exact_hash(a) == exact_hash(b)
    assert exact_hash(a) != exact_hash(a + " extra")


WS_SAMPLES = [
    "",
    "   ",
    " a ",
    "a\r\n\r\nb",
    "x\x1cy\x1dz\x1e\x1fw",
    "nel\x85ls\u2028ps\u2029 ogham\u1680end",
    "nbsp\u00a0ideo\u3000thin\u2009",
    "ﬁ ligature ① circled Ｆｕｌｌ",
    "\ufeffbom",
    "e\u0301 vs é",
]


@pytest.mark.parametrize("text", WS_SAMPLES + [t for t in UNICODE_SAMPLES if "\ud800" not in t])
def test_exact_hash_matches_definition(text: str) -> None:
    assert exact_hash(text) == reference_exact_hash(text)


def test_exact_hash_refuses_lone_surrogates_like_the_definition() -> None:
    text = next(t for t in UNICODE_SAMPLES if "\ud800" in t)
    with pytest.raises(UnicodeEncodeError):
        reference_exact_hash(text)
    with pytest.raises(UnicodeEncodeError):
        exact_hash(text)


@settings(max_examples=300, deadline=None)
@given(
    st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=200),
    st.integers(1, 9),
)
def test_exact_hash_matches_definition_on_arbitrary_text(text: str, piece: int) -> None:
    saved = sg.PIECE_CHARS
    sg.PIECE_CHARS = piece
    try:
        assert exact_hash(text) == reference_exact_hash(text)
    finally:
        sg.PIECE_CHARS = saved


@pytest.mark.parametrize("tasks", [1, 2, 3])
def test_grouped_buckets_write_what_one_task_per_bucket_writes(tmp_path: Path, tasks: int) -> None:
    """Several buckets per task (fewer tasks to start) against datatrove's stage 2 with one task per
    bucket: the same candidate-pair files, byte for byte, and some pairs among them."""
    from datatrove.pipeline.dedup.minhash import MinhashDedupBuckets

    from longctx.pipeline.dedup import GroupedMinhashBuckets

    rng = random.Random(3)
    vocab = [f"w{i}" for i in range(400)]
    base = [[rng.choice(vocab) for _ in range(600)] for _ in range(6)]
    texts = [" ".join(words) for words in base]
    texts += [" ".join(words[:-5] + ["changed"] * 5) for words in base[:3]]  # near duplicates
    config = MinhashConfig(num_buckets=5, hashes_per_bucket=3)
    docs = [Document(text=t, id=str(i)) for i, t in enumerate(texts)]
    for _ in MinhashSignature(tmp_path / "sigs", config).run(iter(docs), rank=0, world_size=1) or ():
        pass
    for bucket in range(config.num_buckets):
        step = MinhashDedupBuckets(str(tmp_path / "sigs"), str(tmp_path / "theirs"), config=config)
        step.run(None, bucket, config.num_buckets)
    for rank in range(tasks):
        ours = GroupedMinhashBuckets(tmp_path / "sigs", tmp_path / "ours", config)
        for _ in ours.run(None, rank, tasks) or ():
            pass
    theirs = {p.name: p.read_bytes() for p in sorted((tmp_path / "theirs").iterdir())}
    assert len(theirs) == config.num_buckets and any(theirs.values())
    assert {p.name: p.read_bytes() for p in sorted((tmp_path / "ours").iterdir())} == theirs


@pytest.mark.parametrize("name", ["32", "64", "1g"])
def test_batched_sets_and_minima_equal_datatrove_per_text(
    name: str, sig_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Many texts hashed together (a repository's files: :func:`shingle_sets`, then
    :func:`minima_of_sets`, several 2-D batches and sets above ``FIRST_BLOCK`` among them) give each
    text datatrove's own shingle count, distinct shingles and signature, as hashed one text at a time.
    Texts over ``PIECE_CHARS`` (made small here) take the piecewise path in the same call."""
    monkeypatch.setattr(sg, "PIECE_CHARS", 3000)
    monkeypatch.setattr(sg, "BATCH_COLUMNS", 700)
    config = CONFIGS[name]
    rng = random.Random(name)
    texts = ["", "   ", "one", "two words", "a b c d", "x y z w v u", "é1 2,5 Ἀ\u0301 ΣΑΣ " * 3]
    texts += [_random_text(rng, rng.choice([5, 40, 300, 900, 2500]), "abcdé1. ") for _ in range(40)]
    texts += [" ".join(f"w{i % 7}" for i in range(200))]  # repeats: few distinct shingles
    rng.shuffle(texts)
    step = datatrove_step(config, sig_dir)
    sets = sg.shingle_sets(texts, config)
    minima = sg.minima_of_sets([unique for _, unique in sets], config)
    assert any(u.size > sg.FIRST_BLOCK for _, u in sets) and any(len(t) > 3000 for t in texts)
    for text, (count, unique), mins in zip(texts, sets, minima):
        ref = step.get_shingles(text).ravel()
        assert count == ref.size
        assert unique.tolist() == sorted(set(ref.tolist()))
        if ref.size:
            signature = mins.astype(config.hash_config.np_dtype).reshape(config.num_buckets, -1).tolist()
            assert signature == step.get_signature(ref.reshape(-1, 1))
        else:
            assert mins is None


def test_batched_minima_exact_at_the_mersenne_wrap() -> None:
    """Small sets holding hashes that hit the rare wrap case of 64-bit precision are redone with
    datatrove's arithmetic inside a batch, the others in the same batch are not disturbed."""
    config = MinhashConfig()
    a, b = sg._parameters(config.seed, 112)
    p = (1 << 61) - 1
    aj, bj = next((int(a[j, 0]), int(b[j, 0])) for j in range(112) if int(a[j, 0]) % 2)
    inv = pow(aj, -1, 1 << 64)
    wraps = [
        ((((hi << 61) | lo) - bj) * inv) % (1 << 64) for hi in range(1, 8) for lo in (0, 1, p - 3, p - 1, p)
    ]
    rng = random.Random(3)
    sets = [
        np.array(sorted({rng.getrandbits(64) for _ in range(rng.randrange(1, 300))}), np.uint64)
        for _ in range(30)
    ]
    sets[4] = distinct(np.concatenate([sets[4], np.array(wraps, np.uint64)]))
    with np.errstate(over="ignore"):
        expected = [sg._reference_minima(s, a, b, 64) for s in sets]
    got = sg.minima_of_sets(sets, config)
    assert [g.tolist() for g in got] == [e.tolist() for e in expected]
    with np.errstate(over="ignore"):  # the wrap case (lo + hi >= p) really occurred in set 4
        assert sg._ordered_residues(sets[4], a, b, 64).min() <= 7
