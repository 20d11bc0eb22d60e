"""Staged training (``train.stages``) against independent references.

- Hand-off: a two-stage run ends with the weights of two ordinary runs chained by hand (the second
  started from the first's exported model, with the second stage's RoPE), to 1e-6; its metrics and
  trackers count one run across the stages.
- Gates: a failed gate stops the run with one line naming the metric, its value (the one written to
  the stage's ``gate.json``) and what to change, and a rerun changes nothing in the finished stages
  (bytes and modification times); ``on_gate_fail: continue`` goes on; a held-out short window is
  one of a document no training row holds, read from the shards' own ``doc_id`` column.
- Resume: a run killed mid-stage 2 (SIGKILL) and started again, or whose second stage is lost, ends
  with the weights of the uninterrupted run (1e-6). A stage whose predecessor changed (its steps
  raised) is trained again, to the weights of a run started by hand from the new predecessor.
- Coverage: a stage at context.original trains with ``required_position`` as given.
- Eval: the effective length and per-task scores in ``summary.json`` and on the console are
  ``longctx.trainer.evaluation.effective`` applied to the needle results written beside them; the baseline is
  evaluated even when ``--model`` leaves it out.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import torch
import yaml
from safetensors.torch import load_file

from longctx import jobs
from longctx.cli import main
from longctx.config import parse_config
from longctx.core.errors import ConfigError
from longctx.trainer.config import EffectiveLengthConfig
from longctx.trainer.evaluation.effective import effective_lengths, task_scores
from longctx.trainer.evaluation.interval import Score
from longctx.trainer.evaluation.measures import NeedleResult
from longctx.trainer.evaluation.short_context import NoHeldOutDocuments
from tests.packer.test_pack_helpers import STAGED_LENGTHS

ORIGINAL = 128
LENGTHS = STAGED_LENGTHS
TINY = {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1}
YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": ORIGINAL}


def run_folder(staged_packed: Path, tmp_path: Path, name: str = "run") -> Path:
    """A copy of the packed run (documents, tokenizer, shards) to train in."""
    folder = tmp_path / name
    shutil.copytree(staged_packed, folder)
    return folder


def staged(root: Path, stages: list[dict[str, Any]], **train: Any) -> dict[str, Any]:
    """A run config over ``root`` training ``stages``; ``train`` overrides train settings."""
    settings: dict[str, Any] = {
        "stages": stages,
        "optim": {"lr": 3e-3, "warmup_steps": 1},
        "checkpoint": {"every": 3, "keep": 3},
        "log": {"every": 1},
        "model": {"rope_scaling": YARN, "tiny": TINY},
    }
    settings.update(train)
    return {
        "output": str(root),
        "context": {"original": ORIGINAL, "target": LENGTHS[-1]},
        "tokenizer": {"path": str(root / "tokenizer.json")},
        "train": settings,
        "eval": {
            "rows": 2,
            "allow_training_windows": True,  # the stages train on every window; these tests score others
            "needle": {"lengths": [256, 512], "depths": [0.5], "samples": 1, "max_new_tokens": 4},
            "short_context": {"source": "papers", "windows": 4},
        },
    }


def two_stages(steps: int = 3, gate: dict[str, Any] | None = None, **second: Any) -> list[dict[str, Any]]:
    return [
        {"seq_len": 256, "steps": steps, "factor": 2.0, **({"gate": gate} if gate else {})},
        {"seq_len": 512, "steps": steps, "factor": 4.0, **second},
    ]


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(folder / "model.safetensors")


def assert_same_weights(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=0, atol=1e-6)


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``folder`` with its bytes and modification time."""
    return {
        str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in folder.rglob("*")
        if p.is_file()
    }


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_stage_hand_off_equals_two_runs_chained_by_hand(staged_packed: Path, tmp_path: Path) -> None:
    """Stage 2 starts from stage 1's final weights with a fresh optimizer: the same as training run B
    from run A's exported model. The trackers see one run: TensorBoard's steps count on across the
    stages, with the stage as a metric."""
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    root = run_folder(staged_packed, tmp_path)
    cfg = staged(root, two_stages(), log={"every": 1, "tensorboard": True})
    result = jobs.train(parse_config(cfg), progress=False)
    stage1, stage2 = (root / "train" / "stages" / f"{k}-{n}" for k, n in ((1, 256), (2, 512)))
    assert [o.result.steps for o in result.stages] == [3, 3]

    # by hand: run A (windows of 256, factor 2), then run B from A's export (windows of 512, factor 4)
    def single(name: str, seq_len: int, factor: float, model: dict[str, Any]) -> Path:
        out = tmp_path / name
        plain = {
            "output": str(out),
            "context": {"original": ORIGINAL, "target": seq_len},
            "tokenizer": {"path": str(root / "tokenizer.json")},
            "train": {
                "shards": str(root / "shards" / f"seq{seq_len}"),
                "steps": 3,
                "optim": {"lr": 3e-3, "warmup_steps": 1},
                "checkpoint": {"every": 3, "keep": 3},
                "model": {**model, "rope_scaling": {**YARN, "factor": factor}},
            },
        }
        jobs.train(parse_config(plain), progress=False)
        return out / "train" / "final"

    first = single("A", 256, 2.0, {"tiny": TINY})
    second = single("B", 512, 4.0, {"hf_path": str(first)})
    assert_same_weights(weights(stage1 / "final"), weights(first))
    assert_same_weights(weights(stage2 / "final"), weights(second))
    assert json.loads((stage2 / "final" / "config.json").read_text())["rope_scaling"]["factor"] == 4.0

    logged = records(stage1 / "metrics.jsonl") + records(stage2 / "metrics.jsonl")
    assert [(r["stage"], r["step"], r["global_step"]) for r in logged] == [
        (1, 1, 1), (1, 2, 2), (1, 3, 3), (2, 1, 4), (2, 2, 5), (2, 3, 6)
    ]  # fmt: skip
    events = EventAccumulator(str(root / "train" / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == [1, 2, 3, 4, 5, 6]
    assert [e.value for e in events.Scalars("train/loss")] == pytest.approx([r["loss"] for r in logged])
    assert [e.value for e in events.Scalars("train/stage")] == [1, 1, 1, 2, 2, 2]


def test_keep_optimizer_carries_the_adam_moments_into_the_next_stage(
    staged_packed: Path, tmp_path: Path
) -> None:
    """With ``keep_optimizer`` stage 2 starts from stage 1's AdamW state: its first update differs
    from a fresh optimizer's, and its checkpoint's optimizer has taken both stages' steps."""
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    fresh = run_folder(staged_packed, tmp_path, "fresh")
    kept = run_folder(staged_packed, tmp_path, "kept")
    jobs.train(parse_config(staged(fresh, two_stages(steps=2))), progress=False)
    jobs.train(parse_config(staged(kept, two_stages(steps=2, keep_optimizer=True))), progress=False)
    stage1 = "train/stages/1-256/final"
    assert_same_weights(weights(kept / stage1), weights(fresh / stage1))
    a, b = (weights(r / "train/stages/2-512/final") for r in (fresh, kept))
    assert any(not torch.allclose(a[n], b[n]) for n in a)
    saved = tmp_path / "optim.pt"
    dcp_to_torch_save(str(kept / "train/stages/2-512/checkpoints/step_0000002/dcp"), str(saved))
    state = torch.load(saved, weights_only=True)["optim"]["state"]
    assert {int(float(s["step"])) for s in state.values()} == {4}  # 2 steps of stage 1, 2 of stage 2
    # --export STEP --stage K writes that stage's checkpoint into the stage's folder
    cfg = parse_config(staged(kept, two_stages(steps=2, keep_optimizer=True)))
    with pytest.raises(
        ConfigError, match=r"name the stage whose checkpoint to export with --stage K \(1 to 2\)"
    ):
        jobs.export(cfg, 2)
    folder = jobs.export(cfg, 2, stage=2)
    assert folder == kept / "train/stages/2-512/export/step_0000002"
    assert_same_weights(weights(folder), b)


def chained_by_hand(
    root: Path, tmp_path: Path, name: str, start: Path, seq_len: int, factor: float, steps: int
) -> Path:
    """An ordinary run of ``steps`` steps on ``root``'s windows of ``seq_len`` tokens from the model
    folder ``start``, with YaRN factor ``factor``: what a stage starting from ``start`` trains."""
    out = tmp_path / name
    plain = {
        "output": str(out),
        "context": {"original": ORIGINAL, "target": seq_len},
        "tokenizer": {"path": str(root / "tokenizer.json")},
        "train": {
            "shards": str(root / "shards" / f"seq{seq_len}"),
            "steps": steps,
            "optim": {"lr": 3e-3, "warmup_steps": 1},
            "checkpoint": {"every": 3, "keep": 3},
            "model": {"hf_path": str(start), "rope_scaling": {**YARN, "factor": factor}},
        },
    }
    jobs.train(parse_config(plain), progress=False)
    return out / "train" / "final"


@pytest.mark.slow
def test_a_stage_whose_predecessor_changed_is_trained_again(
    staged_packed: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Stage 1's steps raised after the run finished: stage 1 trains the extra step, and stage 2,
    which started from stage 1's old last checkpoint, is trained again from the new one (its earlier
    folder kept aside, byte for byte), ending with the weights of a run started by hand from stage 1's
    new model. A stage 2 from before the change (as if the run was killed between the stages) is not
    taken as finished either, and is trained again to the same weights."""
    root = run_folder(staged_packed, tmp_path)
    jobs.train(parse_config(staged(root, two_stages(steps=2))), progress=False)
    stage1, stage2 = root / "train" / "stages" / "1-256", root / "train" / "stages" / "2-512"
    before = snapshot(stage2)
    raised = two_stages(steps=2)
    raised[0]["steps"] = 3
    cfg = parse_config(staged(root, raised))
    capsys.readouterr()
    first, second = jobs.train(cfg, progress=False).stages
    assert first.result is not None and first.result.resumed_from == 2 and first.result.steps == 3
    assert second.result is not None and second.result.resumed_from == 0
    aside = root / "train" / "stages" / "2-512.superseded-1"
    out = capsys.readouterr().out
    assert (
        f"stage 2 (512 tokens) started from {stage1 / 'checkpoints' / 'step_0000002'}, but stage 1 "
        f"(256 tokens) now ends with {stage1 / 'checkpoints' / 'step_0000003'}: training it again; its "
        f"earlier results are kept in {aside}"
    ) in out
    assert snapshot(aside) == before
    want = weights(chained_by_hand(root, tmp_path, "by_hand", stage1 / "final", 512, 4.0, 2))
    assert_same_weights(weights(stage2 / "final"), want)

    # stage 2 as it was before the change, back in place: out of date, so not finished
    shutil.rmtree(stage2)
    aside.rename(stage2)
    assert jobs.finished_training(cfg) is None
    _, second = jobs.train(cfg, progress=False).stages
    assert second.result is not None and second.result.resumed_from == 0
    assert_same_weights(weights(stage2 / "final"), want)
    assert snapshot(root / "train" / "stages" / "2-512.superseded-1") == before
    assert jobs.finished_training(cfg) is not None  # now every stage follows from the one before


def test_a_stage_at_context_original_trains_with_the_required_position_as_given(
    staged_packed: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """context.original 256: the first stage trains windows of the original length, whose last
    position is 255. ``train.coverage.required_position: 255``, what the coverage error's advice asks
    for, is honoured as given (not raised to context.original), and that stage trains more steps
    than ``max_steps_without_long``, since its windows cannot hold a position at or beyond
    context.original."""
    root = run_folder(staged_packed, tmp_path)
    stages = [{"seq_len": 256, "steps": 3, "factor": 1.0}, {"seq_len": 512, "steps": 1, "factor": 2.0}]
    rope = {**YARN, "factor": 2.0, "original_max_position_embeddings": 256}
    settings = staged(
        root,
        stages,
        coverage={"required_position": 255, "max_steps_without_long": 2},
        model={"rope_scaling": rope, "tiny": TINY},
    )
    settings["context"]["original"] = 256
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(settings))
    assert main(["train", "--config", str(config)]) == 0, capsys.readouterr().err
    for folder in ("1-256", "2-512"):
        assert (root / "train" / "stages" / folder / "final" / "config.json").is_file()
    assert [r["step"] for r in records(root / "train" / "stages" / "1-256" / "metrics.jsonl")] == [1, 2, 3]


def test_a_failed_gate_stops_the_run_in_one_line_and_a_rerun_changes_nothing(
    staged_packed: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    root = run_folder(staged_packed, tmp_path)
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(staged(root, two_stages(steps=2, gate={"max_short_loss_ratio": 0.001}))))
    assert main(["train", "--config", str(config)]) == 2
    stderr = capsys.readouterr().err
    err = stderr.strip().splitlines()[-1]  # after the progress bars' lines, the error's own line
    stage1 = root / "train" / "stages" / "1-256"
    gate = json.loads((stage1 / "gate.json").read_text())
    (check,) = gate["checks"]
    assert gate["passed"] is False and check["metric"] == "short_loss_ratio" and check["passed"] is False
    assert "Traceback" not in stderr
    assert err.startswith(
        f"longctx train: stage 1 (256 tokens) failed its gate: short_loss_ratio = {check['value']:.4g}, "
        "above the limit 0.001 (loss on 4 held-out 128-token windows of source 'papers' over the base "
        "model's as released (its own RoPE; gate.short_loss_reference: released))"
    )
    short = gate["measured"]["short_context"]
    assert short["reference"] == "released" and check["value"] == short["loss"] / short["reference_loss"]
    assert "train.stages[0].steps" in err and "train.stages[0].gate.max_short_loss_ratio" in err
    assert "(or set train.on_gate_fail: continue)" in err
    assert not (root / "train" / "stages" / "2-512").exists()  # the next stage never started
    # the windows are held out: their documents are in no training row of any stage's shards
    windows = gate["measured"]["short_context"]["window_documents"]
    trained = {
        doc
        for n in LENGTHS
        for f in (root / "shards" / f"seq{n}").glob("*.arrow")
        for row in pa.ipc.open_stream(pa.memory_map(str(f)).read_buffer()).read_all()["doc_id"].to_pylist()
        for doc in row
    }
    assert windows and all(doc.startswith("papers/") for doc, _ in windows)
    assert not trained & {doc for doc, _ in windows}

    before = snapshot(root / "train" / "stages")
    assert main(["train", "--config", str(config)]) == 2
    assert capsys.readouterr().err.strip() == err  # the recorded result, not measured again
    assert snapshot(root / "train" / "stages") == before

    # against eval.baseline (the base with the run's YaRN) instead: measured again (the gate changed),
    # over the loss `longctx eval` gives base on the same windows, and the detail says so
    gate_on_baseline = {"max_short_loss_ratio": 0.001, "short_loss_reference": "baseline"}
    config.write_text(yaml.safe_dump(staged(root, two_stages(steps=2, gate=gate_on_baseline))))
    assert main(["train", "--config", str(config)]) == 2
    assert "gate.short_loss_reference: baseline" in capsys.readouterr().err
    again = json.loads((stage1 / "gate.json").read_text())
    measured = again["measured"]["short_context"]
    assert measured["reference"] == "baseline" and measured["loss"] == short["loss"]
    evaluated = jobs.evaluate(
        parse_config(
            yaml.safe_load(config.read_text())
            | {"eval": {**yaml.safe_load(config.read_text())["eval"], "models": ["base"], "needle": None}}
        )
    )
    (base,) = evaluated["short_context"]["models"]
    assert measured["reference_loss"] == pytest.approx(base["mean_loss"], rel=1e-9, abs=0)
    assert measured["reference_loss"] != short["reference_loss"]  # not the released base's


def test_the_effective_length_advice_follows_eval_effective(tmp_path: Path) -> None:
    """A failed ``require_effective_length``: with the threshold a fraction of the short score the
    line offers to lower the fraction or the minimum short score; with an absolute one, to lower it
    from its value; ``on_gate_fail`` is offered only while it is ``stop``."""
    from longctx.core.layout import RunLayout
    from longctx.trainer.config import EffectiveLengthConfig
    from longctx.trainer.evaluation.gates import Check, GateResult, failure_line
    from longctx.trainer.stage_plan import resolve_stages

    cfg = parse_config(staged(tmp_path, two_stages(gate={"require_effective_length": True})))
    assert cfg.train is not None
    stage = resolve_stages(cfg.train, RunLayout(tmp_path))[0]
    check = Check("effective_length", 128, 256, False, "threshold 0.5 (absolute, eval.effective.threshold)")
    result = GateResult(1, 256, 3, {}, {}, [check])

    def line(on_gate_fail: str, threshold: float | None) -> str:
        effective = EffectiveLengthConfig(threshold=threshold)
        return failure_line(
            result, stage, RunLayout(tmp_path), on_gate_fail=on_gate_fail, effective=effective
        )

    measured = line("stop", None)
    assert "lower eval.effective.fraction (0.85) or eval.effective.min_short_score (0.5)" in measured
    assert "drop train.stages[0].gate.require_effective_length" in measured
    assert "(or set train.on_gate_fail: continue)" in measured
    fixed = line("continue", 0.8)
    assert "lower eval.effective.threshold (0.8)" in fixed
    assert "on_gate_fail" not in fixed


def test_the_effective_length_gate_scores_the_grid_up_to_the_stage_and_follows_the_definition() -> None:
    """``require_effective_length`` scores ``eval.needle.lengths`` below the stage's length and the
    stage's own; a dip below the stage's length fails it, and a weak short score is undetermined."""
    from longctx.trainer.evaluation.gates import effective_check, gate_lengths, needle_check

    assert gate_lengths([256, 512, 1024, 4096], 2048, True) == [256, 512, 1024, 2048]
    assert gate_lengths([256, 512], 512, True) == [256, 512]
    assert gate_lengths([256, 512], 2048, False) == [2048]  # min_needle_score alone: the stage's length
    config = EffectiveLengthConfig()
    # 100 of 100 at 256 (threshold 0.85; lower ends 0.963 and 0.885 for 100 and 95 of 100), a dip at 512
    measured: dict[str, Any] = {}
    dip = effective_check(
        1024, config, {256: Score(100, 100), 512: Score(50, 100), 1024: Score(95, 100)}, measured
    )
    assert (dip.value, dip.passed) == (256, False) and "first failing length 512" in dip.detail
    assert measured["effective_length"]["first_failure"] == 512
    held = effective_check(
        1024, config, {256: Score(100, 100), 512: Score(95, 100), 1024: Score(95, 100)}, {}
    )
    assert (held.value, held.passed) == (1024, True)
    weak = effective_check(1024, config, {256: Score(1, 100), 1024: Score(100, 100)}, {})
    assert weak.value is None and not weak.passed and weak.detail.startswith("undetermined: the score at")
    # min_needle_score stays a point estimate; its detail gives the count and the interval
    # (4 of 6: Wilson's (4 + z^2/2 -+ z sqrt(4 * 2 / 6 + z^2 / 4)) / (6 + z^2) = 0.30, 0.90)
    check = needle_check(1024, ["single_needle"], Score(4, 6), 0.6)
    assert check.passed and check.value == pytest.approx(4 / 6)
    assert check.detail == (
        "mean score of single_needle at 1024 tokens: 0.67 [0.30, 0.90] n=6, too few items for +/-0.1 "
        "(95% Wilson interval)"
    )


def test_on_gate_fail_continue_logs_the_failure_and_goes_on(
    staged_packed: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Both gates fail and the run still ends; the second gate, measured with what the first one
    kept (its windows, the baseline's loss), equals one measured from scratch."""
    from longctx.core.layout import RunLayout
    from longctx.trainer.evaluation.gates import GateSettings, evaluate_gate
    from longctx.trainer.stage_plan import resolve_stages

    root = run_folder(staged_packed, tmp_path)
    impossible = {"max_short_loss_ratio": 0.001}
    stages = two_stages(steps=2, gate=impossible)
    stages[1]["gate"] = impossible
    cfg = staged(root, stages, on_gate_fail="continue")
    result = jobs.train(parse_config(cfg), progress=False)
    out = capsys.readouterr().out
    for stage in ("stage 1 (256 tokens)", "stage 2 (512 tokens)"):
        assert f"warning: {stage} failed its gate: short_loss_ratio" in out
    assert "going on (train.on_gate_fail: continue)" in out
    assert "set train.on_gate_fail" not in out  # already set: not advised
    assert [o.gate.passed for o in result.stages] == [False, False]
    assert (root / "train" / "stages" / "2-512" / "final" / "config.json").is_file()
    assert json.loads((root / "train" / "stages" / "1-256" / "gate.json").read_text())["passed"] is False
    parsed = parse_config(cfg)
    assert parsed.train is not None
    second = resolve_stages(parsed.train, RunLayout(root))[1]
    fresh = evaluate_gate(
        second,
        train=parsed.train,
        context=parsed.context,
        layout=RunLayout(root),
        tokenizer=None,
        settings=GateSettings(parsed.eval),
        device=torch.device("cpu"),
    )
    assert fresh.checks == result.stages[1].gate.checks
    assert fresh.measured == result.stages[1].gate.measured


@pytest.mark.slow
def test_a_run_killed_mid_stage_2_resumes_to_the_same_weights(staged_packed: Path, tmp_path: Path) -> None:
    """SIGKILL once stage 2 has a checkpoint, start again: stage 1 is left alone, stage 2 resumes from
    its checkpoint and ends with the uninterrupted run's weights. Losing stage 2 entirely (a kill
    between the stages) restarts it from stage 1 to the same weights too."""
    stages = two_stages(steps=3)
    stages[1]["steps"] = 8
    straight = run_folder(staged_packed, tmp_path, "straight")
    jobs.train(parse_config(staged(straight, stages, checkpoint={"every": 1, "keep": 2})), progress=False)
    want = weights(straight / "train" / "stages" / "2-512" / "final")

    killed = run_folder(staged_packed, tmp_path, "killed")
    config = tmp_path / "killed.yaml"
    config.write_text(yaml.safe_dump(staged(killed, stages, checkpoint={"every": 1, "keep": 2})))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    process = subprocess.Popen(
        [sys.executable, "-m", "longctx.cli", "train", "--config", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
    checkpoints = killed / "train" / "stages" / "2-512" / "checkpoints"
    deadline = time.monotonic() + 600
    while not (checkpoints / "step_0000002" / "manifest.json").is_file():
        assert process.poll() is None and time.monotonic() < deadline, "the run ended before it was killed"
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    stage1 = snapshot(killed / "train" / "stages" / "1-256")
    result = jobs.train(
        parse_config(staged(killed, stages, checkpoint={"every": 1, "keep": 2})), progress=False
    )
    first, second = result.stages
    assert first.result is None and 2 <= second.result.resumed_from < 8
    assert snapshot(killed / "train" / "stages" / "1-256") == stage1
    assert_same_weights(weights(killed / "train" / "stages" / "2-512" / "final"), want)
    assert [r["step"] for r in records(killed / "train" / "stages" / "2-512" / "metrics.jsonl")] == list(
        range(1, 9)
    )

    shutil.rmtree(killed / "train" / "stages" / "2-512")  # as if killed before stage 2 started
    jobs.train(parse_config(staged(killed, stages, checkpoint={"every": 1, "keep": 2})), progress=False)
    assert_same_weights(weights(killed / "train" / "stages" / "2-512" / "final"), want)


def test_eval_reports_effective_length_and_short_ratio_from_its_own_results(
    staged_packed: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    root = run_folder(staged_packed, tmp_path)
    config = tmp_path / "run.yaml"
    settings = staged(root, two_stages(steps=2))
    settings["eval"]["needle"] |= {
        "kinds": ["single_needle", "document_qa"],
        "depths": [0.0, 1.0],
        "samples": 2,
    }
    config.write_text(yaml.safe_dump(settings))
    jobs.train(parse_config(settings), progress=False)
    capsys.readouterr()
    assert main(["eval", "--config", str(config), "--model", "trained"]) == 0
    out = capsys.readouterr().out
    folder = root / "eval" / "001"
    summary = json.loads((folder / "summary.json").read_text())
    needles = json.loads((folder / "needle.json").read_text())

    # the baseline was evaluated although --model left it out
    assert [(m["label"], m["added_as_baseline"]) for m in summary["models"]] == [
        ("trained", False),
        ("base", True),
    ]
    assert "base was evaluated too" in out
    # the effective lengths and task scores are effective.py's on the results written to needle.json
    assert needles["lengths"] == [256, 512]
    results = {
        m["label"]: [NeedleResult(**{**r, "score": r["score"]}) for r in m["results"]]
        for m in needles["models"]
    }
    expected = effective_lengths(results, EffectiveLengthConfig())
    assert summary["effective_length"] == json.loads(json.dumps(expected))
    for label, found in expected["models"].items():
        for row in found["scores"]:  # each with its count and interval, and n=2 is too few items
            low, high = row["low"], row["high"]
            assert row["count"] == 4 and not row["enough"]  # 2 kinds x 2 items
            text = f"{row['score']:.2f} [{low:.2f}, {high:.2f}] n=4, too few items for +/-0.1"
            assert f"      {row['context_tokens']:>7}: {text}" in out
        if found["status"] == "undetermined":
            assert f"  {label}: undetermined: {found['reason']}" in out
        for task, by_length in task_scores(results[label]).items():
            assert summary["task_scores"][label][task] == [
                {"context_tokens": n, **json.loads(json.dumps(s.as_json()))} for n, s in by_length.items()
            ]
            assert [c["count"] for c in summary["task_scores"][label][task]] == [2, 2]
    # the short-context guard: each model's loss on the held-out windows, and the ratio of the two
    short = summary["short_context"]
    losses = {m["label"]: m["mean_loss"] for m in short["models"]}
    ratios = {m["label"]: m["ratio"] for m in short["models"]}
    assert short["source"] == "papers" and short["held_out"] and short["excluded_as_trained"] == 0
    assert ratios == {"trained": losses["trained"] / losses["base"], "base": 1.0}
    # and against the base as released: the base of the same run without its RoPE scaling (YaRN),
    # evaluated as a run of its own, is the denominator
    plain = [{"seq_len": stage["seq_len"], "steps": stage["steps"]} for stage in settings["train"]["stages"]]
    released = dict(settings, train={**settings["train"], "model": {"tiny": TINY}, "stages": plain})
    alone = jobs.evaluate(
        parse_config(released | {"eval": {**settings["eval"], "models": ["base"], "needle": None}})
    )
    (own,) = alone["short_context"]["models"]
    assert short["released_base"] == pytest.approx(own["mean_loss"], rel=1e-9, abs=0)
    # the rescaled base is another model: YaRN moves its short-window loss a little (by about 3e-6 here)
    assert abs(short["released_base"] - losses["base"]) > 1e-7
    to_released = {m["label"]: m["ratio_to_released"] for m in short["models"]}
    assert to_released == pytest.approx({label: loss / own["mean_loss"] for label, loss in losses.items()})
    assert (
        f"  trained: loss {losses['trained']:.4f}, ratio {ratios['trained']:.3f}, ratio to the released "
        f"base {to_released['trained']:.3f}"
    ) in out
    assert (folder / "score_by_length.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_source_with_no_held_out_document_is_reported_with_what_to_do(
    staged_packed: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Every ``anchor`` document is in the training rows: eval says so and skips the guard; a gate
    that needs the guard stops the run with the same reason."""
    root = run_folder(staged_packed, tmp_path)
    settings = staged(root, two_stages(steps=1))
    settings["eval"] |= {"short_context": {"source": "anchor"}, "needle": None}
    jobs.train(parse_config(settings), progress=False)
    capsys.readouterr()
    result = jobs.evaluate(parse_config(settings))
    out = capsys.readouterr().out
    reason = result["short_context"]["skipped"]
    assert (
        reason.startswith("eval.short_context: all ")
        and "source 'anchor' are in the training windows" in reason
    )
    assert "fraction 0 in pack.mix" in reason and f"warning: {reason}" in out
    # a gate that needs the guard cannot be measured: the run stops with the same reason
    settings["train"]["stages"][1]["gate"] = {"max_short_loss_ratio": 1.0}
    with pytest.raises(NoHeldOutDocuments) as err:
        jobs.train(parse_config(settings), progress=False)
    assert str(err.value) == reason
    assert not (root / "train" / "stages" / "2-512" / "gate.json").exists()


def test_stage_paths_are_the_run_layouts(tmp_path: Path) -> None:
    from longctx.core.layout import RunLayout

    stage = RunLayout(tmp_path).stage(2, 2048)
    assert stage.folder == tmp_path / "train" / "stages" / "2-2048"
    assert (stage.checkpoints, stage.metrics, stage.final_model, stage.gate) == (
        stage.folder / "checkpoints",
        stage.folder / "metrics.jsonl",
        stage.folder / "final",
        stage.folder / "gate.json",
    )
    assert stage.export(7) == stage.folder / "export" / "step_0000007"


def test_every_stages_shards_are_checked_before_any_rank_starts(
    staged_packed: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """``longctx train --nproc 2`` refuses a plan whose later stage cannot run before starting the
    ranks or writing anything: shards missing, or of another length."""
    root = run_folder(staged_packed, tmp_path)
    config = tmp_path / "run.yaml"
    wrong = two_stages(steps=1, shards=str(root / "shards" / "seq256"))
    config.write_text(yaml.safe_dump(staged(root, wrong, cp=2)))
    assert main(["train", "--config", str(config), "--nproc", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"longctx train: train.stages[1].seq_len = 512, but its shards ({root / 'shards' / 'seq256'}) hold "
        "windows of 256 tokens: point train.stages[1].shards at windows of its length"
    )
    shutil.rmtree(root / "shards" / "seq512")
    config.write_text(yaml.safe_dump(staged(root, two_stages(steps=1), cp=2)))
    assert main(["train", "--config", str(config), "--nproc", "2"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and str(root / "shards" / "seq512") in err, err
    assert not (root / "train").exists()


@pytest.mark.slow
def test_a_finished_staged_run_says_so_and_exports_a_stage_at_another_world_size(
    staged_packed: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A two-stage run trained by 2 ranks (--nproc 2, cp=2), its first gate passed: started again, it
    prints each stage's results and gate and changes nothing; ``--export 2 --stage 1`` in one process
    reads the 2-rank checkpoint and writes exactly the weights the run exported itself."""
    from longctx.trainer.evaluation.gates import GateResult
    from tests.core.disks import tree

    root = run_folder(staged_packed, tmp_path)
    config = tmp_path / "run.yaml"
    stages = two_stages(steps=2, gate={"max_short_loss_ratio": 1000.0})
    config.write_text(yaml.safe_dump(staged(root, stages, cp=2)))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    done = subprocess.run(
        [sys.executable, "-m", "longctx.cli", "train", "--config", str(config), "--nproc", "2"],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
    )  # a hang guard
    assert done.returncode == 0, done.stderr[-3000:]
    stage1, stage2 = root / "train" / "stages" / "1-256", root / "train" / "stages" / "2-512"
    gate = GateResult.from_json(json.loads((stage1 / "gate.json").read_text()))
    assert gate.passed

    before = tree(root / "train")
    assert main(["train", "--config", str(config), "--nproc", "2"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "training already finished: every stage of train.stages is trained; nothing to do",
        f"stage 1 (256 tokens): model {stage1 / 'final'}; metrics {stage1 / 'metrics.jsonl'}",
        f"  gate passed: {gate.summary()}",
        f"stage 2 (512 tokens): model {stage2 / 'final'}; metrics {stage2 / 'metrics.jsonl'}",
        f"final model: {stage2 / 'final'}",
        "add steps or stages to train.stages to train further, or train into another output folder",
    ]
    assert tree(root / "train") == before

    assert main(["train", "--config", str(config), "--export", "2", "--stage", "1"]) == 0
    exported = stage1 / "export" / "step_0000002"
    assert f"exported step 2 to {exported}" in capsys.readouterr().out
    assert_same_weights(weights(exported), weights(stage1 / "final"))
    for name in ("config.json", "tokenizer.json"):
        assert (exported / name).read_bytes() == (stage1 / "final" / name).read_bytes(), name
    # a stage without that checkpoint is refused in one line naming the steps it has
    assert main(["train", "--config", str(config), "--export", "3", "--stage", "2"]) == 2
    err = capsys.readouterr().err
    assert f"no checkpoint of step 3 in {stage2 / 'checkpoints'}" in err and "Traceback" not in err


def test_stages_train_a_family_the_own_decoder_cannot_read_as_two_runs_chained_by_hand(
    staged_packed: Path, tmp_path: Path
) -> None:
    """A Qwen3 checkpoint (q/k norms: only its transformers code runs it): the staged run, whose gate
    measures the stage's model with that same code, ends with the weights of two ordinary runs
    chained by hand. (The gate used to load every stage with the own decoder, which stopped a Qwen3
    run at its first gate.)"""
    pytest.importorskip("transformers", reason="the transformers extra is not installed")
    from tests.trainer.families import save_tiny

    root = run_folder(staged_packed, tmp_path)
    base = save_tiny(tmp_path / "qwen3", "qwen3", vocab_size=320)
    model = {"rope_scaling": YARN, "hf_path": str(base)}
    cfg = staged(root, two_stages(steps=2, gate={"max_short_loss_ratio": 1000.0}), model=model)
    result = jobs.train(parse_config(cfg), progress=False)
    assert [o.gate.passed for o in result.stages if o.gate is not None] == [True]

    def single(name: str, seq_len: int, factor: float, start: dict[str, Any]) -> Path:
        out = tmp_path / name
        plain = {
            "output": str(out),
            "context": {"original": ORIGINAL, "target": seq_len},
            "tokenizer": {"path": str(root / "tokenizer.json")},
            "train": {
                "shards": str(root / "shards" / f"seq{seq_len}"),
                "steps": 2,
                "optim": {"lr": 3e-3, "warmup_steps": 1},
                "checkpoint": {"every": 3, "keep": 3},
                "model": {**start, "rope_scaling": {**YARN, "factor": factor}},
            },
        }
        jobs.train(parse_config(plain), progress=False)
        return out / "train" / "final"

    first = single("A", 256, 2.0, {"hf_path": str(base)})
    second = single("B", 512, 4.0, {"hf_path": str(first)})
    stages = root / "train" / "stages"
    assert_same_weights(weights(stages / "1-256" / "final"), weights(first))
    assert_same_weights(weights(stages / "2-512" / "final"), weights(second))
