"""A curation published to object storage (``curate.output``) and packed elsewhere from it
(``pack.input``), against a real S3-compatible server (moto's, on loopback). The references: the
published objects are the run folder's own files (and ``curation.json`` lists their xxh3-128,
recomputed here from the downloaded bytes); packing the published curation in another folder gives
byte for byte the shards of packing the run folder itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import xxhash
import yaml

from longctx import jobs
from longctx.cli import main
from longctx.config import parse_config
from longctx.core.errors import ConfigError
from longctx.core.remote import RemoteError, cache_folder, publish_folder
from longctx.pipeline.bpe import train_bpe
from tests.pipeline.test_curate import build_input, make_config, prose, python_module
from tests.s3server import S3, local_files, remote_files, s3  # noqa: F401  (the fixture)

SEQ_LEN = 256
PUBLISHED = {"tokenizer.json", "tokenizer_config.json", "ledger.parquet", "stats.json", "stats.png"}


def pack_settings(output: Path, **pack) -> dict:
    return {
        "output": str(output),
        "context": {"original": 64, "target": SEQ_LEN},
        "pack": {"seq_lens": [SEQ_LEN], "shard_tokens": 2048, "executor": {"tasks": 2, "workers": 1}} | pack,
    }


@pytest.fixture(scope="module")
def curated(s3: S3, tmp_path_factory) -> dict:
    """A curation run with ``curate.output: s3://...``, and the same run folder packed locally."""
    root = tmp_path_factory.mktemp("publish")
    build_input(root / "input")
    tokenizer = root / "tok" / "tokenizer.json"
    train_bpe([prose(s, 2000) for s in range(5)] + [python_module(s, 20) for s in range(5)], 400, tokenizer)
    url = f"s3://{s3.bucket()}/run"
    cfg = make_config(root, root / "input", tokenizer, root / "curated")
    cfg["curate"]["storage_options"] = s3.storage_options
    (root / "curate.yaml").write_text(yaml.safe_dump(cfg))
    assert main(["curate", "--config", str(root / "curate.yaml"), "--publish", url]) == 0
    cfg["curate"]["output"] = url  # the same run, the URL in the config (what later tests run again)
    jobs.pack(parse_config(pack_settings(root / "curated")))
    return {"root": root, "run": root / "curated", "url": url, "config": cfg}


def test_the_published_curation_is_the_run_folders_files(curated, s3: S3) -> None:
    run, objects = curated["run"], remote_files(s3, curated["url"])
    documents = {f"documents/{k}" for k in local_files(run / "documents")}
    assert documents and set(objects) == PUBLISHED | documents | {"curation.json"}
    assert all(objects[name] == (run / name).read_bytes() for name in objects)  # no corpus/, work/ or shards/
    listed = json.loads(objects["curation.json"])["files"]
    assert {f["file"] for f in listed} == set(objects) - {"curation.json"}
    for entry in listed:
        data = objects[entry["file"]]
        assert entry["bytes"] == len(data) and entry["xxh3_128"] == xxhash.xxh3_128_hexdigest(data)


def test_packing_the_published_curation_elsewhere_equals_packing_the_run(
    curated, s3: S3, tmp_path: Path, capsys
) -> None:
    """``longctx pack --input URL`` in a fresh folder (the README's command): the same shards, byte
    for byte, as packing the curation's own run folder; the tokenizer becomes the run's."""
    config = tmp_path / "pack.yaml"
    config.write_text(yaml.safe_dump(pack_settings(tmp_path / "out", storage_options=s3.storage_options)))
    assert main(["pack", "--config", str(config), "--input", curated["url"]]) == 0
    out = tmp_path / "out"
    shards = f"shards/seq{SEQ_LEN}"
    assert local_files(out / shards) == local_files(curated["run"] / shards)
    assert (out / "tokenizer.json").read_bytes() == (curated["run"] / "tokenizer.json").read_bytes()
    assert not (out / "documents").exists()
    copy = cache_folder(curated["url"], out / "cache")
    assert local_files(copy) == remote_files(s3, curated["url"])
    # again: the cached copy is reused and the finished output kept
    stamp = (copy / "ledger.parquet").stat().st_mtime_ns
    assert main(["pack", "--config", str(config), "--input", curated["url"]]) == 0
    assert "already packed, kept as it is" in capsys.readouterr().out
    assert (copy / "ledger.parquet").stat().st_mtime_ns == stamp
    assert s3.endpoint not in json.dumps(
        [p.read_text() for p in out.rglob("*.json") if "cache" not in p.parts]
    )

    # evaluation hides its needles in the documents the run packed: the checked copy (the run
    # folder has no documents/ of its own)
    settings = pack_settings(out, input=curated["url"], storage_options=s3.storage_options) | {
        "train": {},
        "eval": {
            "models": ["base"],
            "rows": 1,
            "needle": {"lengths": [240], "depths": [0.5], "samples": 1, "max_new_tokens": 1},
        },
    }
    result = jobs.evaluate(parse_config(settings))
    needles = json.loads((Path(result["folder"]) / "needle.json").read_text())
    assert len(needles["models"][0]["results"]) == 1


def test_publishing_again_sends_nothing_and_an_interrupted_publish_resumes(curated, s3: S3, capsys) -> None:
    url = curated["url"]
    jobs.curate(parse_config(curated["config"]))
    assert f"{url}: already published, unchanged" in capsys.readouterr().out
    # an upload killed before its end: the manifest (sent last) and a document are missing
    before = remote_files(s3, url)
    victim = sorted(name for name in before if name.startswith("documents/"))[0]
    fs = s3.fs()
    for name in ("curation.json", victim):
        fs.rm_file(f"{url.removeprefix('s3://')}/{name}")
    jobs.curate(parse_config(curated["config"]))
    assert f"{url}: published 2 files" in capsys.readouterr().out
    assert remote_files(s3, url) == before


def test_unfinished_damaged_or_conflicting_inputs_are_refused_changing_nothing(
    curated, s3: S3, tmp_path: Path
) -> None:
    opts = s3.storage_options
    out = tmp_path / "out"
    unfinished = curated["url"].replace("/run", "/unfinished")
    with pytest.raises(RemoteError, match=rf"^{unfinished}/curation.json: not found; pack.input must be"):
        jobs.pack(parse_config(pack_settings(out, input=unfinished, storage_options=opts)))
    assert not out.exists() or not any(out.iterdir())

    # a published document damaged after publishing: refused naming its URL, nothing kept
    damaged = curated["url"].replace("/run", "/damaged")
    listed = [f["file"] for f in json.loads((curated["run"] / "curation.json").read_text())["files"]]
    publish_folder(curated["run"], damaged, last="curation.json", storage_options=opts, files=listed)
    victim = sorted(p for p in remote_files(s3, damaged) if p.startswith("documents/"))[-1]
    data = bytearray((curated["run"] / victim).read_bytes())
    data[len(data) // 2] ^= 0xFF
    s3.fs().pipe_file(f"{damaged.removeprefix('s3://')}/{victim}", bytes(data))
    with pytest.raises(RemoteError, match=rf"^{damaged}/{victim}: checksum differs"):
        jobs.pack(parse_config(pack_settings(out, input=damaged, storage_options=opts)))
    assert not (out / "tokenizer.json").exists() and not (out / "shards").exists()
    copy = cache_folder(damaged, out / "cache")
    assert not (copy / victim).exists() and not (copy / "curation.json").exists()
    assert not [p for p in copy.rglob("*") if p.name.endswith(".tmp")]

    # a pack refused for its settings (a mix naming no curated source) writes no tokenizer either
    with pytest.raises(ConfigError, match=r"pack.mix gives no fraction for curated source"):
        jobs.pack(
            parse_config(pack_settings(out, input=curated["url"], storage_options=opts, mix={"nosuch": 1.0}))
        )
    assert (
        not (out / "tokenizer.json").exists()
        and not (out / "shards").exists()
        and not (out / "work").exists()
    )

    # a run folder with a tokenizer or documents of its own is left as it is
    other = tmp_path / "other"
    other.mkdir()
    (other / "tokenizer.json").write_text("{}")
    with pytest.raises(
        ConfigError, match=rf"^pack.input: {other}/tokenizer.json differs from the tokenizer.json published"
    ):
        jobs.pack(parse_config(pack_settings(other, input=curated["url"], storage_options=opts)))
    assert (
        sorted(p.name for p in other.iterdir()) == ["tokenizer.json"]
        and (other / "tokenizer.json").read_text() == "{}"
    )
    with pytest.raises(ConfigError, match=r"holds curated documents of this run"):
        jobs.pack(parse_config(pack_settings(curated["run"], input=curated["url"], storage_options=opts)))


def test_the_readme_object_storage_config_is_valid(tmp_path: Path) -> None:
    """The README's object storage settings are a valid config, the curation published where pack reads it."""
    from tests.readme import code_blocks

    (block,) = code_blocks("Object storage", "yaml")
    cfg = parse_config(
        yaml.safe_load(block) | {"output": str(tmp_path), "context": {"original": 64, "target": SEQ_LEN}}
    )
    assert cfg.curate.output == cfg.pack.input and cfg.pack.output.startswith(cfg.pack.input)


def test_a_curation_published_to_a_local_folder_packs_the_same(curated, tmp_path: Path) -> None:
    """``curate.output`` and ``pack.input`` may be plain folders too (a shared file system): the
    folder is read where it is, and the shards are the run's."""
    from longctx.core.layout import RunLayout
    from longctx.pipeline.publish import publish_curation

    shared = tmp_path / "shared" / "run"
    sent = publish_curation(RunLayout(curated["run"]), str(shared))
    assert sent[-1] == "curation.json" and (shared / "documents").is_dir() and not (shared / "work").exists()
    jobs.pack(parse_config(pack_settings(tmp_path / "out", input=str(shared))))
    shards = f"shards/seq{SEQ_LEN}"
    assert local_files(tmp_path / "out" / shards) == local_files(curated["run"] / shards)
    assert not (tmp_path / "out" / "cache").exists()
