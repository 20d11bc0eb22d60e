"""Where training metrics go: JSON lines always, TensorBoard and Weights & Biases when configured.

:class:`Tracker` is the one object the training loop talks to: ``write(record)`` once per logged
step, ``close()`` at the end. A record is the loop's dict (``step``, ``loss``, ``lr``, ...,
``loss_by_position: {edge: loss}``); JSONL keeps it as it is, the trackers get it flattened into
scalars (:func:`scalars`). Only rank 0 creates a tracker.

Resuming keeps each sink consistent with the checkpoint the run resumed from: the training loop has
already moved the JSONL lines of steps after it aside (``longctx.trainer.resume.prepare_metrics``,
which never deletes a record), TensorBoard is told to purge them (``purge_step``), and W&B continues the same
run (its id is kept in the run folder), where steps it has already seen are not logged twice.

TensorBoard (``torch.utils.tensorboard``) and W&B are optional extras, imported only when
configured; ``longctx train`` refuses them before it starts when they are not installed (the checks
of ``LogConfig``, run by ``longctx.jobs.check``).
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

from longctx.core.atomic import write_text
from longctx.core.errors import ConfigError
from longctx.core.layout import RunLayout
from longctx.core.preflight import disk_faults
from longctx.trainer.config import LogConfig, WandbConfig


def scalars(record: Mapping[str, Any], prefix: str = "train/") -> dict[str, float]:
    """The numbers of a metrics record as ``{tag: value}`` for scalar trackers.

    Top-level metrics become ``train/<name>``, a nested mapping ``<name>/<key>`` (so loss by position
    is its own group: ``loss_by_position/01024``, the bucket's start); numeric keys are zero-padded to
    the widest of their mapping, so that the trackers' text order is the numeric one. The steps are
    the x axis (:func:`tracker_step`), not metrics, and ``None`` (no value this step) is left out. A
    staged run's ``stage`` is a metric, so the stage boundaries show on the run's plots.
    """
    out: dict[str, float] = {}
    for key, value in record.items():
        if key in ("step", "global_step") or value is None:
            continue
        if isinstance(value, Mapping):
            names = [str(k) for k in value]
            width = max((len(n) for n in names if n.isdigit()), default=0)
            out.update(
                {
                    f"{key}/{n.zfill(width) if n.isdigit() else n}": float(v)
                    for n, v in zip(names, value.values(), strict=True)
                    if v is not None
                }
            )
        elif isinstance(value, (int, float)):
            out[prefix + key] = float(value)
    return out


def tracker_step(record: Mapping[str, Any]) -> int:
    """The x axis of a record in the trackers: the run's global step (a staged run counts on across
    its stages, so the trackers show one run), else the step."""
    return int(record.get("global_step", record["step"]))


class Sink(Protocol):
    """One destination of metric records."""

    def write(self, record: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


class JsonlSink:
    """One JSON object per line, appended to ``path`` (the file is never rewritten here; on resume,
    ``prepare_metrics`` has already set aside the lines of steps after the resumed checkpoint)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, record: dict[str, Any]) -> None:
        """Append ``record``; a full or read-only disk is an ``OutputError`` naming the file (rank 0
        alone writes metrics: its recorded error ends the job, and the launcher stops the others)."""
        with disk_faults(self.path), open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def close(self) -> None:
        """Nothing is held open between records."""


class TensorBoardSink:
    """Scalars in TensorBoard event files under ``folder``, flushed at every record."""

    def __init__(self, folder: Path, resume_step: int, config: Mapping[str, Any]) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as err:
            raise ConfigError(
                f"train.log.tensorboard needs TensorBoard: pip install 'longctx[tensorboard]' ({err})"
            ) from None
        # purge_step: TensorBoard hides what an earlier, killed run logged after the resumed checkpoint
        self.writer = SummaryWriter(str(folder), purge_step=resume_step + 1 if resume_step else None)
        if not resume_step:
            self.writer.add_text("config", "```\n" + json.dumps(config, indent=2, default=str) + "\n```", 0)

    def write(self, record: dict[str, Any]) -> None:
        for tag, value in scalars(record).items():
            self.writer.add_scalar(tag, value, global_step=tracker_step(record))
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    """A Weights & Biases run logging the records at their step. The run's id is kept in
    ``layout.wandb_run_id``, so a resumed training run continues the same W&B run; closing stops
    W&B's background service (``wandb-core``), so no process outlives training."""

    def __init__(
        self, section: WandbConfig, layout: RunLayout, resume_step: int, config: Mapping[str, Any]
    ) -> None:
        try:
            import wandb
        except ImportError as err:
            raise ConfigError(
                f"train.log.wandb needs Weights & Biases: pip install 'longctx[wandb]' ({err})"
            ) from None
        self._wandb = wandb
        layout.wandb.mkdir(parents=True, exist_ok=True)
        id_file = layout.wandb_run_id
        run_id = id_file.read_text().strip() if resume_step and id_file.is_file() else None  # None: a new run
        try:
            self.run = wandb.init(
                project=section.project,
                entity=section.entity,
                name=section.name or layout.root.resolve().name,
                group=section.group,
                tags=section.tags,
                mode=section.mode,
                dir=str(layout.wandb.parent),  # W&B writes into <dir>/wandb
                id=run_id,
                resume="allow",
                config=dict(config),
            )
        except Exception as err:  # login, network or settings problems: one line, not a traceback
            wandb.teardown()
            raise ConfigError(f"train.log.wandb: wandb.init failed: {err}") from None
        write_text(id_file, self.run.id + "\n")
        self._next_step = self.run.step  # a resumed online run starts after the steps W&B already has

    def write(self, record: dict[str, Any]) -> None:
        step = tracker_step(record)
        if step >= self._next_step:  # W&B drops earlier steps (with a warning); a resumed run repeats some
            self.run.log(scalars(record), step=step)
            self._next_step = step + 1

    def close(self) -> None:
        self.run.finish()
        self._wandb.teardown()


def _close_all(sinks: Iterable[Sink]) -> None:
    errors = []
    for sink in sinks:
        try:
            sink.close()
        except Exception as err:  # close every sink even when one fails
            errors.append(err)
    if errors:
        raise errors[0]


class Tracker:
    """Every configured sink behind one ``write(record)`` / ``close()``.

    ``config`` (the run's settings) is stored with the run by the trackers that keep one (W&B's run
    config, a TensorBoard text entry). ``resume_step`` is the tracker step the run resumes after
    (:func:`tracker_step`: global across a staged run's stages). ``metrics`` is the JSONL file
    (default ``layout.metrics``; a stage's own in a staged run). ``close`` is idempotent and also
    runs at interpreter exit, so a run that fails midway still flushes its trackers and stops W&B's
    service.
    """

    def __init__(
        self,
        log: LogConfig,
        layout: RunLayout,
        resume_step: int,
        config: Mapping[str, Any] | None = None,
        *,
        metrics: Path | None = None,
    ) -> None:
        config = config or {}
        self.sinks: list[Sink] = [JsonlSink(metrics or layout.metrics)]
        self._close = weakref.finalize(self, _close_all, self.sinks)
        if log.tensorboard:
            self.sinks.append(TensorBoardSink(layout.tensorboard, resume_step, config))
        if log.wandb is not None and log.wandb.mode != "disabled":
            self.sinks.append(WandbSink(log.wandb, layout, resume_step, config))

    def write(self, record: dict[str, Any]) -> None:
        """Send one metrics record to every sink."""
        for sink in self.sinks:
            sink.write(record)

    def close(self) -> None:
        """Flush and close every sink (once)."""
        self._close()

    def __enter__(self) -> Tracker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
