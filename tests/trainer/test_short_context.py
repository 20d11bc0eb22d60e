"""The short-context guard: windows cut from documents (checked against slices of each document
taken here), their loss against transformers run on each document's slice alone, curated documents
framed as the packer frames them (checked against the tokenizer directly), and the ratios."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from datatrove.data import Document

from longctx.core.errors import ConfigError
from longctx.packer.format import TokenizerInfo
from longctx.pipeline.bpe import train_bpe
from longctx.pipeline.docstore import DocumentWriter
from longctx.trainer.evaluation.short_context import (
    ShortWindow,
    loss_ratios,
    short_windows,
    source_documents,
    window_loss,
)
from longctx.trainer.models.interface import load_folder
from tests.trainer.test_evaluate import VOCAB, save_tiny_llama

transformers = pytest.importorskip("transformers")
from transformers import LlamaForCausalLM  # noqa: E402


def docs(lengths: dict[str, int], seed: int = 0) -> dict[str, list[int]]:
    gen = random.Random(seed)
    return {doc_id: [gen.randrange(1, VOCAB) for _ in range(n)] for doc_id, n in lengths.items()}


def test_windows_start_at_multiples_of_the_length_within_one_document() -> None:
    documents = docs({"a": 10, "b": 3, "c": 1, "d": 9})
    windows = short_windows(documents.items(), length=4, count=100, seed=0)
    # a: 0-4, 4-8, 8-10; b: whole; c: one token, nothing to predict; d: 0-4, 4-8 (its last token alone)
    assert [(w.doc_id, w.start) for w in windows] == [
        ("a", 0),
        ("a", 4),
        ("a", 8),
        ("b", 0),
        ("d", 0),
        ("d", 4),
    ]
    for w in windows:
        assert list(w.ids) == documents[w.doc_id][w.start : w.start + 4]


def test_windows_are_drawn_by_seed_whatever_the_input_order() -> None:
    documents = docs({f"doc{i}": 50 + 7 * i for i in range(12)}, seed=1)
    pairs = list(documents.items())
    chosen = short_windows(pairs, length=16, count=5, seed=3)
    assert len(chosen) == 5 and len(set(chosen)) == 5
    random.Random(0).shuffle(pairs)
    assert short_windows(pairs, length=16, count=5, seed=3) == chosen
    draws = {tuple((w.doc_id, w.start) for w in short_windows(pairs, 16, 5, seed)) for seed in range(6)}
    assert len(draws) > 1  # the seed matters
    assert [(w.doc_id, w.start) for w in chosen] == sorted((w.doc_id, w.start) for w in chosen)
    # held-out documents only
    kept = short_windows(pairs, length=16, count=100, seed=3, exclude={"doc0", "doc5"})
    assert {w.doc_id for w in kept} == set(documents) - {"doc0", "doc5"}
    assert short_windows(pairs, 16, 0, 3) == []


def test_window_errors() -> None:
    with pytest.raises(ValueError, match="length >= 2"):
        short_windows([("a", [1, 2, 3])], length=1, count=1, seed=0)
    with pytest.raises(ValueError, match="'a' is given twice"):
        short_windows([("a", [1, 2, 3]), ("a", [4, 5])], length=2, count=1, seed=0)


def test_window_loss_matches_transformers_per_document(tmp_path: Path) -> None:
    checkpoint = save_tiny_llama(tmp_path / "m")
    ours = load_folder(checkpoint)
    theirs = LlamaForCausalLM.from_pretrained(checkpoint).eval()
    documents = docs({"x": 150, "y": 40, "z": 97}, seed=2)
    windows = short_windows(documents.items(), length=64, count=5, seed=1)
    assert len(windows) == 5
    result = window_loss(ours, windows, torch.device("cpu"))

    total, count = 0.0, 0
    with torch.no_grad():
        for w in windows:  # the reference slices the document itself, not the window's ids
            piece = torch.tensor(documents[w.doc_id][w.start : w.start + 64])
            logits = theirs(piece[None]).logits[0, :-1].double()
            total += float(F.cross_entropy(logits, piece[1:], reduction="sum"))
            count += piece.numel() - 1
    assert result["tokens"] == count and result["windows"] == 5
    assert result["mean_loss"] == pytest.approx(total / count, rel=1e-5)
    assert window_loss(ours, [ShortWindow("a", 0, (5,))], torch.device("cpu"))["mean_loss"] is None


def test_source_documents_are_framed_like_the_packer(tmp_path: Path) -> None:
    texts = {
        "anchor": [f"Short anchor text number {i}, with a few words." for i in range(5)],
        "books": ["A longer book text. " * 30],
    }
    documents = tmp_path / "documents"
    for source, items in texts.items():
        with DocumentWriter(documents / source) as writer:
            for i, text in enumerate(items):
                writer.write(Document(text=text, id=f"{source}/{i}", metadata={"source": source}), 0)
    tokenizer = train_bpe([t for items in texts.values() for t in items], 300, tmp_path / "tok.json")
    info = TokenizerInfo(sha256="0" * 64, vocab_size=300, eos_id=0, bos_id=1, pad_id=0)
    pairs = source_documents(documents, "anchor", tokenizer, info)
    assert [doc_id for doc_id, _ in pairs] == [f"anchor/{i}" for i in range(5)]
    for (_, ids), text in zip(pairs, texts["anchor"]):
        assert ids.tolist() == [1, *tokenizer.encode(text, add_special_tokens=False).ids, 0]
    without_bos = source_documents(documents, "anchor", tokenizer, info.model_copy(update={"bos_id": None}))
    assert without_bos[0][1].tolist() == pairs[0][1].tolist()[1:]
    with pytest.raises(ConfigError, match="no curated documents of source 'papers'"):
        source_documents(documents, "papers", tokenizer, info)


def test_loss_ratios() -> None:
    assert loss_ratios({"base": 2.0, "trained": 2.5, "other": None}, "base") == {
        "base": 1.0,
        "trained": 1.25,
        "other": None,
    }
    with pytest.raises(ValueError, match="'base' has no short-window loss"):
        loss_ratios({"base": None, "trained": 2.5}, "base")
    with pytest.raises(ValueError, match="'base' has no short-window loss"):
        loss_ratios({"trained": 2.5}, "base")
