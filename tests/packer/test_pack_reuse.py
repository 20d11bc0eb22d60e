"""Pack reuses the token ids curation stored, and only when they are the run tokenizer's.

The reference is a pack of the same documents written without ids (every text tokenized by pack).
Stored ids made deliberately wrong show which path pack took: with the run tokenizer's fingerprint
they must be used (the shards change), with another fingerprint they must be ignored.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from datatrove.data import Document
from tokenizers import Tokenizer

from longctx import jobs
from longctx.core.tokenizer import tokenizer_fingerprint
from longctx.pipeline.bpe import train_bpe
from longctx.pipeline.docstore import DocumentWriter
from tests.packer.test_pack_helpers import make_config, synthetic_texts, write_curated


def shard_bytes(root: Path) -> dict[str, bytes]:
    files = sorted((root / "shards").rglob("*.arrow"))
    assert files
    return {str(f.relative_to(root)): f.read_bytes() for f in files}


def curated_with_ids(
    root: Path, texts: dict[str, list[str]], sha: str, scramble: bool, some_without: bool = False
) -> None:
    """Documents as curation writes them, ids and fingerprint included (ids reversed if ``scramble``;
    every third document without ids if ``some_without``)."""
    from longctx.core.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(root / "tokenizer.json")
    writer = DocumentWriter(root / "documents", "${source}/${rank}.parquet", tokenizer_sha256=sha)
    with writer:
        for source, docs in texts.items():
            for i, text in enumerate(docs):
                ids = np.array(tokenizer.encode(text, add_special_tokens=False).ids, dtype=np.uint32)
                if scramble:
                    ids = ids[::-1].copy()
                meta = {
                    "source": source,
                    "token_count": len(ids),
                    "path": f"{source}/doc{i:03d}.txt",
                    "token_ids": ids,
                }
                if some_without and i % 3 == 1:
                    del meta["token_ids"]
                writer.write(Document(text=text, id=f"{source}/doc{i:03d}.txt", metadata=meta), rank=i % 2)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    texts = synthetic_texts(0)
    base = tmp_path_factory.mktemp("reuse")
    tokenizer_json = base / "tokenizer.json"
    tokenizer = train_bpe([t for docs in texts.values() for t in docs], 320, tokenizer_json)
    sha = tokenizer_fingerprint(tokenizer_json)
    runs = {}
    for name in ("text", "stored", "scrambled", "other_tokenizer", "scrambled_some_without"):
        root = base / name
        root.mkdir()
        (root / "tokenizer.json").write_bytes(tokenizer_json.read_bytes())
        if name == "text":
            write_curated(root, texts, tokenizer)
        else:
            recorded = "0" * 64 if name == "other_tokenizer" else sha
            without = "some_without" in name
            curated_with_ids(root, texts, recorded, scramble=name != "stored", some_without=without)
        jobs.pack(make_config(root))
        runs[name] = root
    return runs


def test_shards_from_stored_ids_are_byte_identical_to_tokenizing(runs: dict[str, Path]) -> None:
    assert shard_bytes(runs["stored"]) == shard_bytes(runs["text"])


def test_stored_ids_are_what_pack_uses(runs: dict[str, Path]) -> None:
    assert shard_bytes(runs["scrambled"]) != shard_bytes(runs["text"])


def test_documents_without_ids_are_tokenized_from_their_text(runs: dict[str, Path]) -> None:
    """In files that record the run's tokenizer, pack reads texts only for documents without ids (the
    reader leaves the others' in the file): those must be tokenized from their own text. The ids
    stored for the other documents are scrambled, so a shard row is the text run's exactly where it
    holds only documents without ids, and such rows exist."""
    from longctx.packer.format import open_shard

    def rows(root: Path) -> dict[tuple, list[int]]:
        found = {}
        for path in sorted((root / "shards").rglob("*.arrow")):
            table = open_shard(path)[1].to_pydict()
            for ids, docs, offsets in zip(table["input_ids"], table["doc_id"], table["doc_offset"]):
                found[tuple(zip(docs, offsets))] = ids
        return found

    def without_ids(key: tuple) -> bool:  # ids are "<source>/docNNN.txt"; every third has no stored ids
        return all(int(doc[-7:-4]) % 3 == 1 for doc, _ in key if doc is not None)

    text, mixed = rows(runs["text"]), rows(runs["scrambled_some_without"])
    without = {key: ids for key, ids in text.items() if without_ids(key)}
    assert without and all(mixed[key] == ids for key, ids in without.items())
    assert shard_bytes(runs["scrambled_some_without"]) != shard_bytes(runs["text"])


def test_ids_of_another_tokenizer_are_tokenized_again_and_said(runs: dict[str, Path]) -> None:
    assert shard_bytes(runs["other_tokenizer"]) == shard_bytes(runs["text"])
    log = "\n".join(p.read_text() for p in (runs["other_tokenizer"] / "work").rglob("*.log"))
    assert "re-tokenized" in log and "stored ids are of another tokenizer" in log


def test_the_tokenizer_is_loaded_only_for_documents_without_usable_ids() -> None:
    """Pack tasks load the tokenizer (10-30 ms) only when a document must be tokenized."""
    from collections import Counter

    from longctx.packer.format import TokenizerInfo
    from longctx.packer.tokens import document_ids
    from longctx.pipeline.documents import FILE_TOKENIZER

    info = TokenizerInfo(sha256="a" * 64, vocab_size=100, eos_id=0, bos_id=None, pad_id=0)
    ids_meta = {"token_ids": np.array([5, 6], np.uint32), FILE_TOKENIZER: "a" * 64}
    stored = Document(text="x", id="s", metadata=ids_meta)
    loads: list[int] = []

    class Encoder:
        def encode(self, texts: list[str]) -> list[np.ndarray]:
            return [np.array([7], np.uint32) for _ in texts]

    def load() -> Encoder:
        loads.append(1)
        return Encoder()

    ids = document_ids(load, [stored, stored], info, Counter())
    assert [a.tolist() for a in ids] == [[5, 6, 0], [5, 6, 0]] and not loads
    ids = document_ids(load, [stored, Document(text="y", id="t", metadata={})], info, Counter())
    assert [a.tolist() for a in ids] == [[5, 6, 0], [7, 0]] and len(loads) == 1


_COUNT_PACK_THREADS = """
import os, sys
from pathlib import Path
from longctx.packer.format import TokenizerInfo
from longctx.packer.tokens import encode_documents, task_encoder
encoder = task_encoder(Path(sys.argv[1]), int(sys.argv[2]))
info = TokenizerInfo(sha256="0" * 64, vocab_size=400, eos_id=0, bos_id=None, pad_id=0)
before = len(os.listdir("/proc/self/task"))
encode_documents(encoder, [sys.argv[3] * (200 + i) for i in range(16)], info)
print(len(os.listdir("/proc/self/task")) - before)
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores to share")
@pytest.mark.parametrize("tasks, threads", [(1, 2), (2, 0)])
def test_pack_tasks_times_tokenizer_threads_never_exceed_the_cores(
    tmp_path: Path, tasks: int, threads: int
) -> None:
    """A pack task that tokenizes on 2 cores runs the tokenizer's pool of 2 threads when alone and
    encodes on its calling thread when 2 tasks run at once (as curation's tasks do); threads are
    counted in /proc, the tokenizer's pool being the only source of new ones."""
    from tests.pipeline.test_tokens import threads_started

    assert threads_started(tmp_path, _COUNT_PACK_THREADS, tasks) == threads


def test_encoded_documents_are_the_whole_texts_ids_with_their_specials(tmp_path: Path) -> None:
    """Texts long enough to be encoded in pieces get exactly the ids of encoding each whole text,
    framed by BOS and EOS."""
    from longctx.packer.format import TokenizerInfo
    from longctx.packer.tokens import encode_documents
    from longctx.pipeline.tokens import TokenEncoder
    from tests.pipeline.test_tokens import TRAINING, sample_text

    path = tmp_path / "tokenizer.json"
    train_bpe(TRAINING, 400, path)
    tokenizer = Tokenizer.from_file(str(path))
    texts = [sample_text(seed, 3000) for seed in range(3)] + ["", "short one"]
    info = TokenizerInfo(sha256="0" * 64, vocab_size=400, eos_id=1, bos_id=2, pad_id=1)
    encoder = TokenEncoder(tokenizer, piece_chars=1000, call_chars=5000)
    got = encode_documents(encoder, texts, info)
    assert [len(encoder.tokenizer.encode(t).ids) > 100 for t in texts[:3]] == [True] * 3
    assert [a.tolist() for a in got] == [
        [2, *tokenizer.encode(t, add_special_tokens=False).ids, 1] for t in texts
    ]
    assert all(a.dtype == np.int32 for a in got)


@pytest.mark.parametrize("bos", [None, 7])
def test_framed_ids_are_bos_ids_eos_as_int32(bos: int | None) -> None:
    """framed against the concatenation it replaces: the ids as astype(int32) gives them (values
    past int32 wrap), BOS when configured, then EOS; stored uint32 views, lists and empty ids."""
    from longctx.packer.format import TokenizerInfo
    from longctx.packer.tokens import framed

    info = TokenizerInfo(sha256="0" * 64, vocab_size=10, eos_id=3, bos_id=bos, pad_id=3)
    head = [np.array([bos], np.int32)] if bos is not None else []
    for ids in (np.array([], np.uint32), np.array([1, 2, 2**32 - 1], np.uint32)[1:], [5, 6], np.arange(9)):
        expected = np.concatenate([*head, np.asarray(ids).astype(np.int32), np.array([3], np.int32)])
        got = framed(ids, info)
        assert got.dtype == np.int32 and got.tolist() == expected.tolist()
