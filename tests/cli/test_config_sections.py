"""Sections that disagree with each other are refused when the config is loaded, in one line naming
both keys, before any job starts (``longctx.config.check_sections``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from longctx.cli import main
from longctx.config import load_config, parse_config
from longctx.core.errors import ConfigError

CONTEXT = {"original": 512, "target": 2048}


def config(**sections) -> dict:
    return {"context": dict(CONTEXT)} | sections


def test_training_reads_a_length_that_pack_does_not_build() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(config(pack={"seq_lens": [1024]}, train={"cp": 1}), "run.yaml")
    message = str(err.value)
    assert "\n" not in message
    assert message == (
        "run.yaml: train.shards is unset, so training reads the windows of context.target = 2048 tokens, "
        "and pack.seq_lens [1024] does not build them: add 2048 to pack.seq_lens, or set train.shards"
    )
    # the lengths pack builds by default, or a list with the target, or shards named explicitly: accepted
    parse_config(config(pack={}, train={"cp": 1}))
    parse_config(config(pack={"seq_lens": [1024, 2048]}, train={"cp": 1}))
    parse_config(config(pack={"seq_lens": [1024]}, train={"cp": 1, "shards": "s3://bucket/run/seq1024"}))
    parse_config(config(pack={"seq_lens": [1024]}))  # no train section: nothing to disagree with


@pytest.mark.parametrize("target", [1000, 1024, 1536, 2046, 2048, 3000])
@pytest.mark.parametrize("cp", [1, 2, 3, 4, 8])
def test_the_window_training_reads_must_split_into_2cp_chunks(target: int, cp: int) -> None:
    """Zigzag context parallelism gives each of the ``cp`` ranks two of ``2 cp`` equal chunks of every
    window: a target that is not a multiple of ``2 cp`` is refused at load, whatever the command."""
    data = config(pack={}, train={"cp": cp}) | {"context": {"original": 512, "target": target}}
    if target % (2 * cp) == 0:
        assert parse_config(data).train.cp == cp
        return
    with pytest.raises(ConfigError) as err:
        parse_config(data, "run.yaml")
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(
        f"run.yaml: context.target = {target} must be a positive multiple of 2 x train.cp = {2 * cp} (zigzag"
    )


def test_explicit_shards_are_checked_when_training_starts_not_at_load() -> None:
    """With ``train.shards`` the window length is in the shards' manifest, read before the ranks start
    (``longctx.trainer.preflight``); the target does not bind it."""
    data = config(train={"cp": 8, "shards": "s3://bucket/run/shards/seq4096"})
    data["context"]["target"] = 1000
    assert parse_config(data).train.shards == "s3://bucket/run/shards/seq4096"


def test_eval_of_the_base_model_needs_a_train_section() -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(config(eval={}), "run.yaml")
    assert str(err.value) == (
        "run.yaml: eval.models: 'base' is the model of the train section, and this config has none"
    )
    assert parse_config(config(eval={"models": ["trained"]})).eval.models == ["trained"]
    assert parse_config(config(eval={}, train={})).eval.models == ["base", "trained"]


def test_a_mismatch_stops_the_first_job_in_one_line(tmp_path: Path, capsys) -> None:
    """Packing windows training cannot split is refused before packing, not after it."""
    out = tmp_path / "out"
    data = config(output=str(out), pack={"seq_lens": [1002]}, train={"cp": 2})
    data["context"]["target"] = 1002
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(data))
    assert main(["pack", "--config", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"longctx pack: {path}: context.target = 1002 must be a positive multiple of 2 x train.cp = 4 "
        "(zigzag context parallelism cuts every window into 2 x cp equal chunks, two per rank); use windows "
        "of a multiple of 4 tokens, or a train.cp that divides 501"
    )
    assert not out.exists()
    # the override that fixes it is applied before the check
    with pytest.raises(ConfigError, match=r"pack\.seq_lens \[1002\] does not build them"):
        load_config(path, {"context.target": 1024})
    assert load_config(path, {"context.target": 1024, "pack.seq_lens": [1024]}).context.target == 1024


YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512}


def staged(*stages: dict, pack: dict | None = None, **train) -> dict:
    """A config training ``stages`` (windows of 1024 then 2048 by default) over ``pack``."""
    settings = {"cp": 2, "model": {"rope_scaling": YARN}, "stages": list(stages)} | train
    return config(pack=pack if pack is not None else {"seq_lens": [1024, 2048]}, train=settings)


GOOD = ({"seq_len": 1024, "steps": 3, "factor": 2.0}, {"seq_len": 2048, "steps": 3, "factor": 4.0})


@pytest.mark.parametrize(
    ("stages", "extra", "message"),
    [
        (
            ({"seq_len": 1024, "steps": 3}, {"seq_len": 4096, "steps": 3}),
            {},
            "train.stages[1].seq_len = 4096, the last stage, must be context.target = 2048",
        ),
        (
            ({"seq_len": 1536, "steps": 3}, {"seq_len": 2048, "steps": 3}),
            {},
            "train.stages[0].seq_len = 1536 is not packed: pack.seq_lens [1024, 2048] does not build it; add "
            "1536 to pack.seq_lens, or set train.stages[0].shards",
        ),
        (
            ({"seq_len": 1026, "steps": 3, "shards": "s3://b/seq1026"}, {"seq_len": 2048, "steps": 3}),
            {},
            "train.stages[0].seq_len = 1026 must be a positive multiple of 2 x train.cp = 4",
        ),
        (
            ({"seq_len": 256, "steps": 3, "shards": "s3://b/seq256"}, {"seq_len": 2048, "steps": 3}),
            {},
            "train.stages[0].seq_len = 256 is below context.original = 512",
        ),
        (
            ({"seq_len": 1024, "steps": 3, "factor": 3.0}, {"seq_len": 2048, "steps": 3, "factor": 2.0}),
            {},
            "train.stages[1]: RoPE factor 2 is below train.stages[0]'s 3: factors must not shrink",
        ),
        (
            ({"seq_len": 1024, "steps": 3, "factor": 2.0}, {"seq_len": 2048, "steps": 3, "factor": 8.0}),
            {},
            "train.stages[1]: RoPE factor 8 is outside [1, context.target / context.original = 4]",
        ),
        (
            GOOD[:1]
            + (
                {
                    "seq_len": 2048,
                    "steps": 3,
                    "rope_scaling": {**YARN, "original_max_position_embeddings": 8192},
                },
            ),
            {},
            "train.stages[1]: its RoPE scaling's original_max_position_embeddings = 8192 is not "
            "context.original = 512",
        ),
    ],
)
def test_a_stage_plan_that_cannot_run_is_refused_at_load(stages: tuple, extra: dict, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(staged(*stages, **extra), "run.yaml")
    text = str(err.value)
    assert "\n" not in text and text.startswith(f"run.yaml: {message}"), text


@pytest.mark.parametrize(
    ("train", "message"),
    [
        ({"steps": 10}, r"train\.steps \(or --steps\) and train\.stages: each stage has its own steps"),
        ({"shards": "s3://b/seq2048"}, r"train\.shards \(or --shards\) and train\.stages"),
        (
            {"stages": [GOOD[1], GOOD[0]]},
            r"train\.stages: each stage's seq_len must exceed the one before: \[2048, 1024\]",
        ),
        (
            {"model": {}},
            r"train\.stages\[0\]\.factor changes the factor of train\.model\.rope_scaling, which is not",
        ),
        ({"stages": []}, r"train\.stages: List should have at least 1 item"),
        (
            {"stages": [{**GOOD[0], "factor": 2.0, "rope_scaling": YARN}]},
            "give rope_scaling or factor, not both",
        ),
        ({"stages": [{**GOOD[0], "gate": {"max_short_loss": 1.1}}]}, r"did you mean 'max_short_loss_ratio'"),
    ],
)
def test_stage_settings_are_checked_within_the_train_section(train: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_config(staged(*GOOD, **train), "run.yaml")


def test_a_good_stage_plan_loads_and_resolves_each_stage() -> None:
    from longctx.core.layout import RunLayout
    from longctx.trainer.stage_plan import resolve_stages, stage_context, stage_train_config

    cfg = parse_config(
        staged(*GOOD, coverage={"required_position": 1800}, optim={"lr": 1e-3}, global_batch_rows=4)
    )
    first, second = resolve_stages(cfg.train, RunLayout(Path("out")))
    assert (first.rope_scaling, second.rope_scaling) == ({**YARN, "factor": 2.0}, {**YARN, "factor": 4.0})
    assert (first.steps_before, second.steps_before) == (0, 3)
    assert first.layout.folder == Path("out/train/stages/1-1024")
    own = stage_train_config(cfg.train, first)
    assert (own.steps, own.stages, own.global_batch_rows, own.optim.lr) == (3, None, 4, 1e-3)
    assert own.coverage.required_position == 1023  # capped at the stage's last position
    assert stage_train_config(cfg.train, second).coverage.required_position == 1800
    assert stage_context(cfg.context, first).target == 1024
    # a stage may name a whole RoPE scaling (and its own lr), or keep the checkpoint's
    linear = {"rope_type": "linear", "factor": 2.0}
    cfg = parse_config(
        staged(
            {"seq_len": 1024, "steps": 1, "rope_scaling": linear, "lr": 5e-4},
            GOOD[1] | {"factor": None},
            model={},
        )
    )
    first, second = resolve_stages(cfg.train, RunLayout(Path("out")))
    assert (first.rope_scaling, second.rope_scaling) == (linear, None)
    assert stage_train_config(cfg.train, first).optim.lr == 5e-4
