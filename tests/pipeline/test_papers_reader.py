"""PaperReader as a datatrove stage: units, metadata, skips, sharding, and the real shared papers."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from longctx.core.errors import ConfigError
from longctx.pipeline.readers.listing import Tree
from longctx.pipeline.readers.papers import PaperReader, find_main_markdown

METADATA_TYPES = {
    "format": str,
    "main_file": str,
    "main_choice": str,
    "problems": list,
    "included_count": int,
}


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def read_all(root: Path, **kwargs) -> dict[str, object]:
    return {doc.id: doc for doc in PaperReader(root, **kwargs).run(rank=0, world_size=1)}


@pytest.fixture
def papers(tmp_path: Path) -> Path:
    root = tmp_path / "papers"
    write(
        root / "a_single.tex",
        (
            "% header comment\n\\documentclass{article}\n\\begin{document}\nSINGLE\n\\input{shared_macros}\n"
            "\\end{document}\n"
        ),
    )
    write(root / "shared_macros.tex", "MACROS\n")  # no documentclass, but still a unit of its own
    write(root / "b_folder/main.tex", "\\documentclass{article}\n\\input{sec/intro}\n\\input{missing}\n")
    write(root / "b_folder/sec/intro.tex", "FOLDER-INTRO % remark\n")
    write(root / "c_notes.md", "# Notes\r\n\r\nMarkdown body\r\n")
    write(root / "d_plain.txt", "Plain text paper\n")
    write(root / "e_empty.tex", "")
    write(root / "f_binary.tex", b"\x00\x01\x02\x03binary")
    write(root / "g_chapters_only/ch1.tex", "A chapter without preamble\n")
    write(root / "g_chapters_only/README.md", "How to build: run make\n")  # not the paper
    write(root / "h_markdown/README.md", "Readme of the repo\n")
    write(root / "h_markdown/paper.md", "# The paper\n\nPAPER-MD\n")
    write(root / "i_only_comments.tex", "% nothing\n% here\n")
    write(root / ".hidden.tex", "\\documentclass{article}\nHIDDEN\n")
    write(root / "figure.pdf", b"%PDF-1.4")
    return root


def read_units(root):
    return {unit.path: unit.skip for unit in PaperReader(root).list_units()[0]}


def test_units_are_sorted_and_every_top_level_entry_is_one(papers):
    units = read_units(papers)
    assert list(units) == sorted(units)
    assert set(units) == {p.name for p in papers.iterdir()}
    assert units[".hidden.tex"] == "hidden" and units["figure.pdf"] == "unsupported_extension"
    assert all(
        units[n] == "" for n in ("a_single.tex", "b_folder", "c_notes.md", "d_plain.txt", "h_markdown")
    )


def test_symlinked_units_are_skipped(tmp_path, papers):
    write(tmp_path / "elsewhere.tex", "\\documentclass{article}\nELSEWHERE\n")
    os.symlink(tmp_path / "elsewhere.tex", papers / "z_link.tex")
    os.symlink(papers / "b_folder", papers / "z_dirlink")
    units = read_units(papers)
    assert units["z_link.tex"] == units["z_dirlink"] == "symlink"
    docs = read_all(papers)
    assert docs["papers/z_link.tex"].text == "" and docs["papers/z_link.tex"].metadata["skipped"]


def test_documents_ids_formats_and_text(papers):
    docs = read_all(papers)
    single = docs["papers/a_single.tex"]
    assert single.metadata["format"] == "latex"
    assert "SINGLE" in single.text and "MACROS" in single.text and "header comment" not in single.text
    assert single.metadata["main_file"] == "a_single.tex"
    assert single.metadata["main_choice"] == "single_file"
    assert single.metadata["included_count"] == 1
    assert single.metadata["source"] == "papers"

    folder = docs["papers/b_folder"]
    assert folder.metadata["format"] == "latex"
    assert "FOLDER-INTRO" in folder.text and "remark" not in folder.text
    assert folder.metadata["main_file"] == "main.tex"
    assert [p["kind"] for p in folder.metadata["problems"]] == ["missing_include"]

    notes = docs["papers/c_notes.md"]
    assert notes.metadata["format"] == "markdown"
    assert notes.text == "# Notes\n\nMarkdown body\n"

    plain = docs["papers/d_plain.txt"]
    assert plain.metadata["format"] == "text" and plain.text == "Plain text paper\n"

    markdown_folder = docs["papers/h_markdown"]
    assert markdown_folder.metadata["format"] == "markdown"
    assert markdown_folder.metadata["main_file"] == "paper.md"
    assert "PAPER-MD" in markdown_folder.text


@pytest.mark.parametrize(
    ("unit", "reason"),
    [
        ("e_empty.tex", "empty"),
        ("f_binary.tex", "binary"),
        ("g_chapters_only", "no_main_tex"),
        ("i_only_comments.tex", "empty"),
    ],
)
def test_unreadable_units_become_skipped_documents(papers, unit, reason):
    doc = read_all(papers)[f"papers/{unit}"]
    assert doc.text == ""
    assert doc.metadata["skip_reason"] == reason


def test_metadata_keys_and_types_are_uniform(papers):
    for doc in read_all(papers).values():
        if "skip_reason" in doc.metadata:
            continue
        for key, expected in METADATA_TYPES.items():
            assert isinstance(doc.metadata[key], expected), (doc.id, key)
        for problem in doc.metadata["problems"]:
            assert set(problem) == {"kind", "path", "detail"}
            assert all(isinstance(value, str) for value in problem.values())


def test_sharding_covers_every_unit_exactly_once(papers):
    everything = [doc.id for doc in PaperReader(papers).run(rank=0, world_size=1)]
    shards = [[doc.id for doc in PaperReader(papers).run(rank=rank, world_size=2)] for rank in range(2)]
    assert len(everything) == len(read_units(papers))
    assert sorted(shards[0] + shards[1]) == sorted(everything)
    assert not set(shards[0]) & set(shards[1])
    assert all(shards)


def test_limit_reads_the_first_units_and_records_the_others(papers):
    docs = list(PaperReader(papers, limit=2).run())
    assert len(docs) == len(read_units(papers))
    over = [doc.id for doc in docs if doc.metadata.get("skip_reason") == "over_limit"]
    assert len(over) == len(docs) - 2


def test_markdown_folder_preferences(tmp_path):
    folder = tmp_path / "p"
    write(folder / "README.md", "readme\n")
    write(folder / "notes.md", "notes\n")
    assert find_main_markdown(Tree.of(str(folder))).path == "README.md"
    write(folder / "paper.md", "paper\n")
    assert find_main_markdown(Tree.of(str(folder))).path == "paper.md"
    only = tmp_path / "q"
    write(only / "draft.md", "draft\n")
    assert find_main_markdown(Tree.of(str(only))).reason == "only_candidate"
    ambiguous = tmp_path / "r"
    write(ambiguous / "one.md", "1\n")
    write(ambiguous / "two.md", "2\n")
    assert find_main_markdown(Tree.of(str(ambiguous))) is None


def test_folder_paper_never_reads_outside(tmp_path):
    root = tmp_path / "papers"
    write(tmp_path / "secret.tex", "TOP-SECRET\n")
    write(root / "p/main.tex", "\\documentclass{article}\n\\input{../../secret}\n\\input{../sibling}\n")
    write(root / "sibling.tex", "SIBLING\n")
    doc = read_all(root)["papers/p"]
    assert "TOP-SECRET" not in doc.text and "SIBLING" not in doc.text
    assert [p["kind"] for p in doc.metadata["problems"]] == ["include_outside", "include_outside"]


def test_single_file_paper_may_not_leave_its_folder(tmp_path):
    root = tmp_path / "papers"
    write(tmp_path / "secret.tex", "TOP-SECRET\n")
    write(root / "solo.tex", "\\documentclass{article}\n\\input{../secret}\n")
    doc = read_all(root)["papers/solo.tex"]
    assert "TOP-SECRET" not in doc.text
    assert [p["kind"] for p in doc.metadata["problems"]] == ["include_outside"]


def test_missing_input_folder_raises(tmp_path):
    with pytest.raises(ConfigError, match="nope does not exist"):
        list(PaperReader(tmp_path / "nope").run())


# --------------------------------------------------------------------------------------------
# Real papers from the shared corpus
# --------------------------------------------------------------------------------------------


def test_real_shared_papers(shared_corpus):
    folder = shared_corpus / "papers"
    docs = list(PaperReader(folder).run())
    sources = sorted(folder.glob("*.tex"))
    assert len(docs) == len(sources) > 0
    for doc in docs:
        assert "skip_reason" not in doc.metadata, doc.id
        assert doc.metadata["format"] == "latex"
        assert doc.text.strip()
        comment_lines = [line for line in doc.text.split("\n") if line.lstrip().startswith("%")]
        assert not comment_lines, (doc.id, comment_lines[:3])
        source_size = Path(doc.metadata["path"]).stat().st_size
        ratio = len(doc.text.encode("utf-8")) / source_size
        assert 0.5 <= ratio <= 1.0, (doc.id, ratio)
        assert "\\documentclass" in doc.text and "\\begin{document}" in doc.text, doc.id
        for problem in doc.metadata["problems"]:
            # The corpus is already flattened; only generated inputs it never had can be missing.
            assert problem["kind"] == "missing_include", (doc.id, problem)
