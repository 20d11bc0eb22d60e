"""The datatrove stage that builds synthetic long-context tasks as one more curated source.

:class:`SyntheticTasks` takes curated documents as haystack and emits task documents (the pure
builders are ``longctx.pipeline.synthetic.tasks``); :func:`synthetic_pipeline` reads the curated
documents and writes the tasks in the curated layout (``<output>/documents/synthetic/<rank>.parquet``),
where the packer mixes them by ``pack.mix`` like any other source (long-context recipes give retrieval
tasks about 20%).
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterable, Sequence
from pathlib import Path

from datatrove.data import Document, DocumentsPipeline
from datatrove.pipeline.base import PipelineStep
from tokenizers import Tokenizer

from longctx.core.errors import ConfigError
from longctx.core.layout import RunLayout
from longctx.core.tokenizer import load_tokenizer
from longctx.pipeline.config import SyntheticConfig
from longctx.pipeline.docstore import CuratedDocumentReader, DocumentWriter
from longctx.pipeline.synthetic.kinds import DEFAULT_KINDS
from longctx.pipeline.synthetic.tasks import (
    DEFAULT_SOURCE,
    TASK_KINDS,
    ContextSizeError,
    Example,
    HaystackDoc,
    TaskKind,
    TaskSizes,
    build_example,
    derive_seed,
)


def example_document(
    example: Example, tokenizer: Tokenizer, doc_id: str, source: str = DEFAULT_SOURCE
) -> Document:
    """The training document of ``example``: text ``prompt + " " + answer`` and metadata with
    consistent types (``task``, ``answer``, ``question``: str; ``needle_positions``: list[int] of
    token offsets; ``needle_depths``: list[float]; ``needle_is_target``: list[bool]; ``depth``:
    float, requested; ``context_tokens``: int, requested; ``prompt_tokens``: int; ``haystack_ids``:
    list[str]; ``token_count``: int, tokens of the text without special tokens; ``source``: str)."""
    text = example.training_text
    return Document(
        text=text,
        id=doc_id,
        metadata={
            "source": source,
            "task": example.kind,
            "answer": example.answer,
            "question": example.question,
            "needle_positions": [n.token_offset for n in example.needles],
            "needle_depths": [float(n.depth) for n in example.needles],
            "needle_is_target": [n.target for n in example.needles],
            "depth": float(example.depth),
            "context_tokens": int(example.context_tokens),
            "prompt_tokens": int(example.prompt_tokens),
            "haystack_ids": list(example.haystack_ids),
            "token_count": len(tokenizer.encode(text, add_special_tokens=False).ids),
        },
    )


class SyntheticTasks(PipelineStep):
    """Emits synthetic long-context task documents built on the curated documents it receives.

    Input: the incoming ``DocumentsPipeline`` is consumed as haystack (typically the curated
    documents, see :func:`synthetic_pipeline`); documents of ``source`` itself
    (an earlier synthetic run) and empty ones are ignored, and reading stops once
    ``max_haystack_chars`` characters are held. Output: only the synthetic documents, ``n_examples``
    per task kind in total over all ranks; rank ``r`` of ``world_size`` builds the examples with
    indices ``r, r + world_size, ...``, so ranks never repeat each other. Example ``i`` of a kind has
    id ``<source>/<kind>/<seed>/<i>``, its seed derived from ``(seed, kind, i)``, and a context length
    and depth drawn from that seed (a depth uniform in [0, 1] when ``depths`` is None).

    ``context_tokens`` bounds the prompt; the document adds a space and the answer (a few dozen
    tokens at most with the default sizes) and the packer adds BOS/EOS, so choose lengths a little
    below the packing window to keep each task whole in one window (``token_count`` is exact).
    """

    type = "🧪 - SYNTHETIC"
    name = "🪡 Synthetic tasks"

    def __init__(
        self,
        tokenizer_path: str | os.PathLike,
        n_examples: int,
        context_tokens: int | Sequence[int],
        kinds: Sequence[TaskKind] = DEFAULT_KINDS,
        depths: Sequence[float] | None = None,
        seed: int = 0,
        source: str = DEFAULT_SOURCE,
        sizes: TaskSizes = TaskSizes(),
        max_haystack_chars: int = 64_000_000,
    ) -> None:
        super().__init__()
        lengths = [context_tokens] if isinstance(context_tokens, int) else list(context_tokens)
        unknown = [k for k in kinds if k not in TASK_KINDS]
        if unknown or not kinds:
            raise ValueError(
                f"kinds must be a non-empty subset of {', '.join(TASK_KINDS)}; got {list(kinds)}"
            )
        if n_examples < 0 or not lengths or min(lengths) < 1:
            raise ValueError("n_examples must be >= 0 and context_tokens positive")
        if depths is not None and (not depths or any(not 0.0 <= d <= 1.0 for d in depths)):
            raise ValueError(f"depths must be a non-empty list of values in [0, 1], got {depths}")
        self.tokenizer_path = Path(tokenizer_path)
        self.n_examples = n_examples
        self.lengths = lengths
        self.kinds = list(kinds)
        self.depths = None if depths is None else [float(d) for d in depths]
        self.seed = seed
        self.source = source
        self.sizes = sizes
        self.max_haystack_chars = max_haystack_chars

    def run(self, data: DocumentsPipeline = None, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        indices = range(rank, self.n_examples, world_size)
        if not indices:
            return
        haystack = self._haystack(data)
        if not haystack:
            raise ValueError(
                f"{self.name}: rank {rank} received no haystack documents; give it curated documents "
                "(run with at most as many tasks as there are curated files)"
            )
        tokenizer = load_tokenizer(self.tokenizer_path)
        for kind in self.kinds:
            for index in indices:
                with self.track_time():
                    context_tokens, depth = self.shape(kind, index)
                    try:
                        example = build_example(
                            haystack,
                            tokenizer,
                            context_tokens,
                            depth,
                            derive_seed(self.seed, kind, index),
                            kind,
                            self.sizes,
                        )
                    except ContextSizeError as err:  # a user's length: one line naming its key
                        raise ConfigError(f"curate.synthetic.context_tokens: {err}") from None
                    doc = example_document(
                        example, tokenizer, f"{self.source}/{kind}/{self.seed}/{index}", self.source
                    )
                self.stat_update(kind)
                self.stat_update("tokens", value=doc.metadata["token_count"])
                self.update_doc_stats(doc)
                yield doc

    def shape(self, kind: TaskKind, index: int) -> tuple[int, float]:
        """Context length and depth of example ``index`` of ``kind``, drawn from its seed."""
        rng = random.Random(derive_seed(self.seed, kind, index, "shape"))
        length = rng.choice(self.lengths)
        return length, (rng.choice(self.depths) if self.depths is not None else rng.random())

    def _haystack(self, data: DocumentsPipeline) -> list[HaystackDoc]:
        docs: list[HaystackDoc] = []
        chars = 0
        for doc in data or ():
            if not doc.text or doc.metadata.get("source") == self.source:
                continue
            docs.append(HaystackDoc(doc.id, doc.text))
            self.stat_update("haystack_documents")
            chars += len(doc.text)
            if chars >= self.max_haystack_chars:
                break
        return docs


def write_synthetic_documents(
    documents: Iterable[Document], output: str | os.PathLike, rank: int = 0, source: str = DEFAULT_SOURCE
) -> Path:
    """Write synthetic documents into the curated layout, ``<output>/documents/<source>/<rank:05d>.parquet``,
    with :class:`~longctx.pipeline.docstore.DocumentWriter`, so the packer picks them up as source ``source``.

    Returns the file's path (not created when ``documents`` is empty). Refuses documents of another source.
    """
    folder = RunLayout(Path(output)).documents / source
    with DocumentWriter(folder) as writer:
        for doc in documents:
            if doc.metadata.get("source") != source:
                raise ValueError(
                    f"document {doc.id} has source {doc.metadata.get('source')!r}, not {source!r}"
                )
            writer.write(doc, rank)
    return folder / f"{rank:05d}.parquet"


def synthetic_pipeline(output: str | os.PathLike, tasks: SyntheticTasks) -> list[PipelineStep]:
    """The steps that build the synthetic source of a curated ``output`` folder, for any datatrove
    executor: read the curated documents as haystack, run ``tasks`` and write
    ``<output>/documents/<tasks.source>/<rank>.parquet``. Use at most as many executor tasks as there
    are curated files, since each rank's haystack is its share of the files."""
    documents = RunLayout(Path(output)).documents
    return [CuratedDocumentReader(documents), tasks, DocumentWriter(documents / tasks.source)]


def synthetic_tasks(cfg: SyntheticConfig, tokenizer_path: Path, target: int) -> SyntheticTasks:
    """The step that ``curate.synthetic`` describes; prompts default to ``target - 64`` tokens, which
    leaves room for the answer and the packer's special tokens in a window of ``target``."""
    return SyntheticTasks(
        tokenizer_path,
        n_examples=cfg.n_examples,
        context_tokens=cfg.context_tokens or [target - 64],
        kinds=cfg.kinds,
        depths=cfg.depths,
        seed=cfg.seed,
        source=cfg.source,
    )
