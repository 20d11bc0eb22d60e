"""What a synthetic task is made of: haystack documents, sizes, needles and the finished
:class:`Example`, shared by the needle builders (``tasks``) and the builders without haystack text
(``words``, ``jsonkv``, ``icl``)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

from longctx.pipeline.synthetic.kinds import TaskKind

DEFAULT_SOURCE = "synthetic"
ANSWER_CUE = "Answer:"


class ContextSizeError(ValueError):
    """A requested ``context_tokens`` cannot hold the task: too short for its fixed text, or longer
    than the haystack documents can fill. Callers name the setting the length came from (the
    ``curate.synthetic`` stage, the ``eval.needle`` grid)."""


@dataclass(frozen=True)
class HaystackDoc:
    """A curated document whose text can hide needles; ``id`` is recorded in ``Example.haystack_ids``."""

    id: str
    text: str


@dataclass(frozen=True)
class TaskSizes:
    """How many needles or items each task kind uses.

    ``keys``: needles of ``multi_key`` (one asked, the rest distractors). ``values``: values of the
    one ``multi_value`` key. ``hops``: variables in each ``variable_tracking`` chain. ``chains``:
    ``variable_tracking`` chains (one asked, the rest distractors). ``queries``: needles of
    ``multi_query``, all asked at once. ``facts``: facts of ``document_qa`` (one asked, the rest
    distractors about other entities). ``common_words``: the words ``common_words`` asks for (the
    most common of its list); ``frequent_words``: the words ``frequent_words`` asks for (the most
    frequent of its list); ``classes``: the categories of ``icl_labels``, each with its own label
    (from 2 to the 8 categories it knows).
    """

    keys: int = 4
    values: int = 4
    hops: int = 4
    chains: int = 2
    queries: int = 4
    facts: int = 4
    common_words: int = 10
    frequent_words: int = 3
    classes: int = 6

    def __post_init__(self) -> None:
        small = [f.name for f in fields(self) if getattr(self, f.name) < 1]
        if small:
            raise ValueError(f"TaskSizes: {', '.join(small)} must be at least 1")


@dataclass(frozen=True)
class Needle:
    """One inserted needle; see ``longctx.pipeline.synthetic.tasks`` for the exact meaning of the
    offsets.

    ``target`` is true for the needles the answer is about and false for distractors.
    """

    text: str
    char_offset: int
    token_offset: int
    depth: float
    target: bool


@dataclass(frozen=True)
class Example:
    """One synthetic task.

    ``depth`` and ``context_tokens`` are what was requested (the evaluation grid's coordinates);
    ``prompt_tokens`` is the prompt's actual length (never more than ``context_tokens``) and each
    needle records its measured depth. ``context`` is the haystack with the needles inserted (or the
    word list) and starts at ``prompt[context_offset]``; ``needles`` are in order of appearance.

    ``answer`` is ``answer_items`` joined by ``", "``. ``choices`` are, for the kinds scored by
    recall (``kinds.RECALL_KINDS``), every item the prompt offers as a possible answer (the asked
    values and the distractors' values, or the words of the list): what the checker looks for in a
    generation. It is empty for the kinds scored by an exact answer.
    """

    kind: TaskKind
    seed: int
    depth: float
    context_tokens: int
    prompt_tokens: int
    context: str
    context_offset: int
    question: str
    answer: str
    prompt: str
    needles: tuple[Needle, ...]
    haystack_ids: tuple[str, ...]
    answer_items: tuple[str, ...] = ()
    choices: tuple[str, ...] = ()

    @property
    def training_text(self) -> str:
        """The document a model trains on: the prompt followed by the answer."""
        return f"{self.prompt} {self.answer}"


def derive_seed(*parts: object) -> int:
    """A 63-bit seed from ``parts`` (via sha256 of their ``str``), stable across runs and machines."""
    digest = hashlib.sha256("\x1f".join(map(str, parts)).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def as_haystack(items: Sequence[str | HaystackDoc]) -> list[HaystackDoc]:
    """Haystack documents from texts (id: their index) or :class:`HaystackDoc`; empty texts are left out."""
    docs = [
        item if isinstance(item, HaystackDoc) else HaystackDoc(str(i), item) for i, item in enumerate(items)
    ]
    return [doc for doc in docs if doc.text]


def largest_fitting(size: Callable[[int], int], budget: int, fixed: int) -> int:
    """The largest ``n >= 1`` whose ``size(n)`` (the tokens of a prompt of ``n`` items) is at most
    ``budget``, or 0 when one item is already too many; ``fixed`` is the prompt's tokens without
    items. For the builders whose context is a list of items (``json_kv``, ``icl_labels``).

    ``size`` is assumed to grow with ``n`` (items add tokens, nearly additively). The search steps
    from one item by the tokens per item measured so far (a few probes, since the estimate is good
    after the first) and keeps a bracket, bisected when a step would leave it, so it always ends.
    """
    fits, too_many = 0, None  # the largest n known to fit, the smallest known not to
    n = 1
    while too_many is None or too_many - fits > 1:
        tokens = size(n)
        if tokens <= budget:
            fits = n
        else:
            too_many = n
        if too_many == 1:
            return 0
        guess = n + int((budget - tokens) / max(1.0, (tokens - fixed) / n))
        if too_many is None:
            n = max(guess, fits + 1)
        else:
            n = guess if fits < guess < too_many else (fits + too_many) // 2
    return fits
