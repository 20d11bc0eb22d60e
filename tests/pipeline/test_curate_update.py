"""A curation's input files are part of its identity. After a finished run, or one killed after its
read stage, added, removed or rewritten books (even a rewrite of the same size and modification
time) are refused in one line naming the first changed file, and nothing is written; with
``--update`` the run is curated again and ends with the documents and ledger of a fresh curation of
the new inputs (the reference: a curation of them into another folder), its ledger marking what
changed and ``stats.json`` listing it. (Before, a rerun kept the old result without a word: no row
for an added book, the old text of a rewritten one, a deleted book still ``kept``.)"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from longctx import jobs
from longctx.cli import main
from longctx.config import parse_config
from longctx.core.errors import ConfigError
from longctx.pipeline.bpe import train_bpe
from tests.pipeline.test_curate import prose, wrap


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    train_bpe([prose(s, 1500) for s in range(3)], 300, path)
    return path


def book(seed: int) -> str:
    return wrap(prose(seed, 400), 70)


def write_books(root: Path, books: dict[str, str]) -> Path:
    folder = root / "input" / "books"
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in books.items():
        (folder / name).write_text(text)
    return root / "input"


def config(input_dir: Path, tokenizer: Path, output: Path) -> dict:
    return {
        "output": str(output),
        "context": {"original": 32, "target": 128},
        "tokenizer": {"path": str(tokenizer)},
        "curate": {"input": str(input_dir), "executor": {"tasks": 2, "workers": 1}},
    }


def contents(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` with a hash of its bytes."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def ledger(output: Path) -> dict[str, dict]:
    return {r["id"]: r for r in pq.read_table(output / "ledger.parquet").to_pylist()}


def documents(output: Path) -> dict[str, tuple[str, list[int]]]:
    found = {}
    for f in sorted((output / "documents").rglob("*.parquet")):
        for row in pq.read_table(f, columns=["id", "text", "token_ids"]).to_pylist():
            found[row["id"]] = (row["text"], row["token_ids"])
    return found


def without_change(rows: dict[str, dict]) -> dict[str, dict]:
    return {k: {c: v for c, v in r.items() if c not in ("change", "path")} for k, r in rows.items()}


BOOKS = {"b_kept.txt": book(1), "c_rewritten.txt": book(2), "d_removed.txt": book(3)}


def change_inputs(input_dir: Path) -> None:
    """The sweep's change: a book added, one rewritten, one removed."""
    books = input_dir / "books"
    (books / "a_added.txt").write_text(book(4))
    (books / "c_rewritten.txt").write_text(book(5))
    (books / "d_removed.txt").unlink()


def check_refused(cfg: dict, output: Path, first: Path, how: str, counts: str) -> None:
    before = contents(output)
    with pytest.raises(ConfigError) as err:
        jobs.curate(parse_config(cfg))
    assert str(err.value) == (
        f"{first} was {how} since {output} was curated from its inputs ({counts}); run `longctx curate "
        "--update` to curate the changes, or choose another output"
    )
    assert contents(output) == before


def check_updated(root: Path, cfg: dict, tokenizer: Path, summary: dict) -> None:
    """The updated run equals a fresh curation of the new inputs, and says what changed."""
    output = Path(cfg["output"])
    fresh = root / "fresh"
    jobs.curate(parse_config(config(root / "input", tokenizer, fresh)))
    assert documents(output) == documents(fresh)
    assert without_change(ledger(output)) == without_change(ledger(fresh))
    marks = {k: r["change"] for k, r in ledger(output).items()}
    assert marks == {"books/a_added.txt": "added", "books/b_kept.txt": "", "books/c_rewritten.txt": "changed"}
    assert summary["update"]["units"] == {
        "added": ["books/a_added.txt"],
        "changed": ["books/c_rewritten.txt"],
        "outcome_changed": [],
        "removed": ["books/d_removed.txt"],
    }
    assert json.loads((output / "stats.json").read_text())["update"] == summary["update"]
    assert documents(output)["books/c_rewritten.txt"][0].split() == book(5).split()
    assert set(ledger(fresh)) == set(marks)  # no row for the removed book, one for the added one
    again = contents(output)
    jobs.curate(parse_config(cfg))  # the inputs are the record's now: nothing to do
    assert contents(output) == again


def test_changed_inputs_after_a_finished_run_are_refused_then_updated(
    tmp_path: Path, tokenizer: Path
) -> None:
    input_dir = write_books(tmp_path, BOOKS)
    output = tmp_path / "out"
    cfg = config(input_dir, tokenizer, output)
    jobs.curate(parse_config(cfg))
    change_inputs(input_dir)
    check_refused(cfg, output, input_dir / "books" / "a_added.txt", "added", "1 added, 1 removed, 1 changed")
    summary = jobs.curate(parse_config(cfg), update=True)
    check_updated(tmp_path, cfg, tokenizer, summary)


def test_changed_inputs_after_a_run_killed_after_its_read_stage(tmp_path: Path, tokenizer: Path) -> None:
    """The state a run killed after its read stage leaves: the read tasks recorded as complete, no
    later stage, no ledger, no documents. The ledger check used to compare file counts only, so the
    removed book was listed as kept and the added one had no row."""
    input_dir = write_books(tmp_path, BOOKS)
    output = tmp_path / "out"
    cfg = config(input_dir, tokenizer, output)
    jobs.curate(parse_config(cfg))
    logs = output / "work" / "curate" / "logs"
    for stage in logs.iterdir():
        if stage.is_dir() and not stage.name.endswith("_read"):
            shutil.rmtree(stage)
    for made in ("documents", "ledger.parquet", "stats.json", "stats.png"):
        shutil.rmtree(output / made) if (output / made).is_dir() else (output / made).unlink()
    change_inputs(input_dir)
    check_refused(cfg, output, input_dir / "books" / "a_added.txt", "added", "1 added, 1 removed, 1 changed")
    summary = jobs.curate(parse_config(cfg), update=True)
    assert {k: r["change"] for k, r in ledger(output).items()} == {
        "books/a_added.txt": "added",  # the killed run wrote no ledger: every unit is new to it
        "books/b_kept.txt": "added",
        "books/c_rewritten.txt": "added",
    }
    assert summary["update"]["units"]["removed"] == []
    fresh = tmp_path / "fresh"
    jobs.curate(parse_config(config(input_dir, tokenizer, fresh)))
    assert documents(output) == documents(fresh)
    assert without_change(ledger(output)) == without_change(ledger(fresh))


def test_a_rewrite_of_the_same_size_and_time_is_seen(tmp_path: Path, tokenizer: Path) -> None:
    """A book rewritten with other bytes of the same length, its modification time set back: the
    record holds a content hash of files modified just before it was written (their time could
    still be that of a rewrite to come), and compares it again."""
    input_dir = write_books(tmp_path, {"one.txt": book(1), "two.txt": book(2)})
    output = tmp_path / "out"
    cfg = config(input_dir, tokenizer, output)
    jobs.curate(parse_config(cfg))
    path = input_dir / "books" / "two.txt"
    stat = path.stat()
    text = path.read_text()
    path.write_text(text.replace("alpha", "gamma", 1) if "alpha" in text else "x" + text[1:])
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert path.stat().st_size == stat.st_size and path.stat().st_mtime_ns == stat.st_mtime_ns
    check_refused(cfg, output, path, "changed", "1 changed")


def test_the_cli_refuses_in_one_line_and_updates_with_the_flag(
    tmp_path: Path, tokenizer: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    input_dir = write_books(tmp_path, {"one.txt": book(1), "two.txt": book(2)})
    output = tmp_path / "out"
    path = tmp_path / "run.yaml"
    path.write_text(json.dumps(config(input_dir, tokenizer, output)))
    assert main(["curate", "--config", str(path)]) == 0
    (input_dir / "books" / "two.txt").unlink()
    capsys.readouterr()
    assert main(["curate", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"longctx curate: {input_dir / 'books' / 'two.txt'} was removed since {output} was curated from its "
        "inputs (1 removed); run `longctx curate --update` to curate the changes, or choose another output"
    ]
    assert main(["curate", "--config", str(path), "--update"]) == 0
    out = capsys.readouterr().out
    assert "update (1 removed input files): units 1 removed (books/two.txt)" in out
    assert set(ledger(output)) == {"books/one.txt"}


def test_rows_of_a_changed_jsonl_file_are_marked_one_by_one(tmp_path: Path, tokenizer: Path) -> None:
    """A JSONL source is recorded by its files; after an update, the rows whose text changed are
    ``changed``, new rows ``added``, the others unmarked."""
    rows = tmp_path / "rows"
    rows.mkdir()
    texts = {f"r{i}": prose(60 + i, 300) for i in range(3)}

    def write(texts: dict[str, str]) -> None:
        (rows / "a.jsonl").write_text(
            "".join(json.dumps({"id": k, "text": v}) + "\n" for k, v in texts.items())
        )

    write(texts)
    cfg = config(tmp_path / "unused", tokenizer, tmp_path / "out")
    del cfg["curate"]["input"]
    cfg["curate"]["sources"] = [{"name": "rows", "kind": "jsonl", "path": str(rows), "min_tokens": 10}]
    jobs.curate(parse_config(cfg))
    write(texts | {"r1": prose(77, 320), "r9": prose(9, 300)})
    check_refused(cfg, tmp_path / "out", rows / "a.jsonl", "changed", "1 changed")
    jobs.curate(parse_config(cfg), update=True)
    assert {k: r["change"] for k, r in ledger(tmp_path / "out").items()} == {
        "rows/r0": "",
        "rows/r1": "changed",
        "rows/r2": "",
        "rows/r9": "added",
    }
