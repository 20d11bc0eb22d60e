"""The run's tokenizer is the one that counts: after `longctx curate`,

* a config whose ``tokenizer.path`` now names another tokenizer is refused by `longctx pack` in one
  line (it used to pack with the run's tokenizer and say nothing), and nothing is written;
* a run whose ``tokenizer.json`` was replaced by another is packed with the new one: every document
  is tokenized again from its text, the console says so (``re-tokenized N documents: <reason>``), and
  the shards validate (the manifest used to keep the curated counts of the old tokenizer, so that
  `inspect --validate` failed), holding each document's text as the new tokenizer encodes it (the
  reference, encoded here); a mix, which needs the curated counts, is refused instead.

Real `longctx curate` and `longctx pack` commands, on three small books.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from longctx.core.tokenizer import load_tokenizer
from longctx.pipeline.bpe import train_bpe
from tests.core.processes import longctx_command
from tests.packer.test_pack_pipeline import reference_tokens, segments_by_document
from tests.pipeline.test_curate import prose, wrap

SEQ_LEN = 256


def write_config(root: Path, output: Path, tokenizer: Path, **pack: object) -> Path:
    config = {
        "output": str(output),
        "context": {"original": 64, "target": SEQ_LEN},
        "tokenizer": {"path": str(tokenizer)},
        "curate": {"input": str(root / "input"), "executor": {"tasks": 1, "workers": 1}},
        "pack": {"seq_lens": [SEQ_LEN], "executor": {"tasks": 1, "workers": 1}} | pack,
    }
    path = output.parent / f"{output.name}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def longctx(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(longctx_command(*args), capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def curated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A curated run (three books, tokenizer ``a``) and a second tokenizer ``b`` beside it."""
    root = tmp_path_factory.mktemp("tokchange")
    books = root / "input" / "books"
    books.mkdir(parents=True)
    for i in range(3):
        (books / f"book{i}.txt").write_text(wrap(prose(20 + i, 800), 70))
    train_bpe([prose(s, 1500) for s in range(3)], 300, root / "a" / "tokenizer.json")
    train_bpe([prose(s, 1500) for s in range(5, 9)], 360, root / "b" / "tokenizer.json")
    done = longctx("curate", "--config", str(write_config(root, root / "run", root / "a" / "tokenizer.json")))
    assert done.returncode == 0, done.stderr[-3000:]
    return root


def copy_run(curated: Path, where: Path) -> Path:
    shutil.copytree(curated / "run", where)
    return where


def curated_texts(run: Path) -> dict[str, str]:
    return {
        row["id"]: row["text"]
        for f in sorted((run / "documents").rglob("*.parquet"))
        for row in pq.read_table(f, columns=["id", "text"]).to_pylist()
    }


def test_another_configured_tokenizer_is_refused(curated: Path, tmp_path: Path) -> None:
    run = copy_run(curated, tmp_path / "run")
    other = curated / "b" / "tokenizer.json"
    done = longctx("pack", "--config", str(write_config(curated, run, other)))
    assert done.returncode == 2, done.stdout[-2000:]
    assert done.stderr.strip() == (
        f"longctx pack: tokenizer.path: {other} is not this run's tokenizer (tokenizer.json differs from "
        f"{run / 'tokenizer.json'}, with which its documents were curated); point tokenizer.path at the "
        "run's or leave it unset, or curate again with the new tokenizer"
    )
    assert not (run / "shards").exists() and not (run / "work" / "pack").exists()
    same = longctx("pack", "--config", str(write_config(curated, run, curated / "a" / "tokenizer.json")))
    assert same.returncode == 0, same.stderr[-3000:]


@pytest.mark.slow
def test_a_replaced_run_tokenizer_retokenizes_every_document_and_says_so(
    curated: Path, tmp_path: Path
) -> None:
    run = copy_run(curated, tmp_path / "run")
    new = curated / "b" / "tokenizer.json"
    shutil.copyfile(new, run / "tokenizer.json")
    texts = curated_texts(run)
    done = longctx("pack", "--config", str(write_config(curated, run, new)))
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"re-tokenized {len(texts)} documents: stored ids are of another tokenizer" in done.stdout
    folder = run / "shards" / f"seq{SEQ_LEN}"
    checked = longctx("inspect", str(folder), "--validate")
    assert checked.returncode == 0, checked.stdout[-2000:] + checked.stderr[-2000:]
    tokenizer = load_tokenizer(new)
    eos = tokenizer.token_to_id("<|endoftext|>")
    found = segments_by_document(folder)
    assert set(found) == set(texts)
    for doc_id, text in texts.items():
        expected = reference_tokens(tokenizer, text, None, eos)
        assert [t for _, tokens, _ in sorted(found[doc_id]) for t in tokens] == expected, doc_id


def test_a_mix_over_counts_of_a_replaced_tokenizer_is_refused(curated: Path, tmp_path: Path) -> None:
    run = copy_run(curated, tmp_path / "run")
    shutil.copyfile(curated / "b" / "tokenizer.json", run / "tokenizer.json")
    config = write_config(curated, run, curated / "b" / "tokenizer.json", mix={"books": 1.0})
    done = longctx("pack", "--config", str(config))
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"longctx pack: pack.mix: the documents of books were curated with another tokenizer than "
        f"{run / 'tokenizer.json'}, so their token counts do not hold; curate them again with it, or leave "
        "pack.mix out"
    )
    assert not (run / "shards").exists()
