"""JSON key-value retrieval, after HELMET's JSON KV task (Yen et al., 2025, from the key-value
retrieval of Liu et al., 2024): the context is data, not prose, and the answer a random string that
no model can guess.

The context is one JSON object on one line, ``{"<key>": "<value>", ...}``, whose keys and values are
random UUIDs (version-4 form, drawn from the seed); the question names one key, and the answer is its
value. The object holds as many pairs as the token budget allows (the count is searched with the
tokenizer, :func:`~longctx.pipeline.synthetic.example.largest_fitting`). The asked pair is the
needle: of the ``n`` pairs it is number ``round(depth * (n - 1))``, so depth 0 puts it first and
depth 1 last, and its measured depth is the fraction of the context's other tokens that come before
it. There is no haystack text: the other pairs are the haystack. A seed's pairs are the first ``n``
of one stream (the first one asked), so the examples of one grid length, which share their seed,
hold the same pairs and differ only in where the asked one sits.
"""

from __future__ import annotations

import bisect
import json
import random
import uuid
from collections.abc import Sequence

from tokenizers import Tokenizer

from longctx.pipeline.synthetic.example import (
    ANSWER_CUE,
    ContextSizeError,
    Example,
    Needle,
    TaskSizes,
    derive_seed,
    largest_fitting,
)
from longctx.pipeline.synthetic.kinds import TaskKind

INSTRUCTION = (
    "A JSON object of keys and values follows. "
    "Memorize it: a question about the value of one of its keys follows the object."
)


def _pair(key: str, value: str) -> str:
    return f"{json.dumps(key)}: {json.dumps(value)}"


def _question(key: str) -> str:
    return f"What is the value of the key {json.dumps(key)} in the JSON object above?"


def _object(pairs: Sequence[tuple[str, str]]) -> str:
    return "{" + ", ".join(_pair(k, v) for k, v in pairs) + "}"


def json_kv_prompt(pairs: Sequence[tuple[str, str]], key: str) -> str:
    """The prompt of a ``json_kv`` task: the instruction, the object of ``pairs`` in their order,
    the question about ``key`` and the answer cue."""
    return f"{INSTRUCTION}\n\n{_object(pairs)}\n\n{_question(key)}\n{ANSWER_CUE}"


def _uuid(rng: random.Random) -> str:
    return str(uuid.UUID(int=rng.getrandbits(128), version=4))


def build_json_kv_example(
    tokenizer: Tokenizer,
    context_tokens: int,
    depth: float,
    seed: int,
    kind: TaskKind,
    sizes: TaskSizes,
) -> Example:
    """A ``json_kv`` task whose prompt holds at most ``context_tokens`` tokens (without special
    tokens), within one pair of it. ``kind`` (``json_kv``) and ``sizes`` (none apply) are taken for
    the signature common to the builders without haystack text. Deterministic in its arguments.
    Raises ``ValueError`` when the budget cannot hold the instruction, the question and one pair."""
    stream = random.Random(derive_seed(seed, "pairs"))
    pairs: list[tuple[str, str]] = []

    def layout(n: int) -> tuple[list[tuple[str, str]], int]:
        """The first ``n`` pairs of the stream, the asked (first) one moved to its depth's place."""
        while len(pairs) < n:
            pairs.append((_uuid(stream), _uuid(stream)))
        place = round(depth * (n - 1))
        others = pairs[1:n]
        return others[:place] + [pairs[0]] + others[place:], place

    def size(n: int) -> int:
        return len(tokenizer.encode(json_kv_prompt(layout(n)[0], pairs[0][0]), add_special_tokens=False).ids)

    fixed = len(tokenizer.encode(json_kv_prompt([], ""), add_special_tokens=False).ids)
    n = largest_fitting(size, context_tokens, fixed)
    if n == 0:
        raise ContextSizeError(
            f"context_tokens={context_tokens} is too small for json_kv: the instruction, the question and "
            f"one key-value pair take {size(1)} tokens"
        )
    ordered, place = layout(n)
    key, value = pairs[0]
    prompt = json_kv_prompt(ordered, key)
    head = len(INSTRUCTION) + 2
    context = _object(ordered)
    needle_text = _pair(key, value)
    char = head + 1 + sum(len(_pair(k, v)) + 2 for k, v in ordered[:place])
    encoding = tokenizer.encode(prompt, add_special_tokens=False)
    starts, ends = [s for s, _ in encoding.offsets], [e for _, e in encoding.offsets]
    first = bisect.bisect_right(ends, head)
    token = bisect.bisect_right(ends, char)
    span = bisect.bisect_right(ends, char + len(needle_text) - 1) + 1 - token
    others = bisect.bisect_left(starts, head + len(context)) - first - span
    measured = round(min(1.0, max(0.0, (token - first) / max(1, others))), 6)
    return Example(
        kind=kind,
        seed=seed,
        depth=float(depth),
        context_tokens=context_tokens,
        prompt_tokens=len(encoding.ids),
        context=context,
        context_offset=head,
        question=_question(key),
        answer=value,
        prompt=prompt,
        needles=(Needle(needle_text, char, token, measured, True),),
        haystack_ids=(),
        answer_items=(value,),
    )
