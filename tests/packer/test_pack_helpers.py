"""Inputs for the packer's tests: a small curated corpus in the layout curation writes, its
tokenizer, one packed run shared by the test modules (built once per session), and the windows of
staged training runs.

Holds no tests. The packer's test modules import its helpers and load it as a plugin
(``pytest_plugins = ["tests.packer.test_pack_helpers"]``) for the ``packed_run`` fixture.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from datatrove.data import Document
from tokenizers import Tokenizer

from longctx import jobs
from longctx.config import RootConfig, parse_config
from longctx.core.tokenizer import count_tokens, load_tokenizer
from longctx.packer.manifest import Manifest
from longctx.pipeline.bpe import train_bpe
from longctx.pipeline.docstore import DocumentWriter

_SENTENCE = (
    "the of and to in a is that for it as was with be by on not he this are or his from at which but have an "
    "they you were her she there one all we their been has when who will more no if out so said what up its "
    "about into than them can only other new some could time these two may then do first any my now such like"
)
WORDS = _SENTENCE.split()
ORIGINAL = 128
TARGET = 1024
SEQ_LENS = [256, 1024]


def synthetic_texts(seed: int = 0) -> dict[str, list[str]]:
    """Three sources: long ``books`` (several windows each), mid-length ``papers``, short ``anchor``."""
    rng = random.Random(seed)

    def text(words: int) -> str:
        lines = [
            " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 15))) for _ in range(words // 8 + 1)
        ]
        return "\n".join(lines)

    return {
        "books": [text(rng.randint(1500, 4000)) for _ in range(5)],
        "papers": [text(rng.randint(150, 700)) for _ in range(8)],
        "anchor": [text(rng.randint(2, 90)) for _ in range(40)],
    }


def write_curated(
    root: Path, texts: dict[str, list[str]], tokenizer: Tokenizer | None, files_per_source: int = 2
) -> dict[str, str]:
    """Write documents as curation does (``documents/<source>/<rank>.parquet`` via its writer), with
    ``token_count`` from ``tokenizer`` (-1 without one). Returns ``{doc id: text}``."""
    by_id: dict[str, str] = {}
    writer = DocumentWriter(root / "documents", "${source}/${rank}.parquet")
    with writer:
        for source, docs in texts.items():
            counts = count_tokens(tokenizer, docs) if tokenizer else [-1] * len(docs)
            for i, (text, count) in enumerate(zip(docs, counts)):
                doc_id = f"{source}/doc{i:03d}.txt"
                by_id[doc_id] = text
                meta = {"source": source, "token_count": count, "path": doc_id}
                writer.write(Document(text=text, id=doc_id, metadata=meta), rank=i % files_per_source)
    return by_id


def make_config(root: Path, **pack: Any) -> RootConfig:
    """A run config over ``root`` with small windows and shards; ``pack`` overrides pack settings."""
    settings: dict[str, Any] = {
        "seq_lens": SEQ_LENS,
        "shard_tokens": 4096,
        "pool_tokens": 8192,
        "executor": {"tasks": 2, "workers": 1},
    }
    settings.update(pack)
    return parse_config(
        {"output": str(root), "context": {"original": ORIGINAL, "target": TARGET}, "pack": settings}
    )


STAGED_LENGTHS = (256, 512)
"""The window lengths of :func:`pack_staged`: two stages, from twice the original context (128)."""


def pack_staged(root: Path) -> Path:
    """Curated documents and windows of :data:`STAGED_LENGTHS` under ``root`` (what staged runs train
    on); the mix leaves every ``papers`` document out of training, so that source has held-out
    documents for the short-context guard."""
    make_run(root)
    mix = {"books": 0.6, "anchor": 0.4, "papers": 0.0}
    jobs.pack(make_config(root, seq_lens=list(STAGED_LENGTHS), mix=mix, mix_max_dropped=0.9))
    return root


def make_run(root: Path, seed: int = 0, with_counts: bool = True) -> tuple[Tokenizer, dict[str, str]]:
    """A curated run folder (tokenizer and documents) under ``root``, ready to pack."""
    texts = synthetic_texts(seed)
    tokenizer = train_bpe([t for docs in texts.values() for t in docs], 320, root / "tokenizer.json")
    return tokenizer, write_curated(root, texts, tokenizer if with_counts else None)


@dataclass(frozen=True)
class PackedRun:
    root: Path
    texts: dict[str, str]
    manifests: dict[int, Manifest]

    def folder(self, seq_len: int) -> Path:
        return self.root / "shards" / f"seq{seq_len}"

    @property
    def tokenizer_path(self) -> Path:
        return self.root / "tokenizer.json"

    @property
    def tokenizer(self) -> Tokenizer:
        return load_tokenizer(self.tokenizer_path)


@pytest.fixture(scope="session")
def packed_run(tmp_path_factory: pytest.TempPathFactory) -> PackedRun:
    """The synthetic corpus packed at :data:`SEQ_LENS` with best-fit decreasing, 2 tasks, several
    pools and shards per task. Built once per session for every module that lists this module in
    ``pytest_plugins``."""
    root = tmp_path_factory.mktemp("packed")
    _, texts = make_run(root)
    manifests = jobs.pack(make_config(root))
    assert manifests is not None
    return PackedRun(root, texts, manifests)
