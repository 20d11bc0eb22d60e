"""How a model's generation is scored against a synthetic task, the same way for every model.

The generation is the text a model produced after the prompt (greedy decoding, cut at the end
token or when the score is settled). Three rules, chosen by the task kind:

* **Exact answer** (``single_needle``, ``multi_key``, ``multi_value``, ``variable_tracking``):
  1 when the generation, without leading white space, starts with the expected answer, else 0
  (:func:`score_answer`).
* **Recall** (``kinds.RECALL_KINDS``: ``multi_query``, ``document_qa``, ``common_words``,
  ``frequent_words``): the expected answer has ``k`` items (``Example.answer_items``: the asked
  values, the asked fact's value, the N common or K most frequent words). Extraction: the
  generation is lower-cased and split into words (runs of letters, digits and ``_``); scanning left
  to right, each run of words that spells one of the task's choices (``Example.choices``: every
  value or word the prompt offers, targets and distractors alike; the longest choice wins) is an
  answered item; repeats count once; the first ``k`` answered items are kept and anything after
  them is ignored, so listing every candidate earns nothing. Score: the fraction of the ``k``
  expected items among the kept ones, in any order. A perfect answer scores 1, one whose first
  ``k`` items are all wrong (or that names none of the choices) scores 0, and ``j`` right items
  among the first ``k`` score ``j / k``. For ``document_qa`` ``k`` is 1: the first value the
  generation names must be the asked one.
* **Whole value** (``kinds.VALUE_KINDS``: ``json_kv``, ``icl_labels``, ``nolima_needle``, ``passkey``): 1 when
  the generation, without leading white space and without one opening quote (``"`` or ``'``),
  starts with the expected answer and the answer ends there: the generation ends with it or goes on
  with a character that cannot continue a value (anything but a letter, a digit, ``_`` or ``-``),
  else 0 (:func:`score_value`). So ``"v"``, `` v.`` and ``v\nInput: ...`` score 1 for ``v``, and
  ``vx``, a prefix of ``v`` or ``The value is v`` score 0: these answers (random values, invented
  labels and names) may begin longer words, which the exact rule would accept. Case counts.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from longctx.pipeline.synthetic.kinds import RECALL_KINDS, VALUE_KINDS

if TYPE_CHECKING:
    from longctx.pipeline.synthetic.example import Example

_WORD = re.compile(r"\w+")
_TRAILING_WORD = re.compile(r"\w+\Z")
_VALUE_GOES_ON = re.compile(r"[\w-]")  # a character that would make a value longer
_QUOTES = ('"', "'")


def score_answer(generated: str, answer: str) -> bool:
    """Correct when the generation, without leading white space, starts with the expected answer."""
    return generated.lstrip().startswith(answer.strip())


def answer_settled(generated: str, answer: str) -> bool:
    """True once more tokens cannot change :func:`score_answer`: the answer is complete, or the
    generation has left it."""
    text, expected = generated.lstrip(), answer.strip()
    return text.startswith(expected) or (bool(text) and not expected.startswith(text))


def _value_text(generated: str) -> str:
    """The generation without leading white space and one opening quote: where a value starts."""
    text = generated.lstrip()
    return text[1:] if text.startswith(_QUOTES) else text


def score_value(generated: str, answer: str) -> bool:
    """Correct when the generation, without leading white space and one opening quote, is the
    expected answer, whole (see the module docstring)."""
    text, expected = _value_text(generated), answer.strip()
    return text.startswith(expected) and not _VALUE_GOES_ON.match(text, len(expected))


def value_settled(generated: str, answer: str) -> bool:
    """True once more tokens cannot change :func:`score_value`: the generation has gone past the
    answer's length or away from it (a complete answer still waits for the character after it)."""
    return not answer.strip().startswith(_value_text(generated))


def _words(text: str) -> tuple[str, ...]:
    return tuple(_WORD.findall(text.lower()))


@functools.lru_cache(maxsize=8)
def _lookup(choices: tuple[str, ...]) -> tuple[dict[tuple[str, ...], str], list[int]]:
    """Choices by their words, and the word counts of choices, longest first (cached: a word list's
    choices are looked up after every generated token)."""
    lookup = {_words(choice): choice for choice in choices}
    lookup.pop((), None)
    return lookup, sorted({len(key) for key in lookup}, reverse=True)


def extract_items(generated: str, choices: Sequence[str]) -> list[str]:
    """The choices the generation names, in order of first mention, each once (see the module
    docstring); returned as spelled in ``choices``."""
    lookup, lengths = _lookup(tuple(choices))
    words = _words(generated)
    found: dict[str, None] = {}
    i = 0
    while i < len(words):
        for n in lengths:
            choice = lookup.get(words[i : i + n])
            if choice is not None:
                found.setdefault(choice)
                i += n
                break
        else:
            i += 1
    return list(found)


def recall_score(generated: str, expected: Sequence[str], choices: Sequence[str]) -> float:
    """The fraction of ``expected`` among the first ``len(expected)`` items the generation names."""
    if not expected:
        raise ValueError("recall_score needs at least one expected item")
    kept = extract_items(generated, choices)[: len(expected)]
    return len(set(kept) & set(expected)) / len(expected)


def score_generation(example: Example, generated: str) -> float:
    """The score of ``generated`` for ``example``, in [0, 1], by the rule of its kind."""
    if example.kind in RECALL_KINDS:
        return recall_score(generated, example.answer_items, example.choices)
    if example.kind in VALUE_KINDS:
        return float(score_value(generated, example.answer))
    return float(score_answer(generated, example.answer))


def generation_settled(example: Example, generated: str) -> bool:
    """True once more tokens cannot change :func:`score_generation`: for the recall kinds, when the
    generation already names as many choices as the answer has items, not counting a word still
    being written at its end."""
    if example.kind in RECALL_KINDS:
        complete = _TRAILING_WORD.sub("", generated)
        return len(extract_items(complete, example.choices)) >= len(example.answer_items)
    if example.kind in VALUE_KINDS:
        return value_settled(generated, example.answer)
    return answer_settled(generated, example.answer)
