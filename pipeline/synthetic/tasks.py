"""Synthetic long-context tasks: needles hidden in real curated text, for training and evaluation.

Four task kinds, after RULER (Hsieh et al., 2024):

* ``single_needle``: one ``The special magic number for <key> is: <value>.`` sentence; the question
  asks for the key's value.
* ``multi_key``: several such sentences with distinct keys; the question asks for one key, the
  others are distractors.
* ``multi_value``: one key inserted several times with different values; the answer lists every
  value in the order they appear in the context.
* ``variable_tracking``: chains of assignments (``VAR QXJZT = 4819302.``, later
  ``VAR KWMRA = VAR QXJZT.``, ...) scattered through the context, one chain asked about and the
  others distractors; the answer is the asked chain's variables in assignment order.

The haystack is real text: curated documents concatenated in an order drawn from the seed, the first
one entered at a random sentence boundary, and trimmed with the tokenizer so that the whole prompt
(instruction, context, question and the ``Answer:`` cue) fits the requested number of tokens.
Needles are inserted at sentence or line boundaries next to their requested depth. Everything random
comes from :class:`random.Random` instances seeded from the example's seed, never from the global
generator, so an example is a pure function of its inputs.

:func:`build_example` and :func:`make_grid` are the pure builders (the trainer's evaluation uses the
grid; this module imports no datatrove). The datatrove stage that turns examples into documents of a
training source is ``longctx.pipeline.synthetic.stage``.

Needle positions, exactly: ``Needle.char_offset`` is the index in ``Example.prompt`` where the needle
text starts (``prompt[char_offset:].startswith(text)``). ``Needle.token_offset`` is the index, in
``tokenizer.encode(prompt, add_special_tokens=False).ids``, of the token whose character span holds
that first character (with byte-level BPE this token may also hold the whitespace before the needle).
The training text ``prompt + " " + answer`` starts with the prompt's tokens when the tokenizer
splits the answer from the cue's colon (byte-level BPE with GPT-2 pre-tokenization, as this project
trains, does), so the offsets hold for the document too; in a packed window whose documents start
with BOS, add one. ``Needle.depth`` is the measured depth, in [0, 1]: the fraction of the context's
haystack tokens (its tokens outside the needles) that come before the needle, so a needle inserted
at the very start has depth 0 and one after all the haystack text depth 1.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import random
import re
import string
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

from tokenizers import Tokenizer

from longctx.core.text import plural

TaskKind = Literal["single_needle", "multi_key", "multi_value", "variable_tracking"]
TASK_KINDS: tuple[TaskKind, ...] = get_args(TaskKind)
DEFAULT_SOURCE = "synthetic"
ANSWER_CUE = "Answer:"

_DOC_SEPARATOR = "\n\n"
# Where a new sentence or line starts: after . ! or ? (and closing quotes or brackets) plus
# whitespace, or after a line break. The match's end is the boundary; whitespace always precedes it.
_BOUNDARY = re.compile(r"(?<=[.!?])[\"'\u2019\u201d)\]]*\s+|\n\s*")
_SNAP_FRACTION = 0.05  # a boundary is used when it lies within this fraction of the haystack's length
_FIT_ROUNDS = 6  # most haystack lengths tokenized to get the prompt close to the budget
_DRAW_ATTEMPTS = 1000

# fmt: off
_ADJECTIVES = (
    "amber", "ancient", "bitter", "bold", "brave", "bright", "calm", "clever", "copper", "crimson",
    "curious", "distant", "eager", "electric", "emerald", "fierce", "gentle", "golden", "hidden", "hollow",
    "humble", "icy", "ivory", "jolly", "lively", "lonely", "lucky", "misty", "noble", "olive", "patient",
    "quiet", "rapid", "restless", "rusty", "scarlet", "silent", "silver", "sleepy", "solar", "steady",
    "swift", "tidy", "velvet", "violet", "wandering", "wild", "woolen",
)
_NOUNS = (
    "anchor", "badger", "beacon", "canyon", "cedar", "comet", "compass", "falcon", "fern", "fjord",
    "glacier", "harbor", "hedgehog", "heron", "island", "kettle", "lantern", "lemur", "lighthouse",
    "meadow", "meteor", "minnow", "monsoon", "nebula", "orchard", "otter", "pebble", "pelican", "pine",
    "quarry", "raven", "reef", "saddle", "sparrow", "spruce", "summit", "thistle", "thunder", "tortoise",
    "tundra", "valley", "walrus", "willow", "window", "wombat", "yak", "zephyr", "zeppelin",
)
# fmt: on


@dataclass(frozen=True)
class HaystackDoc:
    """A curated document whose text can hide needles; ``id`` is recorded in ``Example.haystack_ids``."""

    id: str
    text: str


@dataclass(frozen=True)
class TaskSizes:
    """How many needles each task kind hides.

    ``keys``: needles of ``multi_key`` (one asked, the rest distractors). ``values``: values of the
    one ``multi_value`` key. ``hops``: variables in each ``variable_tracking`` chain. ``chains``:
    ``variable_tracking`` chains (one asked, the rest distractors).
    """

    keys: int = 4
    values: int = 4
    hops: int = 4
    chains: int = 2

    def __post_init__(self) -> None:
        small = [name for name in ("keys", "values", "hops", "chains") if getattr(self, name) < 1]
        if small:
            raise ValueError(f"TaskSizes: {', '.join(small)} must be at least 1")


@dataclass(frozen=True)
class Needle:
    """One inserted needle; see the module docstring for the exact meaning of the offsets.

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
    needle records its measured depth. ``context`` is the haystack with the needles inserted and
    starts at ``prompt[context_offset]``; ``needles`` are in order of appearance.
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


# --- the task content: needles, question and answer -------------------------------------------


@dataclass(frozen=True)
class _PlannedNeedle:
    text: str
    depth: float  # requested position in the haystack, 0..1
    answer_part: str | None  # what this needle contributes to the answer; None for distractors


@dataclass(frozen=True)
class _Task:
    instruction: str
    question: str
    needles: tuple[_PlannedNeedle, ...]  # ties at one insertion point keep this order


def _draw(rng: random.Random, make: Callable[[random.Random], str], taken: set[str], haystack: str) -> str:
    """A fresh ``make(rng)``: not drawn before in this example and absent from the haystack text."""
    for _ in range(_DRAW_ATTEMPTS):
        value = make(rng)
        if value not in taken and value not in haystack:
            taken.add(value)
            return value
    raise RuntimeError(f"could not draw a value absent from the haystack in {_DRAW_ATTEMPTS} attempts")


def _number(rng: random.Random) -> str:
    return str(rng.randrange(1_000_000, 10_000_000))


def _key(rng: random.Random) -> str:
    return f"{rng.choice(_ADJECTIVES)}-{rng.choice(_NOUNS)}"


def _variable(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_uppercase) for _ in range(5))


def _magic(key: str, value: str) -> str:
    return f"The special magic number for {key} is: {value}."


def _single_needle(rng: random.Random, depth: float, sizes: TaskSizes, haystack: str) -> _Task:
    taken: set[str] = set()
    key, value = _draw(rng, _key, taken, haystack), _draw(rng, _number, taken, haystack)
    return _Task(
        "A special magic number is hidden in the following text. "
        "Memorize it: a question about it follows the text.",
        f"What is the special magic number for {key} mentioned in the text above?",
        (_PlannedNeedle(_magic(key, value), depth, value),),
    )


def _multi_key(rng: random.Random, depth: float, sizes: TaskSizes, haystack: str) -> _Task:
    taken: set[str] = set()
    pairs = [
        (_draw(rng, _key, taken, haystack), _draw(rng, _number, taken, haystack)) for _ in range(sizes.keys)
    ]
    (key, value), distractors = pairs[0], pairs[1:]
    needles = [_PlannedNeedle(_magic(key, value), depth, value)]
    needles += [_PlannedNeedle(_magic(k, v), rng.random(), None) for k, v in distractors]
    return _Task(
        "Special magic numbers for several keys are hidden in the following text. "
        "Memorize them: a question about one of them follows the text.",
        f"What is the special magic number for {key} mentioned in the text above?",
        tuple(needles),
    )


def _multi_value(rng: random.Random, depth: float, sizes: TaskSizes, haystack: str) -> _Task:
    taken: set[str] = set()
    key = _draw(rng, _key, taken, haystack)
    values = [_draw(rng, _number, taken, haystack) for _ in range(sizes.values)]
    depths = [depth] + [rng.random() for _ in values[1:]]
    return _Task(
        "Several special magic numbers are hidden in the following text. "
        "Memorize them: a question about them follows the text.",
        f"What are all the special magic numbers for {key} mentioned in the text above? "
        "List them in the order they appear.",
        tuple(_PlannedNeedle(_magic(key, v), d, v) for v, d in zip(values, depths)),
    )


def _variable_tracking(rng: random.Random, depth: float, sizes: TaskSizes, haystack: str) -> _Task:
    """The asked chain starts at ``depth`` and continues at random depths after it; distractor chains
    lie anywhere. Each chain's assignments appear in order, so evaluating the context as a program
    gives the asked value to exactly the asked chain."""
    taken: set[str] = set()
    needles: list[_PlannedNeedle] = []
    asked_value = ""
    for chain in range(sizes.chains):
        value = _draw(rng, _number, taken, haystack)
        names = [_draw(rng, _variable, taken, haystack) for _ in range(sizes.hops)]
        if chain == 0:
            asked_value = value
            depths = [depth] + sorted(depth + (1.0 - depth) * rng.random() for _ in names[1:])
        else:
            depths = sorted(rng.random() for _ in names)
        texts = [f"VAR {names[0]} = {value}."] + [f"VAR {b} = VAR {a}." for a, b in itertools.pairwise(names)]
        needles += [
            _PlannedNeedle(text, d, name if chain == 0 else None)
            for text, d, name in zip(texts, depths, names)
        ]
    return _Task(
        "Variable assignments are hidden in the following text. "
        "Memorize them: a question about them follows the text.",
        f"Which variables are assigned the value {asked_value}, directly or through other variables? "
        "List them in the order they are assigned.",
        tuple(needles),
    )


_TASKS: dict[str, Callable[[random.Random, float, TaskSizes, str], _Task]] = {
    "single_needle": _single_needle,
    "multi_key": _multi_key,
    "multi_value": _multi_value,
    "variable_tracking": _variable_tracking,
}


# --- the haystack: real text, gathered by seed and cut to a token length ----------------------


def _shuffled(n: int, rng: random.Random) -> Iterator[int]:
    """A uniformly random permutation of ``range(n)``, drawn lazily (Fisher-Yates over a dict), so
    taking the first few costs nothing for a large ``n``."""
    moved: dict[int, int] = {}
    for i in range(n):
        j = rng.randrange(i, n)
        yield moved.get(j, j)
        moved[j] = moved.get(i, i)


def _pieces(docs: Sequence[HaystackDoc], rng: random.Random) -> Iterator[HaystackDoc]:
    """Haystack text in seed order: the first document from a random sentence boundary on, then whole
    documents, then (only when all else was used) the first document's skipped beginning."""
    order = _shuffled(len(docs), rng)
    first = docs[next(order)]
    match = _BOUNDARY.search(first.text, rng.randrange(len(first.text)))
    start = match.end() if match and match.end() < len(first.text) else 0
    yield HaystackDoc(first.id, first.text[start:])
    for i in order:
        yield docs[i]
    if start:
        yield HaystackDoc(first.id, first.text[:start])


@dataclass(frozen=True)
class _Gathered:
    text: str
    starts: list[int]  # token character spans of ``text``
    ends: list[int]
    boundaries: list[int]  # sentence and line starts in ``text``, 0 included
    doc_starts: list[tuple[int, str]]  # (character offset, id) of each piece


def _gather(docs: Sequence[HaystackDoc], rng: random.Random, tokenizer: Tokenizer, tokens: int) -> _Gathered:
    """At least ``tokens + 1`` tokens of haystack text (fewer only when the documents run out)."""
    pieces = _pieces(docs, rng)
    parts: list[str] = []
    doc_starts: list[tuple[int, str]] = []
    length = 0
    exhausted = False
    want = 4 * tokens + 64  # characters; corrected from the observed characters per token
    while True:
        while length < want and not exhausted:
            piece = next(pieces, None)
            if piece is None:
                exhausted = True
                break
            if parts:
                parts.append(_DOC_SEPARATOR)
                length += len(_DOC_SEPARATOR)
            doc_starts.append((length, piece.id))
            parts.append(piece.text)
            length += len(piece.text)
        text = "".join(parts)[:want]
        encoding = tokenizer.encode(text, add_special_tokens=False)
        if len(encoding.ids) > tokens or (exhausted and len(text) == length):
            break
        want = int(want * (tokens + 1) / max(1, len(encoding.ids)) * 1.1) + 64
    return _Gathered(
        text,
        [s for s, _ in encoding.offsets],
        [e for _, e in encoding.offsets],
        [0] + [m.end() for m in _BOUNDARY.finditer(text)],
        doc_starts,
    )


def _cut(gathered: _Gathered, tokens: int) -> int:
    """Character length of a haystack of at most ``tokens`` tokens, ending at a sentence or line start
    when one is near, else after whitespace when one is near, else at the token boundary."""
    end = gathered.ends[min(tokens, len(gathered.ends)) - 1]
    tolerance = max(1, int(end * _SNAP_FRACTION))
    i = bisect.bisect_right(gathered.boundaries, end) - 1
    if end - gathered.boundaries[i] <= tolerance and gathered.boundaries[i] > 0:
        return gathered.boundaries[i]
    low = max(0, end - tolerance)
    space = max(gathered.text.rfind(" ", low, end), gathered.text.rfind("\n", low, end))
    return space + 1 if space >= 0 else end


def _snap(text: str, boundaries: list[int], pos: int) -> int:
    """The sentence or line start nearest ``pos`` (``boundaries`` sorted, holding 0 and ``len(text)``);
    the nearest whitespace when no boundary is within the snap tolerance; else ``pos`` itself."""
    tolerance = max(1, int(len(text) * _SNAP_FRACTION))
    i = bisect.bisect_left(boundaries, pos)
    nearest = min(boundaries[max(0, i - 1) : i + 1], key=lambda b: (abs(b - pos), b))
    if abs(nearest - pos) <= tolerance:
        return nearest
    low = max(0, pos - tolerance)
    back = max(text.rfind(" ", low, pos), text.rfind("\n", low, pos))
    ahead = [
        p for p in (text.find(" ", pos, pos + tolerance), text.find("\n", pos, pos + tolerance)) if p >= 0
    ]
    candidates = ([back + 1] if back >= 0 else []) + ([min(ahead) + 1] if ahead else [])
    return min(candidates, key=lambda b: (abs(b - pos), b)) if candidates else pos


@dataclass(frozen=True)
class _Draft:
    prompt: str
    context: str
    context_offset: int
    needle_chars: list[tuple[int, int]]  # (character offset in prompt, planned index), in order of appearance
    haystack_ids: tuple[str, ...]
    token_starts: list[int]
    token_ends: list[int]


def _compose(task: _Task, gathered: _Gathered, cut: int, tokenizer: Tokenizer) -> _Draft:
    """The prompt with the haystack ``gathered.text[:cut]`` and the needles inserted into it."""
    haystack = gathered.text[:cut]
    n_tokens = bisect.bisect_right(gathered.ends, cut)
    boundaries = gathered.boundaries[: bisect.bisect_left(gathered.boundaries, cut)] + [cut]
    places = []
    for index, needle in enumerate(task.needles):
        token = round(needle.depth * n_tokens)
        pos = gathered.starts[token] if token < n_tokens else cut
        places.append((_snap(haystack, boundaries, pos), index))
    places.sort()
    head = task.instruction + "\n\n"
    parts: list[str] = []
    needle_chars: list[tuple[int, int]] = []
    length, previous, last = 0, 0, "\n"
    for pos, index in places:
        before = haystack[previous:pos]
        last = before[-1] if before else last
        lead = "" if last.isspace() else " "
        sep = "" if pos == cut else ("\n" if pos > 0 and haystack[pos - 1] == "\n" else " ")
        text = task.needles[index].text + sep
        needle_chars.append((len(head) + length + len(before) + len(lead), index))
        parts += [before, lead, text]
        length += len(before) + len(lead) + len(text)
        previous, last = pos, text[-1]
    parts.append(haystack[previous:])
    context = "".join(parts)
    prompt = f"{head}{context}\n\n{task.question}\n{ANSWER_CUE}"
    ids = tuple(dict.fromkeys(doc_id for start, doc_id in gathered.doc_starts if start < cut))
    encoding = tokenizer.encode(prompt, add_special_tokens=False)
    return _Draft(
        prompt,
        context,
        len(head),
        needle_chars,
        ids,
        [s for s, _ in encoding.offsets],
        [e for _, e in encoding.offsets],
    )


def _token_at(ends: list[int], char: int) -> int:
    """Index of the token whose span holds character ``char`` (the first token ending after it)."""
    return bisect.bisect_right(ends, char)


def build_example(
    haystack: Sequence[str | HaystackDoc],
    tokenizer: Tokenizer,
    context_tokens: int,
    depth: float,
    seed: int,
    kind: TaskKind,
    sizes: TaskSizes = TaskSizes(),
) -> Example:
    """One task of ``kind`` whose prompt holds at most ``context_tokens`` tokens (without special tokens).

    ``depth`` (0 = start, 1 = end of the context) places the asked needle: the needle itself for
    ``single_needle`` and ``multi_key``, the first-drawn value for ``multi_value`` and the asked
    chain's first assignment for ``variable_tracking``; other needles get depths drawn from the seed.
    The haystack is cut with the tokenizer so the prompt comes as close to the budget as sentence
    boundaries allow (typically within a few percent). Raises ``ValueError`` for a bad kind or depth,
    a budget too small for the instruction, question and needles, or too little haystack text.
    """
    if kind not in _TASKS:
        raise ValueError(f"unknown task kind {kind!r}; expected one of {', '.join(TASK_KINDS)}")
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must lie in [0, 1], got {depth}")
    docs = as_haystack(haystack)
    if not docs:
        raise ValueError("no haystack text: every haystack document is empty")
    gathered = _gather(docs, random.Random(derive_seed(seed, "haystack")), tokenizer, context_tokens)
    task = _TASKS[kind](random.Random(derive_seed(seed, "task")), depth, sizes, gathered.text)
    fixed = sum(
        len(enc.ids)
        for enc in tokenizer.encode_batch(
            [f"{task.instruction}\n\n\n\n{task.question}\n{ANSWER_CUE}"]
            + [n.text + " " for n in task.needles],
            add_special_tokens=False,
        )
    )
    target = context_tokens - fixed
    if target < 1:
        raise ValueError(
            f"context_tokens={context_tokens} leaves no room for haystack text: the instruction, "
            f"question and {plural(len(task.needles), 'needle')} of {kind} take about {fixed} tokens"
        )
    if len(gathered.ends) < target:
        raise ValueError(
            f"the haystack documents hold {len(gathered.ends)} tokens, fewer than the {target} needed "
            f"for context_tokens={context_tokens}"
        )
    best: _Draft | None = None
    tried: set[int] = set()
    while True:
        cut = _cut(gathered, min(target, len(gathered.ends)))
        if cut not in tried:
            tried.add(cut)
            draft = _compose(task, gathered, cut, tokenizer)
            size = len(draft.token_ends)
            if size <= context_tokens and (best is None or size > len(best.token_ends)):
                best = draft
            if best is not None and (size == context_tokens or len(tried) >= _FIT_ROUNDS):
                return _finish(best, task, kind, seed, depth, context_tokens)
            step = context_tokens - size
        elif best is not None:  # no new haystack length to try
            return _finish(best, task, kind, seed, depth, context_tokens)
        else:  # this length was already too long
            step = -1
        target += step
        if target < 1:
            raise ValueError(f"context_tokens={context_tokens} is too small to fit any haystack text")


def _finish(
    draft: _Draft, task: _Task, kind: TaskKind, seed: int, depth: float, context_tokens: int
) -> Example:
    """Token offsets, measured depths and the answer of a composed prompt."""
    ends = draft.token_ends
    first = _token_at(ends, draft.context_offset)
    context_span = bisect.bisect_left(draft.token_starts, draft.context_offset + len(draft.context)) - first
    tokens = [_token_at(ends, char) for char, _ in draft.needle_chars]
    spans = [
        _token_at(ends, char + len(task.needles[index].text) - 1) + 1 - token
        for (char, index), token in zip(draft.needle_chars, tokens)
    ]
    haystack_tokens = max(1, context_span - sum(spans))
    needles = []
    answer_parts = []
    for i, ((char, index), token) in enumerate(zip(draft.needle_chars, tokens)):
        planned = task.needles[index]
        before = token - first - sum(spans[:i])  # haystack tokens ahead of this needle
        measured = round(min(1.0, max(0.0, before / haystack_tokens)), 6)
        needles.append(Needle(planned.text, char, token, measured, planned.answer_part is not None))
        if planned.answer_part is not None:
            answer_parts.append(planned.answer_part)
    return Example(
        kind=kind,
        seed=seed,
        depth=float(depth),
        context_tokens=context_tokens,
        prompt_tokens=len(draft.token_ends),
        context=draft.context,
        context_offset=draft.context_offset,
        question=task.question,
        answer=", ".join(answer_parts),
        prompt=draft.prompt,
        needles=tuple(needles),
        haystack_ids=draft.haystack_ids,
    )


def make_grid(
    haystack_texts: Sequence[str | HaystackDoc],
    tokenizer: Tokenizer,
    lengths: Sequence[int],
    depths: Sequence[float],
    seed: int,
    kind: TaskKind,
    sizes: TaskSizes = TaskSizes(),
) -> list[Example]:
    """One example per (length, depth), lengths outer, for evaluation.

    The examples of one length share their seed (derived from ``seed``, ``kind`` and the length), so
    they hold the same haystack, keys and values and differ only in where the needles sit.
    """
    return [
        build_example(haystack_texts, tokenizer, n, d, derive_seed(seed, kind, n), kind, sizes)
        for n in lengths
        for d in depths
    ]
