"""Pack frames documents with the tokenizer's own special tokens unless the config names others
(issue 12: a Llama-3 tokenizer has no GPT-2 ``<|endoftext|>``). Reference: the ids the tokenizer
itself gives the tokens its ``tokenizer_config.json`` declares."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from longctx.packer.config import PackConfig
from longctx.packer.tokens import tokenizer_info
from tests.core.test_tokenizer_specials import make_tokenizer

LLAMA3_CONFIG = {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>", "add_bos_token": True}


def test_pack_uses_the_tokenizers_declared_specials(tmp_path: Path) -> None:
    path = make_tokenizer(
        tmp_path, ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"], config=LLAMA3_CONFIG
    )
    tok = Tokenizer.from_file(str(path))
    info = tokenizer_info(path, PackConfig())
    assert info.eos_id == tok.token_to_id("<|end_of_text|>")
    assert info.bos_id == tok.token_to_id("<|begin_of_text|>")
    assert info.pad_id == info.eos_id  # padding is the EOS unless pack.pad_token says otherwise


def test_configured_specials_win(tmp_path: Path) -> None:
    path = make_tokenizer(
        tmp_path, ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"], config=LLAMA3_CONFIG
    )
    tok = Tokenizer.from_file(str(path))
    info = tokenizer_info(path, PackConfig(eos_token="<|eot_id|>", pad_token="<|begin_of_text|>"))
    assert (info.eos_id, info.pad_id) == (tok.token_to_id("<|eot_id|>"), tok.token_to_id("<|begin_of_text|>"))


def test_the_tokenizer_is_read_once(tmp_path: Path, monkeypatch) -> None:
    """Planning reads the tokenizer once for its vocabulary and its special tokens (a large
    ``tokenizer.json`` takes a noticeable part of a second to load)."""
    import longctx.core.tokenizer as core_tokenizer
    import longctx.packer.tokens as pack_tokens

    path = make_tokenizer(tmp_path, ["<|begin_of_text|>", "<|end_of_text|>"], config=LLAMA3_CONFIG)
    loads: list[Path] = []

    def counting(p: Path) -> Tokenizer:
        loads.append(p)
        return Tokenizer.from_file(str(p))

    monkeypatch.setattr(core_tokenizer, "load_tokenizer", counting)
    monkeypatch.setattr(pack_tokens, "load_tokenizer", counting)
    info = tokenizer_info(path, PackConfig())
    assert len(loads) == 1
    assert info.bos_id == Tokenizer.from_file(str(path)).token_to_id("<|begin_of_text|>")
