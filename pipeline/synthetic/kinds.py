"""The names of the synthetic task kinds, in one place: the task builders, the checkers and the
``curate.synthetic.kinds`` / ``eval.needle.kinds`` settings all use them (this module imports
nothing heavy, so configs can).

- Retrieval of needles hidden in real text, scored by an exact answer: ``single_needle``,
  ``multi_key``, ``multi_value``, ``variable_tracking``.
- Scored by the fraction of expected items retrieved (``longctx.pipeline.synthetic.checkers``):
  ``multi_query`` (several needles asked at once), ``document_qa`` (a fact planted in one of the
  curated documents), and the aggregation tasks ``common_words`` and ``frequent_words`` (a list of
  invented words, no haystack text and no needle depth).
- Scored by a whole value (``checkers.score_value``), after HELMET (Yen et al., 2025) and NoLiMa
  (Modarressi et al., 2025), all scorable on base models: ``json_kv`` (the value of one key of a
  JSON object of random keys and values, no haystack text), ``icl_labels`` (many-shot in-context
  learning: inputs labelled by arbitrary words, the last input's label asked; no haystack text and
  no needle depth) and ``nolima_needle`` (a fact hidden in real text, asked by a question that
  shares no content word with it); and ``passkey`` (Mohtashami and Jaggi, 2023: a number in
  filler sentences that repeat, no haystack text; the test Position Interpolation and YaRN report).
"""

from __future__ import annotations

from typing import Literal, get_args

TaskKind = Literal[
    "single_needle",
    "multi_key",
    "multi_value",
    "variable_tracking",
    "multi_query",
    "document_qa",
    "common_words",
    "frequent_words",
    "json_kv",
    "icl_labels",
    "nolima_needle",
    "passkey",
]
TASK_KINDS: tuple[TaskKind, ...] = get_args(TaskKind)
# curate.synthetic's default: the retrieval kinds
DEFAULT_KINDS: tuple[TaskKind, ...] = ("single_needle", "multi_key", "multi_value", "variable_tracking")
# kinds scored by the fraction of expected items in the generation (the others: exact answer prefix)
RECALL_KINDS: frozenset[TaskKind] = frozenset(
    {"multi_query", "document_qa", "common_words", "frequent_words"}
)
# kinds without haystack text or needles: their prompt is a list (of words, or of labelled inputs),
# and depth plays no part
LIST_KINDS: frozenset[TaskKind] = frozenset({"common_words", "frequent_words", "icl_labels"})
# kinds scored by the whole expected value (an opening quote tolerated, a longer word refused): their
# answers (random values, invented labels and names) may begin other words
VALUE_KINDS: frozenset[TaskKind] = frozenset({"json_kv", "icl_labels", "nolima_needle", "passkey"})
