"""Curation on hostile inputs built here: every file under the input ends up in exactly one ledger row
(checked against an independent walk of the folders), books that used to be emptied or mis-read are
kept or refused with the right reason, the original of a forked paper is kept, and a refused run
changes nothing."""

from __future__ import annotations

import codecs
import hashlib
import json
import os
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from longctx import jobs
from longctx.config import parse_config
from longctx.core.errors import ConfigError
from longctx.pipeline.bpe import train_bpe
from tests.pipeline.test_curate import FOOTER, HEADER, prose, python_module, wrap

FORK_SWAPS = {" the ": " his ", " and ": " but ", " was ": " had "}  # same lengths: the fork is as long


def build_inputs(root: Path) -> None:
    books, papers, code = root / "input" / "books", root / "input" / "papers", root / "input" / "code"
    for folder in (books, papers, code, root / "outside"):
        folder.mkdir(parents=True)
    (books / "novel.txt").write_text(wrap(prose(1, 2500), 70))
    # a Project Gutenberg book stored on one line: the markers are inside running text
    (books / "one_line.txt").write_text(" ".join((HEADER + wrap(prose(2, 2500), 70) + FOOTER).split()))
    late_nul = wrap(prose(3, 4000), 70)
    (books / "late_nul.txt").write_text(late_nul[:12_000] + "\x00" + late_nul[12_000:])
    (books / "utf16.txt").write_bytes(codecs.BOM_UTF16_LE + wrap(prose(4, 2500), 70).encode("utf-16-le"))
    (books / ".hidden.txt").write_text(wrap(prose(5, 2500), 70))
    (books / "notes.md").write_text("# notes\n")
    (books / "shelf" / ".git" / "objects").mkdir(parents=True)
    (books / "shelf" / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (books / "shelf" / ".git" / "objects" / "ab").write_bytes(b"\x78\x9c")
    (root / "outside" / "elsewhere.txt").write_text(wrap(prose(6, 2500), 70))
    os.symlink(root / "outside" / "elsewhere.txt", books / "linked.txt")
    os.symlink(root / "outside", books / "linked_folder")

    paper = papers / "attention"
    paper.mkdir()
    main = "\\documentclass{article}\n\\begin{document}\n" + wrap(prose(7, 2500), 70) + "\n\\end{document}\n"
    (paper / "main.tex").write_text(main)
    (paper / "figure.png").write_bytes(b"\x89PNG\x00")
    (paper / "refs.bib").write_text("@article{x, title={X}}\n")
    (papers / "poster.pdf").write_bytes(b"%PDF-1.4")
    # a fork of the paper, as long as the original, in another source whose folder says it is a fork
    fork = root / "forks" / "papers" / "attention"
    fork.mkdir(parents=True)
    forked = main
    for old, new in FORK_SWAPS.items():
        forked = forked.replace(old, new, 3)
    assert len(forked) == len(main) and forked != main
    (fork / "main.tex").write_text(forked)

    repo = code / "toolkit"
    (repo / "toolkit").mkdir(parents=True)
    (repo / "toolkit" / "core.py").write_text(python_module(8, 60))
    (repo / "toolkit" / "__init__.py").write_text("from .core import *\n")
    (repo / ".git").mkdir()
    (repo / ".git" / "config").write_text("[core]\n")
    (repo / "logo.png").write_bytes(b"\x89PNG")
    (code / "loose_script.py").write_text("print('not a repository')\n")


def make_config(root: Path, tokenizer: Path, output: Path, **curate) -> dict:
    forks = {"name": "forks", "kind": "papers", "path": str(root / "forks" / "papers")}
    return {
        "output": str(output),
        "context": {"original": 64, "target": 256},
        "tokenizer": {"path": str(tokenizer)},
        "curate": {"input": str(root / "input"), "sources": [forks], "executor": {"tasks": 2, "workers": 2}}
        | curate,
    }


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, Path, dict]:
    root = tmp_path_factory.mktemp("inputs")
    build_inputs(root)
    tokenizer = root / "tokenizer" / "tokenizer.json"
    train_bpe([prose(s, 2000) for s in range(4)] + [python_module(s, 20) for s in range(4)], 400, tokenizer)
    summary = jobs.curate(parse_config(make_config(root, tokenizer, root / "out")))
    return root, tokenizer, summary


def ledger_rows(output: Path) -> dict[str, dict]:
    return {row["id"]: row for row in pq.read_table(output / "ledger.parquet").to_pylist()}


def walk_files(folder: Path) -> list[str]:
    """Every file under ``folder``, as absolute paths: regular files, special files and links of any
    kind (links to folders included, never followed)."""
    found = []
    for where, dirs, files in os.walk(folder):
        found += [os.path.join(where, n) for n in files]
        found += [os.path.join(where, d) for d in dirs if os.path.islink(os.path.join(where, d))]
    return found


def test_every_file_under_the_input_has_exactly_one_ledger_row(run) -> None:
    root, _, summary = run
    rows = ledger_rows(root / "out")
    files = walk_files(root / "input") + walk_files(root / "forks")
    for file in files:
        owners = [i for i, r in rows.items() if file == r["path"] or file.startswith(r["path"] + "/")]
        assert len(owners) == 1, (file, owners)
    assert sum(r["files"] for r in rows.values()) == len(files) == summary["totals"]["files"]
    # inside the repository, the document's metadata accounts for every file
    docs = {
        r["id"]: r
        for f in (root / "out" / "documents").rglob("*.parquet")
        for r in pq.read_table(f).to_pylist()
    }
    meta = json.loads(docs["code/toolkit"]["metadata"])
    accounted = (
        meta["n_files"] + sum(s["files"] for s in meta["skipped_files"]) + len(meta["duplicate_files"])
    )
    assert accounted == rows["code/toolkit"]["files"] == len(walk_files(root / "input" / "code" / "toolkit"))


def test_outcomes_and_reasons(run) -> None:
    root, _, summary = run
    got = {i: (r["outcome"], r["reason"]) for i, r in ledger_rows(root / "out").items()}
    assert got == {
        "books/novel.txt": ("kept", ""),
        "books/one_line.txt": ("kept", ""),
        "books/late_nul.txt": ("filtered", "binary"),
        "books/utf16.txt": ("kept", ""),
        "books/.hidden.txt": ("skipped", "hidden"),
        "books/notes.md": ("skipped", "unsupported_extension"),
        "books/shelf/.git": ("skipped", "hidden"),
        "books/linked.txt": ("skipped", "symlink"),
        "books/linked_folder": ("skipped", "symlink"),
        "papers/attention": ("kept", ""),
        "papers/poster.pdf": ("skipped", "unsupported_extension"),
        "forks/attention": ("duplicate", "near_duplicate"),
        "code/toolkit": ("kept", ""),
        "code/loose_script.py": ("skipped", "not_a_repository"),
    }
    totals = summary["totals"]
    assert (
        totals["inputs"] == len(got) == sum(totals[k] for k in ("kept", "filtered", "duplicate", "skipped"))
    )


def test_books_are_decoded_and_never_emptied(run) -> None:
    root, _, _ = run
    rows = ledger_rows(root / "out")
    docs = {
        r["id"]: r
        for f in (root / "out" / "documents").rglob("*.parquet")
        for r in pq.read_table(f).to_pylist()
    }
    one_line = docs["books/one_line.txt"]["text"]
    assert prose(2, 2500)[:-1] in one_line  # the whole book is there, boilerplate included
    assert "Gutenberg boilerplate kept" in rows["books/one_line.txt"]["note"]
    assert json.loads(docs["books/one_line.txt"]["metadata"])["gutenberg_unsafe"]
    assert docs["books/utf16.txt"]["text"].split() == prose(4, 2500).split()
    assert "NUL character at offset" in rows["books/late_nul.txt"]["note"]


def test_the_original_of_a_forked_paper_is_kept(run) -> None:
    """The fork is as long as the original and its id sorts first ("forks" < "papers"): only the keep
    policy's ``not_vendored`` rule (its folder is named forks/) tells them apart."""
    root, _, _ = run
    rows = ledger_rows(root / "out")
    assert rows["papers/attention"]["outcome"] == "kept"
    assert rows["forks/attention"]["duplicate_of"] == "papers/attention"


def test_tokenizer_and_its_config_are_copied(run) -> None:
    root, tokenizer, summary = run
    out = root / "out"
    assert (out / "tokenizer.json").read_bytes() == tokenizer.read_bytes()
    assert (out / "tokenizer_config.json").read_bytes() == tokenizer.with_name(
        "tokenizer_config.json"
    ).read_bytes()
    assert summary["run"]["specials"] == {"eos": "<|endoftext|>", "bos": None, "pad": "<|pad|>"}


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` with a hash of its bytes (and every folder)."""
    found = {}
    for where, dirs, files in os.walk(folder):
        for d in dirs:
            found[os.path.join(where, d)] = "dir"
        for f in files:
            found[os.path.join(where, f)] = hashlib.sha256(Path(where, f).read_bytes()).hexdigest()
    return found


@pytest.mark.parametrize(
    "change, key",
    [
        ({"dedup": {"keep": ["not_vendored", "longest"]}}, "dedup"),
        ({"dedup": {"files": {"containment": 0.9}}}, "dedup"),
        ({"vendored_code": "skip"}, "vendored_code"),
        ({"max_book_bytes": 10**6}, "max_book_bytes"),
        ("another tokenizer", "tokenizer"),
    ],
)
def test_a_refused_run_changes_nothing(run, change, key, tmp_path: Path) -> None:
    root, tokenizer, _ = run
    before = snapshot(root / "out")
    if change == "another tokenizer":
        other = tmp_path / "other" / "tokenizer.json"
        train_bpe([prose(s, 500) for s in range(9, 12)], 300, other)
        cfg = make_config(root, other, root / "out")
    else:
        cfg = make_config(root, tokenizer, root / "out", **change)
    with pytest.raises(ConfigError, match=f"different configuration .*{key}"):
        jobs.curate(parse_config(cfg))
    assert snapshot(root / "out") == before


@pytest.mark.slow
def test_trained_tokenizer_settings_are_part_of_the_run(tmp_path: Path) -> None:
    books = tmp_path / "input" / "books"
    books.mkdir(parents=True)
    (books / "a.txt").write_text(wrap(prose(1, 800), 70))
    base = {
        "output": str(tmp_path / "out"),
        "context": {"original": 32, "target": 64},
        "curate": {"input": str(tmp_path / "input"), "executor": {"tasks": 1, "workers": 1}},
    }
    jobs.curate(parse_config(base | {"tokenizer": {"train_vocab_size": 300, "train_sample_bytes": 10_000}}))
    before = snapshot(tmp_path / "out")
    for changed in (
        {"train_vocab_size": 320, "train_sample_bytes": 10_000},
        {"train_vocab_size": 300, "train_sample_bytes": 9_000},
    ):
        with pytest.raises(ConfigError, match=r"different configuration .*tokenizer"):
            jobs.curate(parse_config(base | {"tokenizer": changed}))
        assert snapshot(tmp_path / "out") == before
    assert (
        json.loads((tmp_path / "out" / "tokenizer_config.json").read_text())["eos_token"] == "<|endoftext|>"
    )
    shutil.rmtree(tmp_path / "out")
