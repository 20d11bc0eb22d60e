"""Each job run from a whole run config: the one place where :class:`~longctx.config.RootConfig` is
taken apart, so that every job gets only its own section and what it needs besides.

Each job first checks what the sections it uses name outside the file (:data:`SECTIONS`): paths
that must exist, optional extras. A missing ``train.model.hf_path`` stops ``train``, not ``curate``.
The ``longctx`` commands and the demo call these; so can Python code that holds a run config::

    from longctx import jobs
    from longctx.config import load_config

    cfg = load_config("configs/demo.yaml")
    jobs.curate(cfg)
    jobs.pack(cfg)
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from longctx.config import RootConfig, check_world
from longctx.core.errors import ConfigError

if TYPE_CHECKING:  # the jobs are imported when run, keeping `longctx --help` fast
    from longctx.packer.manifest import Manifest
    from longctx.trainer.stages import StagedResult
    from longctx.trainer.train import TrainResult


SECTIONS: dict[str, tuple[str, ...]] = {
    "curate": ("tokenizer", "curate"),
    "pack": ("tokenizer", "pack"),
    "train": ("train",),
    "eval": ("eval",),
}
"""The sections of the run config each job reads that may name something outside the file (the
``context`` section and pack's special tokens, which curation also reads, name nothing). ``pack``
reads ``tokenizer.path`` to refuse one other than the run's tokenizer. ``eval`` also uses
``train.model`` when it evaluates the ``base`` model; ``train`` and ``eval`` fall back to
``tokenizer.path`` only when the run folder holds no tokenizer, and resolve it then."""


def check(cfg: RootConfig, *names: str) -> None:
    """Refuse, before any work, a config whose sections used by the jobs ``names`` (keys of :data:`SECTIONS`)
    name a missing path or an extra that is not installed: see :func:`longctx.config.check_world`."""
    sections = [section for name in names for section in SECTIONS[name]]
    if "eval" in names and cfg.eval is not None and "base" in cfg.eval.models:
        sections.append("train.model")
    check_world(cfg, sections)


def curate(
    cfg: RootConfig, *, verbose: bool = False, update: bool = False, fresh_process: bool = False
) -> dict[str, Any] | None:
    """``longctx curate``: see :func:`longctx.pipeline.curate.run_curation` (``update``: curate the
    run anew over inputs changed since it started; ``fresh_process``: this process has run nothing
    before, as the command). The special tokens the run's ``pack`` section asks for are checked
    before curation starts."""
    check(cfg, "curate")  # before the job's modules are imported
    from longctx.packer.config import PackConfig
    from longctx.pipeline.curate import run_curation

    pack = cfg.pack or PackConfig()
    specials = {"eos": pack.eos_token, "bos": pack.bos_token, "pad": pack.pad_token}
    return run_curation(
        cfg.curate,
        context=cfg.context,
        tokenizer=cfg.tokenizer,
        output=cfg.output,
        specials=specials,
        verbose=verbose,
        update=update,
        fresh_process=fresh_process,
    )


def _configured_tokenizer(cfg: RootConfig) -> Path | None:
    """The local ``tokenizer.json`` of ``tokenizer.path`` (a file, folder or hub id), for jobs that
    fall back to it when the run folder holds no tokenizer; resolved only when needed."""
    from longctx.core.layout import RunLayout
    from longctx.core.tokenizer import resolve_tokenizer

    if cfg.tokenizer.path is None or RunLayout(cfg.output).tokenizer_file() is not None:
        return None
    return resolve_tokenizer(cfg.tokenizer.path).tokenizer


def pack(cfg: RootConfig, *, verbose: bool = False) -> dict[int, Manifest] | None:
    """``longctx pack`` (default settings when the config has no ``pack`` section): see
    :func:`longctx.packer.run.run_pack`. A ``tokenizer.path`` other than the run's tokenizer is refused."""
    check(cfg, "pack")
    from longctx.core.tokenizer import resolve_tokenizer
    from longctx.packer.config import PackConfig
    from longctx.packer.run import run_pack

    configured = resolve_tokenizer(cfg.tokenizer.path) if cfg.tokenizer.path is not None else None
    return run_pack(
        cfg.pack or PackConfig(),
        context=cfg.context,
        output=cfg.output,
        verbose=verbose,
        tokenizer=configured,
    )


def train(cfg: RootConfig, *, progress: bool = True, restart: bool = False) -> TrainResult | StagedResult:
    """``longctx train`` in this process (one rank of a torchrun job, or alone): see
    :func:`longctx.trainer.train.train`, or for ``train.stages``
    :func:`longctx.trainer.stages.train_staged` (its gates measure with the ``eval`` section)."""
    if cfg.train is None:
        raise ConfigError("the config has no 'train' section")
    check(cfg, "train")
    tokenizer = _configured_tokenizer(cfg)
    if cfg.train.stages:
        from longctx.trainer.evaluation.gates import GateSettings
        from longctx.trainer.stages import train_staged

        return train_staged(
            cfg.train,
            context=cfg.context,
            output=cfg.output,
            tokenizer=tokenizer,
            progress=progress,
            restart=restart,
            gates=GateSettings(cfg.eval, _curated_documents(cfg)),
        )
    from longctx.trainer.train import train as run_training

    return run_training(
        cfg.train,
        context=cfg.context,
        output=cfg.output,
        tokenizer=tokenizer,
        progress=progress,
        restart=restart,
    )


def finished_training(cfg: RootConfig) -> str | None:
    """What ``longctx train`` prints instead of starting when the run of ``cfg`` already finished
    (where its results are), or None when there is work left: see
    :func:`longctx.trainer.resume.finished_run`, and for ``train.stages``
    :func:`longctx.trainer.stages.finished_stages` (the gates' settings are the ``eval`` section's)."""
    if cfg.train is None:
        raise ConfigError("the config has no 'train' section")
    from longctx.core.layout import RunLayout

    layout = RunLayout(cfg.output)
    if cfg.train.stages:
        from longctx.trainer.evaluation.gates import GateSettings
        from longctx.trainer.stages import describe_finished_stages, finished_stages

        settings = GateSettings(cfg.eval, _curated_documents(cfg))
        outcomes = finished_stages(cfg.train, layout, settings)
        return describe_finished_stages(outcomes) if outcomes is not None else None
    from longctx.trainer.resume import describe_finished, finished_run

    step = finished_run(layout, cfg.train.steps)
    return describe_finished(layout, step, cfg.train.steps) if step is not None else None


def export(cfg: RootConfig, step: int, stage: int | None = None) -> Path:
    """``longctx train --export STEP [--stage K]``: see :func:`longctx.trainer.train.export_checkpoint`."""
    if cfg.train is None:
        raise ConfigError("the config has no 'train' section")
    check(cfg, "train")
    from longctx.trainer.train import export_checkpoint

    return export_checkpoint(
        cfg.train,
        context=cfg.context,
        output=cfg.output,
        step=step,
        tokenizer=_configured_tokenizer(cfg),
        stage=stage,
    )


def evaluate(cfg: RootConfig) -> dict[str, Any]:
    """``longctx eval``: see :func:`longctx.trainer.evaluation.job.run_eval`."""
    if cfg.eval is None:
        raise ConfigError("the config has no 'eval' section")
    check(cfg, "eval")
    from longctx.trainer.evaluation.job import run_eval

    return run_eval(
        cfg.eval,
        context=cfg.context,
        output=cfg.output,
        train=cfg.train,
        tokenizer=_configured_tokenizer(cfg),
        documents=_curated_documents(cfg),
    )


def _curated_documents(cfg: RootConfig) -> Path | None:
    """The documents the run packed when ``pack.input`` names a published curation (else None: the
    run folder's own)."""
    from longctx.core.layout import RunLayout
    from longctx.packer.curated import source_layout

    if cfg.pack is None or cfg.pack.input is None:
        return None
    return source_layout(cfg.pack, RunLayout(cfg.output)).documents


def latest_evaluation(cfg: RootConfig) -> dict[str, Any] | None:
    """The newest ``longctx eval`` result of ``cfg.eval``'s settings made after the trained model,
    or None: see :func:`longctx.trainer.evaluation.job.latest_evaluation`."""
    from longctx.trainer.evaluation.job import latest_evaluation as latest

    return latest(cfg.eval, cfg.output, cfg.train) if cfg.eval is not None else None
