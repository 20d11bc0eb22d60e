"""The RULER-style task kinds (multi_query, document_qa, common_words, frequent_words): answers
checked by parsing the prompt independently (regular expressions, word counts), needle depths, the
token budget with a BPE trained here, determinism, and the checkers' scores (oracle 1, wrong 0,
partial j/k)."""

from __future__ import annotations

import random
import re
from collections import Counter

import pytest

from longctx.pipeline.synthetic.checkers import (
    extract_items,
    generation_settled,
    recall_score,
    score_generation,
)
from longctx.pipeline.synthetic.kinds import LIST_KINDS, RECALL_KINDS, TASK_KINDS
from longctx.pipeline.synthetic.stage import SyntheticTasks
from longctx.pipeline.synthetic.tasks import Example, HaystackDoc, TaskSizes, build_example, make_grid
from longctx.pipeline.synthetic.words import build_list_example
from tests.pipeline.test_synthetic import (  # noqa: F401  (module-scoped fixtures)
    MAGIC,
    check_needles,
    haystack,
    relative_position,
    run_stage,
    tokenizer,
    tokenizer_file,
)

NEW_KINDS = ["multi_query", "document_qa", "common_words", "frequent_words"]
# the three document_qa relations, parsed independently of the builder: (fact, question) patterns
FACTS = [
    (
        re.compile(r"([A-Z][a-z]+ [A-Z][a-z]+) was born in the town of ([A-Z][a-z]+)\."),
        re.compile(r"In which town was ([A-Z][a-z]+ [A-Z][a-z]+) born\?"),
    ),
    (
        re.compile(r"([A-Z][a-z]+ [A-Z][a-z]+) has a cat named ([A-Z][a-z]+)\."),
        re.compile(r"What is the name of the cat that ([A-Z][a-z]+ [A-Z][a-z]+) has\?"),
    ),
    (
        re.compile(r"The ([A-Z][a-z]+ [A-Z][a-z]+ Society) was founded by ([A-Z][a-z]+ [A-Z][a-z]+)\."),
        re.compile(r"Who founded the ([A-Z][a-z]+ [A-Z][a-z]+ Society)\?"),
    ),
]


def parse_facts(example: Example) -> tuple[dict[str, str], str]:
    """(entity -> value for every planted fact, the asked entity), from the prompt's text alone."""
    for fact, question in FACTS:
        asked = question.search(example.question)
        if asked:
            return dict(fact.findall(example.context)), asked.group(1)
    raise AssertionError(f"no known relation in {example.question!r}")


def test_kind_registry() -> None:
    assert set(NEW_KINDS) <= set(TASK_KINDS) and set(NEW_KINDS) == RECALL_KINDS
    assert {"common_words", "frequent_words", "icl_labels"} == LIST_KINDS  # icl_labels: HELMET's ICL


# --- multi_query -----------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_multi_query_asks_every_key_in_question_order(haystack, tokenizer, seed) -> None:
    example = build_example(
        haystack, tokenizer, 1200, 0.4, seed=seed, kind="multi_query", sizes=TaskSizes(queries=5)
    )
    check_needles(example, tokenizer)
    values = dict(MAGIC.findall(example.context))
    assert len(values) == len(MAGIC.findall(example.context)) == 5  # distinct keys, one needle each
    named = re.search(r"numbers for (.+) mentioned", example.question).group(1)
    keys = re.split(r", | and ", named)
    assert sorted(keys) == sorted(values)
    assert example.answer.split(", ") == [values[k] for k in keys] == list(example.answer_items)
    assert set(example.choices) == set(values.values())
    assert all(n.target for n in example.needles)


@pytest.mark.parametrize("depth", [0.0, 0.25, 0.5, 0.75, 1.0])
def test_multi_query_first_key_at_the_requested_depth(haystack, tokenizer, depth) -> None:
    example = build_example(haystack, tokenizer, 2048, depth, seed=6, kind="multi_query")
    first_key = re.search(r"numbers for (\S+?),", example.question).group(1)
    needle = next(n for n in example.needles if f"for {first_key} is" in n.text)
    assert abs(relative_position(example, needle.char_offset) - depth) <= 0.1
    assert abs(needle.depth - depth) <= 0.1


# --- document_qa -----------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(6))
def test_document_qa_answer_is_the_asked_entitys_fact(haystack, tokenizer, seed) -> None:
    example = build_example(haystack, tokenizer, 1500, 0.5, seed=seed, kind="document_qa")
    check_needles(example, tokenizer)
    facts, asked = parse_facts(example)
    assert len(facts) == 4 and len(set(facts.values())) == 4  # one asked, three distractors
    assert example.answer == facts[asked] and example.answer_items == (facts[asked],)
    assert set(example.choices) == set(facts.values())
    assert [n.target for n in example.needles].count(True) == 1
    target = next(n for n in example.needles if n.target)
    assert f"{asked} " in target.text or f"{asked} was" in target.text
    # passages of the curated documents, labelled in order: several in one context
    labels = [int(k) for k in re.findall(r"^Document (\d+):$", example.context, flags=re.M)]
    assert labels == list(range(1, len(labels) + 1)) and len(labels) >= 4
    assert example.context.startswith("Document 1:\n")
    texts = {d.id: " ".join(d.text.split()) for d in haystack}  # white space normalized
    passages = re.split(r"\nDocument \d+:\n", example.context.removeprefix("Document 1:\n"))
    for passage in passages:
        for needle in example.needles:
            passage = passage.replace(needle.text, " ")
        passage = " ".join(passage.split())
        assert passage and any(passage in texts[i] for i in example.haystack_ids)
    assert set(example.haystack_ids) <= set(texts)


def test_document_qa_fact_is_followed_by_distractor_documents(haystack, tokenizer) -> None:
    """At depth 0 the asked fact sits in the first document, and whole documents follow it before
    the question."""
    example = build_example(haystack, tokenizer, 4096, 0.0, seed=2, kind="document_qa")
    target = next(n for n in example.needles if n.target)
    after = example.prompt[target.char_offset : example.context_offset + len(example.context)]
    assert not example.prompt[example.context_offset : target.char_offset].count("\nDocument ")
    assert after.count("\n\nDocument ") >= 2
    assert target.depth == 0.0


@pytest.mark.parametrize("depth", [0.0, 0.25, 0.5, 0.75, 1.0])
def test_document_qa_fact_at_the_requested_depth(haystack, tokenizer, depth) -> None:
    example = build_example(haystack, tokenizer, 2048, depth, seed=9, kind="document_qa")
    target = next(n for n in example.needles if n.target)
    assert abs(relative_position(example, target.char_offset) - depth) <= 0.1
    assert abs(target.depth - depth) <= 0.1


# --- common_words and frequent_words ----------------------------------------------------------


@pytest.mark.parametrize("budget", [600, 1200, 3000])
@pytest.mark.parametrize("seed", range(3))
def test_common_words_are_the_most_counted(tokenizer, budget, seed) -> None:
    example = build_example([], tokenizer, budget, 0.5, seed=seed, kind="common_words")
    n_tokens = len(tokenizer.encode(example.prompt, add_special_tokens=False).ids)
    assert 0.9 * budget <= n_tokens == example.prompt_tokens <= budget
    counts = Counter(example.context.split(" "))
    assert set(example.choices) == set(counts) and len(example.choices) == len(counts)
    answer = example.answer.split(", ")
    assert len(answer) == 10 and list(example.answer_items) == answer
    ranked = counts.most_common()
    assert set(answer) == {w for w, _ in ranked[:10]}
    assert ranked[9][1] >= 2 * ranked[10][1]  # common words clearly apart from the rare ones
    assert example.needles == () and example.haystack_ids == ()
    assert example.prompt.endswith("\nAnswer:") and "10 most common words" in example.question


@pytest.mark.parametrize("budget", [600, 1200, 3000])
@pytest.mark.parametrize("seed", range(3))
def test_frequent_words_are_the_top_ranks(tokenizer, budget, seed) -> None:
    example = build_example([], tokenizer, budget, 0.5, seed=seed, kind="frequent_words")
    n_tokens = len(tokenizer.encode(example.prompt, add_special_tokens=False).ids)
    assert 0.9 * budget <= n_tokens == example.prompt_tokens <= budget
    ranked = Counter(example.context.split(" ")).most_common()
    answer = example.answer.split(", ")
    assert answer == [w for w, _ in ranked[:3]]  # from the most frequent
    assert ranked[0][1] > ranked[1][1] > ranked[2][1] > ranked[3][1]  # no tie decides the answer
    assert ranked[-1][1] == 1  # single words fill the list


def test_word_lists_ignore_the_haystack_and_vary_by_depth_in_a_grid(haystack, tokenizer) -> None:
    a = build_example(haystack, tokenizer, 600, 0.0, seed=4, kind="frequent_words")
    assert build_example([], tokenizer, 600, 0.0, seed=4, kind="frequent_words") == a
    assert build_list_example(tokenizer, 600, 0.0, 4, "frequent_words") == a
    grid = make_grid([], tokenizer, [500, 800], [0.0, 1.0], seed=1, kind="common_words")
    assert [(e.context_tokens, e.depth) for e in grid] == [(500, 0.0), (500, 1.0), (800, 0.0), (800, 1.0)]
    assert len({e.context for e in grid}) == 4  # each cell its own list


def test_word_lists_too_small_and_sizes(tokenizer) -> None:
    with pytest.raises(ValueError, match="too small for common_words"):
        build_example([], tokenizer, 120, 0.5, seed=0, kind="common_words")
    with pytest.raises(ValueError, match="too small for frequent_words"):
        build_example([], tokenizer, 60, 0.5, seed=0, kind="frequent_words")
    with pytest.raises(ValueError, match="not a word-list task kind"):
        build_list_example(tokenizer, 600, 0.5, 0, "single_needle")
    example = build_example(
        [], tokenizer, 800, 0.5, seed=0, kind="common_words", sizes=TaskSizes(common_words=4)
    )
    assert len(example.answer_items) == 4 and "4 most common" in example.question
    with pytest.raises(ValueError, match="queries, facts must be at least 1"):
        TaskSizes(queries=0, facts=0)


@pytest.mark.parametrize("kind", NEW_KINDS)
def test_deterministic_by_seed(haystack, tokenizer, kind) -> None:
    random.seed(1)
    a = build_example(haystack, tokenizer, 900, 0.3, seed=21, kind=kind)
    random.seed(2)
    assert build_example(haystack, tokenizer, 900, 0.3, seed=21, kind=kind) == a
    b = build_example(haystack, tokenizer, 900, 0.3, seed=22, kind=kind)
    assert b.prompt != a.prompt and b.answer != a.answer


def test_stage_builds_the_new_kinds(haystack, tokenizer, tokenizer_file) -> None:
    step = SyntheticTasks(tokenizer_file, n_examples=2, context_tokens=700, kinds=NEW_KINDS, seed=5)
    docs = run_stage(step, haystack)
    assert sorted(d.metadata["task"] for d in docs) == sorted(NEW_KINDS * 2)
    for doc in docs:
        meta = doc.metadata
        assert doc.text.endswith("\nAnswer: " + meta["answer"])
        assert meta["token_count"] == len(tokenizer.encode(doc.text, add_special_tokens=False).ids)
        assert bool(meta["needle_positions"]) == (meta["task"] not in LIST_KINDS)


# --- the checkers ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def examples(haystack, tokenizer) -> dict[str, Example]:
    return {kind: build_example(haystack, tokenizer, 1200, 0.5, seed=3, kind=kind) for kind in TASK_KINDS}


@pytest.mark.parametrize("kind", TASK_KINDS)
def test_oracle_scores_one_and_wrong_scores_zero(examples, kind) -> None:
    example = examples[kind]
    assert score_generation(example, " " + example.answer) == 1.0
    assert score_generation(example, example.answer + "\nQuestion: what next? 1234") == 1.0
    assert score_generation(example, "") == 0.0
    assert score_generation(example, " I do not know.") == 0.0
    if kind in RECALL_KINDS:  # wrong items: choices that are not the answer, or none at all
        wrong = [c for c in example.choices if c not in example.answer_items][: len(example.answer_items)]
        assert score_generation(example, ", ".join(wrong)) == 0.0
        assert score_generation(example, " 0000000, zzz, Nobody") == 0.0


@pytest.mark.parametrize("kind", sorted(RECALL_KINDS))
def test_recall_answers_any_order_and_spelling(examples, kind) -> None:
    example = examples[kind]
    items = list(example.answer_items)
    assert score_generation(example, "\n".join(reversed(items)).upper()) == 1.0
    assert score_generation(example, "The answer is: " + "; ".join(items) + ".") == 1.0
    assert score_generation(example, ", ".join(items + items)) == 1.0  # repeats count once


@pytest.mark.parametrize("kind", ["multi_query", "common_words", "frequent_words"])
def test_partial_answers_score_the_fraction_retrieved(examples, kind) -> None:
    example = examples[kind]
    items, k = list(example.answer_items), len(example.answer_items)
    wrong = [c for c in example.choices if c not in items]
    for right in range(k + 1):
        answer = items[:right] + wrong[: k - right]
        random.Random(right).shuffle(answer)
        assert score_generation(example, ", ".join(answer)) == pytest.approx(right / k)
    # only the first k named choices count: listing every candidate earns what its first k earn
    everything = wrong + items
    assert score_generation(example, " ".join(everything)) == pytest.approx(
        len(set(everything[:k]) & set(items)) / k
    )
    # a choice missing from a shorter list costs its share
    assert score_generation(example, ", ".join(items[1:])) == pytest.approx((k - 1) / k)


def test_document_qa_takes_the_first_value_named(examples) -> None:
    example = examples["document_qa"]
    distractor = next(c for c in example.choices if c != example.answer)
    assert score_generation(example, f"{example.answer}, or maybe {distractor}") == 1.0
    assert score_generation(example, f"{distractor}, or maybe {example.answer}") == 0.0


def test_extraction_by_whole_words() -> None:
    choices = ["1234567", "Vera Tolimak", "Vera", "kelu"]
    assert extract_items("12345678 1234567", choices) == ["1234567"]
    assert extract_items("VERA TOLIMAK, then vera; kelubury kelu", choices) == [
        "Vera Tolimak",
        "Vera",
        "kelu",
    ]
    assert recall_score("vera", ["Vera Tolimak"], choices) == 0.0
    with pytest.raises(ValueError, match="at least one expected item"):
        recall_score("x", [], choices)


def test_generation_settled(examples) -> None:
    exact = examples["single_needle"]
    assert generation_settled(exact, " " + exact.answer)
    assert not generation_settled(exact, " " + exact.answer[:3])
    listed = examples["multi_query"]
    items = list(listed.answer_items)
    assert not generation_settled(listed, ", ".join(items[:-1]) + ", ")
    assert not generation_settled(listed, ", ".join(items))  # the last number may still grow
    assert generation_settled(listed, ", ".join(items) + ".")
    words = examples["frequent_words"]
    wrong = [c for c in words.choices if c not in words.answer_items][:3]
    assert generation_settled(words, ", ".join(wrong) + ",")  # three named: more cannot count


def test_new_kinds_on_real_books(shared_corpus, tokenizer) -> None:
    from longctx.pipeline.readers.base import read_text_file

    names = ["patrickmineault__zipf__dracula.txt", "aimacode__aima-data__flatland.txt"]
    books = [HaystackDoc(f"books/{n}", read_text_file(shared_corpus / "books" / n)) for n in names]
    for depth in (0.0, 0.5, 1.0):
        example = build_example(books, tokenizer, 4096, depth, seed=1, kind="document_qa")
        check_needles(example, tokenizer)
        facts, asked = parse_facts(example)
        assert example.answer == facts[asked]
        target = next(n for n in example.needles if n.target)
        assert abs(relative_position(example, target.char_offset) - depth) <= 0.1
        assert 0.9 * 4096 <= example.prompt_tokens <= 4096
