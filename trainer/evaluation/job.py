"""``longctx eval`` as a function: score each model of ``eval.models`` on the same windows (loss by
position), the same needles and the same held-out short windows, and write tables, JSON and one plot
per metric (a line or a panel per model) into a new folder ``<output>/eval/<NNN>``: an evaluation
never replaces an earlier one.

From the needle results it reports each model's effective context length
(``longctx.trainer.evaluation.effective``: each model held to a threshold from its own score at the
shortest length, or an absolute one) and its score per task and length, each with its count and
95% interval; every item's question, answer and generation go to ``needle.json`` and the prompts,
once for every model, to ``needle_prompts.jsonl.gz``. From the short windows, the short-context
guard (``longctx.trainer.evaluation.short_context``: loss on windows of documents no training row
holds, as a ratio to the baseline model's). The ``eval.baseline`` model is evaluated whenever the
guard needs it, even when ``eval.models`` (or ``--model``) leaves it out.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from longctx.core.atomic import new_numbered_folder, write_json, write_text
from longctx.core.config import ContextConfig
from longctx.core.errors import ConfigError
from longctx.core.layout import RunLayout
from longctx.core.preflight import check_output_folder
from longctx.core.remote import is_remote
from longctx.pipeline.documents import document_files, read_column, source_of
from longctx.trainer.config import (
    MODEL_KEYWORDS,
    EvalConfig,
    NeedleEvalConfig,
    TrainConfig,
    check_base_model,
    missing_local_shards,
)
from longctx.trainer.evaluation.effective import effective_lengths, task_scores
from longctx.trainer.models.files import CONFIG_NAME, is_model_folder
from longctx.trainer.stage_plan import final_model, training_shards

if TYPE_CHECKING:
    from longctx.packer.dataset import PackedDataset
    from longctx.packer.format import TokenizerInfo
    from longctx.trainer.evaluation.short_context import GuardWindows
    from longctx.trainer.models.interface import TrainedModel

T = TypeVar("T")


def _haystack(documents: Path, limit_chars: int) -> list[str]:
    """Curated texts to hide needles in: books first, then other sources, in file order."""
    if not documents.is_dir():
        return []
    files = sorted(document_files(documents), key=lambda f: (source_of(documents, f) != "books", str(f)))
    texts, total = [], 0
    for f in files:
        for text in read_column(f, "text").to_pylist():
            texts.append(text)
            total += len(text)
            if total >= limit_chars:
                return texts
    return texts


def eval_documents(eval: EvalConfig, layout: RunLayout, train: TrainConfig | None) -> Path | None:
    """The folder ``eval.documents`` names (None when it is not set): a local folder as it is, a URL
    copied into the cache (``train.cache``, default ``<output>/cache``) with
    :func:`longctx.core.remote.fetch_folder`. ``ConfigError`` naming the key when a URL holds no
    file."""
    from longctx.core.remote import cache_folder, fetch_folder

    if eval.documents is None:
        return None
    if not is_remote(eval.documents):
        return Path(eval.documents.removeprefix("file://"))
    cache = (train.cache if train and train.cache else None) or layout.cache
    storage = eval.storage_options or (train.storage_options if train else None)
    folder = fetch_folder(eval.documents, cache_folder(eval.documents, cache), storage_options=storage)
    if folder is None:
        raise ConfigError(f"eval.documents: no file under {eval.documents}")
    return folder


def _location(shards: str | Path) -> str | Path:
    """A shard folder as a comparable value: a URL as it is, a local folder as a :class:`Path`."""
    return shards if is_remote(shards) else Path(shards)


@dataclass(frozen=True)
class ModelSpec:
    """One model to evaluate: its label in tables and plots, and where it comes from."""

    label: str
    source: str  # "base", or a Hugging Face checkpoint folder
    path: Path | None


def resolve_models(models: list[str], layout: RunLayout, train: TrainConfig | None) -> list[ModelSpec]:
    """``eval.models`` as :class:`ModelSpec` s, checked before any work: ``trained`` must exist (a
    staged run's is its last stage's model), ``base`` needs the run's train section, and every
    checkpoint folder must be readable whole (``folder.check_model_folder``)."""
    check_base_model(models, train)
    specs = []
    trained = final_model(layout, train)
    for model in models:
        if model == "base":
            assert train is not None  # check_base_model
            path = train.model.hf_path
            specs.append(
                ModelSpec("base", str(path) if path else f"train.model.tiny (seed {train.seed})", None)
            )
        elif model == "trained":
            if not is_model_folder(trained):
                raise ConfigError(
                    f"eval.models: no trained model at {trained} (train first, or list Hugging "
                    "Face checkpoint folders with --model)"
                )
            specs.append(ModelSpec("trained", str(trained), trained))
        else:
            specs.append(ModelSpec(Path(model).name or model, model, Path(model)))
    from longctx.trainer.models.files import check_model_folder

    for folder in [s.path for s in specs if s.path is not None] + (
        [train.model.hf_path] if "base" in models and train and train.model.hf_path else []
    ):
        check_model_folder(folder)  # a truncated or damaged folder, in one line naming the file
    names = [s.label for s in specs]
    return [ModelSpec(s.source, s.source, s.path) if names.count(s.label) > 1 else s for s in specs]


def with_baseline(
    specs: list[ModelSpec], baseline: str, layout: RunLayout, train: TrainConfig | None
) -> tuple[list[ModelSpec], str]:
    """``specs`` with the ``eval.baseline`` model appended when it is not among them, and its label.
    ``ConfigError`` when ``baseline`` is neither a label of ``specs``, a keyword, nor a checkpoint
    folder."""
    labels = [s.label for s in specs]
    if baseline in labels:
        return specs, baseline
    if baseline not in MODEL_KEYWORDS and not is_model_folder(baseline):
        raise ConfigError(
            f"eval.baseline: {baseline!r} is not a label of the evaluated models ({', '.join(labels)}), "
            f"{' nor '.join(MODEL_KEYWORDS)}, nor a Hugging Face checkpoint folder"
        )
    (added,) = resolve_models([baseline], layout, train)
    match = next((s for s in specs if s.source == added.source), None)
    if match is not None:  # the same model under another label
        return specs, match.label
    return [*specs, added], added.label


def released_base(train: TrainConfig) -> TrainConfig:
    """``train`` with its model as released: without the run's ``train.model.rope_scaling`` and
    ``rope_theta`` overrides (the checkpoint's own RoPE; the tiny model's defaults). The short-context
    guard compares with it, since the rescaled base is already a changed model."""
    model = train.model.model_copy(update={"rope_scaling": None, "rope_theta": None})
    return train.model_copy(update={"model": model})


def released_loss(
    train: TrainConfig,
    context: ContextConfig,
    vocab_size: int,
    device: torch.device,
    windows: Any,
    bf16: bool,
    known: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The released base's (:func:`released_base`) loss on the guard's ``windows``, as
    ``short_context.window_loss`` gives it. ``known`` is the rescaled base's, reused when the run
    overrides no RoPE setting (the two are then the same model)."""
    from longctx.trainer.build import base_model
    from longctx.trainer.evaluation.short_context import window_loss

    same = train.model.rope_scaling is None and train.model.rope_theta is None
    if same and known is not None:
        return known
    model = base_model(released_base(train), context, vocab_size, device)
    try:
        return window_loss(model, windows, device, bf16)
    finally:
        del model


def load_model_spec(
    spec: ModelSpec, train: TrainConfig | None, context: ContextConfig, vocab_size: int, device: torch.device
) -> TrainedModel:
    """The model of ``spec`` on ``device``: a checkpoint folder, run by the implementation
    ``train.model.implementation`` picks for it (``interface.load_folder``), or ``base`` built from
    ``train`` (``build.base_model``)."""
    from longctx.trainer.build import base_model
    from longctx.trainer.models.interface import load_folder

    if spec.path is not None:
        implementation = train.model.implementation if train is not None else "auto"
        return load_folder(spec.path, implementation=implementation, device=device)
    assert train is not None  # resolve_models refuses 'base' without a train section
    return base_model(train, context, vocab_size, device)


@dataclass(frozen=True)
class Windows:
    """The packed windows scored for loss by position: the held-out ones first."""

    dataset: PackedDataset
    shards: str | Path
    indices: list[int]
    held_out: int
    """How many of :attr:`indices` are windows training set aside (``train.holdout_rows``)."""
    rows: list[dict[str, torch.Tensor]]
    training: int = 0
    """How many of :attr:`indices` are windows training read (``eval.allow_training_windows``)."""

    def caption(self) -> str:
        """A line saying the scored windows include training windows ('' when none do)."""
        if not self.training:
            return ""
        return (
            f"{self.training} of these {len(self.indices)} windows are training windows "
            "(eval.allow_training_windows): the trained model's loss on them is a training loss\n"
        )


@dataclass(frozen=True)
class Needles:
    """The needle examples every model is scored on, and how their answers are tokenized and end."""

    config: NeedleEvalConfig
    tokenizer: Any
    examples: list[Any]
    eos: list[int]


@dataclass(frozen=True)
class Guard:
    """The short-context guard's windows, or why it was skipped (``eval.short_context`` set)."""

    windows: GuardWindows | None
    skipped: str | None = None


@dataclass(frozen=True)
class Scores:
    """Each model's results, by label in the order the models were given; ``baseline`` is the
    label of ``eval.baseline``'s model and ``added`` the labels evaluated only because a measure
    needed them."""

    sources: dict[str, str]
    losses: dict[str, list[dict[str, Any]]]
    needles: dict[str, list[Any]]
    short: dict[str, dict[str, Any]]
    baseline: str = "base"
    added: list[str] = field(default_factory=list)
    released: dict[str, Any] | None = None
    """The released base's loss on the guard's windows (:func:`released_base`), when measured."""


def run_eval(
    eval: EvalConfig,
    *,
    context: ContextConfig,
    output: Path,
    train: TrainConfig | None = None,
    tokenizer: Path | None = None,
    documents: Path | None = None,
) -> dict[str, Any]:
    """Evaluate every model of ``eval.models`` and return what was written.

    ``documents`` are the curated documents needles are hidden in (default ``<output>/documents``;
    the copy of ``pack.input`` when the run packed a published curation).

    ``train`` is the run's training section, when it has one: it defines the ``base`` model, its
    shards are the default windows to score, and its held-out windows are scored first.
    ``tokenizer`` is the configured ``tokenizer.path``, used when the run folder holds no
    ``tokenizer.json``.
    """
    layout = RunLayout(output)
    check_output_folders(eval, layout, train)
    specs = resolve_models(eval.models, layout, train)
    listed = [s.label for s in specs]
    baseline = eval.baseline
    if eval.short_context is not None:  # the ratio needs the baseline
        specs, baseline = with_baseline(specs, eval.baseline, layout, train)
    tokenizer_path = layout.tokenizer_file(tokenizer)
    documents = eval_documents(eval, layout, train) or documents or layout.documents
    windows = choose_windows(eval, layout, context.target, train, tokenizer_path)
    check_vocabularies(specs, train, windows)
    needles = None  # the same needles for every model, built before any model is loaded
    if eval.needle is not None:
        needles = build_needles(eval.needle, tokenizer_path, documents)
    info = windows.dataset.shards.manifest.header.tokenizer
    guard = choose_short_windows(eval, context, layout, train, documents, tokenizer_path, info)
    started = time.monotonic()
    scores = score_models(specs, windows, needles, guard, eval, train, context)
    added = [s.label for s in specs if s.label not in listed]
    scores = replace(scores, baseline=baseline, added=added)
    folder = write_evaluation(layout, eval, windows, needles, guard, scores, context, started)
    return _result(folder)


def check_output_folders(eval: EvalConfig, layout: RunLayout, train: TrainConfig | None) -> None:
    """Refuse, before any work, an evaluation whose ``<output>/eval`` (or cache, when the windows or
    ``eval.documents`` come from a URL) is a file, read-only or cannot be created: one line naming
    the path."""
    check_output_folder(layout.eval, key="output")
    shards = eval.shards or (train.shards if train else None)
    if any(url is not None and is_remote(url) for url in (shards, eval.documents)):
        cache = train.cache if train and train.cache else None
        check_output_folder(cache or layout.cache, key="train.cache" if cache else "output")


def choose_windows(
    eval: EvalConfig, layout: RunLayout, target: int, train: TrainConfig | None, tokenizer: Path | None
) -> Windows:
    """``eval.rows`` windows of ``eval.shards`` (default: the training shards): when these are the
    training windows (the same folder, or shards with the same files and checksums elsewhere), the
    ones training held out; other shards' windows in epoch 0's order of ``eval.seed``.

    Too few held-out windows are refused (``ConfigError``) when a model this run trained is scored,
    since its loss on windows it trained on is not a held-out loss, unless
    ``eval.allow_training_windows`` lets training windows fill the rest, counted in
    :attr:`Windows.training` and labelled as such in the results."""
    from longctx.packer.dataset import PackedDataset

    if eval.shards is None and train is not None and (problem := missing_local_shards(train.shards)):
        raise ConfigError(f"train.shards: {problem}")  # the windows scored by default
    trained_on = layout.training_shards(train.shards if train else None, target)
    shards = eval.shards or trained_on
    storage = eval.storage_options or (train.storage_options if train else None)
    training_windows = _same_windows(shards, trained_on, storage, train.storage_options if train else None)
    holdout = train.holdout_rows if train and training_windows else 0
    # the held-out draw depends on the training seed: use it, so these are the rows training skipped
    seed = train.seed if train and training_windows else eval.seed
    dataset = PackedDataset(
        _location(shards),
        tokenizer=tokenizer,
        seed=seed,
        holdout_rows=holdout,
        cache=(train.cache if train else None) or layout.cache,
        storage_options=storage,
    )
    held_out = dataset.heldout_rows()[: eval.rows]
    missing = eval.rows - len(held_out) if training_windows else 0
    if missing and not eval.allow_training_windows and _scores_a_model_trained_here(eval.models, layout):
        options = [f"lower eval.rows to {len(held_out)}"] if held_out else []
        options += [
            "set train.holdout_rows (before training)",
            "point eval.shards at windows training did not see",
            "set eval.allow_training_windows: true to score training windows, labelled as such",
        ]
        raise ConfigError(
            f"eval.rows = {eval.rows}, but {shards} are the training windows and hold {len(held_out)} that "
            f"training did not see (train.holdout_rows = {holdout}): the trained model would be scored on "
            f"windows it trained on; {', '.join(options[:-1])} or {options[-1]}"
        )
    indices = held_out + [int(i) for i in dataset.order(0)[: eval.rows - len(held_out)]]
    windows = Windows(
        dataset, shards, indices, len(held_out), [dataset[i] for i in indices], training=missing
    )
    if missing:
        print(windows.caption(), end="", flush=True)
    return windows


def check_vocabularies(specs: list[ModelSpec], train: TrainConfig | None, windows: Windows) -> None:
    """Refuse, before any model is loaded, a checkpoint folder (``base``'s too) whose embedding has
    fewer rows than the shards' vocabulary, whose token ids it could not read: one line naming the
    folder and both sizes, as training refuses such shards (``train.check_vocabulary``)."""
    from longctx.trainer.models import interface
    from longctx.trainer.models.files import config_json

    vocab_size = windows.dataset.shards.manifest.header.tokenizer.vocab_size
    folders = [s.path for s in specs if s.path is not None]
    if train is not None and train.model.hf_path is not None and any(s.path is None for s in specs):
        folders.append(train.model.hf_path)
    implementation = train.model.implementation if train is not None else "auto"
    for folder in folders:
        rows, embedding = interface.from_hf(config_json(folder), implementation).input_embedding
        if rows < vocab_size:
            raise ConfigError(
                f"{folder}: the model's {embedding} has {rows} rows, fewer than the {vocab_size} tokens of "
                f"the vocabulary of the shards it would be scored on ({windows.shards}); evaluate it on "
                "shards packed with its tokenizer (eval.shards) or in a run that uses it"
            )


def _same_windows(shards: str | Path, trained_on: str | Path, storage: Any, train_storage: Any) -> bool:
    """Whether ``shards`` hold the training windows: the same folder or URL (however spelled), or a
    copy of it (a manifest listing the same files with the same checksums)."""
    from longctx.core.errors import LongctxError
    from longctx.packer.manifest import load_manifest

    if _comparable(shards) == _comparable(trained_on):
        return True
    try:
        theirs = load_manifest(trained_on, train_storage)
        ours = load_manifest(shards, storage)
    except (LongctxError, OSError):
        return False  # the training shards are gone (or unreadable): nothing to compare with
    return ours.shards == theirs.shards


def _comparable(shards: str | Path) -> str | Path:
    """A URL without its trailing slash, a local folder resolved (relative or through a link)."""
    return str(shards).rstrip("/") if is_remote(shards) else Path(shards).resolve()


def _scores_a_model_trained_here(models: list[str], layout: RunLayout) -> bool:
    """Whether ``eval.models`` names a model this run trained: ``trained``, or a folder under
    ``<output>/train`` (an export of a checkpoint)."""
    train = layout.train.resolve()
    return any(
        model == "trained" or (model != "base" and Path(model).resolve().is_relative_to(train))
        for model in models
    )


def choose_short_windows(
    eval: EvalConfig,
    context: ContextConfig,
    layout: RunLayout,
    train: TrainConfig | None,
    documents: Path,
    tokenizer: Path | None,
    info: TokenizerInfo,
) -> Guard | None:
    """The short-context guard's windows (None when ``eval.short_context`` is not set): from the
    curated documents of its source that no training row holds (every shard folder the run trains
    on, read from the rows' ``doc_id``). A source with no such document is reported (printed, and
    written to the summary) and the guard skipped."""
    from longctx.core.tokenizer import load_tokenizer
    from longctx.trainer.evaluation.short_context import NoHeldOutDocuments, guard_windows, trained_documents

    section = eval.short_context
    if section is None:
        return None
    trained = None
    if train is not None:
        trained = trained_documents(
            training_shards(train, layout, context),
            tokenizer=tokenizer,
            seed=train.seed,
            holdout_rows=train.holdout_rows,
            cache=train.cache or layout.cache,
            storage_options=train.storage_options,
        )
    else:
        print(
            "warning: eval.short_context: the config has no train section, so its windows are not checked "
            "against training windows",
            flush=True,
        )
    try:
        found = guard_windows(
            section, section.length or context.original, documents, load_tokenizer(tokenizer), info, trained
        )
    except NoHeldOutDocuments as err:
        print(f"warning: {err}; the short-context guard is skipped", flush=True)
        return Guard(None, str(err))
    return Guard(found)


def items_per_kind(needle: NeedleEvalConfig) -> int:
    """Items per (task kind, length): ``eval.needle.samples``, or by default enough for every length
    to pool :data:`~longctx.trainer.evaluation.interval.ENOUGH_ITEMS` (93) over the kinds."""
    from longctx.trainer.evaluation.interval import ENOUGH_ITEMS

    return needle.samples or -(-ENOUGH_ITEMS // len(needle.kinds))


def build_needles(
    needle: NeedleEvalConfig,
    tokenizer: Path | None,
    documents: Path,
    sources: Mapping[int, str] | None = None,
) -> Needles:
    """The needle grid of ``eval.needle``, hidden in curated ``documents`` (books first). A length
    too short for its task is refused naming the setting it comes from: ``sources[length]``, by
    default ``eval.needle.lengths``."""
    from longctx.core.tokenizer import EOS_TOKEN, load_tokenizer
    from longctx.trainer.evaluation.measures import NeedleLengthError, needle_examples

    tok = load_tokenizer(tokenizer)
    haystack = _haystack(documents, 8 * max(needle.lengths) + 10_000)
    if not haystack:
        raise ConfigError(f"no curated documents under {documents} to build needle haystacks from")
    try:
        examples = needle_examples(
            haystack, tok, needle.lengths, needle.depths, needle.kinds, needle.seed, items_per_kind(needle)
        )
    except NeedleLengthError as err:
        raise ConfigError(f"{(sources or {}).get(err.length, 'eval.needle.lengths')}: {err}") from None
    eos = [i for i in (tok.token_to_id(EOS_TOKEN),) if i is not None]
    return Needles(needle, tok, examples, eos)


def score_models(
    specs: list[ModelSpec],
    windows: Windows,
    needles: Needles | None,
    guard: Guard | None,
    eval: EvalConfig,
    train: TrainConfig | None,
    context: ContextConfig,
) -> Scores:
    """Load each model in turn (one at a time in memory) and score it on the windows, the needles
    and the guard's short windows (one progress bar over all of them, :class:`EvalProgress`)."""
    from longctx.trainer.build import use_bf16
    from longctx.trainer.evaluation.measures import loss_by_position, score_needles
    from longctx.trainer.evaluation.short_context import window_loss

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    bf16 = use_bf16(eval.precision, device)
    vocab_size = windows.dataset.shards.manifest.header.tokenizer.vocab_size
    losses: dict[str, list[dict[str, Any]]] = {}
    answers: dict[str, list[Any]] = {}
    short: dict[str, dict[str, Any]] = {}
    guard_windows = guard.windows.windows if guard is not None and guard.windows is not None else None
    progress = EvalProgress(
        len(specs),
        len(windows.rows) + (len(guard_windows) if guard_windows is not None else 0),
        len(needles.examples) if needles else 0,
    )
    try:
        for spec in specs:
            progress.write(f"evaluating {spec.label} ({spec.source})")
            model = load_model_spec(spec, train, context, vocab_size, device)
            losses[spec.label] = loss_by_position(
                model,
                progress.track(windows.rows, spec.label, "windows"),
                context.original,
                windows.dataset.seq_len,
                device,
                bf16,
            )
            if guard_windows is not None:
                short[spec.label] = window_loss(
                    model, progress.track(guard_windows, spec.label, "short windows"), device, bf16
                )
            if needles is not None:
                answers[spec.label] = score_needles(
                    model,
                    needles.tokenizer,
                    progress.track(needles.examples, spec.label, "needles"),
                    device,
                    needles.config.max_new_tokens,
                    needles.eos,
                )
            del model
        released = None
        if guard_windows is not None and train is not None:
            progress.write("evaluating the base model as released (its own RoPE) on the short windows")
            base = short.get("base") if any(s.label == "base" and s.path is None for s in specs) else None
            released = released_loss(train, context, vocab_size, device, guard_windows, bf16, base)
    finally:
        progress.close()
    labels = {s.label: s.source for s in specs}
    return Scores(labels, losses, answers, short, released=released)


def short_context_report(guard: Guard | None, scores: Scores) -> dict[str, Any] | None:
    """The guard's part of the summary: where the windows come from and each model's loss, its
    ``ratio`` to the baseline's and its ``ratio_to_released`` to the base model as released
    (``released_base``: its loss, or None without a train section); ``{"skipped": why}`` when no
    window was held out; None when not measured."""
    from longctx.trainer.evaluation.short_context import loss_ratios

    if guard is None:
        return None
    if guard.windows is None:
        return {"skipped": guard.skipped}
    losses = {label: r["mean_loss"] for label, r in scores.short.items()}
    ratios = loss_ratios(losses, scores.baseline)
    released = scores.released["mean_loss"] if scores.released is not None else None
    return {
        **guard.windows.as_json(),
        "baseline": scores.baseline,
        "released_base": released,
        "models": [
            {
                "label": label,
                **r,
                "ratio": ratios[label],
                "ratio_to_released": r["mean_loss"] / released
                if released and r["mean_loss"] is not None
                else None,
            }
            for label, r in scores.short.items()
        ],
    }


class EvalProgress:
    """A progress bar over every model's windows (loss by position, and the guard's short ones) and
    needles (``models x (windows + needles)``, the needles being lengths x depths x kinds x samples),
    on stderr as training's is, and quiet where
    stderr is not a terminal."""

    def __init__(
        self, models: int, windows: int, needles: int, *, file: Any = None, enabled: bool | None = None
    ):
        from tqdm import tqdm

        self.total = models * (windows + needles)
        disable = None if enabled is None else not enabled  # None: off unless stderr is a terminal
        self.bar = tqdm(
            total=self.total, desc="eval", unit="item", dynamic_ncols=True, file=file, disable=disable
        )

    def track(self, items: Iterable[T], model: str, part: str) -> Iterator[T]:
        """``items``, one step of the bar each, labelled with the model and the part it scores."""
        self.bar.set_postfix_str(f"{model}: {part}", refresh=False)
        for item in items:
            yield item
            self.bar.update(1)

    def write(self, line: str) -> None:
        """Print ``line`` on stdout above the bar."""
        self.bar.write(line, file=sys.stdout)
        sys.stdout.flush()

    def close(self) -> None:
        self.bar.close()


PROMPTS = "needle_prompts.jsonl.gz"
"""The needle prompts of an evaluation, one JSON line per item, shared by every model's results."""


def write_prompts(path: Path, examples: list[Any]) -> None:
    """Every needle item's prompt as a gzip JSON-lines file (``{"id", "kind", "context_tokens",
    "depth", "seed", "prompt"}``; ``needle.json``'s results name theirs by ``prompt``), written
    atomically. The prompts go here rather than into ``needle.json`` because they are as long as
    the context and the same for every model."""
    import gzip
    import io

    from longctx.core.atomic import atomic_path

    with atomic_path(path) as tmp, gzip.GzipFile(tmp, "wb", mtime=0) as raw:  # mtime 0: same bytes again
        f = io.TextIOWrapper(raw, encoding="utf-8")
        for item in examples:
            e = item.example
            row = {
                "id": item.id,
                "kind": item.task,
                "item": item.item,
                "context_tokens": e.context_tokens,
                "depth": e.depth,
                "seed": e.seed,
                "prompt": e.prompt,
            }
            f.write(json.dumps(row) + "\n")
        f.flush()


def write_evaluation(
    layout: RunLayout,
    eval: EvalConfig,
    windows: Windows,
    needles: Needles | None,
    guard: Guard | None,
    scores: Scores,
    context: ContextConfig,
    started: float,
) -> Path:
    """Write tables, JSON and plots into a new folder ``<output>/eval/<NNN>`` (``summary.json`` last,
    with the seconds since ``started``); returns the folder. The effective lengths and the task
    scores are computed here from the needle results written beside them."""
    from longctx.trainer.evaluation.measures import (
        format_loss_table,
        format_short_context,
        needle_accuracy,
        plot_loss_by_position,
        plot_needle_heatmap,
        plot_score_by_length,
    )

    sources, original = scores.sources, context.original
    accuracy = {label: needle_accuracy(results) for label, results in scores.needles.items()}
    effective = tasks = None
    if needles is not None:
        effective = effective_lengths(scores.needles, eval.effective)
        tasks = {
            label: {
                task: [{"context_tokens": n, **v.as_json()} for n, v in by_length.items()]
                for task, by_length in task_scores(results).items()
            }
            for label, results in scores.needles.items()
        }
    short = short_context_report(guard, scores)
    with new_numbered_folder(layout.eval) as (tmp, folder):
        write_json(
            tmp / "loss_by_position.json",
            {
                "shards": str(windows.shards),
                "rows": windows.indices,
                "held_out_rows": windows.held_out,
                "training_rows": windows.training,
                "models": [
                    {"label": label, "model": sources[label], "buckets": table}
                    for label, table in scores.losses.items()
                ],
            },
        )
        table = windows.caption() + format_loss_table(scores.losses, original)
        if short is not None:
            table += "\n" + format_short_context(short)
        write_text(tmp / "loss_by_position.txt", table + "\n")
        plot_loss_by_position(scores.losses, original, tmp / "loss_by_position.png")
        if needles is not None:
            write_json(
                tmp / "needle.json",
                {
                    **needles.config.model_dump(mode="json"),
                    "models": [
                        {
                            "label": label,
                            "model": sources[label],
                            **accuracy[label],
                            "results": [r.__dict__ for r in results],
                        }
                        for label, results in scores.needles.items()
                    ],
                },
            )
            write_prompts(tmp / PROMPTS, needles.examples)
            plot_needle_heatmap(scores.needles, tmp / "needle.png")
            assert effective is not None
            plot_score_by_length(effective, tmp / "score_by_length.png")
        files = sorted(p.name for p in tmp.iterdir()) + ["summary.json"]
        summary = {  # models in the order they were given (JSON keys are written sorted)
            "models": [
                {"label": label, "model": source, "added_as_baseline": label in scores.added}
                for label, source in sources.items()
            ],
            "eval": eval.model_dump(mode="json"),
            "needle_accuracy": [{"label": label, "accuracy": a["accuracy"]} for label, a in accuracy.items()]
            if needles is not None
            else None,
            "effective_length": effective,
            "task_scores": tasks,
            "short_context": short,
            "files": files,
            "seconds": time.monotonic() - started,
        }
        write_json(tmp / "summary.json", summary)
    return folder


def _result(folder: Path) -> dict[str, Any]:
    """What :func:`run_eval` returns, read from an evaluation folder."""
    summary = json.loads((folder / "summary.json").read_text())
    losses = json.loads((folder / "loss_by_position.json").read_text())
    needles = json.loads((folder / "needle.json").read_text()) if (folder / "needle.json").is_file() else None
    return {
        "folder": str(folder),
        "files": [str(folder / name) for name in summary["files"]],
        "models": {m["label"]: m["model"] for m in summary["models"]},
        "eval": summary["eval"],
        "loss_by_position": {m["label"]: m["buckets"] for m in losses["models"]},
        "loss_table": (folder / "loss_by_position.txt").read_text().rstrip("\n"),
        "needle_accuracy": {m["label"]: m["accuracy"] for m in needles["models"]} if needles else None,
        "needle_by_length": {m["label"]: m["by_length"] for m in needles["models"]} if needles else None,
        "added_as_baseline": [m["label"] for m in summary["models"] if m.get("added_as_baseline")],
        "effective_length": summary.get("effective_length"),
        "task_scores": summary.get("task_scores"),
        "short_context": summary.get("short_context"),
    }


def latest_evaluation(
    eval: EvalConfig, output: Path, train: TrainConfig | None = None
) -> dict[str, Any] | None:
    """The newest evaluation under ``<output>/eval`` made with these ``eval`` settings after the
    trained model was written (as :func:`run_eval` returns it), or None."""
    layout = RunLayout(output)
    trained = final_model(layout, train) / CONFIG_NAME
    if not layout.eval.is_dir() or not is_model_folder(trained.parent):
        return None
    folders = sorted(
        (p for p in layout.eval.iterdir() if p.name.isdigit() and (p / "summary.json").is_file()),
        reverse=True,
    )
    for folder in folders:
        if folder.stat().st_mtime < trained.stat().st_mtime:
            return None
        if json.loads((folder / "summary.json").read_text())["eval"] == eval.model_dump(mode="json"):
            return _result(folder)
    return None
