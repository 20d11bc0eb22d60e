"""The trainer against independent references.

- Packing invariance: the loss (and gradients) of a packed, document-masked window equal the
  token-weighted mean of each segment's loss computed alone, with positions 0..n-1.
- Context parallelism: P = 2 ranks (gloo, zigzag split, ring attention) give the same loss and
  gradients as one process, for every RoPE type.
- Training: a tiny batch is overfitted; 6 steps equal 3 steps + resume + 3 steps; shards that never
  reach the required position are refused; a 2-rank CP run trains on CPU and its loss falls.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import yaml
from safetensors.torch import load_file

from longctx import jobs
from longctx.config import parse_config
from longctx.core.errors import ConfigError
from longctx.core.tokenizer import load_tokenizer
from longctx.packer import PackedDataset
from longctx.trainer.coverage import CoverageError, CoverageTracker
from longctx.trainer.models.decoder import ModelConfig, RingAttention, Transformer
from longctx.trainer.models.rope import RopeConfig
from longctx.trainer.parallel.layout import context_split
from tests.conftest import WINDOW
from tests.packer.test_pack_helpers import make_config as make_pack_config
from tests.packer.test_pack_helpers import synthetic_texts, write_curated

SEQ_LEN = WINDOW
ROPES = {
    "default": {},
    "linear": {"rope_type": "linear", "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "ntk": {"rope_type": "ntk", "factor": 4.0},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    "llama3": {
        "rope_type": "llama3",
        "factor": 4.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    },
    "longrope": {
        "rope_type": "longrope",
        "short_factor": [1.0] * 8,
        "long_factor": [1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.0],
        "original_max_position_embeddings": 64,
    },
}


def busiest_row(root: Path) -> dict[str, torch.Tensor]:
    """The window with the most document segments (several documents plus padding)."""
    ds = PackedDataset(root / "shards" / f"seq{SEQ_LEN}", tokenizer=root / "tokenizer.json", shuffle=False)
    return max((ds[i] for i in range(len(ds))), key=lambda s: len(s["cu_seqlens"]))


def tiny_model(vocab: int, rope: dict, attention=None, seed: int = 0) -> Transformer:
    cfg = ModelConfig.tiny(vocab_size=vocab, rope=RopeConfig(head_dim=16, max_position_embeddings=SEQ_LEN))
    cfg = cfg.with_rope(rope_scaling=rope or None, max_position_embeddings=SEQ_LEN)
    model = Transformer(cfg, attention=attention or RingAttention(None))
    model.init_weights(generator=torch.Generator().manual_seed(seed))
    return model


def segments(sample: dict[str, torch.Tensor]) -> list[tuple[int, int]]:
    cu = sample["cu_seqlens"].tolist()
    return list(itertools.pairwise(cu))


def packed_loss_and_grads(
    model: Transformer, sample: dict[str, torch.Tensor]
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.zero_grad()
    shard = context_split(sample, cp=1, cp_rank=0)
    labels = torch.where(shard.loss_mask, shard.labels, -100)
    hidden = model(shard.input_ids, shard.position_ids, shard.indices, shard.segment_ids)
    loss = model.cross_entropy_sum(hidden, labels) / shard.loss_mask.sum()
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("rope", ["default", "yarn"])
def test_packed_loss_equals_per_document_losses(packed: Path, rope: str) -> None:
    """Reference: each segment run alone (positions from 0, no other document in sight); the
    packed loss must be their token-weighted mean, and the gradients must match too."""
    sample = busiest_row(packed)
    assert len(segments(sample)) >= 4
    model = tiny_model(int(sample["input_ids"].max()) + 1, ROPES[rope])
    packed, packed_grads = packed_loss_and_grads(model, sample)

    model.zero_grad()
    total, count = torch.zeros(()), 0
    for start, end in segments(sample):
        tokens = sample["input_ids"][start:end]
        n = end - start
        if n < 2 or not sample["loss_mask"][start:end].any():
            continue  # padding, or a 1-token segment: nothing to predict
        positions = torch.arange(n)
        hidden = model(tokens, positions, positions, torch.zeros(n, dtype=torch.long))
        labels = torch.cat([tokens[1:], torch.tensor([-100])])
        labels[~sample["loss_mask"][start:end]] = -100
        total = total + model.cross_entropy_sum(hidden, labels)
        count += int((labels != -100).sum())
    assert count == int(sample["loss_mask"].sum())
    (total / count).backward()
    reference = (total / count).detach()
    assert torch.allclose(packed, reference, rtol=1e-5, atol=0)
    for got, want in zip(packed_grads, (p.grad for p in model.parameters())):
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-7)


def _cp_worker(rank: int, world: int, store: str, root: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    sample = busiest_row(Path(root))
    results = {}
    for name, rope in ROPES.items():
        model = tiny_model(
            int(sample["input_ids"].max()) + 1, rope, attention=RingAttention(dist.group.WORLD)
        )
        shard = context_split(sample, cp=world, cp_rank=rank)
        count = float(sample["loss_mask"].sum())
        labels = torch.where(shard.loss_mask, shard.labels, -100)
        hidden = model(
            shard.input_ids, shard.position_ids, shard.indices, shard.segment_ids, rope_seq_len=SEQ_LEN
        )
        loss = model.cross_entropy_sum(hidden, labels) / count
        loss.backward()
        flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        dist.all_reduce(flat)
        total = loss.detach().clone()
        dist.all_reduce(total)
        results[name] = (total, flat)
    if rank == 0:
        torch.save(results, out)
    dist.destroy_process_group()


@pytest.mark.slow
def test_two_cp_ranks_equal_one_process_for_every_rope_type(packed: Path, tmp_path: Path) -> None:
    out = tmp_path / "cp2.pt"
    mp.spawn(_cp_worker, args=(2, str(tmp_path / "store"), str(packed), str(out)), nprocs=2, join=True)
    cp2 = torch.load(out, weights_only=True)
    sample = busiest_row(packed)
    for name, rope in ROPES.items():
        model = tiny_model(int(sample["input_ids"].max()) + 1, rope)
        loss, grads = packed_loss_and_grads(model, sample)
        flat = torch.cat([g.reshape(-1) for g in grads])
        assert torch.allclose(cp2[name][0], loss, rtol=1e-5, atol=0), name
        assert torch.allclose(cp2[name][1], flat, rtol=1e-4, atol=1e-6), name


def train_config(root: Path, output: Path, **train) -> dict:
    settings = {
        "shards": str(root / "shards" / f"seq{SEQ_LEN}"),
        "steps": 6,
        "cp": 1,
        "optim": {"lr": 3e-3, "warmup_steps": 1},
        "coverage": {"required_position": 200},
        "checkpoint": {"every": 3, "keep": 2},
        "log": {"every": 1},
        "model": {
            "tiny": {
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_attention_heads": 2,
                "num_key_value_heads": 1,
            }
        },
    }
    settings.update(train)
    return {
        "output": str(output),
        "context": {"original": 128, "target": SEQ_LEN},
        "tokenizer": {"path": str(root / "tokenizer.json")},
        "train": settings,
    }


def test_overfitting_a_tiny_batch_drives_the_loss_down(packed: Path, tmp_path: Path) -> None:
    """Three windows cut from one document, seen again and again: the model must memorize them."""
    root = tmp_path / "tiny"
    root.mkdir()
    (root / "tokenizer.json").write_bytes((packed / "tokenizer.json").read_bytes())
    text = synthetic_texts(seed=7)["books"][0][:1200]
    write_curated(root, {"books": [text]}, load_tokenizer(root / "tokenizer.json"))
    manifests = jobs.pack(make_pack_config(root, seq_lens=[SEQ_LEN]))
    assert 2 <= manifests[SEQ_LEN].rows <= 4
    cfg = train_config(
        root,
        root,
        steps=60,
        optim={"lr": 1e-2, "warmup_steps": 2, "min_lr_ratio": 1.0},
        checkpoint={"every": 100, "keep": 1},
        global_batch_rows=2,
        model={"tiny": {"hidden_size": 64, "intermediate_size": 128}},
    )
    cfg["train"]["shards"] = str(root / "shards" / f"seq{SEQ_LEN}")
    result = jobs.train(parse_config(cfg), progress=False)
    assert result.losses[-1] < 0.5 * result.losses[0], result.losses


def test_six_steps_equal_three_plus_resume_plus_three(packed: Path, tmp_path: Path) -> None:
    """A run killed right after its step-3 checkpoint (later checkpoints never written) and started
    again ends with the same losses as a run that was never interrupted."""
    cfg = train_config(packed, tmp_path / "run", checkpoint={"every": 3, "keep": 3})
    straight = jobs.train(parse_config(cfg), progress=False)
    final = tmp_path / "run" / "train" / "final" / "model.safetensors"
    straight_weights = load_file(final)
    checkpoints = tmp_path / "run" / "train" / "checkpoints"
    shutil.rmtree(checkpoints / "step_0000006")
    shutil.rmtree(final.parent)
    resumed = jobs.train(parse_config(cfg), progress=False)
    assert resumed.resumed_from == 3 and len(resumed.losses) == 3
    for a, b in zip(straight.losses[3:], resumed.losses):
        assert abs(a - b) <= 1e-6 * abs(a), (straight.losses, resumed.losses)
    resumed_weights = load_file(final)
    assert resumed_weights.keys() == straight_weights.keys()
    for name, value in straight_weights.items():
        torch.testing.assert_close(resumed_weights[name], value, rtol=0, atol=1e-6)
    logged = [
        json.loads(line) for line in (tmp_path / "run" / "train" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in logged] == [1, 2, 3, 4, 5, 6]
    assert [r["loss"] for r in logged] == straight.losses[:3] + resumed.losses
    assert (tmp_path / "run" / "train" / "final" / "config.json").is_file()


def test_resume_into_a_changed_run_is_refused(packed: Path, tmp_path: Path) -> None:
    jobs.train(parse_config(train_config(packed, tmp_path / "run", steps=3)), progress=False)
    changed = train_config(packed, tmp_path / "run", steps=6, global_batch_rows=2)
    with pytest.raises(ConfigError, match=r"cannot resume .*global_batch_rows"):
        jobs.train(parse_config(changed), progress=False)


def test_metrics_record_what_the_issue_asks_for(packed: Path, tmp_path: Path) -> None:
    jobs.train(parse_config(train_config(packed, tmp_path / "m", steps=2)), progress=False)
    record = json.loads((tmp_path / "m" / "train" / "metrics.jsonl").read_text().splitlines()[-1])
    for key in (
        "loss",
        "lr",
        "grad_norm",
        "tokens_per_s",
        "mfu",
        "comm_fraction",
        "max_position",
        "loss_by_position",
        "attention_score_fraction",
    ):
        assert key in record
    assert 0 < record["attention_score_fraction"] <= 1  # one process: one block pair, no ring to skip
    assert record["max_position"] >= 128
    buckets = {int(k): v for k, v in record["loss_by_position"].items()}
    assert 128 in buckets and buckets[0] is not None


def test_shards_that_never_reach_the_required_position_are_refused(packed: Path, tmp_path: Path) -> None:
    cfg = train_config(packed, tmp_path / "refused", coverage={"required_position": 5000})
    with pytest.raises(CoverageError, match=r"largest position is .* below the required 5000"):
        jobs.train(parse_config(cfg), progress=False)
    path = tmp_path / "refused.yaml"
    path.write_text(yaml.safe_dump(cfg))
    done = subprocess.run(
        [sys.executable, "-m", "longctx.cli", "train", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (
        done.returncode == 2 and "below the required 5000" in done.stderr and "Traceback" not in done.stderr
    )
    assert not (tmp_path / "refused" / "train" / "checkpoints").exists()


def test_the_coverage_advice_names_only_settings_that_would_change_it(
    packed: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The refusal offers ``train.coverage.allow_short``; the warning printed because it is set does
    not. A configured ``required_position`` is to be lowered, an unset one (the default, the windows'
    last position) set, each to the shards' largest position read from their manifest."""
    from longctx.packer.manifest import load_manifest

    largest = load_manifest(packed / "shards" / f"seq{SEQ_LEN}").max_position
    cfg = train_config(packed, tmp_path / "refused", coverage={"required_position": 5000})
    with pytest.raises(CoverageError) as refused:
        jobs.train(parse_config(cfg), progress=False)
    advice = str(refused.value).splitlines()[-1]
    assert advice == (
        f"Pack longer windows (pack.seq_lens) from longer documents, lower "
        f"train.coverage.required_position to {largest} or below or set train.coverage.allow_short: true "
        "to train anyway."
    )
    capsys.readouterr()
    warned = train_config(
        packed, tmp_path / "warned", steps=1, coverage={"required_position": 5000, "allow_short": True}
    )
    jobs.train(parse_config(warned), progress=False)
    out = capsys.readouterr().out
    assert "warning (train.coverage.allow_short): the shards' largest position" in out
    assert "allow_short: true" not in out
    assert (
        "Pack longer windows (pack.seq_lens) from longer documents or lower "
        f"train.coverage.required_position to {largest} or below."
    ) in out
    unset = train_config(packed, tmp_path / "default", coverage={})
    unset["context"]["target"] = 2 * SEQ_LEN  # the default requires position 511 of these 256-token windows
    with pytest.raises(CoverageError, match=f"set train.coverage.required_position to {largest} or below"):
        jobs.train(parse_config(unset), progress=False)


def test_tracker_aborts_after_steps_without_long_positions() -> None:
    tracker = CoverageTracker(original=100, seq_len=256, max_steps_without_long=3)
    short = [0] * len(tracker.edges)
    short[3] = 10
    for _ in range(2):
        tracker.add(short, 50)
        tracker.check()
    long = [0] * len(tracker.edges)
    long[tracker.edges.index(100)] = 1
    tracker.add(long, 120)
    tracker.check()
    for _ in range(3):
        tracker.add(short, 50)
    with pytest.raises(CoverageError, match="3 optimizer steps trained no token at or beyond position 100"):
        tracker.check()


def test_config_errors_for_train(tmp_path: Path, packed: Path) -> None:
    with pytest.raises(ConfigError, match=r"train\.optim\.lrr: unknown key"):
        parse_config(train_config(packed, tmp_path, optim={"lrr": 1}))
    cfg = parse_config(train_config(packed, tmp_path / "x", cp=3))
    with pytest.raises(ConfigError, match=r"train\.cp = 3 must divide the number of processes"):
        jobs.train(cfg, progress=False)


@pytest.fixture(scope="module")
def cp2_run(packed: Path, tmp_path_factory) -> tuple[Path, Path, Path]:
    """(run folder, config file, $TMPDIR it ran with): `longctx train --nproc 2` with cp=2 (ring
    attention over gloo) on CPU, 8 steps, checkpoints at 4 and 8, in a fresh, empty $TMPDIR."""
    root = tmp_path_factory.mktemp("cp2")
    cfg = train_config(
        packed, root / "cp2", cp=2, cp_mode="ring", steps=8, checkpoint={"every": 4, "keep": 2}
    )
    path = root / "cp2.yaml"
    path.write_text(yaml.safe_dump(cfg))
    tmpdir = root / "tmpdir"
    tmpdir.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.pop("TORCHINDUCTOR_CACHE_DIR", None)
    done = subprocess.run(
        [sys.executable, "-m", "longctx.cli", "train", "--config", str(path), "--nproc", "2"],
        capture_output=True,
        text=True,
        timeout=900,
        env={**env, "TMPDIR": str(tmpdir)},
    )  # a hang guard
    assert done.returncode == 0, done.stderr[-3000:]
    return root / "cp2", path, tmpdir


@pytest.mark.slow
def test_two_rank_context_parallel_run_matches_one_process_and_learns(
    cp2_run: tuple[Path, Path, Path], packed: Path, tmp_path: Path
) -> None:
    """`longctx train --nproc 2` with cp=2 (ring attention over gloo) on CPU: same losses as one
    process to 1e-5, and the loss falls."""
    output, _, _ = cp2_run
    records = [json.loads(line) for line in (output / "train" / "metrics.jsonl").read_text().splitlines()]
    cp2 = [r["loss"] for r in records]
    assert all(0 < r["attention_score_fraction"] < 1 for r in records)  # the zigzag ring skips masked scores
    single = jobs.train(
        parse_config(
            train_config(packed, tmp_path / "cp1", cp=1, steps=8, checkpoint={"every": 4, "keep": 1})
        ),
        progress=False,
    ).losses
    assert len(cp2) == 8
    for a, b in zip(cp2, single):
        assert abs(a - b) <= 1e-5 * abs(b), (cp2, single)
    assert cp2[-1] < cp2[0]


@pytest.mark.slow
def test_a_two_rank_run_leaves_nothing_in_tmpdir(cp2_run: tuple[Path, Path, Path]) -> None:
    """Importing torch._dynamo (the optimizer and FSDP2 do) made torch's compiler cache folder,
    $TMPDIR/torchinductor_<user>, in every rank; it now lives in the run folder (RunLayout.compile_cache)."""
    output, _, tmpdir = cp2_run
    assert sorted(p.name for p in tmpdir.iterdir()) == []
    assert (output / "train" / "compile_cache").is_dir()  # RunLayout.compile_cache


@pytest.mark.slow
def test_an_export_in_one_process_equals_the_two_rank_runs_own(
    cp2_run: tuple[Path, Path, Path], capsys
) -> None:
    """`longctx train --export 8` in one process (no --nproc) reads the checkpoint the 2-rank cp=2 run
    wrote and exports exactly the weights, config and tokenizer that run exported itself at step 8."""
    from longctx.cli import main

    output, config, _ = cp2_run
    assert main(["train", "--config", str(config), "--export", "8"]) == 0
    exported = output / "train" / "export" / "step_0000008"
    assert f"exported step 8 to {exported}" in capsys.readouterr().out
    final = output / "train" / "final"
    assert sorted(p.name for p in exported.iterdir()) == sorted(p.name for p in final.iterdir())
    theirs, ours = load_file(final / "model.safetensors"), load_file(exported / "model.safetensors")
    assert theirs.keys() == ours.keys()
    for name, value in theirs.items():
        assert torch.equal(ours[name], value), name
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        assert (exported / name).read_bytes() == (final / name).read_bytes(), name
    # a step without a checkpoint is refused in one line naming the steps there are
    assert main(["train", "--config", str(config), "--export", "6"]) == 2
    err = capsys.readouterr().err
    assert "no checkpoint of step 6" in err and "steps 4, 8" in err and "Traceback" not in err


@pytest.mark.slow
def test_a_finished_run_started_again_says_so_and_does_nothing(
    cp2_run: tuple[Path, Path, Path], capsys
) -> None:
    """It printed 'loss None -> None; 0 tokens/s' after starting the ranks and exporting again."""
    from longctx.cli import main
    from tests.core.disks import tree

    output, config, _ = cp2_run
    before = tree(output / "train")
    assert main(["train", "--config", str(config), "--nproc", "2"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines() == [
        "training already finished at step 8; nothing to do",
        f"final model: {output / 'train' / 'final'}",
        f"metrics: {output / 'train' / 'metrics.jsonl'}",
        f"checkpoints: {output / 'train' / 'checkpoints'}",
        "raise train.steps (--steps) to train further, or train into another output folder",
    ]
    assert tree(output / "train") == before


@pytest.mark.slow
def test_two_data_parallel_ranks_equal_one_process_accumulating_two_rows(
    packed: Path, tmp_path: Path
) -> None:
    """World 2 with cp=1 (data parallel): rank r takes rows r, r+2, ...; one process with
    global_batch_rows=2 takes the same two rows per step. The global-token loss makes them equal."""
    cfg = train_config(packed, tmp_path / "dp2", cp=1, steps=4)
    path = tmp_path / "dp2.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    done = subprocess.run(
        [sys.executable, "-m", "longctx.cli", "train", "--config", str(path), "--nproc", "2"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    dp2 = [
        json.loads(line)["loss"]
        for line in (tmp_path / "dp2" / "train" / "metrics.jsonl").read_text().splitlines()
    ]
    single = jobs.train(
        parse_config(train_config(packed, tmp_path / "acc2", cp=1, steps=4, global_batch_rows=2)),
        progress=False,
    ).losses
    assert len(dp2) == 4
    for a, b in zip(dp2, single):
        assert abs(a - b) <= 1e-5 * abs(b), (dp2, single)
