"""The reader base: text decoding (BOMs, NUL anywhere), listing without following links, every file
accounted for by one unit, and units shared among tasks by size."""

from __future__ import annotations

import codecs
import os
import random
from pathlib import Path

import pytest

from longctx.pipeline.readers.base import UnreadableInput, decode_text
from longctx.pipeline.readers.books import BookFolderReader
from longctx.pipeline.readers.listing import Tree, assign_by_size, list_tree, open_folder

TEXT = "Chapter 1\nIt was a bright cold day in April, and the clocks were striking thirteen. Ünïcødé ✓\n"


@pytest.mark.parametrize(
    "encoding, bom",
    [
        ("utf-16-le", codecs.BOM_UTF16_LE),
        ("utf-16-be", codecs.BOM_UTF16_BE),
        ("utf-32-le", codecs.BOM_UTF32_LE),
        ("utf-32-be", codecs.BOM_UTF32_BE),
        ("utf-8", codecs.BOM_UTF8),
    ],
)
def test_text_with_a_byte_order_mark_is_decoded(encoding: str, bom: bytes) -> None:
    assert decode_text(bom + TEXT.replace("\n", "\r\n").encode(encoding)) == TEXT


def test_utf16_text_starting_with_a_nul_after_the_mark_is_not_taken_for_utf32() -> None:
    """``FF FE 00 00`` opens UTF-32-LE, and also UTF-16-LE text whose first character is NUL."""
    raw = codecs.BOM_UTF16_LE + "\x00abc".encode("utf-16-le")
    with pytest.raises(UnreadableInput) as err:
        decode_text(raw)
    assert err.value.reason == "binary"  # decoded as UTF-16, then refused for its NUL character


@pytest.mark.parametrize(
    "raw, reason",
    [
        (codecs.BOM_UTF16_LE + TEXT.encode("utf-16-le") + b"\x00", "bad_encoding"),  # odd byte count
        (codecs.BOM_UTF16_LE + b"\x00\xd8\x41\x00", "bad_encoding"),  # lone surrogate
        (codecs.BOM_UTF8 + b"caf\xe9", "bad_encoding"),
        ("café au lait".encode("latin-1"), "not_utf8"),
        (TEXT.encode("utf-16-le"), "binary"),  # UTF-16 without a mark: NUL bytes, not UTF-8
        (b"   \n\t  \n", "empty"),
        (codecs.BOM_UTF16_BE + " \n".encode("utf-16-be"), "empty"),
    ],
)
def test_undecodable_text_is_refused_with_its_reason(raw: bytes, reason: str) -> None:
    with pytest.raises(UnreadableInput) as err:
        decode_text(raw)
    assert err.value.reason == reason


def test_nul_anywhere_in_the_text_is_binary() -> None:
    body = ("word " * 20_000).encode()  # 100 KB: the NUL is far beyond the first 8 KiB
    position = 90_000
    with pytest.raises(UnreadableInput) as err:
        decode_text(body[:position] + b"\x00" + body[position:])
    assert err.value.reason == "binary" and str(position) in err.value.detail
    with pytest.raises(UnreadableInput, match="binary"):
        decode_text(codecs.BOM_UTF16_LE + ("word " * 5000 + "\x00").encode("utf-16-le"))


def _book_docs(root: Path) -> dict:
    return {doc.id: doc for doc in BookFolderReader(root).run()}


def test_book_reader_decodes_utf16_and_refuses_a_late_nul(tmp_path: Path) -> None:
    books = tmp_path / "books"
    books.mkdir()
    (books / "utf16.txt").write_bytes(codecs.BOM_UTF16_LE + TEXT.encode("utf-16-le"))
    (books / "late_nul.txt").write_bytes(b"a" * 20_000 + b"\x00" + b"b" * 100)
    docs = _book_docs(books)
    assert docs["books/utf16.txt"].text == TEXT
    assert docs["books/late_nul.txt"].metadata["skip_reason"] == "binary"


def _walk_files(root: Path) -> set[str]:
    """Every input file under ``root``: non-folders, and links of any kind (never followed)."""
    found = set()
    for folder, dirs, files in os.walk(root):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(folder, d))]:
            found.add(os.path.relpath(os.path.join(folder, name), root))
    return found


def test_every_file_under_a_book_folder_is_one_units_business(tmp_path: Path) -> None:
    books = tmp_path / "books"
    (books / "shelf" / ".cache").mkdir(parents=True)
    (books / "a.txt").write_text(TEXT)
    (books / "shelf" / "b.txt").write_text(TEXT)
    (books / "shelf" / ".hidden.txt").write_text(TEXT)
    (books / "shelf" / ".cache" / "x.txt").write_text(TEXT)
    (books / "shelf" / ".cache" / "y.bin").write_bytes(b"\x00")
    (books / "cover.jpg").write_bytes(b"\xff\xd8")
    (tmp_path / "outside.txt").write_text("SECRET " * 100)
    os.symlink(tmp_path / "outside.txt", books / "linked.txt")
    os.symlink(tmp_path, books / "linked_dir")
    os.mkfifo(books / "pipe.txt")
    docs = _book_docs(books)
    outcome = {i: d.metadata.get("skip_reason", "") for i, d in docs.items()}
    assert outcome == {
        "books/a.txt": "",
        "books/shelf/b.txt": "",
        "books/shelf/.hidden.txt": "hidden",
        "books/shelf/.cache": "hidden",
        "books/cover.jpg": "unsupported_extension",
        "books/linked.txt": "symlink",
        "books/linked_dir": "symlink",
        "books/pipe.txt": "not_regular_file",
    }
    assert all(docs[i].metadata["skipped"] for i, reason in outcome.items() if reason)
    assert all("SECRET" not in d.text for d in docs.values())
    # the units' paths cover every file under the folder exactly once
    files = _walk_files(books)
    covering = {f: [i for i in docs if f == i[6:] or f.startswith(i[6:] + "/")] for f in files}
    assert all(len(units) == 1 for units in covering.values()), covering
    assert sum(d.metadata["input_files"] for d in docs.values()) == len(files)


def test_listing_never_follows_links(tmp_path: Path) -> None:
    (tmp_path / "root").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "deep.txt").write_text("x")
    os.symlink(tmp_path / "elsewhere", tmp_path / "root" / "link")
    entries = {e.path: e.kind for e in list_tree(open_folder(tmp_path / "root"))}
    assert entries == {"link": "symlink"}
    tree = Tree.of(str(tmp_path / "root"))
    with pytest.raises(OSError):
        tree.read_bytes("link")


def test_a_file_swapped_for_a_link_after_listing_is_not_read(tmp_path: Path) -> None:
    (tmp_path / "secret.txt").write_text("SECRET")
    root = tmp_path / "root"
    root.mkdir()
    (root / "a.txt").write_text("fine")
    tree = Tree.of(str(root))
    (root / "a.txt").unlink()
    os.symlink(tmp_path / "secret.txt", root / "a.txt")
    with pytest.raises(OSError):
        tree.read_bytes("a.txt")


def test_units_are_shared_among_tasks_by_bytes_not_count() -> None:
    rng = random.Random(0)
    # a few large units among many small ones, as books beside code repositories are
    sizes = [rng.randint(1, 9) * 10**3 for _ in range(300)] + [rng.randint(1, 9) * 10**6 for _ in range(12)]
    rng.shuffle(sizes)
    for tasks in (2, 3, 8):
        owners = assign_by_size(sizes, tasks)
        loads = [sum(s for s, o in zip(sizes, owners) if o == t) for t in range(tasks)]
        assert sum(loads) == sum(sizes)
        assert max(loads) - min(loads) <= max(sizes)  # never worse than one unit apart
        assert max(loads) <= 4 / 3 * max(sum(sizes) / tasks, max(sizes))  # greedy LPT bound
        # a count-based split (datatrove's files[rank::world_size]) is far less even
        by_count = [sum(sizes[t::tasks]) for t in range(tasks)]
        assert (max(loads) - min(loads)) * 5 < max(by_count) - min(by_count)
        assert owners == assign_by_size(sizes, tasks)  # every task computes the same split


def test_balanced_split_of_even_units_is_even() -> None:
    owners = assign_by_size([100] * 12, 4)
    assert sorted(owners.count(t) for t in range(4)) == [3, 3, 3, 3]
