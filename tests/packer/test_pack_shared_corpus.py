"""Packing the real books and papers of ``../shared/corpus`` at 16K and 64K: efficiency, the
lowest possible padding, long-position coverage, and every invariant. Skips without the corpus."""

from __future__ import annotations

from pathlib import Path

import pytest

from longctx import jobs
from longctx.config import parse_config
from longctx.packer.validate import validate_folder
from longctx.pipeline.bpe import train_bpe
from longctx.pipeline.readers.base import read_text_file
from tests.packer.test_pack_helpers import write_curated

SEQ_LENS = [16384, 65536]


@pytest.fixture(scope="module")
def shared_run(shared_corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    root = tmp_path_factory.mktemp("shared")
    texts = {
        source: [read_text_file(p) for p in sorted((shared_corpus / source).iterdir()) if p.is_file()]
        for source in ("books", "papers")
    }
    train_bpe([t for docs in texts.values() for t in docs], 4096, root / "tokenizer.json")
    write_curated(root, texts, tokenizer=None)
    cfg = parse_config(
        {
            "output": str(root),
            "context": {"original": 4096, "target": 65536},
            "pack": {"seq_lens": SEQ_LENS, "executor": {"tasks": 1, "workers": 1}},
        }
    )
    return root, jobs.pack(cfg)


@pytest.mark.slow
@pytest.mark.parametrize("seq_len", SEQ_LENS)
def test_shared_corpus_packs_at_the_lowest_possible_padding(
    shared_run: tuple[Path, dict], seq_len: int
) -> None:
    root, manifests = shared_run
    manifest = manifests[seq_len]
    lowest = -manifest.tokens % seq_len  # nothing lost or repeated: at least ceil(tokens / seq_len) windows
    print(
        f"\nseq_len {seq_len}: {manifest.rows} rows, {manifest.tokens:,} tokens, "
        f"padding {manifest.padding:,} "
        f"(lowest possible {lowest:,}), efficiency {manifest.efficiency:.4%}, "
        f"long fraction {manifest.long_fraction:.3f}, short-document pieces {manifest.short_document_pieces}"
    )
    assert manifest.padding == lowest
    if seq_len == 16384:
        assert manifest.efficiency >= 0.995
    assert manifest.short_document_pieces == 0
    assert manifest.max_position == seq_len - 1 and manifest.long_fraction > 0.5
    assert validate_folder(root / "shards" / f"seq{seq_len}", root / "tokenizer.json") == []
