"""Distributed checkpoints in one process: damage, refusals, metrics on resume, export.

References: an uninterrupted run (for the losses after a resume), the bytes of files written before
(metrics are never rewritten beyond what resume requires), and ``transformers`` for exports.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from longctx import jobs
from longctx.config import parse_config
from longctx.core.errors import ConfigError
from longctx.trainer.checkpoint import CheckpointError
from tests.trainer.conftest import save_random_llama
from tests.trainer.test_train import train_config

transformers = pytest.importorskip("transformers")


def config(packed: Path, output: Path, **train: Any) -> dict[str, Any]:
    # a constant learning rate: a 3-step run resumed for a 4th step is the start of a 4-step run
    settings = {
        "steps": 3,
        "checkpoint": {"every": 1, "keep": 3},
        "optim": {"lr": 3e-3, "warmup_steps": 0, "min_lr_ratio": 1.0},
    }
    return train_config(packed, output, **{**settings, **train})


def run(cfg: dict[str, Any], **kwargs: Any):
    return jobs.train(parse_config(cfg), progress=False, **kwargs)


@pytest.fixture(scope="module")
def three_steps(packed: Path, tmp_path_factory) -> tuple[Path, list[float]]:
    """A finished 3-step run with checkpoints after every step, and the losses of 4 uninterrupted steps."""
    root = tmp_path_factory.mktemp("ckpt")
    straight = run(config(packed, root / "straight", steps=4)).losses
    run(config(packed, root / "run3"))
    return root / "run3", straight


def copy_of(run_folder: Path, tmp_path: Path) -> Path:
    target = tmp_path / "copy"
    shutil.copytree(run_folder, target)
    return target


def checkpoint(output: Path, step: int) -> Path:
    return output / "train" / "checkpoints" / f"step_{step:07d}"


def truncate(folder: Path) -> None:
    shard = folder / "dcp" / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:-100])


def flip(folder: Path) -> None:
    shard = folder / "dcp" / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 8] = bytes(b ^ 0x5A for b in data[middle : middle + 8])
    shard.write_bytes(bytes(data))


def drop_manifest(folder: Path) -> None:
    (folder / "manifest.json").unlink()


def drop_file(folder: Path) -> None:
    (folder / "dcp" / ".metadata").unlink()


DAMAGE = {
    "truncated": (truncate, "dcp/__0_0.distcp has"),
    "flipped": (flip, "dcp/__0_0.distcp does not match its checksum"),
    "no manifest": (drop_manifest, "manifest.json is missing"),
    "missing file": (drop_file, "dcp/.metadata is missing"),
}


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_a_damaged_newest_checkpoint_is_named_skipped_and_kept(
    kind: str,
    three_steps: tuple[Path, list[float]],
    packed: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
) -> None:
    original, straight = three_steps
    output = copy_of(original, tmp_path)
    damage, reason = DAMAGE[kind]
    damage(checkpoint(output, 3))
    damaged_files = {
        p.relative_to(checkpoint(output, 3)): p.read_bytes()
        for p in checkpoint(output, 3).rglob("*")
        if p.is_file()
    }
    metrics = output / "train" / "metrics.jsonl"
    before = metrics.read_text().splitlines(keepends=True)

    resumed = run(config(packed, output, steps=4))

    printed = capsys.readouterr().out
    assert f"checkpoint {checkpoint(output, 3)} is damaged: {reason}" in printed
    assert resumed.resumed_from == 2
    for a, b in zip(resumed.losses, straight[2:]):
        assert abs(a - b) <= 1e-6 * abs(b), (resumed.losses, straight)
    kept = checkpoint(output, 3).with_name("step_0000003.damaged")
    assert {p.relative_to(kept): p.read_bytes() for p in kept.rglob("*") if p.is_file()} == damaged_files
    # Metrics: the lines of steps 1-2 untouched, step 3's (about to be redone) moved aside, 3 and 4 appended.
    after = metrics.read_text().splitlines(keepends=True)
    assert after[:2] == before[:2] and [json.loads(line)["step"] for line in after] == [1, 2, 3, 4]
    assert (metrics.parent / "metrics.superseded.jsonl").read_text().splitlines(keepends=True) == before[2:]


def test_no_intact_checkpoint_refuses_unless_restart(
    three_steps: tuple[Path, list[float]], packed: Path, tmp_path: Path
) -> None:
    original, straight = three_steps
    output = copy_of(original, tmp_path)
    for step, damage in ((1, truncate), (2, drop_manifest), (3, flip)):
        damage(checkpoint(output, step))
    snapshot = {p: p.read_bytes() for p in output.rglob("*") if p.is_file()}
    with pytest.raises(
        CheckpointError,
        match=r"no intact checkpoint in .*step_0000003 \(dcp/__0_0.distcp does not "
        r"match its checksum\); step_0000002 \(manifest.json is missing .*\); step_0000001 .*--restart",
    ):
        run(config(packed, output))
    assert {
        p: p.read_bytes() for p in output.rglob("*") if p.is_file()
    } == snapshot  # a refused run changes nothing

    # The command line says so in one line, exit status 2.
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(config(packed, output)))
    done = subprocess.run(
        [sys.executable, "-m", "longctx.cli", "train", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2 and "no intact checkpoint" in done.stderr and "Traceback" not in done.stderr
    assert {p: p.read_bytes() for p in output.rglob("*") if p.is_file()} == snapshot

    metrics = output / "train" / "metrics.jsonl"
    earlier = metrics.read_bytes()
    restarted = run(config(packed, output), restart=True)
    assert restarted.resumed_from == 0
    assert abs(restarted.losses[0] - straight[0]) <= 1e-6 * straight[0]
    assert (metrics.parent / "metrics.before-restart-1.jsonl").read_bytes() == earlier
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == [1, 2, 3]
    for step in (1, 2, 3):
        assert checkpoint(output, step).with_name(f"step_{step:07d}.damaged").is_dir()


def test_restart_with_an_intact_checkpoint_is_refused(
    three_steps: tuple[Path, list[float]], packed: Path
) -> None:
    original, _ = three_steps
    snapshot = {p: p.read_bytes() for p in original.rglob("*") if p.is_file()}
    with pytest.raises(CheckpointError, match=r"--restart refused: .*step_0000003 is an intact checkpoint"):
        run(config(packed, original), restart=True)
    assert {p: p.read_bytes() for p in original.rglob("*") if p.is_file()} == snapshot


def test_a_run_killed_while_saving_leaves_no_checkpoint_behind(
    three_steps: tuple[Path, list[float]], packed: Path, tmp_path: Path
) -> None:
    """A writer killed before the rename leaves only ``step_<N>.tmp``: never resumed from, removed."""
    original, _straight = three_steps
    output = copy_of(original, tmp_path)
    checkpoint(output, 3).rename(checkpoint(output, 3).with_name("step_0000003.tmp"))
    resumed = run(config(packed, output, steps=4))
    assert resumed.resumed_from == 2 and not checkpoint(output, 3).with_name("step_0000003.tmp").exists()


def test_shards_with_a_larger_vocabulary_than_the_model_are_refused(packed: Path, tmp_path: Path) -> None:
    small = save_random_llama(tmp_path / "small_vocab", 100)
    with pytest.raises(
        ConfigError, match="use a vocabulary of 320 tokens but the model's embedding has 100 rows"
    ):
        run(config(packed, tmp_path / "out", model={"hf_path": str(small)}))
    assert not (tmp_path / "out").exists()


def test_shards_overflowing_a_per_layer_input_embedding_are_refused(packed: Path, tmp_path: Path) -> None:
    """Gemma 4's per-layer input embedding is indexed by every token id too: a smaller
    ``vocab_size_per_layer_input`` is refused like a smaller embedding (an IndexError on every rank
    before)."""
    from tests.trainer.families import save_tiny

    gemma4 = save_tiny(
        tmp_path / "gemma4",
        "gemma4_text",
        vocab_size=320,
        vocab_size_per_layer_input=128,
        sliding_window=1024,
    )
    with pytest.raises(ConfigError) as refused:
        run(config(packed, tmp_path / "out", model={"hf_path": str(gemma4)}))
    assert str(refused.value) == (
        f"the shards in {packed / 'shards' / 'seq256'} use a vocabulary of 320 tokens but the model's "
        "per-layer input embedding (vocab_size_per_layer_input) has 128 rows: pack with the model's "
        "tokenizer (or a model whose vocabulary covers it)"
    )
    assert not (tmp_path / "out").exists()


def test_a_model_beyond_this_machines_memory_is_refused_on_the_cpu(packed: Path, tmp_path: Path) -> None:
    """No GPU: the estimate is checked against the machine's physical memory (here some 8 TB of states)."""
    huge = {
        "tiny": {
            "hidden_size": 16384,
            "intermediate_size": 53248,
            "num_hidden_layers": 128,
            "num_attention_heads": 128,
            "num_key_value_heads": 8,
        }
    }
    with pytest.raises(ConfigError, match=r"does not fit this machine's memory: about .* per rank"):
        run(config(packed, tmp_path / "out", model=huge))
    assert not (tmp_path / "out").exists()


def test_the_cpu_ranks_of_one_machine_share_its_memory(monkeypatch) -> None:
    from longctx.trainer.train import device_memory

    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert device_memory(torch.device("cpu")) == physical // 4


def test_memory_beyond_the_device_is_refused_before_loading(
    packed: Path, tmp_path: Path, monkeypatch
) -> None:
    from longctx.trainer import train as train_module

    monkeypatch.setattr(train_module, "device_memory", lambda device: 1_000_000)
    with pytest.raises(
        ConfigError,
        match=r"does not fit .*per rank \(weights, AdamW moments and gradients "
        r".*train.activation_checkpointing",
    ):
        run(config(packed, tmp_path / "out"))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_export_opens_in_transformers_with_the_trained_logits(
    dtype: str, packed: Path, base_llama: Path, tmp_path: Path
) -> None:
    """``longctx train --export 2`` on a run started from a bf16 Llama: config, weights (dtype), tokenizer."""
    base = save_random_llama(tmp_path / "bf16_base", 320, dtype=torch.bfloat16)
    cfg = config(packed, tmp_path / "out", model={"hf_path": str(base)}, export={"dtype": "auto"})
    result = run(cfg)
    assert (
        json.loads((result.final_model / "config.json").read_text())["torch_dtype"] == "bfloat16"
    )  # as the base
    cfg["train"]["export"] = {"dtype": dtype, "max_shard_size": "20KB"}
    folder = jobs.export(parse_config(cfg), 2)
    assert folder == tmp_path / "out" / "train" / "export" / "step_0000002"
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 1  # sharded by huggingface_hub
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    assert hf.config.max_position_embeddings == 256
    assert hf.model.embed_tokens.weight.dtype == torch.float32

    from tests.trainer.test_sharded import weights  # the trained model, read back from its checkpoint

    trained = weights(tmp_path / "out", 2)
    stored = {name: tensor for name, tensor in hf.state_dict().items() if name in trained}
    assert stored.keys() == trained.keys()
    for name, tensor in trained.items():
        want = tensor if dtype == "float32" else tensor.to(torch.bfloat16).float()
        assert torch.equal(stored[name], want), name
    ids = torch.randint(0, 320, (1, 64), generator=torch.Generator().manual_seed(1))
    from longctx.trainer.models.decoder import ModelConfig, Transformer

    ours = Transformer(ModelConfig.from_hf(json.loads((folder / "config.json").read_text())))
    ours.load_state_dict(trained)
    with torch.no_grad():
        theirs = hf(input_ids=ids).logits[0]
        mine = ours.logits(
            ours(ids[0], torch.arange(64), torch.arange(64), torch.zeros(64, dtype=torch.long))
        )
    error = (theirs - mine).abs().max().item()
    # bf16 storage rounds each weight to 8 significant bits (relative error <= 2^-9); through this model
    # that moves the logits by well under 1% of their range.
    tolerance = 1e-5 if dtype == "float32" else 1e-2 * mine.abs().max().item()
    assert error <= tolerance, (error, tolerance)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    assert tokenizer.eos_token == "<|endoftext|>" and tokenizer.model_max_length == 256
    # the base checkpoint's token ids are kept (this random base has transformers' defaults)
    assert json.loads((folder / "config.json").read_text())["eos_token_id"] == 2
