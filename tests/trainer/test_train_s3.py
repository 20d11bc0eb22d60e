"""``longctx train`` on shards on object storage, against a real S3-compatible server (moto's, on
loopback): pack publishes to ``s3://``, training reads the URL through its checked cache and
publishes the trained model. The reference is the same training on the local shards: the same
losses, step by step, and the same exported files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from longctx import jobs
from longctx.cli import main
from longctx.config import parse_config
from longctx.core.layout import RunLayout
from longctx.core.remote import cache_folder
from tests.packer.test_pack_helpers import make_config as make_pack_config
from tests.packer.test_pack_helpers import make_run
from tests.s3server import S3, s3  # noqa: F401  (the fixture)
from tests.trainer.test_train import SEQ_LEN, train_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run(s3: S3, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A run packed and published to a bucket by ``longctx pack --publish``: ``(run folder, bucket URL)``."""
    root = tmp_path_factory.mktemp("s3_train")
    make_run(root)
    bucket = f"s3://{s3.bucket()}"
    cfg = make_pack_config(root, seq_lens=[SEQ_LEN]).model_dump(mode="json", exclude_none=True)
    cfg["pack"]["storage_options"] = s3.storage_options
    (root / "pack.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["pack", "--config", str(root / "pack.yaml"), "--publish", f"{bucket}/run/shards"]) == 0
    assert s3.fs().exists(f"{bucket.removeprefix('s3://')}/run/shards/seq{SEQ_LEN}/manifest.json")
    return root, bucket


def test_training_from_s3_equals_training_from_local_shards(run, s3: S3, tmp_path: Path) -> None:
    """``longctx train --shards s3://...`` logs the same losses as training on the local shards."""
    root, bucket = run
    local = jobs.train(parse_config(train_config(root, tmp_path / "local", steps=4)), progress=False)
    url = f"{bucket}/run/shards/seq{SEQ_LEN}"
    cfg = train_config(
        root,
        tmp_path / "remote",
        steps=4,
        storage_options=s3.storage_options,
        export={"output": f"{bucket}/trained"},
    )
    (tmp_path / "remote.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["train", "--config", str(tmp_path / "remote.yaml"), "--shards", url]) == 0
    metrics = (tmp_path / "remote" / "train" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["loss"] for line in metrics] == local.losses and len(local.losses) == 4
    # the shards were read from the documented cache under the output folder
    cached = cache_folder(url, RunLayout(tmp_path / "remote").cache)
    assert sorted(p.name for p in cached.iterdir()) == sorted(
        p.name for p in (root / "shards" / f"seq{SEQ_LEN}").iterdir()
    )
    # the trained model was published whole: the same files as the local final/ folder
    final = tmp_path / "remote" / "train" / "final"
    fs = s3.fs()
    prefix = f"{bucket.removeprefix('s3://')}/trained/final"
    published = {p[len(prefix) + 1 :]: fs.cat_file(p) for p in fs.find(prefix)}
    assert published == {
        p.relative_to(final).as_posix(): p.read_bytes() for p in final.rglob("*") if p.is_file()
    }
    assert "config.json" in published


def test_a_missing_remote_shard_folder_is_refused_before_training(
    run,
    s3: S3,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
) -> None:
    """One line naming the URL, exit 2, and nothing written."""
    root, bucket = run
    cfg = train_config(root, tmp_path / "out", storage_options=s3.storage_options)
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    url = f"{bucket}/run/shards/seq999"
    assert main(["train", "--config", str(tmp_path / "cfg.yaml"), "--shards", url]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"longctx train: {url}: no manifest.json") and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()
