"""The HELMET- and NoLiMa-style task kinds (json_kv, icl_labels, nolima_needle): prompts against
hand-written golden text, the checkers' scores against hand-written golden cases, and properties
over many seeds checked by parsing the prompt independently (JSON, regular expressions, a stop-word
list written here): the token budget, where the answer sits, determinism, the labelling rule and the
absence of a shared content word between a NoLiMa fact and its question."""

from __future__ import annotations

import json
import random
import re

import pytest

from longctx.pipeline.synthetic.associations import RELATIONS
from longctx.pipeline.synthetic.checkers import (
    generation_settled,
    score_generation,
    score_value,
    value_settled,
)
from longctx.pipeline.synthetic.example import Example, largest_fitting
from longctx.pipeline.synthetic.icl import CATEGORIES, icl_prompt
from longctx.pipeline.synthetic.jsonkv import json_kv_prompt
from longctx.pipeline.synthetic.kinds import LIST_KINDS, RECALL_KINDS, TASK_KINDS, VALUE_KINDS
from longctx.pipeline.synthetic.names import ADJECTIVES
from longctx.pipeline.synthetic.stage import SyntheticTasks
from longctx.pipeline.synthetic.tasks import HaystackDoc, TaskSizes, build_example, make_grid
from longctx.trainer.evaluation.measures import NeedleLengthError, needle_examples
from tests.pipeline.test_synthetic import (  # noqa: F401  (module-scoped fixtures)
    check_needles,
    haystack,
    relative_position,
    run_stage,
    tokenizer,
    tokenizer_file,
)

KINDS = ["json_kv", "icl_labels", "nolima_needle"]
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}")
DEMO = re.compile(r"^Input: (.+)\nAnswer: (\S+)$", re.M)
PSEUDO_WORD = re.compile(r"(?:[bdfgklmnprstvz][aeiou]){2,3}")
# English class names a label must never be (the categories' names, and common label words)
CLASS_NAMES = {
    "animal", "animals", "tool", "tools", "fruit", "fruits", "instrument", "instruments", "vehicle",
    "vehicles", "clothing", "clothes", "furniture", "weather", "positive", "negative", "neutral", "yes",
    "no", "true", "false",
}  # fmt: skip
STOP_WORDS = {
    "a", "an", "the", "to", "of", "in", "on", "at", "for", "from", "by", "with", "and", "or", "has",
    "have", "had", "been", "be", "is", "was", "which", "who", "what", "that", "this", "it", "its",
}  # fmt: skip
NOLIMA_INSTRUCTION = (
    "A fact about a character is hidden in the following text. "
    "Memorize it: a question about it follows the text."
)


def content_words(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower())) - STOP_WORDS


def by_hand(kind: str, answer: str) -> Example:
    """An example with only what the checkers read, written by hand."""
    return Example(kind, 0, 0.0, 100, 90, "", 0, "", answer, "", (), (), (answer,))  # type: ignore[arg-type]


def test_kind_registry() -> None:
    assert set(KINDS) <= set(TASK_KINDS) and set(KINDS) | {"passkey"} == VALUE_KINDS
    assert not VALUE_KINDS & RECALL_KINDS and {"icl_labels"} == LIST_KINDS & VALUE_KINDS


# --- golden prompts ----------------------------------------------------------------------------


def test_json_kv_golden_prompt() -> None:
    assert json_kv_prompt([("alpha", "1"), ("beta", "two words")], "beta") == (
        "A JSON object of keys and values follows. Memorize it: a question about the value of one of "
        "its keys follows the object.\n"
        "\n"
        '{"alpha": "1", "beta": "two words"}\n'
        "\n"
        'What is the value of the key "beta" in the JSON object above?\n'
        "Answer:"
    )


def test_icl_golden_prompt() -> None:
    assert icl_prompt([("quiet otter", "kelu"), ("hammer bold", "tovima")], "rusty heron") == (
        "Each input below has a label. Learn the labels from the examples: the last input's label is "
        "asked.\n"
        "\n"
        "Input: quiet otter\n"
        "Answer: kelu\n"
        "\n"
        "Input: hammer bold\n"
        "Answer: tovima\n"
        "\n"
        "Input: rusty heron\n"
        "Answer:"
    )


def test_nolima_golden_associations(haystack, tokenizer) -> None:
    """The prompt's frame, and for items whose place is written here by hand, the question names it."""
    places = {"the Semper Opera House": "Dresden", "Big Ben": "London", "paella": "Spain", "sushi": "Japan"}
    fact = re.compile(
        r"([A-Z][a-z]+ [A-Z][a-z]+) (?:lives next to (.+)|works across the street from (.+)"
        r"|cooked (.+) for the neighbours last night|made (.+) for dinner)\."
    )
    question = re.compile(
        r"Which character (?:has been to|has visited|knows a recipe from|has tried the cuisine of) (.+)\?"
    )
    seen = set()
    for seed in range(80):
        example = build_example(haystack, tokenizer, 400, 0.5, seed=seed, kind="nolima_needle")
        assert example.prompt == (f"{NOLIMA_INSTRUCTION}\n\n{example.context}\n\n{example.question}\nAnswer:")
        (needle,) = example.needles
        name, *items = fact.fullmatch(needle.text).groups()
        item = next(i for i in items if i)
        place = question.fullmatch(example.question).group(1)
        assert example.answer == name and needle.target
        if item in places:
            assert place == places[item]
            seen.add(item)
    assert len(seen) >= 2  # the hand-written pairs were met


# --- checkers: golden cases --------------------------------------------------------------------

VALUE = "0209be8e-b19a-444b-98fe-316686826410"


@pytest.mark.parametrize(
    ("kind", "answer", "generated", "score"),
    [
        # json_kv: the value, whole; an opening quote and any closing punctuation are fine
        ("json_kv", VALUE, " 0209be8e-b19a-444b-98fe-316686826410", 1.0),
        ("json_kv", VALUE, ' "0209be8e-b19a-444b-98fe-316686826410"', 1.0),
        ("json_kv", VALUE, "'0209be8e-b19a-444b-98fe-316686826410'}", 1.0),
        ("json_kv", VALUE, "0209be8e-b19a-444b-98fe-316686826410\nWhat is the value", 1.0),
        ("json_kv", VALUE, " 0209be8e-b19a-444b-98fe-316686826410, the value", 1.0),
        ("json_kv", VALUE, " 0209be8e-b19a-444b", 0.0),  # partly right
        ("json_kv", VALUE, " 0209be8e-b19a-444b-98fe-3166868264100", 0.0),  # one digit more
        ("json_kv", VALUE, " 0209be8e-b19a-444b-98fe-316686826410-ab", 0.0),
        ("json_kv", VALUE, " 0209BE8E-B19A-444B-98FE-316686826410", 0.0),  # case counts
        ("json_kv", VALUE, ' ""0209be8e-b19a-444b-98fe-316686826410"', 0.0),  # one quote only
        ("json_kv", VALUE, " The value is 0209be8e-b19a-444b-98fe-316686826410", 0.0),
        ("json_kv", VALUE, " 1f4c2a7e-0d3b-4c8a-9e21-5b7f60a1c9d3", 0.0),  # another value
        ("json_kv", VALUE, "", 0.0),
        # icl_labels: the label word, whole
        ("icl_labels", "kelu", " kelu", 1.0),
        ("icl_labels", "kelu", " kelu\n\nInput: quiet otter", 1.0),
        ("icl_labels", "kelu", ' "kelu".', 1.0),
        ("icl_labels", "kelu", " kelum", 0.0),  # a longer word
        ("icl_labels", "kelu", " kelu_2", 0.0),
        ("icl_labels", "kelu", " kel", 0.0),
        ("icl_labels", "kelu", " Kelu", 0.0),
        ("icl_labels", "kelu", " tovima", 0.0),
        ("icl_labels", "kelu", " animal", 0.0),
        # nolima_needle: the full name
        ("nolima_needle", "Vera Tolimak", " Vera Tolimak", 1.0),
        ("nolima_needle", "Vera Tolimak", " Vera Tolimak.\nWhich character", 1.0),
        ("nolima_needle", "Vera Tolimak", " Vera", 0.0),
        ("nolima_needle", "Vera Tolimak", " Vera Tolimakova", 0.0),
        ("nolima_needle", "Vera Tolimak", " Tolimak", 0.0),
        ("nolima_needle", "Vera Tolimak", " vera tolimak", 0.0),
        ("nolima_needle", "Vera Tolimak", " The character is Vera Tolimak", 0.0),
    ],
)
def test_whole_value_checker_golden(kind, answer, generated, score) -> None:
    assert score_generation(by_hand(kind, answer), generated) == score
    assert score_value(generated, answer) == bool(score)


@pytest.mark.parametrize(
    ("generated", "settled"),
    [
        ("", False),
        (" ", False),
        (' "', False),
        (" ke", False),
        (" kelu", False),  # the next character decides
        (" kelu\n", True),
        (' "kelu"', True),
        (" kelum", True),
        (" tovi", True),
        (" Kelu", True),
    ],
)
def test_whole_value_settled_golden(generated, settled) -> None:
    assert value_settled(generated, "kelu") == settled
    for kind in VALUE_KINDS:
        assert generation_settled(by_hand(kind, "kelu"), generated) == settled


def test_largest_fitting_golden() -> None:
    def size(n: int) -> int:  # 20 tokens of frame, 7 per item
        return 20 + 7 * n

    assert largest_fitting(size, 100, 20) == 11  # 97 tokens; 12 items take 104
    assert largest_fitting(size, 27, 20) == 1 and largest_fitting(size, 26, 20) == 0

    def uneven(n: int) -> int:  # not additive: the search still ends on the largest fitting count
        return 5 + 3 * n + (n % 4) * 2

    assert largest_fitting(uneven, 200, 5) == max(n for n in range(1, 100) if uneven(n) <= 200)


# --- json_kv ------------------------------------------------------------------------------------


@pytest.mark.parametrize("budget", [300, 800, 2000])
@pytest.mark.parametrize("seed", range(5))
def test_json_kv_answer_is_the_asked_keys_value(tokenizer, budget, seed) -> None:
    depth = random.Random(seed).random()
    example = build_example([], tokenizer, budget, depth, seed=seed, kind="json_kv")
    check_needles(example, tokenizer)
    assert example.prompt_tokens <= budget and example.prompt.endswith("\nAnswer:")
    pairs = json.loads(example.context, object_pairs_hook=list)
    assert len({k for k, _ in pairs}) == len(pairs)
    assert all(UUID.fullmatch(k) and UUID.fullmatch(v) for k, v in pairs)
    key = re.fullmatch(r'What is the value of the key "(.+)" in the JSON object above\?', example.question)[1]
    assert dict(pairs)[key] == example.answer == example.answer_items[0]
    assert example.prompt == json_kv_prompt(pairs, key)  # the same frame as the golden prompt
    # the needle is the asked pair, at the requested place among the pairs, and the only target
    (needle,) = example.needles
    assert needle.text == f'"{key}": "{example.answer}"' and needle.target
    assert [k for k, _ in pairs].index(key) == round(depth * (len(pairs) - 1))
    # within one pair of the budget: one more pair would not fit
    pair = len(tokenizer.encode(", " + needle.text, add_special_tokens=False).ids)
    assert example.prompt_tokens > budget - pair - 2
    assert example.haystack_ids == () and example.choices == ()


@pytest.mark.parametrize("depth", [0.0, 0.25, 0.5, 0.75, 1.0])
def test_json_kv_pair_at_the_requested_depth(tokenizer, depth) -> None:
    example = build_example([], tokenizer, 3000, depth, seed=4, kind="json_kv")
    (needle,) = example.needles
    assert abs(needle.depth - depth) <= 0.05
    assert abs(relative_position(example, needle.char_offset) - depth) <= 0.05


def test_json_kv_grid_moves_one_pair(tokenizer) -> None:
    grid = make_grid([], tokenizer, [700], [0.0, 0.5, 1.0], seed=3, kind="json_kv")
    objects = [json.loads(e.context, object_pairs_hook=list) for e in grid]
    assert len({frozenset(pairs) for pairs in objects}) == 1  # the same pairs, in another order
    assert len({e.answer for e in grid}) == 1 and len({e.context for e in grid}) == 3
    assert objects[0][0][1] == grid[0].answer and objects[2][-1][1] == grid[2].answer


def test_json_kv_too_small(tokenizer) -> None:
    with pytest.raises(ValueError, match=r"context_tokens=60 is too small for json_kv: .* take \d+ tokens"):
        build_example([], tokenizer, 60, 0.5, seed=0, kind="json_kv")
    with pytest.raises(NeedleLengthError, match="a length of 60 tokens is too small for json_kv"):
        needle_examples([], tokenizer, [60], [0.5], ["json_kv"], seed=0)


# --- icl_labels ---------------------------------------------------------------------------------


def parse_icl(example: Example) -> tuple[list[tuple[str, str]], str]:
    """(noun, label) of every demonstration and the asked noun, from the prompt's text alone: an
    input's noun is its one word that is not an adjective of the inputs."""

    def noun(text: str) -> str:
        (word,) = [w for w in text.split(" ") if w not in ADJECTIVES]
        return word

    demos = [(noun(text), label) for text, label in DEMO.findall(example.context)]
    assert example.context.count("Input: ") == len(demos)
    return demos, noun(example.question.removeprefix("Input: "))


@pytest.mark.parametrize("budget", [200, 600, 1500])
@pytest.mark.parametrize("seed", range(6))
def test_icl_label_follows_the_rule(tokenizer, budget, seed) -> None:
    example = build_example([], tokenizer, budget, 0.5, seed=seed, kind="icl_labels")
    assert example.prompt_tokens == len(tokenizer.encode(example.prompt, add_special_tokens=False).ids)
    assert example.prompt_tokens <= budget and example.prompt.endswith("\nAnswer:")
    assert example.prompt == icl_prompt(
        DEMO.findall(example.context), example.question.removeprefix("Input: ")
    )
    demos, asked = parse_icl(example)
    category = {noun: name for name, nouns in CATEGORIES.items() for noun in nouns}
    labels: dict[str, set[str]] = {}
    for noun, label in demos:
        labels.setdefault(category[noun], set()).add(label)
    assert all(len(v) == 1 for v in labels.values())  # one label per class
    assert len(set().union(*labels.values())) == len(labels) <= 6  # distinct labels, default classes
    assert asked in {noun for noun, _ in demos}  # the context alone decides the answer
    assert {example.answer} == labels[category[asked]] and example.answer_items == (example.answer,)
    for label in set().union(*labels.values()):  # arbitrary words: no class name, no input word
        assert PSEUDO_WORD.fullmatch(label) and label not in CLASS_NAMES
        assert label not in category and label not in ADJECTIVES
    demo = len(tokenizer.encode(f"\n\nInput: {demos[0][0]}\nAnswer: x", add_special_tokens=False).ids)
    assert example.prompt_tokens > budget - 3 * demo  # within a demonstration or so of the budget
    assert example.needles == () and example.haystack_ids == () and example.depth == 0.5


def test_icl_many_shots_and_classes(tokenizer) -> None:
    example = build_example([], tokenizer, 4000, 0.0, seed=1, kind="icl_labels")
    demos, _ = parse_icl(example)
    assert len(demos) >= 100  # many-shot: about 35 tokens a demonstration with this small BPE
    assert len({label for _, label in demos}) == 6
    three = build_example([], tokenizer, 1000, 0.0, seed=1, kind="icl_labels", sizes=TaskSizes(classes=3))
    assert len({label for _, label in parse_icl(three)[0]}) == 3


def test_icl_settings_and_grid(tokenizer) -> None:
    for classes in (1, 9):
        with pytest.raises(ValueError, match=f"TaskSizes.classes={classes}: icl_labels takes from 2 to 8"):
            build_example(
                [], tokenizer, 600, 0.5, seed=0, kind="icl_labels", sizes=TaskSizes(classes=classes)
            )
    with pytest.raises(ValueError, match="context_tokens=20 is too small for icl_labels"):
        build_example([], tokenizer, 20, 0.5, seed=0, kind="icl_labels")
    grid = make_grid([], tokenizer, [500], [0.0, 1.0], seed=2, kind="icl_labels")
    assert grid[0].context != grid[1].context  # no depth: each cell its own example


# --- nolima_needle ------------------------------------------------------------------------------


def test_nolima_table_shares_no_content_word() -> None:
    """Every fact template x question template x pair of every relation."""
    for relation in RELATIONS:
        for item, place in relation.pairs:
            for fact in relation.facts:
                for question in relation.questions:
                    f = content_words(fact.format(name="Vera Tolimak", item=item))
                    q = content_words(question.format(place=place))
                    assert not f & q, (fact, question, item, place)


@pytest.mark.parametrize("budget", [300, 1200])
def test_nolima_question_shares_no_content_word_with_the_fact(haystack, tokenizer, budget) -> None:
    for seed in range(60):
        example = build_example(haystack, tokenizer, budget, 0.3, seed=seed, kind="nolima_needle")
        (needle,) = example.needles
        assert not content_words(needle.text) & content_words(example.question), seed
        assert example.answer in needle.text and example.answer not in example.question
        assert example.context.count(example.answer) == 1  # the name appears in the fact only
        assert example.prompt_tokens <= budget


@pytest.mark.parametrize("depth", [0.0, 0.25, 0.5, 0.75, 1.0])
def test_nolima_fact_at_the_requested_depth(haystack, tokenizer, depth) -> None:
    example = build_example(haystack, tokenizer, 2048, depth, seed=5, kind="nolima_needle")
    check_needles(example, tokenizer)
    (needle,) = example.needles
    assert abs(relative_position(example, needle.char_offset) - depth) <= 0.1
    assert abs(needle.depth - depth) <= 0.1
    assert 0.9 * 2048 <= example.prompt_tokens <= 2048


# --- all three ----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_deterministic_by_seed(haystack, tokenizer, kind) -> None:
    random.seed(1)
    a = build_example(haystack, tokenizer, 900, 0.3, seed=21, kind=kind)
    random.seed(2)
    assert build_example(haystack, tokenizer, 900, 0.3, seed=21, kind=kind) == a
    b = build_example(haystack, tokenizer, 900, 0.3, seed=22, kind=kind)
    assert b.prompt != a.prompt and b.answer != a.answer


@pytest.mark.parametrize("kind", KINDS)
def test_oracle_and_wrong_answers(haystack, tokenizer, kind) -> None:
    example = build_example(haystack, tokenizer, 900, 0.5, seed=7, kind=kind)
    assert score_generation(example, " " + example.answer) == 1.0
    assert score_generation(example, f' "{example.answer}"\n') == 1.0
    assert score_generation(example, " " + example.answer + "x") == 0.0
    assert score_generation(example, " " + example.answer[:-1]) == 0.0


def test_stage_builds_the_helmet_kinds(haystack, tokenizer, tokenizer_file) -> None:
    step = SyntheticTasks(tokenizer_file, n_examples=2, context_tokens=700, kinds=KINDS, seed=5)
    docs = run_stage(step, haystack)
    assert sorted(d.metadata["task"] for d in docs) == sorted(KINDS * 2)
    for doc in docs:
        meta = doc.metadata
        assert doc.text.endswith("\nAnswer: " + meta["answer"])
        assert meta["token_count"] == len(tokenizer.encode(doc.text, add_special_tokens=False).ids)
        assert bool(meta["needle_positions"]) == (meta["task"] != "icl_labels")
        assert meta["prompt_tokens"] <= meta["context_tokens"] == 700


def test_nolima_on_real_books(shared_corpus, tokenizer) -> None:
    from longctx.pipeline.readers.base import read_text_file

    names = ["patrickmineault__zipf__dracula.txt", "aimacode__aima-data__flatland.txt"]
    books = [HaystackDoc(f"books/{n}", read_text_file(shared_corpus / "books" / n)) for n in names]
    for seed, depth in enumerate((0.0, 0.5, 1.0)):
        example = build_example(books, tokenizer, 4096, depth, seed=seed, kind="nolima_needle")
        check_needles(example, tokenizer)
        (needle,) = example.needles
        assert not content_words(needle.text) & content_words(example.question)
        assert example.context.count(example.answer) == 1
        assert abs(relative_position(example, needle.char_offset) - depth) <= 0.1
        assert 0.9 * 4096 <= example.prompt_tokens <= 4096
