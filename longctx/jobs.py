"""Each job run from a whole run config: the one place where :class:`~longctx.config.RootConfig` is
taken apart, so that every job gets only its own section and what it needs besides.

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

from longctx.config import RootConfig
from longctx.core.errors import ConfigError

if TYPE_CHECKING:  # the jobs are imported when run, keeping `longctx --help` fast
    from longctx.packer.manifest import Manifest
    from longctx.trainer.stages import StagedResult
    from longctx.trainer.train import TrainResult


def curate(cfg: RootConfig, *, verbose: bool = False) -> dict[str, Any] | None:
    """``longctx curate``: see :func:`longctx.pipeline.curate.run_curation`. The special tokens
    the run's ``pack`` section asks for are checked before curation starts."""
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
    :func:`longctx.packer.run.run_pack`."""
    from longctx.packer.config import PackConfig
    from longctx.packer.run import run_pack

    return run_pack(cfg.pack or PackConfig(), context=cfg.context, output=cfg.output, verbose=verbose)


def train(cfg: RootConfig, *, progress: bool = True, restart: bool = False) -> TrainResult | StagedResult:
    """``longctx train`` in this process (one rank of a torchrun job, or alone): see
    :func:`longctx.trainer.train.train`, or for ``train.stages``
    :func:`longctx.trainer.stages.train_staged` (its gates measure with the ``eval`` section)."""
    from longctx.trainer.gates import GateSettings
    from longctx.trainer.stages import train_staged
    from longctx.trainer.train import train as run_training

    if cfg.train is None:
        raise ConfigError("the config has no 'train' section")
    tokenizer = _configured_tokenizer(cfg)
    if cfg.train.stages:
        gates = GateSettings(cfg.eval, _curated_documents(cfg))
        return train_staged(
            cfg.train,
            context=cfg.context,
            output=cfg.output,
            tokenizer=tokenizer,
            progress=progress,
            restart=restart,
            gates=gates,
        )
    return run_training(
        cfg.train,
        context=cfg.context,
        output=cfg.output,
        tokenizer=tokenizer,
        progress=progress,
        restart=restart,
    )


def export(cfg: RootConfig, step: int, stage: int | None = None) -> Path:
    """``longctx train --export STEP [--stage K]``: see :func:`longctx.trainer.train.export_checkpoint`."""
    from longctx.trainer.train import export_checkpoint

    if cfg.train is None:
        raise ConfigError("the config has no 'train' section")
    return export_checkpoint(
        cfg.train,
        context=cfg.context,
        output=cfg.output,
        step=step,
        tokenizer=_configured_tokenizer(cfg),
        stage=stage,
    )


def evaluate(cfg: RootConfig) -> dict[str, Any]:
    """``longctx eval``: see :func:`longctx.trainer.eval_job.run_eval`."""
    from longctx.trainer.eval_job import run_eval

    if cfg.eval is None:
        raise ConfigError("the config has no 'eval' section")
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
    or None: see :func:`longctx.trainer.eval_job.latest_evaluation`."""
    from longctx.trainer.eval_job import latest_evaluation as latest

    return latest(cfg.eval, cfg.output, cfg.train) if cfg.eval is not None else None
