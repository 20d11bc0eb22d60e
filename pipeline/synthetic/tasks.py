"""Synthetic long-context tasks: needles hidden in real curated text, for training and evaluation.

Task kinds, after RULER (Hsieh et al., 2024):

* ``single_needle``: one ``The special magic number for <key> is: <value>.`` sentence; the question
  asks for the key's value.
* ``multi_key``: several such sentences with distinct keys; the question asks for one key, the
  others are distractors.
* ``multi_value``: one key inserted several times with different values; the answer lists every
  value in the order they appear in the context.
* ``variable_tracking``: chains of assignments (``VAR QXJZT = 4819302.``, later
  ``VAR KWMRA = VAR QXJZT.``, ...) scattered through the context, one chain asked about and the
  others distractors; the answer is the asked chain's variables in assignment order.
* ``multi_query``: several magic-number sentences with distinct keys, all asked at once; the answer
  lists the values in the order the question names the keys.
* ``document_qa``: the haystack is passages of the curated documents (about an eighth of the
  context each, between 400 and 4000 characters, from random sentence boundaries), labelled
  ``Document 1:``, ``Document 2:``, ...; a natural-language fact about an invented entity (``Vera
  Tolimak was born in the town of Kelubury.``) is planted in one of them, and facts of the same
  form about other entities (with other values) as distractors; the question, after all the
  documents, names the entity and asks for the value.
* ``common_words`` and ``frequent_words``: aggregation over a list of invented words, without
  haystack text (``longctx.pipeline.synthetic.words``).

After HELMET (Yen et al., 2025) and NoLiMa (Modarressi et al., 2025), three kinds a base model can
be scored on without instruction tuning:

* ``json_kv``: the value of one key of a JSON object of random UUID keys and values, without
  haystack text (``longctx.pipeline.synthetic.jsonkv``).
* ``icl_labels``: many-shot in-context learning, inputs labelled by arbitrary invented words; the
  last input's label is asked; without haystack text (``longctx.pipeline.synthetic.icl``).
* ``nolima_needle``: one fact about an invented character (``Vera Tolimak lives next to the Semper
  Opera House.``) hidden in the text; the question names what the fact implies (``Which character
  has been to Dresden?``) and shares no content word with it, and the answer is the character
  (``longctx.pipeline.synthetic.associations``).

After Mohtashami and Jaggi (2023), the test with which Position Interpolation and YaRN show extension:

* ``passkey``: a 5-digit number in filler sentences that repeat, without haystack text
  (``longctx.pipeline.synthetic.passkey``); the question asks for it.

How each kind is scored is ``longctx.pipeline.synthetic.checkers``.

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
import itertools
import random
import re
import string
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from tokenizers import Tokenizer

from longctx.pipeline.synthetic.associations import RELATIONS
from longctx.pipeline.synthetic.example import (
    ANSWER_CUE,
    DEFAULT_SOURCE,
    ContextSizeError,
    Example,
    HaystackDoc,
    Needle,
    TaskSizes,
    as_haystack,
    derive_seed,
)
from longctx.pipeline.synthetic.icl import build_icl_example
from longctx.pipeline.synthetic.jsonkv import build_json_kv_example
from longctx.pipeline.synthetic.kinds import LIST_KINDS, TASK_KINDS, TaskKind
from longctx.pipeline.synthetic.names import (
    ADJECTIVES,
    NOUNS,
    person_name,
    pet_name,
    place_name,
    society_name,
)
from longctx.pipeline.synthetic.passkey import build_passkey_example
from longctx.pipeline.synthetic.words import build_list_example

__all__ = [
    "ANSWER_CUE",
    "DEFAULT_SOURCE",
    "TASK_KINDS",
    "ContextSizeError",
    "Example",
    "HaystackDoc",
    "Needle",
    "TaskKind",
    "TaskSizes",
    "as_haystack",
    "build_example",
    "derive_seed",
    "make_grid",
]
from longctx.core.text import plural

_DOC_SEPARATOR = "\n\n"
# Where a new sentence or line starts: after . ! or ? (and closing quotes or brackets) plus
# whitespace, or after a line break. The match's end is the boundary; whitespace always precedes it.
_BOUNDARY = re.compile(r"(?<=[.!?])[\"'\u2019\u201d)\]]*\s+|\n\s*")
_SNAP_FRACTION = 0.05  # a boundary is used when it lies within this fraction of the haystack's length
_FIT_ROUNDS = 6  # most haystack lengths tokenized to get the prompt close to the budget
_DRAW_ATTEMPTS = 1000
_MIN_PASSAGE_CHARS, _MAX_PASSAGE_CHARS = 400, 4000  # document_qa's passages


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
    # the answer's items in the order the question asks for them; None: the targets' answer parts in
    # order of appearance
    answer_items: tuple[str, ...] | None = None
    choices: tuple[str, ...] = ()  # Example.choices


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
    return f"{rng.choice(ADJECTIVES)}-{rng.choice(NOUNS)}"


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


def _multi_query(rng: random.Random, depth: float, sizes: TaskSizes, haystack: str) -> _Task:
    """The first-named key's needle sits at ``depth``, the others at depths drawn from the seed."""
    taken: set[str] = set()
    keys = [_draw(rng, _key, taken, haystack) for _ in range(sizes.queries)]
    pairs = [(key, _draw(rng, _number, taken, haystack)) for key in keys]
    depths = [depth] + [rng.random() for _ in pairs[1:]]
    named = ", ".join(keys[:-1]) + f" and {keys[-1]}" if len(keys) > 1 else keys[0]
    values = tuple(v for _, v in pairs)
    return _Task(
        "Special magic numbers for several keys are hidden in the following text. "
        "Memorize them: a question about them follows the text.",
        f"What are the special magic numbers for {named} mentioned in the text above? "
        "List them in the order of the keys in this question.",
        tuple(_PlannedNeedle(_magic(k, v), d, v) for (k, v), d in zip(pairs, depths)),
        answer_items=values,
        choices=values,
    )


# (entity, value, fact, question): ``{e}`` the entity, ``{v}`` the value
_RELATIONS: tuple[tuple[Callable[[random.Random], str], Callable[[random.Random], str], str, str], ...] = (
    (person_name, place_name, "{e} was born in the town of {v}.", "In which town was {e} born?"),
    (person_name, pet_name, "{e} has a cat named {v}.", "What is the name of the cat that {e} has?"),
    (society_name, person_name, "The {e} was founded by {v}.", "Who founded the {e}?"),
)


def _document_qa(rng: random.Random, depth: float, sizes: TaskSizes, haystack: str) -> _Task:
    """One relation drawn from the seed; the asked fact at ``depth``, distractor facts of the same
    relation about other entities (with other values) at depths drawn from the seed."""
    entity, value, fact, question = rng.choice(_RELATIONS)
    taken: set[str] = set()
    pairs = [
        (_draw(rng, entity, taken, haystack), _draw(rng, value, taken, haystack)) for _ in range(sizes.facts)
    ]
    asked, answer = pairs[0]
    depths = [depth] + [rng.random() for _ in pairs[1:]]
    return _Task(
        "Read the following documents: a question about them follows.",
        f"Answer the question from the documents above. {question.format(e=asked)}",
        tuple(
            _PlannedNeedle(fact.format(e=e, v=v), d, v if i == 0 else None)
            for i, ((e, v), d) in enumerate(zip(pairs, depths))
        ),
        answer_items=(answer,),
        choices=tuple(v for _, v in pairs),
    )


def _nolima_needle(rng: random.Random, depth: float, sizes: TaskSizes, haystack: str) -> _Task:
    """One fact about an invented character at ``depth``, from a relation, templates and an
    ``(item, place)`` pair drawn from the seed; the question names the place."""
    relation = rng.choice(RELATIONS)
    item, place = rng.choice(relation.pairs)
    name = _draw(rng, person_name, set(), haystack)
    fact = rng.choice(relation.facts).format(name=name, item=item)
    return _Task(
        "A fact about a character is hidden in the following text. "
        "Memorize it: a question about it follows the text.",
        rng.choice(relation.questions).format(place=place),
        (_PlannedNeedle(fact, depth, name),),
    )


_TASKS: dict[str, Callable[[random.Random, float, TaskSizes, str], _Task]] = {
    "single_needle": _single_needle,
    "multi_key": _multi_key,
    "multi_value": _multi_value,
    "variable_tracking": _variable_tracking,
    "multi_query": _multi_query,
    "document_qa": _document_qa,
    "nolima_needle": _nolima_needle,
}
# the kinds built without haystack text, each by its own module
_TEXTLESS: dict[str, Callable[[Tokenizer, int, float, int, TaskKind, TaskSizes], Example]] = {
    "common_words": build_list_example,
    "frequent_words": build_list_example,
    "icl_labels": build_icl_example,
    "json_kv": build_json_kv_example,
    "passkey": build_passkey_example,
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


def _passages(docs: Sequence[HaystackDoc], rng: random.Random, chars: int) -> Iterator[HaystackDoc]:
    """Passages of about ``chars`` characters for ``document_qa``: documents in seed order, each
    one passage from a random sentence boundary to the first boundary ``chars`` characters on
    (a shorter document whole); then further rounds with new random passages, until as many
    characters as the documents hold have been given."""
    total, given = sum(len(d.text) for d in docs), 0
    while given < total:
        before = given
        for i in _shuffled(len(docs), rng):
            text = docs[i].text
            start = 0
            if len(text) > chars:
                match = _BOUNDARY.search(text, rng.randrange(len(text) - chars))
                start = match.end() if match and match.end() < len(text) else 0
            match = _BOUNDARY.search(text, start + chars)
            passage = text[start : match.end() if match else len(text)].strip()
            if passage:
                given += len(passage)
                yield HaystackDoc(docs[i].id, passage)
            if given >= total:
                return
        if given == before:  # nothing but white space
            return


@dataclass(frozen=True)
class _Gathered:
    text: str
    starts: list[int]  # token character spans of ``text``
    ends: list[int]
    boundaries: list[int]  # sentence and line starts in ``text``, 0 included
    doc_starts: list[tuple[int, str]]  # (character offset, id) of each piece


def _gather(
    docs: Sequence[HaystackDoc],
    rng: random.Random,
    tokenizer: Tokenizer,
    tokens: int,
    passage_chars: int | None = None,
) -> _Gathered:
    """At least ``tokens + 1`` tokens of haystack text (fewer only when the documents run out).
    With ``passage_chars``, the pieces are :func:`_passages` and each starts with ``Document <k>:``
    on a line of its own."""
    labelled = passage_chars is not None
    pieces = _passages(docs, rng, passage_chars) if passage_chars is not None else _pieces(docs, rng)
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
            body = f"Document {len(doc_starts)}:\n{piece.text}" if labelled else piece.text
            parts.append(body)
            length += len(body)
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


def _passage_chars(context_tokens: int) -> int:
    """``document_qa``'s passage length: about an eighth of the context (at about 4 characters a
    token), between 400 and 4000 characters, so that a context holds several documents."""
    return min(_MAX_PASSAGE_CHARS, max(_MIN_PASSAGE_CHARS, 4 * context_tokens // 8))


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
    ``single_needle`` and ``multi_key``, the first-drawn value for ``multi_value``, the asked
    chain's first assignment for ``variable_tracking``, the first-named key's needle for
    ``multi_query``, the asked fact for ``document_qa`` and the one fact of ``nolima_needle``; other
    needles get depths drawn from the seed. The haystack is cut with the tokenizer so the prompt
    comes as close to the budget as sentence boundaries allow (typically within a few percent). The
    word-list kinds (``common_words``, ``frequent_words``) and ``icl_labels`` use neither the
    haystack nor the depth (:func:`longctx.pipeline.synthetic.words.build_list_example`,
    :func:`longctx.pipeline.synthetic.icl.build_icl_example`); ``json_kv`` uses the depth for the
    asked pair but no haystack (:func:`longctx.pipeline.synthetic.jsonkv.build_json_kv_example`), and
    ``passkey`` for the pass key among its filler sentences
    (:func:`longctx.pipeline.synthetic.passkey.build_passkey_example`).
    Raises ``ValueError`` for a bad kind or depth, a budget too small for the instruction, question
    and needles, or too little haystack text.
    """
    if kind not in _TASKS and kind not in _TEXTLESS:
        raise ValueError(f"unknown task kind {kind!r}; expected one of {', '.join(TASK_KINDS)}")
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"depth must lie in [0, 1], got {depth}")
    if kind in _TEXTLESS:
        return _TEXTLESS[kind](tokenizer, context_tokens, depth, seed, kind, sizes)
    docs = as_haystack(haystack)
    if not docs:
        raise ValueError("no haystack text: every haystack document is empty")
    gathered = _gather(
        docs,
        random.Random(derive_seed(seed, "haystack")),
        tokenizer,
        context_tokens,
        passage_chars=_passage_chars(context_tokens) if kind == "document_qa" else None,
    )
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
        raise ContextSizeError(
            f"context_tokens={context_tokens} leaves no room for haystack text: the instruction, "
            f"question and {plural(len(task.needles), 'needle')} of {kind} take about {fixed} tokens"
        )
    if len(gathered.ends) < target:
        raise ContextSizeError(
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
            raise ContextSizeError(f"context_tokens={context_tokens} is too small to fit any haystack text")


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
    items = task.answer_items if task.answer_items is not None else tuple(answer_parts)
    return Example(
        kind=kind,
        seed=seed,
        depth=float(depth),
        context_tokens=context_tokens,
        prompt_tokens=len(draft.token_ends),
        context=draft.context,
        context_offset=draft.context_offset,
        question=task.question,
        answer=", ".join(items),
        prompt=draft.prompt,
        needles=tuple(needles),
        haystack_ids=draft.haystack_ids,
        answer_items=items,
        choices=task.choices,
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
    they hold the same haystack, keys and values and differ only in where the needles sit. The kinds
    without depth (``kinds.LIST_KINDS``: the word lists and ``icl_labels``) take the depth into
    their seed too, so each cell of a length is an independent list rather than the same one
    repeated.
    """
    return [
        build_example(
            haystack_texts,
            tokenizer,
            n,
            d,
            derive_seed(seed, kind, n, d) if kind in LIST_KINDS else derive_seed(seed, kind, n),
            kind,
            sizes,
        )
        for n in lengths
        for d in depths
    ]
