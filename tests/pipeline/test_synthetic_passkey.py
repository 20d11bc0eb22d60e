"""The ``passkey`` task kind (Mohtashami and Jaggi, 2023): its prompt against hand-written golden
text, the whole-value checker on it, and properties over seeds, depths and budgets checked by
parsing the prompt with a regular expression written here: the budget, where the key sits, that the
filler is the four sentences in turn and nothing else, determinism and the one-line size error."""

from __future__ import annotations

import re

import pytest

from longctx.pipeline.synthetic.checkers import score_generation
from longctx.pipeline.synthetic.example import ContextSizeError
from longctx.pipeline.synthetic.passkey import passkey_prompt
from longctx.pipeline.synthetic.stage import SyntheticTasks
from longctx.pipeline.synthetic.tasks import build_example, make_grid
from longctx.trainer.evaluation.measures import NeedleLengthError, needle_examples
from tests.pipeline.test_synthetic import (  # noqa: F401  (module-scoped fixtures)
    check_needles,
    haystack,
    relative_position,
    run_stage,
    tokenizer,
    tokenizer_file,
)

SENTENCES = [
    "The river runs to the sea.",
    "The hills are quiet at dawn.",
    "The wind moves through the trees.",
    "Night follows day, and day follows night.",
]
KEY_SENTENCE = re.compile(r"The pass key is (\d{5})\. Remember it: (\d{5}) is the pass key\.")


def test_golden_prompt() -> None:
    assert passkey_prompt(5, 2, "12345") == (
        "A pass key is hidden in the text below, among sentences that repeat. Find it and remember it: "
        "a question about it follows the text.\n"
        "\n"
        "The river runs to the sea. The hills are quiet at dawn. The pass key is 12345. Remember it: "
        "12345 is the pass key. The wind moves through the trees. Night follows day, and day follows "
        "night. The river runs to the sea.\n"
        "\n"
        "What is the pass key?\n"
        "Answer:"
    )


@pytest.mark.parametrize("budget", [300, 600, 2000])
@pytest.mark.parametrize("seed", range(4))
def test_key_is_the_answer_and_the_budget_holds(tokenizer, budget, seed) -> None:
    example = build_example([], tokenizer, budget, 0.5, seed=seed, kind="passkey")
    check_needles(example, tokenizer)
    (match,) = KEY_SENTENCE.finditer(example.context)
    assert match.group(1) == match.group(2) == example.answer and 10_000 <= int(example.answer) < 100_000
    fillers = [s for s in re.split(r"(?<=\.)\s+", KEY_SENTENCE.sub("", example.context)) if s]
    assert fillers == [SENTENCES[i % 4] for i in range(len(fillers))]  # the four sentences in turn
    tokens = len(tokenizer.encode(example.prompt, add_special_tokens=False).ids)
    assert tokens == example.prompt_tokens <= budget
    longest = max(len(tokenizer.encode(" " + s, add_special_tokens=False).ids) for s in SENTENCES)
    assert budget - tokens <= longest + 1  # within one filler sentence of the budget


@pytest.mark.parametrize("depth", [0.0, 0.25, 0.5, 0.75, 1.0])
def test_key_at_the_requested_depth(tokenizer, depth) -> None:
    example = build_example([], tokenizer, 2000, depth, seed=3, kind="passkey")
    (needle,) = example.needles
    assert abs(needle.depth - depth) <= 0.03
    assert abs(relative_position(example, needle.char_offset) - depth) <= 0.05


def test_grid_is_deterministic_and_keys_differ_by_seed(tokenizer) -> None:
    grid = make_grid([], tokenizer, [300, 900], [0.0, 1.0], seed=5, kind="passkey")
    again = make_grid([], tokenizer, [300, 900], [0.0, 1.0], seed=5, kind="passkey")
    assert grid == again
    other = build_example([], tokenizer, 300, 0.0, seed=6, kind="passkey")
    assert other.answer != build_example([], tokenizer, 300, 0.0, seed=7, kind="passkey").answer


def test_whole_value_checker(tokenizer) -> None:
    example = build_example([], tokenizer, 400, 0.5, seed=7, kind="passkey")
    assert score_generation(example, " " + example.answer) == 1.0
    assert score_generation(example, " " + example.answer + ".\n") == 1.0
    assert score_generation(example, " " + example.answer + "7") == 0.0  # a longer number
    assert score_generation(example, " " + example.answer[:-1]) == 0.0


def test_too_small_is_a_size_error(tokenizer) -> None:
    with pytest.raises(ContextSizeError, match=r"context_tokens=30 is too small for passkey: .* take \d+"):
        build_example([], tokenizer, 30, 0.5, seed=0, kind="passkey")
    with pytest.raises(NeedleLengthError, match="a length of 30 tokens is too small for passkey"):
        needle_examples([], tokenizer, [30], [0.5], ["passkey"], seed=0)


def test_stage_writes_passkey_documents(haystack, tokenizer, tokenizer_file) -> None:
    step = SyntheticTasks(tokenizer_file, n_examples=3, context_tokens=[200, 400], kinds=["passkey"], seed=5)
    docs = run_stage(step, haystack)
    assert len(docs) == 3
    for doc in docs:
        meta = doc.metadata
        assert meta["task"] == "passkey" and doc.text.endswith("\nAnswer: " + meta["answer"])
        assert meta["token_count"] == len(tokenizer.encode(doc.text, add_special_tokens=False).ids)
        assert meta["prompt_tokens"] <= meta["context_tokens"] and len(meta["needle_positions"]) == 1
