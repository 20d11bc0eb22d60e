"""Project Gutenberg boilerplate stripping: synthetic e-texts and the real shared books."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from longctx.pipeline.readers import gutenberg
from longctx.pipeline.readers.base import normalize_newlines
from longctx.pipeline.readers.gutenberg import (
    MAX_FOOTER_CHARS,
    MAX_HEADER_CHARS,
    footer_markers,
    strip_gutenberg,
)

HEADER = """\
The Project Gutenberg EBook of The Test Book, by Ann Author

This eBook is for the use of anyone anywhere at no cost and with
almost no restrictions whatsoever.  You may copy it, give it away or
re-use it under the terms of the Project Gutenberg License included
with this eBook or online at www.gutenberg.org


Title: The Test Book

Author: Ann Author

Release Date: May 1, 2010 [EBook #99999]

Language: English


*** START OF THIS PROJECT GUTENBERG EBOOK THE TEST BOOK ***




Produced by Some Volunteer and the Online Distributed
Proofreading Team at http://www.pgdp.net




"""

BODY = """\
THE TEST BOOK

by Ann Author


CHAPTER I

It was a dark and stormy night. The heroine opened an old copy of
Project Gutenberg's catalogue and read it by candlelight.

    "Produced by the river," she said, "all of it."

CHAPTER II

The end of the Project was near, and everyone knew it.
"""

FOOTER = """\




End of the Project Gutenberg EBook of The Test Book, by Ann Author

*** END OF THIS PROJECT GUTENBERG EBOOK THE TEST BOOK ***

***** This file should be named 99999-8.txt or 99999-8.zip *****

*** START: FULL LICENSE ***

THE FULL PROJECT GUTENBERG LICENSE
PLEASE READ THIS BEFORE YOU DISTRIBUTE OR USE THIS WORK

Section 1.  General Terms of Use and Redistributing Project Gutenberg-tm
electronic works
"""

# Phrases of the Gutenberg header, footer and licence, matched case-sensitively as PG writes
# them ("start of the" in lower case is ordinary prose).
LICENCE_PHRASES = (
    "PROJECT GUTENBERG LICENSE",
    "Project Gutenberg License",
    "START OF TH",
    "END OF TH",
    "This eBook is for the use of anyone anywhere",
    "Project Gutenberg Literary Archive Foundation",
)


def _words(text: str) -> str:
    """Whitespace-collapsed, case-folded text, to compare copies wrapped differently."""
    return " ".join(text.split()).casefold()


# --------------------------------------------------------------------------------------------
# Synthetic e-texts
# --------------------------------------------------------------------------------------------


def test_header_credits_and_footer_removed_body_kept():
    cleaned, info = strip_gutenberg(HEADER + BODY + FOOTER)
    assert cleaned == BODY
    assert info["header_found"] and info["footer_found"] and info["credits_found"]
    assert info["chars_removed"] == len(HEADER) + len(FOOTER)


def test_crlf_and_bom_input_gives_the_same_result():
    crlf = "\ufeff" + (HEADER + BODY + FOOTER).replace("\n", "\r\n")
    cleaned, info = strip_gutenberg(crlf)
    assert cleaned == BODY
    assert "\r" not in cleaned and "\ufeff" not in cleaned
    assert info["header_found"] and info["footer_found"]


def test_lone_cr_line_endings_are_normalized():
    cleaned, _ = strip_gutenberg((HEADER + BODY + FOOTER).replace("\n", "\r"))
    assert cleaned == BODY


def test_text_without_markers_comes_back_unchanged():
    text = "A book about Project Gutenberg.\n\nProject Gutenberg was founded in 1971.\n   \n"
    cleaned, info = strip_gutenberg(text)
    assert cleaned == text
    assert info == {
        "header_found": False,
        "footer_found": False,
        "credits_found": False,
        "trailer_found": False,
        "chars_removed": 0,
        "unsafe": "",
    }


def test_text_without_markers_only_gets_newlines_normalized():
    cleaned, info = strip_gutenberg("\ufeffLine one\r\nLine two\rLine three\n")
    assert cleaned == "Line one\nLine two\nLine three\n"
    assert info["chars_removed"] == 0


def test_gutenberg_mentioned_in_the_body_is_kept():
    cleaned, _ = strip_gutenberg(HEADER + BODY + FOOTER)
    assert "Project Gutenberg's catalogue" in cleaned
    assert '"Produced by the river,"' in cleaned
    assert "The end of the Project was near" in cleaned


def test_produced_by_without_any_header_is_kept():
    text = "Produced by the author's own hand.\n\nCHAPTER I\n\nStory.\n"
    cleaned, info = strip_gutenberg(text)
    assert cleaned == text
    assert not info["credits_found"]


def test_credit_paragraph_is_dropped_only_when_short():
    long_credits = "Produced by\n" + "".join(f"volunteer {i}\n" for i in range(20))
    cleaned, info = strip_gutenberg(HEADER.split("Produced by")[0] + long_credits + "\n" + BODY)
    assert cleaned.startswith("Produced by\nvolunteer 0")
    assert not info["credits_found"]


@pytest.mark.parametrize(
    "marker",
    [
        "*** START OF THE PROJECT GUTENBERG EBOOK THE TEST BOOK ***",
        "***START OF THE PROJECT GUTENBERG EBOOK THE TEST BOOK***",
        "*** START OF THIS PROJECT GUTENBERG EBOOK THE TEST\nBOOK ***",
        "*END*THE SMALL PRINT! FOR PUBLIC DOMAIN ETEXTS*Ver.04.29.93*END*",
        "*END THE SMALL PRINT! FOR PUBLIC DOMAIN EBOOKS*Ver.02/11/02*END*",
    ],
)
def test_header_marker_variants(marker):
    preamble = "The Project Gutenberg Etext of The Test Book\n\nsmall print and notices\n\n"
    text = preamble + marker + "\n\n" + BODY
    cleaned, info = strip_gutenberg(text)
    assert cleaned == BODY
    assert info["header_found"]


@pytest.mark.parametrize(
    "footer",
    [
        "End of Project Gutenberg's The Test Book, by Ann Author\n",
        "End of the Project Gutenberg EBook of The Test Book\n",
        "End of this Project Gutenberg Etext of The Test Book\n",
        "***END OF THE PROJECT GUTENBERG EBOOK THE TEST BOOK***\n\nlicence text\n",
        "*** END OF THE PROJECT GUTENBERG EBOOK THE TEST BOOK ***\n\nlicence text\n",
    ],
)
def test_footer_marker_variants(footer):
    cleaned, info = strip_gutenberg(BODY + "\n\n" + footer)
    assert cleaned == BODY
    assert info["footer_found"] and not info["header_found"]


def test_old_preamble_without_start_marker():
    preamble = (
        "Project Gutenberg's The Test Book, by Ann Author\n\n"
        "This eBook is for the use of anyone anywhere at no cost and with\n"
        "almost no restrictions whatsoever.\n\n\n"
        "Title: The Test Book\n"
        "       A Subtitle On A Second Line\n\n"
        "Author: Ann Author\n\n"
        "Release Date: May 1, 2010 [EBook #99999]\n"
        "[This file last updated on June 2, 2011]\n\n"
        "Language: English\n\n\n"
    )
    cleaned, info = strip_gutenberg(preamble + BODY)
    assert cleaned == BODY
    assert info["header_found"]


def test_preamble_with_typographic_apostrophe():
    text = "Project Gutenberg\u2019s The Test Book, by Ann Author\n\nTitle: The Test Book\n\n" + BODY
    cleaned, info = strip_gutenberg(text)
    assert cleaned == BODY
    assert info["header_found"]


def test_preamble_stops_at_the_first_body_paragraph():
    text = "The Project Gutenberg EBook of Flatland\n\nPART 1\n\nTitle: not a field paragraph here\n"
    cleaned, _ = strip_gutenberg(text)
    assert cleaned == "PART 1\n\nTitle: not a field paragraph here\n"


def test_start_marker_deep_inside_the_text_is_not_a_header():
    filler = "Words of the book.\n" * (MAX_HEADER_CHARS // 19 + 10)
    text = filler + "*** START OF THE PROJECT GUTENBERG EBOOK QUOTED ***\nMore words.\n"
    cleaned, info = strip_gutenberg(text)
    assert cleaned == text
    assert not info["header_found"]


def test_footer_is_cut_at_the_last_marker_cluster():
    # A stray footer-like line early in the body must not cut the book in half.
    body = "Intro.\nEnd of Project Gutenberg's first volume, as the preface says.\n" + "Story.\n" * 500
    cleaned, info = strip_gutenberg(body + "\n" + FOOTER)
    assert cleaned == body
    assert info["footer_found"]


def test_see_notice_trailer_is_removed():
    text = BODY + "\n\n" + "=" * 60 + "\n(See notice at gutenberg.txt)\n"
    cleaned, info = strip_gutenberg(text)
    assert cleaned == BODY
    assert info["trailer_found"] and not info["header_found"] and not info["footer_found"]
    assert info["chars_removed"] == len(text) - len(BODY)


def test_result_is_idempotent():
    once, _ = strip_gutenberg(HEADER + BODY + FOOTER)
    twice, info = strip_gutenberg(once)
    assert twice == once
    assert info["chars_removed"] == 0


# --------------------------------------------------------------------------------------------
# Real e-texts from the shared corpus
# --------------------------------------------------------------------------------------------


def _read(path: Path) -> str:
    return path.read_bytes().decode("utf-8")


def _has_licence(raw: str) -> bool:
    """Independent oracle: the file still carries Project Gutenberg's licence text."""
    return "project gutenberg license" in raw.casefold()


def _dup_pairs(shared_corpus: Path) -> list[tuple[str, str, str]]:
    manifest = (shared_corpus / "MANIFEST.md").read_text(encoding="utf-8")
    pairs = re.findall(r"\| (DUP-S\d+) \| books \| `(books/[^`]+)`<br>`(books/[^`]+)`", manifest)
    assert pairs, "MANIFEST.md lists no duplicate book pairs"
    return pairs


def test_real_duplicate_pairs_align_after_stripping(shared_corpus):
    for group, first, second in _dup_pairs(shared_corpus):
        raws = {name: _read(shared_corpus / name) for name in (first, second)}
        kept = [name for name, raw in raws.items() if _has_licence(raw)]
        assert len(kept) == 1, f"{group}: expected exactly one copy with the PG boilerplate, got {kept}"
        (stripped_name,) = set(raws) - set(kept)
        clean_kept, info = strip_gutenberg(raws[kept[0]])
        clean_stripped, _ = strip_gutenberg(raws[stripped_name])
        assert info["header_found"] and info["footer_found"], group

        for cleaned in (clean_kept, clean_stripped):
            for phrase in LICENCE_PHRASES:
                assert phrase not in cleaned, (group, phrase)
            assert "produced by" not in _words(cleaned[:1000]), group

        # Both copies open on the same title within a few hundred characters...
        title = _words(next(line for line in clean_stripped.split("\n") if line.strip()))
        assert _words(clean_stripped).find(title) == 0
        assert 0 <= _words(clean_kept).find(title) <= 400, group
        # ... and the body survived to its last sentence.
        ending = _words(clean_stripped)[-40:]
        words_kept = _words(clean_kept)
        position = words_kept.rfind(ending)
        assert position >= 0, f"{group}: last sentence of the book lost"
        assert len(words_kept) - position <= 3000, f"{group}: footer left behind the last sentence"


def test_real_books_with_boilerplate_lose_only_boilerplate(shared_corpus):
    checked = 0
    for path in sorted((shared_corpus / "books").glob("*.txt")):
        raw = _read(path)
        if not _has_licence(raw):
            continue
        checked += 1
        normalized = normalize_newlines(raw.removeprefix("\ufeff"))
        cleaned, info = strip_gutenberg(raw)
        assert info["header_found"] and info["footer_found"], path.name
        for phrase in LICENCE_PHRASES:
            assert phrase not in cleaned, (path.name, phrase)
        # The licence and header are about 20 KB; the books are hundreds of KB.
        assert len(cleaned) >= 0.85 * len(normalized), path.name
        assert info["chars_removed"] == len(normalized) - len(cleaned)
        # Every line of the cleaned text is a line of the original, in one contiguous block.
        assert cleaned.strip() in normalized, path.name
    assert checked >= 3


def test_real_books_already_stripped_are_unchanged_but_for_a_small_trailer(shared_corpus):
    checked = 0
    for path in sorted((shared_corpus / "books").glob("*.txt")):
        raw = _read(path)
        if _has_licence(raw):
            continue
        checked += 1
        normalized = normalize_newlines(raw.removeprefix("\ufeff"))
        cleaned, info = strip_gutenberg(raw)
        assert not info["header_found"] and not info["footer_found"], path.name
        if cleaned != normalized:
            assert info["trailer_found"], path.name
            assert normalized.startswith(cleaned.rstrip("\n")), path.name
            assert len(normalized) - len(cleaned) <= 200, path.name
    assert checked >= 3


# ------------------------------------------------------------------ markers that cannot be used safely


def _one_line(text: str) -> str:
    return " ".join(text.split())


def test_book_on_one_line_is_kept_whole_and_the_reason_recorded():
    """The whole e-text on one line: every marker is inside running text, so nothing is a line of
    boilerplate; cutting at a marker "line" would take the whole book with it."""
    text = _one_line(HEADER + BODY * 400 + FOOTER)
    cleaned, info = strip_gutenberg(text)
    assert cleaned == text
    assert info["chars_removed"] == 0
    assert info["unsafe"]


def test_start_marker_line_running_into_the_book_is_not_used():
    text = "*** START OF THIS PROJECT GUTENBERG EBOOK X *** " + _one_line(BODY) * 100 + "\n"
    cleaned, info = strip_gutenberg(text)
    assert cleaned == text and info["unsafe"]


def test_footer_longer_than_any_licence_is_not_cut():
    """An end marker early in a long text would make the "footer" most of the book."""
    body = BODY * (MAX_FOOTER_CHARS // len(BODY) + 50)
    text = HEADER + "*** END OF THIS PROJECT GUTENBERG EBOOK THE TEST BOOK ***\n" + body
    cleaned, info = strip_gutenberg(text)
    assert cleaned == normalize_newlines(text)
    assert "footer" in info["unsafe"]


def test_nothing_left_after_stripping_keeps_the_text():
    text = HEADER + FOOTER
    cleaned, info = strip_gutenberg(text)
    assert cleaned == text and info["unsafe"] == "nothing would be left after removing the boilerplate"


def test_usable_markers_are_still_stripped_with_no_unsafe_reason():
    cleaned, info = strip_gutenberg(HEADER + BODY + FOOTER)
    assert cleaned == BODY and info["unsafe"] == ""


MARKER_PIECES = [
    "*** END OF THE PROJECT GUTENBERG EBOOK X ***",
    "End of Project Gutenberg's X",
    "end of the project gutenberg",
    "  \t**END OF THIS PROJECT GUTENBERG",
    "*** END OF THE PROJECT GUTENBERGS",
    "END OF THE PROJECT GUTENBERG",
    "gutenberg",
    "GuTeNbErG",
    "Project Gutenberg",
    "x END OF THE PROJECT GUTENBERG",
    "İ",
    "ẞ",
    "K",
    "ſ",
    "é",
    "\n",
    " ",
    "\t",
    "*",
    "End of",
    "the",
    "words and more words",
]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.sampled_from(MARKER_PIECES), max_size=40), st.integers(0, 400))
@example(["İ"] * 30 + ["\n", "End of Project Gutenberg's X", "\n", "words and more words"], 0)
def test_footer_markers_are_the_patterns_matches(pieces: list[str], start: int) -> None:
    """The lines tried because they hold "gutenberg" are exactly the pattern's matches over the
    whole text, from any start (mid-line too), with case variants, markers glued to text, and
    characters that lowercase to two (the fallback) or that fold to ASCII letters (Kelvin sign, long s)."""
    text = "".join(pieces)
    start = min(start, len(text))
    expected = [m.start() for m in gutenberg._FOOTER_MARKER_RE.finditer(text, start)]
    assert footer_markers(text, start) == expected
