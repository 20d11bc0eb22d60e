"""What a run started in an existing output folder does with what it finds there.

- **Checkpoints**: it resumes from the newest intact one (``checkpoint.find_resume_checkpoint``:
  damaged newer ones are reported and skipped); with checkpoints present but none intact it refuses
  unless ``restart`` is given; ``restart`` with an intact checkpoint present is refused too, since the
  new run's checkpoint rotation would later delete it.
- **Settings**: a checkpoint is only resumed by a run that reads the same data in the same order and
  trains the same model (:func:`check_settings`); the world size and the mesh may change.
- **A finished run** (its newest checkpoint at ``train.steps`` or beyond, and the final model
  written): nothing to do; :func:`finished_run` finds it, and ``longctx train`` says where the
  results are instead of starting ranks that would train no step and export the model again.
- **Metrics** (``metrics.jsonl``, one line per logged step): resuming from step ``k`` keeps every
  line of steps up to ``k`` byte for byte; the lines of steps after ``k``, written by the earlier run
  after its last checkpoint and about to be trained again, move to ``metrics.superseded.jsonl``
  (appended, never lost). Starting over with ``restart`` renames the earlier ``metrics.jsonl`` to
  ``metrics.before-restart-<n>.jsonl``. Nothing else ever rewrites the file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from longctx.core.atomic import write_text
from longctx.core.errors import ConfigError
from longctx.core.layout import RunLayout, StageLayout
from longctx.core.preflight import disk_faults
from longctx.trainer.models.files import is_model_folder

SUPERSEDED = "metrics.superseded.jsonl"


def finished_run(layout: RunLayout | StageLayout, steps: int) -> int | None:
    """The step a finished training run in ``layout`` reached, or None when there is training (or the
    final export) left to do: finished means the final model is written and the newest checkpoint is
    at ``steps`` or beyond and intact (every file matches its manifest entry, checksums included, as
    resuming from it would check; a damaged one is left to the resume, which reports it)."""
    from longctx.trainer.checkpoint import damage, list_checkpoints
    from longctx.trainer.parallel.state import ParallelState

    if not is_model_folder(layout.final_model):
        return None
    newest = next(iter(list_checkpoints(layout.checkpoints)), None)
    if newest is None or newest.step < steps or damage(newest.folder, ParallelState.single()) is not None:
        return None
    return newest.step


def describe_finished(layout: RunLayout, step: int, steps: int) -> str:
    """What ``longctx train`` prints for a finished run: where its results are, and how to go on."""
    beyond = f" (train.steps is {steps})" if step > steps else ""
    return (
        f"training already finished at step {step}{beyond}; nothing to do\n"
        f"final model: {layout.final_model}\nmetrics: {layout.metrics}\ncheckpoints: {layout.checkpoints}\n"
        "raise train.steps (--steps) to train further, or train into another output folder"
    )


def check_settings(folder: Path, saved: dict[str, Any], expected: dict[str, Any]) -> None:
    """Refuse to resume checkpoint ``folder`` when a setting that fixes the data order or the model
    changed."""
    changed = sorted(k for k, v in expected.items() if saved.get(k) != v)
    if changed:
        details = ", ".join(f"{k}: {saved.get(k)!r} -> {expected[k]!r}" for k in changed)
        hint = ""
        if "global_batch_rows" in changed:
            hint = (
                " (train.global_batch_rows defaults to the data-parallel size; set it to the checkpoint's "
                "value to resume at another world size)"
            )
        raise ConfigError(
            f"cannot resume from {folder}: the run changed ({details}){hint}; use a new output folder"
        )


def _kept(line: str, resume_step: int) -> bool:
    """Whether a metrics line survives a resume from ``resume_step`` (a torn last line does not)."""
    try:
        return int(json.loads(line).get("step", 0)) <= resume_step
    except (ValueError, AttributeError, TypeError):
        return False


def prepare_metrics(path: Path, resume_step: int, restart: bool) -> None:
    """Make ``path`` hold exactly the records of steps up to ``resume_step`` (see the module docstring)."""
    if not path.exists():
        return
    if restart:
        number = 1
        while (aside := path.with_name(f"metrics.before-restart-{number}.jsonl")).exists():
            number += 1
        with disk_faults(path):
            path.rename(aside)
        return
    lines = [line for line in path.read_text(encoding="utf-8").splitlines(keepends=True) if line.strip()]
    later = [line for line in lines if not _kept(line, resume_step)]
    if not later:
        return
    superseded = path.with_name(SUPERSEDED)
    with disk_faults(superseded), open(superseded, "a", encoding="utf-8") as handle:
        handle.writelines(line if line.endswith("\n") else line + "\n" for line in later)
    write_text(path, "".join(line for line in lines if _kept(line, resume_step)))
