"""``longctx train`` on shards on object storage, against a real S3-compatible server (moto's, on
loopback): pack publishes to ``s3://``, training reads the URL through its checked cache and
publishes the trained model. The reference is the same training on the local shards: the same
losses, step by step, and the same exported files."""

from __future__ import annotations

from pathlib import Path

import pytest

from longctx import jobs
from longctx.config import parse_config
from longctx.core.errors import LongctxError
from longctx.core.layout import RunLayout
from longctx.core.remote import cache_folder
from tests.packer.test_pack_helpers import make_config as make_pack_config
from tests.packer.test_pack_helpers import make_run
from tests.s3server import S3, s3  # noqa: F401  (the fixture)
from tests.trainer.test_train import SEQ_LEN, train_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run(s3: S3, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:  # noqa: F811
    """A run packed locally and published to a bucket: ``(run folder, bucket URL)``."""
    root = tmp_path_factory.mktemp("s3_train")
    make_run(root)
    bucket = f"s3://{s3.bucket()}"
    cfg = make_pack_config(root, seq_lens=[SEQ_LEN], output=f"{bucket}/run/shards", storage_options=s3.storage_options)
    assert jobs.pack(cfg)[SEQ_LEN].max_position >= 200
    return root, bucket


def test_training_from_s3_equals_training_from_local_shards(run, s3: S3, tmp_path: Path) -> None:  # noqa: F811
    root, bucket = run
    local = jobs.train(parse_config(train_config(root, tmp_path / "local", steps=4)), progress=False)
    url = f"{bucket}/run/shards/seq{SEQ_LEN}"
    cfg = train_config(
        root,
        tmp_path / "remote",
        steps=4,
        shards=url,
        storage_options=s3.storage_options,
        export={"output": f"{bucket}/trained"},
    )
    remote = jobs.train(parse_config(cfg), progress=False)
    assert remote.losses == local.losses and len(local.losses) == 4
    # the shards were read from the documented cache under the output folder
    cached = cache_folder(url, RunLayout(tmp_path / "remote").cache)
    assert sorted(p.name for p in cached.iterdir()) == sorted(p.name for p in (root / "shards" / f"seq{SEQ_LEN}").iterdir())
    # the trained model was published whole: the same files as the local final/ folder
    final = tmp_path / "remote" / "train" / "final"
    fs = s3.fs()
    prefix = f"{bucket.removeprefix('s3://')}/trained/final"
    published = {p[len(prefix) + 1 :]: fs.cat_file(p) for p in fs.find(prefix)}
    assert published == {p.relative_to(final).as_posix(): p.read_bytes() for p in final.rglob("*") if p.is_file()}
    assert "config.json" in published


def test_a_missing_remote_shard_folder_is_refused_before_training(run, s3: S3, tmp_path: Path) -> None:  # noqa: F811
    root, bucket = run
    cfg = train_config(root, tmp_path / "out", shards=f"{bucket}/run/shards/seq999", storage_options=s3.storage_options)
    with pytest.raises(LongctxError, match=rf"^{bucket}/run/shards/seq999: no manifest.json"):
        jobs.train(parse_config(cfg), progress=False)
    assert not (tmp_path / "out" / "train" / "checkpoints").exists()
