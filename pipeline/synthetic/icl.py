"""Many-shot in-context learning with labels mapped to arbitrary words, after HELMET's ICL category
(Yen et al., 2025): the labels carry no meaning, so a model cannot answer from what it knows about
class names and must learn the mapping from the demonstrations in its context.

* **Inputs**: one to three adjectives (``names.ADJECTIVES``) with one noun of a category of
  :data:`CATEGORIES` among them, at a random place (``quiet otter rusty``).
* **The rule**: an input's class is its noun's category; the adjectives play no part.
* **Labels**: an example draws ``TaskSizes.classes`` categories and gives each a distinct invented
  word (``names.pseudo_word``, ``kelu``): never a category's name nor any word of the inputs.
* **The prompt**: demonstrations ``Input: <input>`` / ``Answer: <label>``, separated by blank
  lines, their classes drawn uniformly, as many as the token budget allows (the count is searched
  with the tokenizer, :func:`~longctx.pipeline.synthetic.example.largest_fitting`); then the asked
  input and the ``Answer:`` cue, so the prompt ends like every demonstration and a base model
  continues it with a label. The asked noun is one a demonstration used, so the context alone
  decides the answer (a model that knows the categories can also generalize across nouns).

No haystack text and no needles: ``depth`` is recorded (the evaluation grid's coordinate) and
otherwise unused, as for the word lists (``kinds.LIST_KINDS``). A seed's demonstrations are the
first ``n`` of one stream; the asked input is drawn from the seed and ``n``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from tokenizers import Tokenizer

from longctx.pipeline.synthetic.example import (
    ANSWER_CUE,
    ContextSizeError,
    Example,
    TaskSizes,
    derive_seed,
    largest_fitting,
)
from longctx.pipeline.synthetic.kinds import TaskKind
from longctx.pipeline.synthetic.names import ADJECTIVES, pseudo_word

# fmt: off
# the classes an input's noun decides; no noun is an adjective of the inputs or another class's noun
CATEGORIES: dict[str, tuple[str, ...]] = {
    "animal": ("otter", "badger", "falcon", "heron", "lemur", "walrus", "wombat", "sparrow"),
    "tool": ("hammer", "wrench", "chisel", "pliers", "shovel", "trowel", "mallet", "crowbar"),
    "fruit": ("apple", "banana", "cherry", "mango", "pear", "plum", "peach", "apricot"),
    "instrument": ("violin", "cello", "flute", "trumpet", "harp", "oboe", "banjo", "tuba"),
    "vehicle": ("bicycle", "tractor", "canoe", "tram", "scooter", "truck", "wagon", "ferry"),
    "clothing": ("jacket", "scarf", "boot", "glove", "sock", "shirt", "coat", "sandal"),
    "furniture": ("table", "chair", "sofa", "wardrobe", "bench", "stool", "cupboard", "dresser"),
    "weather": ("storm", "drizzle", "blizzard", "fog", "hail", "breeze", "frost", "sleet"),
}
# fmt: on
INSTRUCTION = (
    "Each input below has a label. Learn the labels from the examples: the last input's label is asked."
)
_MAX_ADJECTIVES = 3
_DRAW_ATTEMPTS = 1000


def icl_prompt(demos: Sequence[tuple[str, str]], query: str) -> str:
    """The prompt of an ``icl_labels`` task: the instruction, the ``(input, label)`` demonstrations
    in their order, the asked input and the answer cue."""
    context = "\n\n".join(f"Input: {text}\n{ANSWER_CUE} {label}" for text, label in demos)
    return f"{INSTRUCTION}\n\n{context}\n\nInput: {query}\n{ANSWER_CUE}"


def _input(rng: random.Random, noun: str) -> str:
    words = rng.sample(ADJECTIVES, rng.randint(1, _MAX_ADJECTIVES))
    words.insert(rng.randint(0, len(words)), noun)
    return " ".join(words)


def _labels(rng: random.Random, count: int) -> list[str]:
    """``count`` distinct invented words, none a category's name nor a word of the inputs."""
    taken = set(CATEGORIES) | set(ADJECTIVES) | {noun for nouns in CATEGORIES.values() for noun in nouns}
    labels: list[str] = []
    for _ in range(_DRAW_ATTEMPTS):
        word = pseudo_word(rng)
        if word not in taken:
            taken.add(word)
            labels.append(word)
            if len(labels) == count:
                return labels
    raise RuntimeError(f"could not draw {count} distinct labels in {_DRAW_ATTEMPTS} attempts")


def build_icl_example(
    tokenizer: Tokenizer,
    context_tokens: int,
    depth: float,
    seed: int,
    kind: TaskKind,
    sizes: TaskSizes,
) -> Example:
    """An ``icl_labels`` task whose prompt holds at most ``context_tokens`` tokens (without special
    tokens), within one demonstration of it. ``kind`` (``icl_labels``) is taken for the signature
    common to the builders without haystack text. Deterministic in its arguments. Raises
    ``ValueError`` for ``TaskSizes.classes`` outside [2, 8] or a budget that cannot hold the
    instruction, one demonstration and the asked input."""
    if not 2 <= sizes.classes <= len(CATEGORIES):
        raise ValueError(
            f"TaskSizes.classes={sizes.classes}: icl_labels takes from 2 to {len(CATEGORIES)} classes"
        )
    rng = random.Random(derive_seed(seed, "classes"))
    classes = rng.sample(sorted(CATEGORIES), sizes.classes)
    label = dict(zip(classes, _labels(rng, len(classes))))
    stream = random.Random(derive_seed(seed, "demos"))
    demos: list[tuple[str, str, str]] = []  # (noun, input, label)

    def layout(n: int) -> tuple[list[tuple[str, str]], str, str]:
        """The first ``n`` demonstrations, the asked input and its label."""
        while len(demos) < n:
            category = stream.choice(classes)
            noun = stream.choice(CATEGORIES[category])
            demos.append((noun, _input(stream, noun), label[category]))
        ask = random.Random(derive_seed(seed, "query", n))
        noun, _, answer = demos[ask.randrange(n)]
        return [(text, lab) for _, text, lab in demos[:n]], _input(ask, noun), answer

    def size(n: int) -> int:
        pairs, query, _ = layout(n)
        return len(tokenizer.encode(icl_prompt(pairs, query), add_special_tokens=False).ids)

    fixed = len(tokenizer.encode(icl_prompt([], ""), add_special_tokens=False).ids)
    n = largest_fitting(size, context_tokens, fixed)
    if n == 0:
        raise ContextSizeError(
            f"context_tokens={context_tokens} is too small for icl_labels: the instruction, one "
            f"demonstration and the asked input take {size(1)} tokens"
        )
    pairs, query, answer = layout(n)
    prompt = icl_prompt(pairs, query)
    head = len(INSTRUCTION) + 2
    question = f"Input: {query}"
    return Example(
        kind=kind,
        seed=seed,
        depth=float(depth),
        context_tokens=context_tokens,
        prompt_tokens=len(tokenizer.encode(prompt, add_special_tokens=False).ids),
        context=prompt[head : len(prompt) - len(f"\n\n{question}\n{ANSWER_CUE}")],
        context_offset=head,
        question=question,
        answer=answer,
        prompt=prompt,
        needles=(),
        haystack_ids=(),
        answer_items=(answer,),
    )
