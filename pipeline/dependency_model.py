"""The model-based long-range dependency score of each curated document (``curate.dependency.model``),
in the manner of ProLong-data (Chen et al. 2024, "Long Context is Not Long at All"): how much a causal
LM's loss on later segments of a document falls when it also reads the distant text before them.

A document of N tokens (in the model's tokenizer) has K = ``model_segments`` segments of
S = ``model_segment_tokens`` tokens scored, their starts evenly spaced from min(C, N - S) to N - S,
C being the context (``model_context_tokens``): every segment has C tokens before it, or, in a document
shorter than C + S, everything before it. Each segment is read twice, the model's loss counted on the
segment's tokens only:

- the short view: the L = ``model_local_tokens`` tokens just before the segment, then the segment;
- the long view: the C tokens before it (the distant text, then the same local text), then the segment.

With ``loss_short`` and ``loss_long`` the mean loss per segment token over the K segments (nats), the
document's score, stored as ``metadata["dependency_model"]``, is the relative fall

    dependency_model = (loss_short - loss_long) / loss_short

0 when the distant text does not help (and for a document of at most L + S tokens, which has none),
toward 1 when it makes the segments predictable, below 0 when it misleads. It is normalized for
length: per token; relative to the segments' own difficulty (code and prose compare); from the same
number of segments, each with the same context, whatever the document's length (a document twice as
long neither adds up more segments nor gives them more to read).

The text is read in the model's own tokenizer when its folder has one (the run's token ids, in the
run's tokenizer, may differ); a model folder without one must read the run's tokenizer, whose token ids
the documents already carry (checked: the run's vocabulary fits the model's). Views of equal length
are batched (``model_batch_size``), on a GPU where there is one (``model_device``); the model is loaded
once per process. The step runs in the ``read`` stage, resumed as every stage is: tasks that
completed are not run again.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from datatrove.data import Document, DocumentsPipeline
from datatrove.pipeline.base import PipelineStep
from datatrove.utils.batching import batched

from longctx.core.config import TokenizerConfig
from longctx.core.errors import ConfigError
from longctx.core.executors import concurrent_tasks
from longctx.core.tokenizer import TokenizerFiles, load_tokenizer
from longctx.pipeline.causal_lm import (
    CausalLMInfo,
    inspect_causal_lm,
    load_causal_lm,
    load_model_tokenizer,
    locate_model,
    model_fingerprint,
)
from longctx.pipeline.config import CurateConfig, DependencyConfig
from longctx.pipeline.tokens import tokenizer_threads

KEY = "curate.dependency"
METADATA_KEY = "dependency_model"
"""The document metadata the score is stored under."""
DEFAULT_CONTEXT_TOKENS = 4096
"""The context when ``model_context_tokens`` is null (fewer when the model has fewer positions)."""


@dataclass(frozen=True)
class ScoreSettings:
    """The lengths of the views (tokens) and how many are read at once."""

    segment: int
    local: int
    context: int
    segments: int
    batch_size: int


def score_settings(dependency: DependencyConfig, info: CausalLMInfo) -> ScoreSettings:
    """The settings of ``dependency`` against the model's positions (its ``max_position_embeddings``):
    the context defaults to :data:`DEFAULT_CONTEXT_TOKENS`, fewer when the model has fewer positions,
    and a long view (context, segment and a BOS token) must fit them. A :class:`ConfigError` naming the
    key when it cannot, or when the local context is not shorter than the whole one."""
    segment = dependency.model_segment_tokens
    limit = None if info.max_positions is None else info.max_positions - segment - 1
    if dependency.model_context_tokens is not None:
        context = dependency.model_context_tokens
        if limit is not None and context > limit:
            raise ConfigError(
                f"{KEY}.model_context_tokens: {context}, a segment of {segment} tokens "
                f"(model_segment_tokens) and a BOS token exceed the model's {info.max_positions} positions "
                "(max_position_embeddings)"
            )
    else:
        context = DEFAULT_CONTEXT_TOKENS if limit is None else min(DEFAULT_CONTEXT_TOKENS, limit)
        if context < 1:
            raise ConfigError(
                f"{KEY}.model_segment_tokens: {segment} tokens and a BOS token leave no context within the "
                f"model's {info.max_positions} positions (max_position_embeddings)"
            )
    if dependency.model_local_tokens >= context:
        raise ConfigError(
            f"{KEY}.model_local_tokens: {dependency.model_local_tokens} is not below the context of "
            f"{context} tokens (model_context_tokens): the long view would read no distant text"
        )
    return ScoreSettings(
        segment=segment,
        local=dependency.model_local_tokens,
        context=context,
        segments=dependency.model_segments,
        batch_size=dependency.model_batch_size,
    )


def segment_starts(n_tokens: int, settings: ScoreSettings) -> list[int]:
    """Where the scored segments of a document of ``n_tokens`` start: ``settings.segments`` starts evenly
    spaced from min(context, n - segment) to n - segment (fewer where they coincide); none when the
    document has no text beyond the local context of its last segment."""
    last = n_tokens - settings.segment
    if last <= settings.local:
        return []
    first = min(settings.context, last)
    return sorted({round(x) for x in np.linspace(first, last, settings.segments)})


def document_views(
    ids: np.ndarray, settings: ScoreSettings, bos: int | None
) -> list[tuple[np.ndarray, np.ndarray]]:
    """The (short, long) views of each scored segment of the document ``ids``, the segment last in each,
    with ``bos`` before both when the model has one."""
    head = np.array([] if bos is None else [bos], dtype=np.int64)
    ids = np.asarray(ids, dtype=np.int64)
    views = []
    for start in segment_starts(len(ids), settings):
        end = start + settings.segment
        short = ids[max(0, start - settings.local) : end]
        long = ids[max(0, start - settings.context) : end]
        views.append((np.concatenate([head, short]), np.concatenate([head, long])))
    return views


def relative_fall(short_losses: Sequence[float], long_losses: Sequence[float]) -> float:
    """``(loss_short - loss_long) / loss_short`` of the mean losses of a document's segments; 0 without
    segments (or without loss to fall)."""
    if not short_losses:
        return 0.0
    short, long = float(np.mean(short_losses)), float(np.mean(long_losses))
    return (short - long) / short if short > 0 else 0.0


def segment_losses(
    model: Any, views: Sequence[np.ndarray], settings: ScoreSettings, device: str
) -> list[float]:
    """The model's mean loss (nats per token) on the last ``settings.segment`` tokens of each view, in the
    order given: views of equal length are read together, ``settings.batch_size`` at a time, and the
    model computes logits for those tokens only where it can (``logits_to_keep``)."""
    import torch
    import torch.nn.functional as F

    keep = settings.segment + 1  # the logits before each segment token: the last segment + 1, less the last
    kwargs: dict[str, Any] = {"use_cache": False}
    if "logits_to_keep" in inspect.signature(model.forward).parameters:
        kwargs["logits_to_keep"] = keep
    losses = [0.0] * len(views)
    order = sorted(range(len(views)), key=lambda i: len(views[i]))
    batches: list[list[int]] = []
    for i in order:
        if batches and len(batches[-1]) < settings.batch_size and len(views[batches[-1][0]]) == len(views[i]):
            batches[-1].append(i)
        else:
            batches.append([i])
    with torch.inference_mode():
        for batch in batches:
            tokens = torch.from_numpy(np.stack([views[i] for i in batch])).to(device)
            logits = model(input_ids=tokens, **kwargs).logits[:, -keep:-1].float()
            targets = tokens[:, -settings.segment :]
            nll = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none").mean(dim=1)
            for i, value in zip(batch, nll.tolist(), strict=True):
                losses[i] = value
    return losses


def score_documents(
    model: Any, documents: Sequence[np.ndarray], settings: ScoreSettings, device: str, bos: int | None
) -> list[float]:
    """The score of each document (its token ids in the model's vocabulary), rounded to 6 decimals, its
    views batched with those of the other documents."""
    views = [document_views(ids, settings, bos) for ids in documents]
    flat = [view for pairs in views for pair in pairs for view in pair]
    losses = iter(segment_losses(model, flat, settings, device))
    scores = []
    for pairs in views:
        short, long = [], []
        for _ in pairs:
            short.append(next(losses))
            long.append(next(losses))
        scores.append(round(relative_fall(short, long), 6))
    return scores


class DependencyModelScore(PipelineStep):
    """Sets ``metadata["dependency_model"]`` (:data:`METADATA_KEY`) of every document to its score (see
    the module), a batch of documents at a time.

    ``model_folder`` is a checked local folder (:func:`~longctx.pipeline.causal_lm.inspect_causal_lm`);
    ``run_tokenizer`` is None when the model reads its own tokenizer, else the run's ``tokenizer.json``,
    whose ids the documents carry as ``metadata["token_ids"]`` (encoded here when they do not).
    ``device`` is ``model_device`` (resolved in each task); ``threads``, when set, the CPU threads of
    each task (the cores shared by the tasks that run at once)."""

    type = "📊 - STATS"
    name = "🔭 Dependency (model)"

    def __init__(
        self,
        model_folder: str | Path,
        settings: ScoreSettings,
        *,
        device: str = "auto",
        run_tokenizer: str | Path | None = None,
        threads: int | None = None,
    ) -> None:
        super().__init__()
        self.model_folder = str(model_folder)
        self.settings = settings
        self.device = device
        self.run_tokenizer = None if run_tokenizer is None else Path(run_tokenizer)
        self.threads = threads

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        if not data:
            return
        scorer = None
        for group in batched(data, self.settings.batch_size):
            if scorer is None:
                scorer = self._scorer(rank)
            with self.track_time(unit="batch"):
                ids = scorer.token_ids(group)
                scores = score_documents(scorer.model, ids, self.settings, scorer.device, scorer.bos)
            for doc, doc_ids, score in zip(group, ids, scores, strict=True):
                doc.metadata[METADATA_KEY] = score
                scored = len(segment_starts(len(doc_ids), self.settings))
                self.stat_update("scored_segments", value=scored)
                if not scored:
                    self.stat_update("no_distant_text")
                yield doc

    def _scorer(self, rank: int) -> _Scorer:
        import torch

        device = resolve_device(self.device, rank)
        if self.threads is not None and device == "cpu":
            torch.set_num_threads(self.threads)
        model = load_causal_lm(self.model_folder, device)
        if self.run_tokenizer is not None:
            return _Scorer(model, device, None, run_tokenizer=load_tokenizer(self.run_tokenizer))
        tokenizer = load_model_tokenizer(self.model_folder)
        return _Scorer(model, device, tokenizer.bos_token_id, model_tokenizer=tokenizer)


@dataclass
class _Scorer:
    """What a task scores with: the model on its device, its BOS id, and the tokenizer of its ids."""

    model: Any
    device: str
    bos: int | None
    model_tokenizer: Any = None
    run_tokenizer: Any = None

    def token_ids(self, documents: Sequence[Document]) -> list[np.ndarray]:
        """The documents' ids in the model's vocabulary: their text in the model's tokenizer, else the
        run's ids they carry (or their text encoded with the run's tokenizer)."""
        if self.model_tokenizer is not None:
            texts = [doc.text for doc in documents]
            encoded = self.model_tokenizer(texts, add_special_tokens=False, verbose=False)["input_ids"]
            return [np.asarray(ids, dtype=np.int64) for ids in encoded]
        found = [doc.metadata.get("token_ids") for doc in documents]
        missing = [i for i, ids in enumerate(found) if ids is None]
        if missing:
            encodings = self.run_tokenizer.encode_batch(
                [documents[i].text for i in missing], add_special_tokens=False
            )
            for i, encoding in zip(missing, encodings, strict=True):
                found[i] = encoding.ids
        return [np.asarray(ids, dtype=np.int64) for ids in found]


def resolve_device(device: str, rank: int = 0) -> str:
    """The torch device of ``model_device`` (``auto``, ``cpu`` or ``cuda``) for task ``rank``: ``auto``
    is a GPU when torch sees one, else the CPU; the tasks of one machine take its GPUs in turn (``rank``
    modulo their count). A :class:`ConfigError` for ``cuda`` where torch sees no GPU."""
    import torch

    if device == "cpu" or (device == "auto" and not torch.cuda.is_available()):
        return "cpu"
    if not torch.cuda.is_available():
        raise ConfigError(f"{KEY}.model_device: cuda, but torch sees no GPU here")
    return f"cuda:{rank % torch.cuda.device_count()}"


def check_dependency_model(
    curate: CurateConfig, tokenizer: TokenizerConfig, files: TokenizerFiles | None
) -> None:
    """Refuse, before a run writes anything, a ``curate.dependency`` model that cannot score: one that
    cannot be found or loaded (:func:`~longctx.pipeline.causal_lm.inspect_causal_lm`), lengths that
    do not fit it (:func:`score_settings`), its own tokenizer unreadable, or, without one, a run
    tokenizer (``files``, or the one curation trains from ``tokenizer``) with more tokens than the
    model has embeddings; ``cuda`` without a GPU for a local run. Nothing when no model is set."""
    dependency = curate.dependency
    if dependency.model is None:
        return
    info = inspect_causal_lm(dependency.model, f"{KEY}.model")
    score_settings(dependency, info)
    if not info.has_tokenizer:
        vocab = tokenizer.train_vocab_size
        if files is not None:
            vocab = load_tokenizer(files.tokenizer).get_vocab_size()
        if vocab > info.vocab_size:
            raise ConfigError(
                f"{KEY}.model: {info.folder} has no tokenizer, so it reads the run's token ids, but the "
                f"run's tokenizer has {vocab} tokens and the model {info.vocab_size} (vocab_size): put the "
                "model's tokenizer in its folder"
            )
    if curate.executor.kind == "local":
        resolve_device(dependency.model_device)


def dependency_model_steps(curate: CurateConfig, tokenizer_path: Path) -> list[PipelineStep]:
    """The read stage's scoring step (:class:`DependencyModelScore`) for the run's model, put after the
    token-length filter; none when ``curate.dependency.model`` is unset. ``tokenizer_path`` is the
    run's tokenizer, which a model folder without its own reads."""
    dependency = curate.dependency
    if dependency.model is None:
        return []
    info = inspect_causal_lm(dependency.model, f"{KEY}.model")
    running = concurrent_tasks(curate.executor, curate.executor.tasks)
    step = DependencyModelScore(
        info.folder,
        score_settings(dependency, info),
        device=dependency.model_device,
        run_tokenizer=None if info.has_tokenizer else tokenizer_path,
        threads=tokenizer_threads(running) if running > 1 else None,
    )
    return [step]


def dependency_model_identity(dependency: DependencyConfig) -> dict[str, Any]:
    """What of ``dependency`` decides the stored scores, for the run's identity: the model (its name and
    :func:`~longctx.pipeline.causal_lm.model_fingerprint`), the view lengths and the device (a GPU reads
    in bfloat16). Empty when no model is set, so that runs recorded without one resume as before."""
    if dependency.model is None:
        return {}
    return {
        METADATA_KEY: {
            "model": dependency.model,
            "files_sha256": model_fingerprint(locate_model(dependency.model)),
            "segment_tokens": dependency.model_segment_tokens,
            "local_tokens": dependency.model_local_tokens,
            "context_tokens": dependency.model_context_tokens,
            "segments": dependency.model_segments,
            "device": dependency.model_device,
        }
    }
