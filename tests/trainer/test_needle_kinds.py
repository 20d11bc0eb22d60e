"""The eval grid with the RULER-, HELMET- and NoLiMa-style kinds: built by ``needle_examples`` from
the same task code as curation, decoded by a tiny transformers Llama, scored by each kind's
checker, with room for list answers and long values."""

from __future__ import annotations

import json
import random

import pytest
import torch

from longctx.pipeline.bpe import train_bpe
from longctx.pipeline.config import SyntheticConfig
from longctx.pipeline.synthetic.checkers import score_generation
from longctx.pipeline.synthetic.kinds import RECALL_KINDS, TASK_KINDS, VALUE_KINDS
from longctx.pipeline.synthetic.tasks import build_example, derive_seed
from longctx.trainer.config import NeedleEvalConfig
from longctx.trainer.evaluation.effective import score_by_length
from longctx.trainer.evaluation.measures import (
    generation_budget,
    needle_accuracy,
    needle_examples,
    score_needles,
)
from longctx.trainer.models.interface import load_folder
from tests.pipeline.test_synthetic import prose
from tests.trainer.test_evaluate import VOCAB, save_tiny_llama

pytest.importorskip("transformers")
KINDS = [
    "single_needle",
    "multi_query",
    "document_qa",
    "common_words",
    "frequent_words",
    "json_kv",
    "icl_labels",
    "nolima_needle",
    "passkey",
]


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    folder = tmp_path_factory.mktemp("kinds")
    rng = random.Random(7)
    haystack = [prose(rng, 60) for _ in range(6)]
    tokenizer = train_bpe(haystack + ["Answer: 0123456789 key value, Document"], VOCAB, folder / "tok.json")
    return haystack, tokenizer, load_folder(save_tiny_llama(folder / "m"))


def test_grid_examples_are_the_task_builders(setup) -> None:
    haystack, tokenizer, _ = setup
    examples = needle_examples(haystack, tokenizer, [900], [0.0, 1.0], KINDS, seed=5, samples=3)
    assert len(examples) == len(KINDS) * 3  # 3 items per (kind, length), over the 2 depths
    assert [e.id for e in examples] == list(range(len(examples)))
    for kind in KINDS:
        items = [e for e in examples if e.task == kind]
        assert [e.item for e in items] == [0, 1, 2]
        assert [e.example.depth for e in items] == [0.0, 1.0, 0.0]  # item i at depths[i % 2]
    for item in examples:  # the same example curation would build from the item's own seed
        d, seed = item.example.depth, derive_seed(5, item.task, 900, "item", item.item)
        assert item.example == build_example(haystack, tokenizer, 900, d, seed, item.task)
    # every item draws its own haystack, keys and values
    assert len({e.example.prompt for e in examples}) == len(examples)


def test_settings_take_every_kind() -> None:
    assert set(KINDS) == set(TASK_KINDS) - {"multi_key", "multi_value", "variable_tracking"}
    assert NeedleEvalConfig(kinds=list(TASK_KINDS)).kinds == list(TASK_KINDS)
    assert SyntheticConfig(kinds=list(TASK_KINDS)).kinds == list(TASK_KINDS)


def test_generation_budget_fits_list_answers(setup) -> None:
    haystack, tokenizer, _ = setup
    for kind in KINDS:
        example = build_example(haystack, tokenizer, 900, 0.5, 1, kind)
        answer = len(tokenizer.encode(" " + example.answer, add_special_tokens=False).ids)
        budget = generation_budget(example, tokenizer, 4)
        if kind in RECALL_KINDS | VALUE_KINDS:  # lists, and values scored with the character after them
            assert budget == answer + 8 and budget > 4  # the configured 4 could never hold the list
        else:
            assert budget == 4  # the exact-answer kinds keep max_new_tokens as configured
        assert generation_budget(example, tokenizer, 500) == 500


@pytest.mark.slow
def test_scores_come_from_each_kinds_checker(setup) -> None:
    haystack, tokenizer, model = setup
    # short answers: fast (json_kv's value is a UUID of dozens of tokens)
    kinds = ["single_needle", "multi_query", "document_qa", "frequent_words", "icl_labels", "nolima_needle"]
    examples = needle_examples(haystack, tokenizer, [500, 600], [0.5], kinds, seed=2, samples=1)
    results = score_needles(model, tokenizer, examples, torch.device("cpu"), max_new_tokens=4)
    assert [(r.task, r.context_tokens) for r in results] == [
        (e.task, e.example.context_tokens) for e in examples
    ]
    for item, r in zip(examples, results):
        assert r.score == score_generation(item.example, r.generated)
        assert 0.0 <= r.score <= 1.0 and r.correct == (r.score == 1.0)
        assert r.answer == item.example.answer
    json.dumps([r.__dict__ for r in results])
    assert all(
        r.question == item.example.question and r.seed == item.example.seed
        for item, r in zip(examples, results)
    )
    # the accuracy keeps its meaning (fully correct answers); the length score averages the partial ones
    assert needle_accuracy(results)["accuracy"] == sum(r.correct for r in results) / len(results)
    by_length = score_by_length(results)
    assert set(by_length) == {500, 600}
    for n, score in by_length.items():  # the partial scores summed, over every kind's one item
        assert score.count == len(kinds) and score.total == sum(
            r.score for r in results if r.context_tokens == n
        )
