"""End-to-end curation on small synthetic inputs, on the shared corpus and on vendored repositories.

References are independent of the code under test: the inputs are built here with known
duplicates and defects, token counts are recomputed with the tokenizer, and the shared corpus's
own manifest says which items are duplicates.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml
from datatrove.pipeline.readers import ParquetReader

from longctx import jobs
from longctx.config import parse_config
from longctx.core.errors import ConfigError
from longctx.core.layout import RunLayout
from longctx.core.tokenizer import load_tokenizer, tokenizer_fingerprint
from longctx.core.workers import SEMAPHORE_FOLDER, semaphore_prefix
from longctx.pipeline.bpe import train_bpe
from longctx.pipeline.documents import document_files, file_tokenizer, iter_rows

WORDS = [
    "the",
    "of",
    "and",
    "to",
    "in",
    "that",
    "was",
    "his",
    "he",
    "it",
    "with",
    "is",
    "for",
    "as",
    "had",
    "you",
    "not",
    "be",
    "her",
    "on",
    "at",
    "by",
    "which",
    "have",
    "or",
    "from",
    "this",
    "him",
    "but",
    "all",
    "she",
    "they",
    "were",
    "my",
    "are",
    "me",
    "one",
    "their",
    "so",
    "an",
    "said",
    "them",
    "we",
    "who",
    "would",
    "been",
    "will",
    "no",
    "when",
    "there",
    "if",
    "more",
    "out",
]
HEADER = (
    "The Project Gutenberg EBook of A Test Book, by Nobody\n\n"
    "This eBook is for the use of anyone anywhere at no cost and with\nalmost no restrictions whatsoever.\n\n"
    "Title: A Test Book\n\nAuthor: Nobody\n\n*** START OF THIS PROJECT GUTENBERG EBOOK A TEST BOOK ***\n\n"
)
FOOTER = (
    "\n\nEnd of the Project Gutenberg EBook of A Test Book, by Nobody\n\n"
    "*** END OF THIS PROJECT GUTENBERG EBOOK A TEST BOOK ***\n\n"
    "***** This file should be named 1234.txt or 1234.zip *****\n"
    "Updated editions will replace the previous one--the old editions\nwill be renamed.\n\n"
    "START: FULL LICENSE\n\nTHE FULL PROJECT GUTENBERG LICENSE\n" + "license words here. " * 40 + "\n"
)


def prose(seed: int, n_words: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n_words)) + "."


def wrap(text: str, width: int) -> str:
    lines, line = [], ""
    for word in text.split():
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    return "\n".join(lines + [line])


def python_module(seed: int, n_funcs: int, imports: str = "") -> str:
    rng = random.Random(seed)
    body = [imports]
    for i in range(n_funcs):
        a, b = rng.sample(WORDS, 2)
        body.append(
            f'def {a}_{b}_{i}(x, y={rng.randint(0, 99)}):\n    """{prose(seed * 100 + i, 12)}"""\n'
            f"    return x * y + {i}\n"
        )
    return "\n".join(body)


@pytest.fixture(scope="module")
def tokenizer_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    train_bpe([prose(s, 2000) for s in range(5)] + [python_module(s, 20) for s in range(5)], 400, path)
    return path


def build_input(root: Path) -> None:
    """books/, papers/ and code/ with known duplicates and defects."""
    books, papers, code = root / "books", root / "papers", root / "code"
    for d in (books, papers, code):
        d.mkdir(parents=True)
    novel = prose(1, 3000)
    (books / "novel_gutenberg.txt").write_text(HEADER + wrap(novel, 70) + FOOTER)
    # the same novel, another edition: no boilerplate, other line width, CRLF and a BOM
    (books / "novel_plain.txt").write_bytes(
        ("\ufeff" + wrap(novel, 55).replace("\n", "\r\n")).encode("utf-8")
    )
    (books / "other_novel.txt").write_text(wrap(prose(2, 2500), 72))
    (books / "short.txt").write_text(prose(3, 20))
    (books / "empty.txt").write_text("\n  \n")
    (books / "binary.txt").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00" + bytes(range(256)) * 4)
    (books / "latin1.txt").write_bytes(("café " * 500).encode("latin-1"))
    paper = papers / "paper_a"
    paper.mkdir()
    (paper / "main.tex").write_text(
        "\\documentclass{article}\n\\begin{document}\n% a comment that must go\n"
        + prose(4, 600)
        + "\n\\input{sections/intro}\n\\input{../../outside}\n\\end{document}\n"
    )
    (paper / "sections").mkdir()
    (paper / "sections" / "intro.tex").write_text(prose(5, 600) + "\n\\input{sections/intro}\n")
    (papers / "notes.md").write_text("# Notes\n\n" + prose(6, 800))
    (papers / "no_main").mkdir()
    (papers / "no_main" / "fragment.tex").write_text("just a fragment " + prose(7, 300))
    repo = code / "toolkit"
    (repo / "toolkit").mkdir(parents=True)
    (repo / "toolkit" / "core.py").write_text(python_module(8, 40))
    (repo / "toolkit" / "__init__.py").write_text("from .core import *\n")
    (repo / "toolkit" / "api.py").write_text(python_module(9, 30, "from toolkit import core\n"))
    (repo / "README.md").write_text("# toolkit\n\n" + prose(10, 200))
    # a vendored copy of the same repository, one function edited
    vendored = code / "toolkit_vendored"
    shutil.copytree(repo, vendored)
    api = vendored / "toolkit" / "api.py"
    api.write_text(api.read_text().replace("return x * y + 3", "return x - y"))
    binary_repo = code / "assets_only"
    binary_repo.mkdir()
    (binary_repo / "logo.png").write_bytes(b"\x89PNG\x00\x00" * 100)


def make_config(tmp_path: Path, input_dir: Path, tokenizer_file: Path, output: Path, **curate) -> dict:
    return {
        "output": str(output),
        "context": {"original": 64, "target": 256},
        "tokenizer": {"path": str(tokenizer_file)},
        "curate": {"input": str(input_dir), "executor": {"tasks": 2, "workers": 2}} | curate,
    }


def read_documents(output: Path) -> dict[str, dict]:
    rows = {}
    for f in sorted((output / "documents").rglob("*.parquet")):
        for row in pq.read_table(f).to_pylist():
            assert row["id"] not in rows
            rows[row["id"]] = row
    return rows


@pytest.fixture(scope="module")
def curated(tmp_path_factory, tokenizer_file) -> tuple[Path, dict]:
    tmp = tmp_path_factory.mktemp("curate")
    build_input(tmp / "input")
    cfg = parse_config(make_config(tmp, tmp / "input", tokenizer_file, tmp / "out"))
    summary = jobs.curate(cfg)
    return tmp / "out", summary


def test_every_input_has_one_ledger_row_with_its_outcome(curated) -> None:
    out, summary = curated
    ledger = {r["id"]: r for r in pq.read_table(out / "ledger.parquet").to_pylist()}
    expected = {
        "books/novel_gutenberg.txt": ("kept", ""),
        "books/novel_plain.txt": ("duplicate", "exact_duplicate"),
        "books/other_novel.txt": ("kept", ""),
        "books/short.txt": ("filtered", "too_short"),
        "books/empty.txt": ("filtered", "empty"),
        "books/binary.txt": ("filtered", "binary"),
        "books/latin1.txt": ("filtered", "not_utf8"),
        "papers/paper_a": ("kept", ""),
        "papers/notes.md": ("kept", ""),
        "papers/no_main": ("filtered", "no_main_tex"),
        "code/toolkit": ("kept", ""),
        "code/toolkit_vendored": ("duplicate", "repository_copy"),
        "code/assets_only": ("filtered", "no_source_files"),
    }
    assert {k: (v["outcome"], v["reason"]) for k, v in ledger.items()} == expected
    assert ledger["books/novel_plain.txt"]["duplicate_of"] == "books/novel_gutenberg.txt"
    assert ledger["code/toolkit_vendored"]["duplicate_of"] == "code/toolkit"
    totals = summary["totals"]
    assert totals["inputs"] == len(expected) == totals["kept"] + totals["filtered"] + totals["duplicate"]
    for source, s in summary["sources"].items():
        assert s["inputs"] == sum(1 for k in expected if k.startswith(source + "/"))


def test_kept_documents_are_clean_and_counted(curated, tokenizer_file) -> None:
    out, summary = curated
    docs = read_documents(out)
    assert set(docs) == {
        "books/novel_gutenberg.txt",
        "books/other_novel.txt",
        "papers/paper_a",
        "papers/notes.md",
        "code/toolkit",
    }
    tok = load_tokenizer(tokenizer_file)
    for doc in docs.values():
        assert doc["token_count"] == len(tok.encode(doc["text"], add_special_tokens=False).ids) >= 128
        assert "\r" not in doc["text"]
    book = docs["books/novel_gutenberg.txt"]["text"]
    assert "Project Gutenberg" not in book and "LICENSE" not in book
    assert book.split() == prose(1, 3000).split()
    paper = docs["papers/paper_a"]["text"]
    assert "a comment that must go" not in paper and prose(5, 600) in paper
    problems = {p["kind"] for p in json.loads(docs["papers/paper_a"]["metadata"])["problems"]}
    assert {"include_cycle", "include_outside"} <= problems
    repo = docs["code/toolkit"]
    files = json.loads(repo["metadata"])["files"]
    order = [f["path"] for f in files]
    assert order.index("toolkit/core.py") < order.index("toolkit/__init__.py")
    assert order.index("toolkit/core.py") < order.index("toolkit/api.py")
    for f in files:
        assert f["path"] in repo["text"][f["offset"] : f["offset"] + f["length"]]
    assert sum(d["token_count"] for d in docs.values()) == summary["totals"]["kept_tokens"]


def test_kept_documents_store_the_ids_of_their_text(curated, tokenizer_file) -> None:
    """Tokenize once: the stored ids are the re-tokenized text's, and the files name the tokenizer."""
    out, _ = curated
    tok = load_tokenizer(tokenizer_file)
    files = document_files(out / "documents")
    assert {file_tokenizer(f) for f in files} == {tokenizer_fingerprint(tokenizer_file)}
    for f in files:
        for row in iter_rows(f, ["text", "token_count", "token_ids"]):
            expected = tok.encode(row["text"], add_special_tokens=False).ids
            assert row["token_ids"].dtype == np.uint32 and row["token_ids"].tolist() == expected
            assert row["token_count"] == len(expected)


def test_outputs_are_datatrove_readable_and_plotted(curated) -> None:
    out, summary = curated
    docs = list(ParquetReader(str(out / "documents"), recursive=True).run())
    assert len(docs) == summary["totals"]["kept"]
    assert all(
        d.metadata["source"] in ("books", "papers", "code") and d.metadata["token_count"] > 0 for d in docs
    )
    assert (out / "stats.png").stat().st_size > 10_000
    stats = json.loads((out / "stats.json").read_text())
    assert stats["totals"] == summary["totals"]
    assert stats["run"]["bounds"]["books"] == [128, None]


def test_rerun_with_another_config_is_refused(curated, tokenizer_file) -> None:
    out, _ = curated
    data = yaml.safe_load((out / "work" / "curate" / "run.json").read_text())
    assert data["tasks"] == 2
    cfg = make_config(out.parent, out.parent / "input", tokenizer_file, out)
    cfg["curate"]["min_fraction_of_target"] = 0.9
    with pytest.raises(ConfigError, match=r"different configuration .*bounds"):
        jobs.curate(parse_config(cfg))


def _curate_cmd(config_path: Path) -> list[str]:
    return [sys.executable, "-m", "longctx.cli", "curate", "--config", str(config_path)]


def _semaphores(work: Path) -> set[str]:
    """The named semaphores of the job whose work folder is ``work`` (files in /dev/shm on Linux; none
    found elsewhere). Only the job's own: other processes of the machine create and remove theirs."""
    pattern = f"sem.{semaphore_prefix(work).lstrip('/')}-*"
    return {p.name for p in SEMAPHORE_FOLDER.glob(pattern)} if SEMAPHORE_FOLDER.is_dir() else set()


def _snapshot(output: Path) -> tuple[dict, list]:
    ledger = sorted(pq.read_table(output / "ledger.parquet").to_pylist(), key=lambda r: r["id"])
    return read_documents(output), ledger


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_output(tmp_path: Path, tokenizer_file) -> None:
    build_input(tmp_path / "input")
    reference = tmp_path / "reference"
    jobs.curate(parse_config(make_config(tmp_path, tmp_path / "input", tokenizer_file, reference)))

    killed = tmp_path / "killed"
    cfg_path = tmp_path / "killed.yaml"
    cfg_path.write_text(yaml.safe_dump(make_config(tmp_path, tmp_path / "input", tokenizer_file, killed)))
    proc = subprocess.Popen(
        _curate_cmd(cfg_path), start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    marker = killed / "work" / "curate" / "logs" / "4_read" / "completions"
    deadline = time.monotonic() + 120
    while (
        time.monotonic() < deadline
        and not (marker.exists() and any(marker.iterdir()))
        and proc.poll() is None
    ):
        time.sleep(0.05)
    # kill while a pool of workers is up, so that its named semaphores exist: between two stages (the
    # driver's own, after both read tasks finished together) there are none
    while (
        time.monotonic() < deadline
        and proc.poll() is None
        and SEMAPHORE_FOLDER.is_dir()
        and not _semaphores(killed / "work" / "curate")
    ):
        time.sleep(0.005)
    assert proc.poll() is None, "the run finished before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (killed / "ledger.parquet").exists()
    # the process group's kill missed multiprocess's resource tracker (in a session of its own),
    # which unlinked the pool's named semaphores once the group was gone
    deadline = time.monotonic() + 5
    while _semaphores(killed / "work" / "curate") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _semaphores(killed / "work" / "curate") == set()
    done = subprocess.run(_curate_cmd(cfg_path), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert _snapshot(killed) == _snapshot(reference)
    assert _semaphores(killed / "work" / "curate") == set()


def test_interrupted_write_stage_is_redone_without_duplicates(tmp_path: Path, tokenizer_file) -> None:
    """A run killed while stage 4 (write) task 1 was writing: that task's completion marker is
    missing, its files are partial, and stage 5 never ran. Running again redoes exactly those."""
    build_input(tmp_path / "input")
    out = tmp_path / "out"
    cfg = parse_config(make_config(tmp_path, tmp_path / "input", tokenizer_file, out))
    jobs.curate(cfg)
    before = _snapshot(out)
    logs = out / "work" / "curate" / "logs"
    (next(logs.glob("*_write")) / "completions" / "00001").unlink()
    for f in (out / "documents").rglob("00001.parquet"):
        f.write_bytes(f.read_bytes()[:100])  # truncated, as a killed writer leaves it
    shutil.rmtree(next(logs.glob("*_finalize")))
    (out / "ledger.parquet").unlink()
    jobs.curate(cfg)
    assert _snapshot(out) == before


def build_vendoring_repositories(code: Path) -> None:
    """Repositories taken from installed packages: ``pip`` (its package with the network code that
    uses requests, and its ``_vendor/requests``), upstream ``requests``, and the stdlib's ``json``."""
    pip_spec, req_spec = importlib.util.find_spec("pip"), importlib.util.find_spec("requests")
    if pip_spec is None or req_spec is None:
        pytest.skip("needs pip and requests installed (requests is in the test extra)")
    pip_dir = Path(pip_spec.origin).parent
    if not (pip_dir / "_vendor" / "requests").is_dir():
        pytest.skip("this pip does not vendor requests")
    ignore = shutil.ignore_patterns("__pycache__")
    repo = code / "pip" / "src" / "pip"
    for rel in ("__init__.py", "__main__.py", "_vendor/__init__.py", "_internal/__init__.py"):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(pip_dir / rel, repo / rel)
    shutil.copytree(pip_dir / "_internal" / "network", repo / "_internal" / "network", ignore=ignore)
    shutil.copytree(pip_dir / "_vendor" / "requests", repo / "_vendor" / "requests", ignore=ignore)
    shutil.copytree(Path(req_spec.origin).parent, code / "requests" / "requests", ignore=ignore)
    shutil.copytree(Path(json.__file__).parent, code / "json", ignore=ignore)


def check_vendored_copy_removed(output: Path, code: Path, ledger: dict[str, dict]) -> int:
    """pip's vendored copies of requests files leave pip's document, upstream requests keeps all of
    its files, and every file of every repository is accounted for; returns the files removed."""
    docs = read_documents(output)
    pip_meta = json.loads(docs["code/pip"]["metadata"])
    requests_meta = json.loads(docs["code/requests"]["metadata"])
    removed = {d["path"]: d for d in pip_meta["duplicate_files"]}
    vendored = {
        p.relative_to(code / "pip").as_posix()
        for p in (code / "pip" / "src" / "pip" / "_vendor" / "requests").rglob("*.py")
    }
    assert removed and set(removed) <= vendored
    assert all(d["duplicate_of"] == "code/requests" for d in removed.values())
    for path, d in removed.items():
        assert d["of_path"] == "requests/" + path.removeprefix("src/pip/_vendor/requests/")
        assert f"# ===== {path} =====" not in docs["code/pip"]["text"]
    # what pip keeps of its vendored copy differs from upstream too much to be called a copy of it
    kept_vendored = {f["path"] for f in pip_meta["files"]} & vendored
    assert kept_vendored == vendored - set(removed) - {s["path"] for s in pip_meta["skipped_files"]}
    assert requests_meta["duplicate_files"] == []
    upstream = {
        p.relative_to(code / "requests").as_posix() for p in (code / "requests").rglob("*") if p.is_file()
    }
    assert {f["path"] for f in requests_meta["files"]} | {
        s["path"] for s in requests_meta["skipped_files"]
    } == upstream
    for repo in ("pip", "requests", "json"):
        on_disk = sum(1 for p in (code / repo).rglob("*") if p.is_file())
        assert ledger[f"code/{repo}"]["files"] == on_disk
        if f"code/{repo}" in docs:
            meta = json.loads(docs[f"code/{repo}"]["metadata"])
            assert (
                meta["n_files"]
                + sum(s["files"] for s in meta["skipped_files"])
                + len(meta["duplicate_files"])
                == on_disk
            )
    return len(removed)


@pytest.mark.slow
def test_shared_corpus_known_duplicates_collapse(shared_corpus: Path, tmp_path: Path, tokenizer_file) -> None:
    """The corpus manifest lists duplicate groups with their similarity: members at Jaccard >= 0.9
    must collapse onto one document; the borderline older revision (0.33) must stay. Beside it, code
    repositories from installed packages, pip vendoring requests: the vendored copy's files leave
    pip's document, upstream is kept, and every file under the input has exactly one ledger row."""
    code = tmp_path / "code"
    build_vendoring_repositories(code)
    out = tmp_path / "out"
    cfg = make_config(tmp_path, shared_corpus, tokenizer_file, out)
    cfg["curate"]["sources"] = [{"name": "code", "kind": "code", "path": str(code)}]
    summary = jobs.curate(parse_config(cfg))
    manifest = json.loads((shared_corpus / "manifest.json").read_text())
    ledger = {r["id"]: r for r in pq.read_table(out / "ledger.parquet").to_pylist()}
    code_rows = {k for k in ledger if k.startswith("code/")}
    assert code_rows == {"code/pip", "code/requests", "code/json"}
    assert len(ledger) - len(code_rows) == sum(len(v) for v in manifest.values())
    assert len(ledger) == summary["totals"]["inputs"]
    on_disk = sum(1 for sub in ("books", "papers") for p in (shared_corpus / sub).rglob("*") if p.is_file())
    on_disk += sum(1 for p in code.rglob("*") if p.is_file())
    assert sum(r["files"] for r in ledger.values()) == on_disk
    groups: dict[str, list[tuple[str, float]]] = {}
    for entry in manifest["books"] + manifest["papers"]:
        if entry.get("dup_group"):
            sim = entry["dup_similarity"].get("jaccard_5gram_words", 1.0)
            groups.setdefault(entry["dup_group"], []).append((entry["file"], sim))
    expected_dups = set()
    for members in groups.values():
        close = [f for f, sim in members if sim >= 0.9]
        kept = [f for f in close if ledger[f]["outcome"] == "kept"]
        assert len(kept) == 1, f"group {members} kept {kept}"
        assert ledger[kept[0]]["chars"] == max(ledger[f]["chars"] for f in close)  # keep: the longest
        expected_dups |= set(close) - set(kept)
        for f, sim in members:
            if sim < 0.5:
                assert ledger[f]["outcome"] == "kept", f"{f} (similarity {sim}) was removed"
    assert {k for k, r in ledger.items() if r["outcome"] == "duplicate"} == expected_dups
    exact = {k for k, r in ledger.items() if r["reason"] == "exact_duplicate"}
    assert exact == {"papers/ethereum__yellowpaper__Paper.tex"} or exact == {
        "papers/RenanSouza2__yellowpaper__Paper.tex"
    }
    removed = check_vendored_copy_removed(out, code, ledger)
    assert summary["file_dedup"]["files_removed"] == removed
    print(
        f"\nfile-level dedup on the shared corpus + pip/requests/json: {removed} files removed from code/pip"
    )


@pytest.mark.slow
def test_vendored_copy_leaves_the_vendoring_repository(tmp_path: Path, tokenizer_file) -> None:
    """pip vendors ``requests``; the standalone ``requests`` is the same project at a nearby version.
    Document-level MinHash cannot see the copy inside pip's larger document; file-level dedup does."""
    code = tmp_path / "input" / "code"
    build_vendoring_repositories(code)
    summary = jobs.curate(
        parse_config(make_config(tmp_path, tmp_path / "input", tokenizer_file, tmp_path / "out"))
    )
    ledger = {r["id"]: r for r in pq.read_table(tmp_path / "out" / "ledger.parquet").to_pylist()}
    assert {k: r["outcome"] for k, r in ledger.items()} == {
        "code/pip": "kept",
        "code/requests": "kept",
        "code/json": "kept",
    }
    removed = check_vendored_copy_removed(tmp_path / "out", code, ledger)
    assert summary["file_dedup"]["files_removed"] == removed
    assert "files removed as duplicates of files of code/requests" in ledger["code/pip"]["note"]


@pytest.mark.slow
def test_four_tasks_on_two_workers_keep_the_same_set_as_one_task(tmp_path: Path, tokenizer_file) -> None:
    build_input(tmp_path / "input")
    outputs = {}
    for tasks, workers in ((1, 1), (4, 2)):
        out = tmp_path / f"out_{tasks}"
        cfg = make_config(tmp_path, tmp_path / "input", tokenizer_file, out)
        cfg["curate"]["executor"] = {"tasks": tasks, "workers": workers}
        jobs.curate(parse_config(cfg))
        outputs[tasks] = _snapshot(out)
    assert outputs[1] == outputs[4]
    assert len(list((tmp_path / "out_4" / "work" / "curate" / "inputs").glob("*.parquet"))) == 4


def test_huge_book_is_refused_not_loaded(tmp_path: Path, tokenizer_file) -> None:
    books = tmp_path / "input" / "books"
    books.mkdir(parents=True)
    (books / "ok.txt").write_text(wrap(prose(1, 400), 70))
    with open(books / "huge.txt", "wb") as f:
        f.truncate(3 * 2**20)  # sparse: 3 MiB that are never read
    cfg = make_config(tmp_path, tmp_path / "input", tokenizer_file, tmp_path / "out", max_book_bytes=2**20)
    jobs.curate(parse_config(cfg))
    ledger = {r["id"]: r for r in pq.read_table(tmp_path / "out" / "ledger.parquet").to_pylist()}
    assert (ledger["books/huge.txt"]["outcome"], ledger["books/huge.txt"]["reason"]) == (
        "filtered",
        "too_large",
    )
    assert ledger["books/ok.txt"]["outcome"] == "kept"


def test_driver_stages_follow_the_code_size(tmp_path: Path, tokenizer_file, monkeypatch) -> None:
    """Bucket searches run in the driver; the files stage too while the code input is small."""
    from longctx.pipeline import curate as curate_mod

    build_input(tmp_path / "input")
    cfg = parse_config(make_config(tmp_path, tmp_path / "input", tokenizer_file, tmp_path / "out"))
    sources = curate_mod.resolve_sources(cfg.curate, RunLayout(cfg.output, "curate"))
    assert curate_mod.driver_stages(cfg.curate, sources) == {"files", "file_buckets", "buckets"}
    code_bytes = sum(p.stat().st_size for p in (tmp_path / "input" / "code").rglob("*") if p.is_file())
    monkeypatch.setattr(curate_mod, "FILES_IN_DRIVER_BYTES", code_bytes - 1)
    assert curate_mod.driver_stages(cfg.curate, sources) == {"file_buckets", "buckets"}
    monkeypatch.setattr(curate_mod, "FILES_IN_DRIVER_BYTES", code_bytes)
    assert "files" in curate_mod.driver_stages(cfg.curate, sources)
    books_only = [s for s in sources if s.kind != "code"]
    assert curate_mod.driver_stages(cfg.curate, books_only) == {"file_buckets", "buckets"}


@pytest.mark.slow
def test_stages_run_in_the_driver_write_what_pooled_stages_write(
    tmp_path: Path, tokenizer_file, monkeypatch
) -> None:
    """Every file of the output (documents, ledger, stats, the work folder's intermediate Parquet
    files) is byte-identical whether the light stages ran in the driver or in pool workers."""
    from longctx.core import executors
    from longctx.pipeline import curate as curate_mod

    build_input(tmp_path / "input")
    seen: dict[str, frozenset] = {}
    run_stages = executors.run_stages

    def recording(*args, in_driver=(), **kwargs):
        seen[str(args[2])] = frozenset(in_driver)
        return run_stages(*args, in_driver=in_driver, **kwargs)

    monkeypatch.setattr(curate_mod, "run_stages", recording)
    jobs.curate(parse_config(make_config(tmp_path, tmp_path / "input", tokenizer_file, tmp_path / "driver")))
    monkeypatch.setattr(curate_mod, "driver_stages", lambda curate, sources: frozenset())
    jobs.curate(parse_config(make_config(tmp_path, tmp_path / "input", tokenizer_file, tmp_path / "pooled")))
    assert sorted(seen.values()) == [frozenset(), {"files", "file_buckets", "buckets"}]

    def outputs(root: Path) -> dict[str, bytes]:
        return {
            p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*"))
            if p.is_file() and (p.suffix == ".parquet" or p.name == "stats.json") and "logs" not in p.parts
        }

    driver, pooled = outputs(tmp_path / "driver"), outputs(tmp_path / "pooled")
    assert len(driver) > 20 and "ledger.parquet" in driver and "stats.json" in driver
    assert driver == pooled
