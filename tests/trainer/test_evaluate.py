"""Evaluation against independent references: transformers' greedy generation (our decoding uses a
key/value cache) and loss computed by transformers per document, bucketed in the test; needle
scoring; plots and JSON from a Hugging Face checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from longctx.pipeline.bpe import train_bpe
from longctx.trainer.evaluation.generate import KVCache, cached_attention, greedy_generate
from longctx.trainer.evaluation.measures import (
    answer_settled,
    loss_by_position,
    needle_grid,
    plot_loss_by_position,
    plot_needle_heatmap,
    score_answer,
)
from longctx.trainer.models.interface import load_folder

transformers = pytest.importorskip("transformers")
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

VOCAB = 300


def save_tiny_llama(path: Path, **config) -> Path:
    """A tiny random Llama saved by transformers (safetensors)."""
    torch.manual_seed(0)
    settings = {
        "vocab_size": VOCAB,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
    }
    LlamaForCausalLM(LlamaConfig(**{**settings, **config})).save_pretrained(path, safe_serialization=True)
    return path


@pytest.fixture(scope="module")
def hf_checkpoint(tmp_path_factory) -> Path:
    return save_tiny_llama(tmp_path_factory.mktemp("hf") / "tiny-llama")


YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "rope_theta": 10000.0}


@pytest.mark.parametrize("rope", [None, YARN], ids=["default", "yarn"])
def test_greedy_generation_with_kv_cache_matches_transformers(rope, tmp_path: Path) -> None:
    """Several prompts, 12 new tokens each (no early stop): the tokens transformers' own cached
    greedy generation produces."""
    path = save_tiny_llama(tmp_path / "m", **({"rope_parameters": rope} if rope else {}))
    ours = load_folder(path)
    theirs = LlamaForCausalLM.from_pretrained(path).eval()
    gen = torch.Generator().manual_seed(1)
    for n in (1, 7, 40, 150):
        prompt = torch.randint(0, VOCAB, (n,), generator=gen)
        expected = theirs.generate(
            prompt[None],
            max_new_tokens=12,
            do_sample=False,
            min_new_tokens=12,
            pad_token_id=0,
            eos_token_id=None,
        )[0, n:].tolist()
        assert greedy_generate(ours, prompt.tolist(), 12, torch.device("cpu")) == expected, n


def test_kv_cache_logits_equal_a_full_forward(hf_checkpoint: Path) -> None:
    """Prefill 30 tokens, then 1 and then 3 tokens against the cache: the hidden states equal one
    forward pass over all 34 tokens (float64, to 1e-10)."""
    model = load_folder(hf_checkpoint, dtype=torch.float64).eval()
    ids = torch.randint(0, VOCAB, (34,), generator=torch.Generator().manual_seed(4))
    pos = torch.arange(34)
    with torch.no_grad():
        full = model(ids, pos, pos, torch.zeros_like(pos))
        with cached_attention(model, 34) as cache:
            parts = [
                model(ids[a:b], pos[a:b], pos[a:b], torch.zeros_like(pos[a:b]))
                for a, b in ((0, 30), (30, 31), (31, 34))
            ]
            assert isinstance(cache, KVCache)
            with pytest.raises(ValueError, match="exceeds the cache capacity 34"):
                model(ids[:1], torch.tensor([34]), torch.tensor([34]), torch.zeros(1, dtype=torch.long))
    torch.testing.assert_close(torch.cat(parts), full, rtol=1e-10, atol=1e-10)
    assert model.attention is not cache  # the model's own attention is back


def test_loss_by_position_matches_per_document_reference(hf_checkpoint: Path) -> None:
    """A packed window of three documents and padding; the reference runs transformers on each
    document alone and buckets its token losses by position in the test."""
    ours = load_folder(hf_checkpoint)
    theirs = LlamaForCausalLM.from_pretrained(hf_checkpoint).eval()
    gen = torch.Generator().manual_seed(2)
    lengths, pad = [70, 150, 21], 15
    docs = [torch.randint(1, VOCAB, (n,), generator=gen) for n in lengths]
    seq_len = sum(lengths) + pad
    input_ids = torch.cat(docs + [torch.zeros(pad, dtype=torch.long)])
    position_ids = torch.cat([torch.arange(n) for n in lengths] + [torch.arange(pad)])
    cu = torch.tensor([0, 70, 220, 241, 256], dtype=torch.int32)
    labels = torch.full((seq_len,), -100)
    for start, n in zip(cu[:-1].tolist(), lengths):
        labels[start : start + n - 1] = input_ids[start + 1 : start + n]
    sample = {
        "input_ids": input_ids,
        "position_ids": position_ids,
        "cu_seqlens": cu,
        "labels": labels,
        "loss_mask": labels != -100,
    }
    original = 64
    table = loss_by_position(ours, [sample], original, seq_len, torch.device("cpu"))

    edges = [0, 1, 2, 4, 8, 16, 32, 64, 128, 256]  # powers of two up to seq_len, plus the original (64)
    assert [row["start"] for row in table] == edges[:-1]
    sums, counts = dict.fromkeys(edges[:-1], 0.0), dict.fromkeys(edges[:-1], 0)
    with torch.no_grad():
        for doc in docs:
            logits = theirs(doc[None]).logits[0, :-1].double()
            losses = F.cross_entropy(logits, doc[1:], reduction="none")
            for pos, loss in enumerate(losses.tolist()):
                edge = max(e for e in edges[:-1] if e <= pos)
                sums[edge] += loss
                counts[edge] += 1
    for row in table:
        assert row["tokens"] == counts[row["start"]]
        if counts[row["start"]]:
            assert row["mean_loss"] == pytest.approx(sums[row["start"]] / counts[row["start"]], rel=1e-5)
        else:
            assert row["mean_loss"] is None


@pytest.mark.parametrize(
    "generated, answer, correct, settled",
    [
        (" 1234567", "1234567", True, True),
        (" 123", "1234567", False, False),
        (" 129", "1234567", False, True),
        ("", "1234567", False, False),
        ("1234567 and more", "1234567", True, True),
    ],
)
def test_answer_scoring(generated: str, answer: str, correct: bool, settled: bool) -> None:
    assert score_answer(generated, answer) is correct
    assert answer_settled(generated, answer) is settled


def test_needle_grid_runs_on_a_hugging_face_checkpoint(hf_checkpoint: Path, tmp_path: Path) -> None:
    words = [
        "the",
        "quick",
        "brown",
        "fox",
        "jumps",
        "over",
        "a",
        "lazy",
        "dog",
        "while",
        "rivers",
        "run",
        "to",
        "the",
        "sea",
    ]
    gen = torch.Generator().manual_seed(3)
    haystack = [
        ". ".join(
            " ".join(words[i] for i in torch.randint(0, len(words), (9,), generator=gen).tolist())
            for _ in range(400)
        )
        + "."
    ]
    tokenizer = train_bpe(haystack + ["Answer: 0123456789 key value"], VOCAB, tmp_path / "tok.json")
    model = load_folder(hf_checkpoint)
    results = needle_grid(
        model,
        tokenizer,
        haystack,
        [384, 512],
        [0.0, 1.0],
        ["single_needle"],
        0,
        torch.device("cpu"),
        max_new_tokens=4,
        samples=2,
    )
    assert len(results) == 4  # 2 items per length, item i at depth i % 2
    assert [(r.context_tokens, r.depth, r.item) for r in results] == [
        (n, d, i) for n in (384, 512) for i, d in enumerate((0.0, 1.0))
    ]
    # each item hides its own needle; the same seed gives the same needles again
    assert len({r.answer for r in results if r.context_tokens == 384}) == 2
    again = needle_grid(
        model,
        tokenizer,
        haystack,
        [384],
        [0.0, 1.0],
        ["single_needle"],
        0,
        torch.device("cpu"),
        max_new_tokens=4,
        samples=2,
    )
    assert [r.answer for r in again] == [r.answer for r in results if r.context_tokens == 384]
    assert all(r.correct == score_answer(r.generated, r.answer) for r in results)
    plot_needle_heatmap({"a": results, "b": results[:2]}, tmp_path / "needle.png")
    table = [
        {"start": 0, "end": 1, "tokens": 1, "mean_loss": 2.0},
        {"start": 1, "end": 2, "tokens": 1, "mean_loss": 1.0},
    ]
    plot_loss_by_position({"a": table, "b": table}, 1, tmp_path / "loss.png")
    assert (tmp_path / "needle.png").stat().st_size > 5000 and (tmp_path / "loss.png").stat().st_size > 5000
    json.dumps([r.__dict__ for r in results])
