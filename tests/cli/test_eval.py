"""`longctx eval` compares models on the same windows and needles and never overwrites a result.

The run trains from a Hugging Face checkpoint saved by transformers, so ``base`` (the model training
starts from) has an independent twin: the same checkpoint named by its folder must score exactly
the same. The trained model must beat the base on the held-out windows. The command is the
README's, run as written except for the config.
"""

from __future__ import annotations

import gzip
import json
import shlex
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import yaml

from longctx import jobs
from longctx.cli import main
from longctx.config import parse_config
from longctx.core.errors import ConfigError
from tests.packer.test_pack_helpers import make_config as make_pack_config
from tests.packer.test_pack_helpers import make_run
from tests.readme import code_blocks
from tests.s3server import s3  # noqa: F401  (the fixture)

transformers = pytest.importorskip("transformers")

SEQ_LEN = 256
SECTION = "Comparing models: `longctx eval`"


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> tuple[Path, Path, Path]:
    """(run folder, config file, base checkpoint): shards of 256 tokens, 3 steps from a tiny Llama."""
    root = tmp_path_factory.mktemp("eval_run")
    make_run(root)
    jobs.pack(make_pack_config(root, seq_lens=[SEQ_LEN]))
    base = root / "base-llama"
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=320,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=SEQ_LEN,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(base, safe_serialization=True)
    (readme_eval,) = (yaml.safe_load(b)["eval"] for b in code_blocks(SECTION, "yaml"))
    settings: dict[str, Any] = {
        "output": str(root),
        "context": {"original": 128, "target": SEQ_LEN},
        "tokenizer": {"path": str(root / "tokenizer.json")},
        "train": {
            "model": {"hf_path": str(base)},
            "steps": 3,
            "holdout_rows": 4,
            "optim": {"lr": 1e-2, "warmup_steps": 1},
            "coverage": {"required_position": 200},
            "checkpoint": {"every": 3, "keep": 1},
        },
        # the README's eval section, on this run's short windows and few steps
        "eval": {
            **readme_eval,
            "rows": 4,
            "needle": {
                **readme_eval["needle"],
                "lengths": [256, 384],
                "depths": [0.0, 1.0],
                "max_new_tokens": 4,
            },
        },
    }
    path = root / "run.yaml"
    path.write_text(yaml.safe_dump(settings))
    jobs.train(parse_config(settings), progress=False)
    return root, path, base


def readme_command(config: Path) -> list[str]:
    """The README's ``longctx eval`` command with its config replaced."""
    (line,) = [
        line
        for b in code_blocks(SECTION, "bash")
        for line in b.splitlines()
        if line.startswith("longctx eval")
    ]
    argv = shlex.split(line)[1:]
    argv[argv.index("--config") + 1] = str(config)
    return argv


@pytest.mark.slow
def test_models_are_compared_on_the_same_windows_and_needles(trained_run, capsys) -> None:
    root, config, base = trained_run
    argv = readme_command(config) + ["--model", str(base)]
    assert main(argv) == 0
    out = capsys.readouterr().out
    folder = root / "eval" / "001"
    assert f"written to {folder}" in out
    losses = json.loads((folder / "loss_by_position.json").read_text())
    needles = json.loads((folder / "needle.json").read_text())
    order = ["base", "trained", "base-llama"]
    assert [m["label"] for m in losses["models"]] == order == [m["label"] for m in needles["models"]]
    losses["models"] = {m["label"]: m for m in losses["models"]}
    needles["models"] = {m["label"]: m for m in needles["models"]}
    assert losses["held_out_rows"] == 4 == len(losses["rows"])

    # base is the checkpoint training started from: the same numbers as that folder evaluated directly
    by_model = {label: m["buckets"] for label, m in losses["models"].items()}
    for ours, twin in zip(by_model["base"], by_model["base-llama"]):
        assert ours["tokens"] == twin["tokens"]
        assert ours["mean_loss"] == pytest.approx(twin["mean_loss"], rel=1e-6)
    assert needles["models"]["base"]["results"] == needles["models"]["base-llama"]["results"]

    def mean(buckets: list[dict]) -> float:
        return sum(b["mean_loss"] * b["tokens"] for b in buckets if b["tokens"]) / sum(
            b["tokens"] for b in buckets
        )

    assert mean(by_model["trained"]) < mean(by_model["base"])

    # eval.needle.samples (6) items per (kind, length), the same needles for every model
    results = needles["models"]["trained"]["results"]
    assert len(results) == 2 * 6 == needles["models"]["trained"]["examples"]
    for n in (256, 384):  # spread evenly over the depths, item i at depths[i % 2]
        items = [r for r in results if r["context_tokens"] == n]
        assert [r["item"] for r in items] == list(range(6))
        assert [r["depth"] for r in items] == [0.0, 1.0] * 3
    # every item says what was asked; its prompt is in needle_prompts.jsonl.gz, once for every model
    with gzip.open(folder / "needle_prompts.jsonl.gz", "rt", encoding="utf-8") as f:
        prompts = [json.loads(line) for line in f]
    assert [p["id"] for p in prompts] == list(range(12))
    for r in results:
        prompt = prompts[r["prompt"]]
        assert (prompt["context_tokens"], prompt["depth"], prompt["seed"]) == (
            r["context_tokens"],
            r["depth"],
            r["seed"],
        )
        assert r["question"] and r["question"] in prompt["prompt"]
        assert r["needles"] and all(needle in prompt["prompt"] for needle in r["needles"])
        assert r["answer"] in " ".join(r["needles"])
    assert [r["answer"] for r in results] == [r["answer"] for r in needles["models"]["base"]["results"]]
    for label in ("base", "trained"):
        scored = needles["models"][label]["results"]
        assert needles["models"][label]["accuracy"] == sum(r["correct"] for r in scored) / 12
        assert needles["models"][label]["by_length"] == [
            {
                "context_tokens": n,
                "accuracy": sum(r["correct"] for r in scored if r["context_tokens"] == n) / 6,
                "count": 6,
            }
            for n in (256, 384)
        ]
    for plot in ("loss_by_position.png", "needle.png"):
        assert (folder / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = (folder / "loss_by_position.txt").read_text().splitlines()
    assert table[0].split()[2:] == ["base", "trained", "base-llama"]

    # a second evaluation gets its own folder; the first is untouched
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert main(["eval", "--config", str(config), "--model", "trained"]) == 0
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    second = json.loads((root / "eval" / "002" / "summary.json").read_text())
    # the same needles give the same prompts file, byte for byte (no time stamp in it)
    prompts = "needle_prompts.jsonl.gz"
    assert (root / "eval" / "002" / prompts).read_bytes() == (folder / prompts).read_bytes()
    # each model is held to its own short score: without the short-context guard no baseline is added
    assert [(m["label"], m["added_as_baseline"]) for m in second["models"]] == [("trained", False)]
    assert second["needle_accuracy"] == [
        {"label": "trained", "accuracy": needles["models"]["trained"]["accuracy"]}
    ]


def test_bad_models_are_refused_before_any_work(trained_run, tmp_path: Path, capsys) -> None:
    root, config, _ = trained_run
    before = sorted(p.name for p in (root / "eval").iterdir()) if (root / "eval").exists() else []
    assert main(["eval", "--config", str(config), "--model", str(tmp_path / "missing")]) == 2
    err = capsys.readouterr().err
    assert "eval.models" in err and "missing" in err and len(err.strip().splitlines()) == 2
    assert main(["eval", "--config", str(config), "--model", "trained", "--model", "trained"]) == 2
    assert "listed twice" in capsys.readouterr().err
    assert (
        main(["eval", "--config", str(config), "--output", str(tmp_path / "empty"), "--model", "trained"])
        == 2
    )
    assert "no trained model at" in capsys.readouterr().err
    after = sorted(p.name for p in (root / "eval").iterdir()) if (root / "eval").exists() else []
    assert after == before and not (tmp_path / "empty").exists()


def test_eval_shards_from_s3_score_as_the_local_copy(trained_run, s3, tmp_path: Path) -> None:
    """``eval.shards`` given as an ``s3://`` URL (published from the run's shards) scores exactly the
    windows and losses of the same folder read locally, from a checked copy in the run's cache;
    its storage options never reach the results."""
    import shutil

    from longctx.core.remote import cache_folder, publish_folder

    root, config, _ = trained_run
    local = tmp_path / "seq256"  # a copy: not the training folder, so no held-out rows either way
    shutil.copytree(root / "shards" / f"seq{SEQ_LEN}", local)
    url = f"s3://{s3.bucket()}/elsewhere/seq{SEQ_LEN}"
    publish_folder(local, url, last="manifest.json", storage_options=s3.storage_options)
    settings = yaml.safe_load(config.read_text())
    settings["eval"] = {"models": ["trained"], "rows": 3, "needle": None, "shards": str(local)}
    by_local = jobs.evaluate(parse_config(settings))
    settings["eval"] |= {"shards": url, "storage_options": s3.storage_options}
    by_url = jobs.evaluate(parse_config(settings))
    expected = json.loads((Path(by_local["folder"]) / "loss_by_position.json").read_text())
    got = json.loads((Path(by_url["folder"]) / "loss_by_position.json").read_text())
    assert got["shards"] == url and expected["shards"] == str(local)
    assert got["rows"] == expected["rows"] and got["models"] == expected["models"]
    assert (cache_folder(url, root / "cache") / "manifest.json").read_bytes() == (
        local / "manifest.json"
    ).read_bytes()
    assert s3.endpoint not in (Path(by_url["folder"]) / "summary.json").read_text()
    with pytest.raises(ConfigError, match=r"eval\.shards: path does not exist"):
        jobs.evaluate(parse_config(settings | {"eval": {"shards": str(tmp_path / "missing")}}))


def test_a_damaged_model_folder_is_refused_in_one_line_naming_the_file(
    trained_run, tmp_path: Path, capsys
) -> None:
    """A truncated final/model.safetensors (eval --model trained) and a truncated Hugging Face folder
    given with --model: one line naming the file before any model is scored, instead of a
    SafetensorError traceback; no evaluation folder is written."""
    import shutil

    root, config, base = trained_run
    output = tmp_path / "run"
    shutil.copytree(root / "train" / "final", output / "train" / "final")
    shutil.copytree(base, tmp_path / "base-copy")
    for weights in (
        output / "train" / "final" / "model.safetensors",
        tmp_path / "base-copy" / "model.safetensors",
    ):
        data = weights.read_bytes()
        weights.write_bytes(data[: len(data) // 2])
    for argv, damaged in (
        (["--output", str(output), "--model", "trained"], output / "train" / "final" / "model.safetensors"),
        (["--model", str(tmp_path / "base-copy")], tmp_path / "base-copy" / "model.safetensors"),
    ):
        before = sorted(p.name for p in (root / "eval").iterdir()) if (root / "eval").exists() else []
        assert main(["eval", "--config", str(config), *argv]) == 2
        err = capsys.readouterr().err
        assert err.splitlines() == [
            f"longctx eval: {damaged}: not a complete safetensors file (incomplete metadata, file not fully "
            "covered); the folder is damaged: export or copy it again"
        ]
        assert not (output / "eval").exists()
        assert (
            sorted(p.name for p in (root / "eval").iterdir()) if (root / "eval").exists() else []
        ) == before


def test_training_windows_are_not_scored_as_held_out(trained_run, tmp_path: Path, capsys) -> None:
    """``eval.shards`` naming the training windows another way (a link, a copy) with more rows than
    training held out: refused when the trained model is scored (it said 'warning: only 0 held-out
    windows' and scored training windows); scored and labelled as training windows when asked."""
    import shutil

    from longctx.packer.dataset import PackedDataset

    root, config, _ = trained_run
    shards = root / "shards" / f"seq{SEQ_LEN}"
    (tmp_path / "link").symlink_to(shards)
    shutil.copytree(shards, tmp_path / "copy")
    held_out = PackedDataset(shards, tokenizer=root / "tokenizer.json", seed=0, holdout_rows=4).heldout_rows()
    settings = yaml.safe_load(config.read_text())
    before = sorted(p.name for p in (root / "eval").iterdir()) if (root / "eval").exists() else []
    for folder in (tmp_path / "link", tmp_path / "copy"):
        eval_section = {"models": ["trained"], "rows": 6, "needle": None, "shards": str(folder)}
        path = tmp_path / "eval.yaml"
        path.write_text(yaml.safe_dump({**settings, "eval": eval_section}))
        assert main(["eval", "--config", str(path)]) == 2
        (line,) = capsys.readouterr().err.splitlines()
        assert line.startswith(
            f"longctx eval: eval.rows = 6, but {folder} are the training windows and hold 4 that training "
            "did not see (train.holdout_rows = 4): the trained model would be scored on windows it trained "
            "on; lower eval.rows to 4, "
        )
        assert "eval.allow_training_windows: true" in line
        assert (
            sorted(p.name for p in (root / "eval").iterdir()) if (root / "eval").exists() else []
        ) == before

        # asked for: the 4 held-out windows first, then 2 training windows, said so in the results
        path.write_text(
            yaml.safe_dump({**settings, "eval": {**eval_section, "allow_training_windows": True}})
        )
        assert main(["eval", "--config", str(path)]) == 0
        out = capsys.readouterr().out
        caption = (
            "2 of these 6 windows are training windows (eval.allow_training_windows): the trained model's "
            "loss on them is a training loss"
        )
        assert caption in out
        folder_written = Path(out.split("written to ")[1].split(":\n")[0])
        losses = json.loads((folder_written / "loss_by_position.json").read_text())
        assert losses["rows"][:4] == held_out and len(set(losses["rows"])) == 6
        assert losses["held_out_rows"] == 4 and losses["training_rows"] == 2
        assert (folder_written / "loss_by_position.txt").read_text().splitlines()[0] == caption
        before = sorted(p.name for p in (root / "eval").iterdir())

    # the base model never trained on these windows: scored, and still labelled
    base_only = {"models": ["base"], "rows": 6, "needle": None, "shards": str(tmp_path / "copy")}
    result = jobs.evaluate(parse_config({**settings, "eval": base_only}))
    losses = json.loads((Path(result["folder"]) / "loss_by_position.json").read_text())
    assert losses["held_out_rows"] == 4 and losses["training_rows"] == 2


def test_progress_counts_every_model_window_and_needle() -> None:
    import io

    from longctx.trainer.evaluation.job import EvalProgress

    out = io.StringIO()
    progress = EvalProgress(2, 3, 5, file=out, enabled=True)
    assert progress.total == 2 * (3 + 5)
    seen = []
    for model in ("base", "trained"):
        seen += list(progress.track(range(3), model, "windows"))
        seen += list(progress.track(range(5), model, "needles"))
    assert seen == 2 * ([0, 1, 2] + [0, 1, 2, 3, 4]) and progress.bar.n == 16
    progress.close()
    assert "16/16" in out.getvalue() and "trained: needles" in out.getvalue()
    quiet = EvalProgress(1, 1, 1, file=io.StringIO())  # not a terminal: no bar
    assert list(quiet.track([7], "base", "windows")) == [7] and quiet.bar.disable


def changed_config(config: Path, where: Path, edit: Any) -> Path:
    """A copy of the run's config at ``where`` with ``edit(settings)`` applied."""
    settings = yaml.safe_load(config.read_text())
    edit(settings)
    where.write_text(yaml.safe_dump(settings))
    return where


def evaluations(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "eval").iterdir()) if (root / "eval").exists() else []


def test_missing_training_shards_are_named_by_their_key(trained_run, tmp_path: Path, capsys) -> None:
    """The windows eval scores default to ``train.shards``: a folder that does not exist is named
    under that key, not taken for a pack run that has not finished."""
    root, config, _ = trained_run
    missing = tmp_path / "nowhere" / "seq256"
    edited = changed_config(config, tmp_path / "run.yaml", lambda s: s["train"].update(shards=str(missing)))
    before = evaluations(root)
    assert main(["eval", "--config", str(edited), "--model", "trained"]) == 2
    err = capsys.readouterr().err
    assert err.strip() == f"longctx eval: train.shards: path does not exist: {missing}", err
    assert evaluations(root) == before


def test_a_needle_length_too_short_for_its_task_names_eval_needle_lengths(
    trained_run, tmp_path: Path, capsys
) -> None:
    """A length of the grid that cannot hold the task's instruction, question and needle is named
    as an entry of ``eval.needle.lengths`` (not the pipeline's ``context_tokens``); the removed
    ``eval.effective.baseline_length`` is refused naming the key and where the reference is now."""
    root, config, _ = trained_run
    before = evaluations(root)
    short = changed_config(
        config, tmp_path / "short.yaml", lambda s: s["eval"]["needle"].update(lengths=[16, 256])
    )
    assert main(["eval", "--config", str(short), "--model", "trained"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(
        "longctx eval: eval.needle.lengths: a length of 16 tokens leaves no room for haystack text"
    ), err
    assert "context_tokens" not in err and "eval.effective" not in err and "\n" not in err
    bar = changed_config(
        config, tmp_path / "bar.yaml", lambda s: s["eval"].update(effective={"baseline_length": 16})
    )
    assert main(["eval", "--config", str(bar), "--model", "trained"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines()[1] == (
        "  eval.effective: baseline_length was removed: each model's threshold comes from its own score "
        "at the shortest length of eval.needle.lengths (drop the key; list that length there)"
    ), err
    assert "Traceback" not in err
    assert evaluations(root) == before


def test_a_model_whose_vocabulary_the_shards_overflow_is_refused_before_any_work(
    trained_run, tmp_path: Path, capsys
) -> None:
    """Token ids of the shards (vocabulary 320) beyond a model's embedding (100 rows) are refused in
    one line naming the model folder and both sizes, before any model is loaded or folder written."""
    root, config, _ = trained_run
    small = tmp_path / "small-llama"
    shape = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1}
    heads = {"num_attention_heads": 2, "num_key_value_heads": 1}
    transformers.LlamaForCausalLM(transformers.LlamaConfig(vocab_size=100, **shape, **heads)).save_pretrained(
        small
    )
    before = evaluations(root)
    capsys.readouterr()
    assert main(["eval", "--config", str(config), "--model", str(small)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"longctx eval: {small}: ") and len(err.strip().splitlines()) == 1, err
    assert "100" in err and "320" in err and "Traceback" not in err
    assert evaluations(root) == before


def test_eval_documents_points_the_needles_elsewhere_local_or_s3(trained_run, s3, tmp_path: Path) -> None:
    """``eval.documents`` hides the needles in another documents folder: a copy of the run's gives the
    run's own prompts, one with other texts other prompts, and the copy published to ``s3://`` the
    local copy's prompts (from a copy in the run's cache); a missing folder is one error naming the
    key."""
    import shutil

    from longctx.core.remote import cache_folder, publish_folder

    root, config, _ = trained_run
    settings = yaml.safe_load(config.read_text())
    needle = {"lengths": [SEQ_LEN], "depths": [0.5], "samples": 2, "max_new_tokens": 2}
    settings["eval"] = {"models": ["trained"], "rows": 1, "allow_training_windows": True, "needle": needle}

    def prompts(eval_section: dict) -> list[str]:
        result = jobs.evaluate(parse_config(settings | {"eval": {**settings["eval"], **eval_section}}))
        with gzip.open(Path(result["folder"]) / "needle_prompts.jsonl.gz", "rt", encoding="utf-8") as f:
            return [json.loads(line)["prompt"] for line in f]

    own = prompts({})
    copy = tmp_path / "documents"
    shutil.copytree(root / "documents", copy)
    assert prompts({"documents": str(copy)}) == own
    other = tmp_path / "other"
    shutil.copytree(root / "documents", other)
    for f in sorted(other.rglob("*.parquet")):  # the same files, every text in reverse word order
        table = pq.read_table(f)
        texts = [" ".join(reversed(t.split())) for t in table.column("text").to_pylist()]
        pq.write_table(table.set_column(table.schema.get_field_index("text"), "text", pa.array(texts)), f)
    moved = prompts({"documents": str(other)})
    assert len(moved) == len(own) and all(a != b for a, b in zip(moved, own))

    url = f"s3://{s3.bucket()}/curated/documents"
    publish_folder(copy, url, storage_options=s3.storage_options)
    assert prompts({"documents": url, "storage_options": s3.storage_options}) == own
    fetched = cache_folder(url, root / "cache")
    assert sorted(p.relative_to(fetched) for p in fetched.rglob("*.parquet")) == sorted(
        p.relative_to(copy) for p in copy.rglob("*.parquet")
    )
    with pytest.raises(ConfigError, match=r"eval\.documents: path does not exist"):
        prompts({"documents": str(tmp_path / "missing")})
    with pytest.raises(ConfigError, match=r"^eval\.documents: no file under s3://"):
        prompts({"documents": f"s3://{s3.bucket()}/nothing", "storage_options": s3.storage_options})
