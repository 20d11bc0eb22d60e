"""Aggregation tasks over a list of invented words, after RULER's common- and frequent-words
extraction: the model must count, not look something up.

* ``common_words``: ``TaskSizes.common_words`` (N) words each appear ``c`` times and many rare words
  appear twice each; the question asks for the N most common words. ``c`` grows with the list so
  the common words fill about half of it, and is at least 4 (twice a rare word's count).
* ``frequent_words``: word counts follow a Zipf law of exponent 1, ``count(r) = floor(C / r)`` for
  the ranks ``r`` whose count is at least 2, and single words fill the rest of the list (the ranked
  words fill about half of it); the question asks for the ``TaskSizes.frequent_words`` (K) most
  frequent words. ``C >= K (K + 1)`` makes rank K's count strictly above rank K+1's, so the answer
  is never a tie.

The words are :func:`~longctx.pipeline.synthetic.names.pseudo_word` s, all distinct, written
separated by spaces in an order drawn from the seed. The list is as long as the token budget allows:
its length is searched with the tokenizer, as the needle tasks cut their haystack. The expected
answer lists the common words in order of first appearance, the frequent ones from the most
frequent; the checker (``longctx.pipeline.synthetic.checkers``) ignores the order.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from tokenizers import Tokenizer

from longctx.pipeline.synthetic.example import ANSWER_CUE, ContextSizeError, Example, TaskSizes, derive_seed
from longctx.pipeline.synthetic.kinds import TaskKind
from longctx.pipeline.synthetic.names import pseudo_word

_RARE_REPEATS = 2  # common_words: how often each rare word appears
_MIN_COMMON_REPEATS = 4  # common_words: the least a common word appears
_HEAD_SHARE = 0.5  # the common (ranked) words fill about this share of the list
_FIT_ROUNDS = 8  # most list lengths tokenized to get the prompt close to the budget
_DRAW_ATTEMPTS = 1000


def _common_counts(entries: int, n: int) -> list[int] | None:
    """Counts of the N common words then of the rare ones, for a list of about ``entries`` words;
    None when the list cannot hold at least as many rare words as common ones."""
    repeats = max(_MIN_COMMON_REPEATS, int(entries * _HEAD_SHARE) // n)
    rare = (entries - n * repeats) // _RARE_REPEATS
    return [repeats] * n + [_RARE_REPEATS] * rare if rare >= n else None


def _zipf_head(top: int) -> list[int]:
    """``floor(top / r)`` for the ranks ``r`` where it is at least 2."""
    return [top // r for r in range(1, top // 2 + 1)]


def _frequent_counts(entries: int, k: int) -> list[int] | None:
    """Counts by rank for a list of ``entries`` words (see the module docstring); None when the list
    is too short for rank K to be strictly more frequent than rank K+1."""
    budget = int(entries * _HEAD_SHARE)
    low, high = 0, max(2, budget)  # the largest top count whose Zipf head fits the budget
    while low < high:
        mid = (low + high + 1) // 2
        if sum(_zipf_head(mid)) <= budget:
            low = mid
        else:
            high = mid - 1
    if low < max(2, k * (k + 1)):
        return None
    head = _zipf_head(low)
    return head + [1] * (entries - sum(head))


_COUNTS: dict[str, tuple[Callable[[int, int], list[int] | None], Callable[[TaskSizes], int]]] = {
    "common_words": (_common_counts, lambda sizes: sizes.common_words),
    "frequent_words": (_frequent_counts, lambda sizes: sizes.frequent_words),
}


def _smallest_list(kind: str, asked: int) -> int:
    counts = _COUNTS[kind][0]
    entries = asked
    while counts(entries, asked) is None:
        entries += 1
    return entries


def _distinct_words(rng: random.Random, count: int) -> list[str]:
    taken: set[str] = set()
    words: list[str] = []
    while len(words) < count:
        for _ in range(_DRAW_ATTEMPTS):
            word = pseudo_word(rng)
            if word not in taken:
                break
        else:
            raise RuntimeError(f"could not draw {count} distinct words in {_DRAW_ATTEMPTS} attempts")
        taken.add(word)
        words.append(word)
    return words


def _texts(kind: TaskKind, asked: int) -> tuple[str, str]:
    if kind == "common_words":
        return (
            "Below is a list of words. Memorize it: a question about it follows the list.",
            f"What are the {asked} most common words in the list above? List them separated by commas.",
        )
    return (
        "Below is a text of invented words. Memorize it: a question about it follows the text.",
        f"What are the {asked} most frequent words in the text above? "
        "List them from the most frequent, separated by commas.",
    )


def _layout(kind: TaskKind, seed: int, entries: int, asked: int) -> tuple[list[str], list[str]] | None:
    """The list of about ``entries`` words and the expected answer; None when too short."""
    counts = _COUNTS[kind][0](entries, asked)
    if counts is None:
        return None
    words = _distinct_words(random.Random(derive_seed(seed, "words")), len(counts))
    items = [w for w, c in zip(words, counts) for _ in range(c)]
    random.Random(derive_seed(seed, "order", len(items))).shuffle(items)
    if kind == "common_words":
        common = set(words[:asked])
        answer = list(dict.fromkeys(w for w in items if w in common))
    else:
        answer = words[:asked]
    return items, answer


def build_list_example(
    tokenizer: Tokenizer,
    context_tokens: int,
    depth: float,
    seed: int,
    kind: TaskKind,
    sizes: TaskSizes = TaskSizes(),
) -> Example:
    """A ``common_words`` or ``frequent_words`` task whose prompt holds at most ``context_tokens``
    tokens (without special tokens), usually within a few percent of it.

    ``depth`` is recorded (the evaluation grid's coordinate) and otherwise unused: there are no
    needles. Deterministic in its arguments. Raises ``ValueError`` when the budget cannot hold the
    shortest list that still has a well-defined answer.
    """
    if kind not in _COUNTS:
        raise ValueError(f"{kind!r} is not a word-list task kind; expected one of {', '.join(_COUNTS)}")
    asked = _COUNTS[kind][1](sizes)
    instruction, question = _texts(kind, asked)
    head = instruction + "\n\n"

    def prompt(context: str) -> str:
        return f"{head}{context}\n\n{question}\n{ANSWER_CUE}"

    def size(text: str) -> int:
        return len(tokenizer.encode(text, add_special_tokens=False).ids)

    fixed = size(prompt(""))
    smallest = _smallest_list(kind, asked)
    best: tuple[int, str, list[str], list[str]] | None = None
    entries = max(smallest, (context_tokens - fixed) // 4)
    tried: set[int] = set()
    for _ in range(_FIT_ROUNDS):
        if entries in tried:
            break
        tried.add(entries)
        layout = _layout(kind, seed, entries, asked)
        assert layout is not None  # entries >= smallest
        items, answer = layout
        text = prompt(" ".join(items))
        n = size(text)
        if n <= context_tokens and (best is None or n > best[0]):
            best = (n, text, items, answer)
        if n == context_tokens:
            break
        step = int((context_tokens - n) / max(1e-9, (n - fixed) / len(items)))
        entries = max(smallest, entries + (step if step else (1 if n < context_tokens else -1)))
    if best is None:
        raise ContextSizeError(
            f"context_tokens={context_tokens} is too small for {kind}: its shortest list "
            f"({smallest} words, {asked} asked) does not fit"
        )
    n, text, items, answer = best
    return Example(
        kind=kind,
        seed=seed,
        depth=float(depth),
        context_tokens=context_tokens,
        prompt_tokens=n,
        context=" ".join(items),
        context_offset=len(head),
        question=question,
        answer=", ".join(answer),
        prompt=text,
        needles=(),
        haystack_ids=(),
        answer_items=tuple(answer),
        choices=tuple(dict.fromkeys(items)),
    )
