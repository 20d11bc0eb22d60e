"""Pass-key retrieval, after Mohtashami and Jaggi (2023, "Landmark Attention", arXiv:2305.16300),
the test that Position Interpolation (Chen et al., 2023, arXiv:2306.15595) and YaRN (Peng et al.,
2023, arXiv:2309.00071) use to show that a RoPE model reads past its pretraining length after
extension: a random number hidden in filler text that repeats, asked for after it.

The filler is four plain sentences repeated in turn, so it carries no information and a small model
predicts it after little training: what is left to learn, and to measure, is finding the number at
any distance. The context is ``n`` filler sentences with the pass-key sentence between two of them,
as many as the token budget allows (searched with the tokenizer,
:func:`~longctx.pipeline.synthetic.example.largest_fitting`). The pass key sits after filler sentence
``round(depth * n)``, so depth 0 puts it first and depth 1 last; its measured depth is the fraction
of the context's filler tokens that come before it. There is no haystack text.
"""

from __future__ import annotations

import bisect
import random

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
    "A pass key is hidden in the text below, among sentences that repeat. "
    "Find it and remember it: a question about it follows the text."
)
FILLER = (
    "The river runs to the sea.",
    "The hills are quiet at dawn.",
    "The wind moves through the trees.",
    "Night follows day, and day follows night.",
)
QUESTION = "What is the pass key?"


def _needle(key: str) -> str:
    return f"The pass key is {key}. Remember it: {key} is the pass key."


def passkey_prompt(repeats: int, place: int, key: str) -> str:
    """The prompt of a ``passkey`` task: the instruction, ``repeats`` filler sentences (the four in
    turn) with the pass-key sentence after the first ``place`` of them, the question and the answer
    cue."""
    parts = [FILLER[i % len(FILLER)] for i in range(repeats)]
    parts.insert(place, _needle(key))
    return f"{INSTRUCTION}\n\n{' '.join(parts)}\n\n{QUESTION}\n{ANSWER_CUE}"


def build_passkey_example(
    tokenizer: Tokenizer,
    context_tokens: int,
    depth: float,
    seed: int,
    kind: TaskKind,
    sizes: TaskSizes,
) -> Example:
    """A ``passkey`` task whose prompt holds at most ``context_tokens`` tokens (without special
    tokens), within one filler sentence of it; the key is a 5-digit number drawn from ``seed``. ``kind``
    (``passkey``) and ``sizes`` (none apply) are taken for the signature common to the builders
    without haystack text. Deterministic in its arguments. Raises
    :class:`~longctx.pipeline.synthetic.example.ContextSizeError` when the budget cannot hold the
    instruction, the pass-key sentence, one filler sentence and the question."""
    key = str(random.Random(derive_seed(seed, "key")).randrange(10_000, 100_000))

    def size(n: int) -> int:
        prompt = passkey_prompt(n, round(depth * n), key)
        return len(tokenizer.encode(prompt, add_special_tokens=False).ids)

    fixed = len(tokenizer.encode(passkey_prompt(0, 0, key), add_special_tokens=False).ids)
    n = largest_fitting(size, context_tokens, fixed)
    if n == 0:
        raise ContextSizeError(
            f"context_tokens={context_tokens} is too small for passkey: the instruction, the pass key, "
            f"one filler sentence and the question take {size(1)} tokens"
        )
    place = round(depth * n)
    prompt = passkey_prompt(n, place, key)
    head = len(INSTRUCTION) + 2
    context = prompt[head : prompt.index(f"\n\n{QUESTION}")]
    needle_text = _needle(key)
    char = head + sum(len(FILLER[i % len(FILLER)]) + 1 for i in range(place))
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
        question=QUESTION,
        answer=key,
        prompt=prompt,
        needles=(Needle(needle_text, char, token, measured, True),),
        haystack_ids=(),
        answer_items=(key,),
    )
