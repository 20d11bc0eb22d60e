"""The whole chain on object storage, through the CLI, against a real S3-compatible server (moto's, on
loopback): ``longctx curate`` reads its input from ``s3://``, ``longctx pack --publish s3://...``
uploads the shards, ``longctx train --shards s3://...`` trains from them. The reference is the same
three steps on the local copy of the input: the same ledger and documents (but for where they came
from), the published objects byte for byte the local shards, and the same losses step by step."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from longctx import jobs
from longctx.config import parse_config
from longctx.core.atomic import TEMP_SUFFIX
from longctx.pipeline.bpe import train_bpe
from tests.packer.test_remote_shards import local_files, remote_files
from tests.pipeline.test_curate import build_input, prose, python_module
from tests.pipeline.test_curate_s3 import documents, ledger
from tests.s3server import S3, s3  # noqa: F401  (the fixture)

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
SEQ_LEN = 256
STEPS = 3


def chain_config(
    root: Path, output: Path, tokenizer: Path, input_: str, storage_options: dict | None
) -> dict:
    """One config for curate, pack and train, as small as the chain allows; ``storage_options`` (the
    server's, credentials included) go to every section that reads or writes object storage."""
    remote = {"storage_options": storage_options} if storage_options else {}
    return {
        "output": str(output),
        "context": {"original": 64, "target": SEQ_LEN},
        "tokenizer": {"path": str(tokenizer)},
        "curate": {"input": input_, "executor": {"tasks": 1, "workers": 1}} | remote,
        "pack": {
            "seq_lens": [SEQ_LEN],
            "shard_tokens": 2048,
            "pool_tokens": 4096,
            "executor": {"tasks": 1, "workers": 1},
        }
        | remote,
        "train": {
            "shards": str(output / "shards" / f"seq{SEQ_LEN}"),
            "steps": STEPS,
            "cp": 1,
            "optim": {"lr": 3e-3, "warmup_steps": 1},
            "coverage": {"required_position": 200},
            "checkpoint": {"every": STEPS, "keep": 1},
            "log": {"every": 1},
            "model": {
                "tiny": {
                    "hidden_size": 32,
                    "intermediate_size": 64,
                    "num_hidden_layers": 1,
                    "num_attention_heads": 2,
                    "num_key_value_heads": 1,
                }
            },
        }
        | remote,
    }


def cli(*args: str) -> None:
    """``python -m longctx.cli ARGS`` in a fresh process, as a user runs it; it must succeed."""
    env = os.environ | {"PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "longctx.cli", *args], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, f"longctx {' '.join(args)}:\n{done.stderr[-3000:]}"


@pytest.fixture(scope="module")
def chain(s3: S3, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The chain run twice: from the bucket through the CLI, and from local disk through ``jobs``."""
    root = tmp_path_factory.mktemp("s3_chain")
    build_input(root / "input")
    bucket = s3.bucket("chain")
    s3.fs().put(str(root / "input"), f"{bucket}/corpus", recursive=True)
    tokenizer = root / "tok" / "tokenizer.json"
    train_bpe([prose(s, 2000) for s in range(5)] + [python_module(s, 20) for s in range(5)], 400, tokenizer)

    local = parse_config(chain_config(root, root / "local", tokenizer, str(root / "input"), None))
    jobs.curate(local)
    jobs.pack(local)
    losses = jobs.train(local, progress=False).losses

    cfg = root / "remote.yaml"
    cfg.write_text(
        yaml.safe_dump(
            chain_config(root, root / "remote", tokenizer, f"s3://{bucket}/corpus", s3.storage_options)
        )
    )
    shards = f"s3://{bucket}/run/shards"
    cli("curate", "--config", str(cfg))
    cli("pack", "--config", str(cfg), "--publish", shards)
    cli("train", "--config", str(cfg), "--shards", f"{shards}/seq{SEQ_LEN}")
    return {"root": root, "bucket": bucket, "shards": shards, "losses": losses}


def test_curating_from_s3_keeps_the_same_documents_and_ledger(chain) -> None:
    root, bucket = chain["root"], chain["bucket"]
    local, remote = ledger(root / "local"), ledger(root / "remote")
    assert set(local) == set(remote) and any(r["outcome"] == "kept" for r in local.values())
    for doc_id, row in local.items():
        assert remote[doc_id] == row | {
            "path": row["path"].replace(str(root / "input"), f"s3://{bucket}/corpus")
        }
    assert documents(root / "remote") == documents(root / "local")


def test_published_shards_are_the_local_chains_bytes(chain, s3: S3) -> None:
    expected = local_files(chain["root"] / "local" / "shards" / f"seq{SEQ_LEN}")
    assert any(name.endswith(".arrow") for name in expected)
    assert remote_files(s3, chain["shards"]) == {
        f"seq{SEQ_LEN}/{name}": data for name, data in expected.items()
    }


def test_training_from_s3_logs_the_local_chains_losses(chain) -> None:
    metrics = (chain["root"] / "remote" / "train" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["loss"] for line in metrics] == chain["losses"] and len(chain["losses"]) == STEPS


def test_no_temporary_files_are_left_behind(chain, s3: S3) -> None:
    """Nothing under a temporary name in the remote run's output (its shard cache included) or in the
    bucket, and the bucket holds only the input and the published shards."""
    output = chain["root"] / "remote"
    assert (output / "cache").is_dir()
    assert not [p for p in output.rglob("*") if p.name.endswith(TEMP_SUFFIX)]
    keys = s3.fs().find(chain["bucket"])
    assert not [k for k in keys if k.endswith(TEMP_SUFFIX)]
    assert {k.split("/")[1] for k in keys} == {"corpus", "run"}
