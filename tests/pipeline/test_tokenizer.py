"""The demo tokenizer: trained byte-level BPE, loading errors and fingerprints."""

from __future__ import annotations

from pathlib import Path

import pytest

from longctx.core.tokenizer import EOS_TOKEN, load_tokenizer, tokenizer_fingerprint
from longctx.pipeline.bpe import train_bpe


def test_trained_bpe_round_trips_any_text(tmp_path: Path) -> None:
    corpus = ["def f(x):\n    return x * 2\n", "It was the best of times, it was the worst of times."] * 50
    tok = train_bpe(corpus, 300, tmp_path / "tok.json")
    assert tok.token_to_id(EOS_TOKEN) is not None
    for text in ["Ünïcödé ✓ 中文 \t\n", "unseen words zyxw", corpus[0]]:
        assert tok.decode(tok.encode(text).ids) == text
    again = load_tokenizer(tmp_path / "tok.json")
    assert again.encode(corpus[1]).ids == tok.encode(corpus[1]).ids
    assert len(tokenizer_fingerprint(tmp_path / "tok.json")) == 64


def test_bad_tokenizer_files_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="tokenizer file not found"):
        load_tokenizer(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match=r"not a valid tokenizer\.json"):
        load_tokenizer(bad)
