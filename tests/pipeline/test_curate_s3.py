"""Curation reading its sources from object storage: a real S3-compatible server (moto's) started on
loopback by the test, read through fsspec/s3fs by datatrove's data folders. The reference is the same
input curated from local disk: the same documents and the same ledger, but for where they came from.
The README's snippet (a hub tokenizer id, an s3:// input) runs as written but for the bucket, the
endpoint and a hub cache laid out by the test, offline."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from longctx import jobs
from longctx.cli import main
from longctx.config import parse_config
from longctx.core.errors import ConfigError
from longctx.pipeline.bpe import train_bpe
from tests.core.test_tokenizer_specials import lay_out_hub_cache
from tests.pipeline.test_curate import build_input, make_config, prose, python_module, tokenizer_file  # noqa: F401
from tests.readme import code_blocks
from tests.s3server import S3, AuthS3, remote_files, s3, s3_auth  # noqa: F401  (the fixtures)

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def curated(s3: S3, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("s3")
    build_input(root / "input")
    # repository code is never executed, wherever it is read from
    (root / "input" / "code" / "toolkit" / "setup.py").write_text(
        f"open({str(root / 'PWNED')!r}, 'w').write('ran')\n"
    )
    bucket = s3.bucket("corpora")
    s3.fs().put(str(root / "input"), f"{bucket}/corpus", recursive=True)
    tokenizer = root / "tok" / "tokenizer.json"
    train_bpe([prose(s, 2000) for s in range(5)] + [python_module(s, 20) for s in range(5)], 400, tokenizer)
    local = make_config(root, root / "input", tokenizer, root / "local")
    remote = make_config(root, root / "input", tokenizer, root / "remote")
    remote["curate"]["input"] = f"s3://{bucket}/corpus"
    remote["curate"]["storage_options"] = s3.storage_options
    jobs.curate(parse_config(local))
    jobs.curate(parse_config(remote))
    return {"root": root, "local": root / "local", "remote": root / "remote", "bucket": bucket}


def documents(output: Path) -> dict[str, dict]:
    rows = {}
    for f in sorted((output / "documents").rglob("*.parquet")):
        for row in pq.read_table(f).to_pylist():
            meta = json.loads(row.pop("metadata"))
            meta.pop("path")
            rows[row["id"]] = row | {"metadata": meta}
    return rows


def ledger(output: Path) -> dict[str, dict]:
    return {r["id"]: r for r in pq.read_table(output / "ledger.parquet").to_pylist()}


def test_curating_from_s3_equals_curating_from_disk(curated) -> None:
    local, remote = ledger(curated["local"]), ledger(curated["remote"])
    assert set(local) == set(remote)
    for doc_id, row in local.items():
        assert row["path"].startswith(str(curated["root"] / "input"))
        assert remote[doc_id]["path"] == row["path"].replace(
            str(curated["root"] / "input"), f"s3://{curated['bucket']}/corpus"
        )
        assert {k: v for k, v in remote[doc_id].items() if k != "path"} == {
            k: v for k, v in row.items() if k != "path"
        }
    assert documents(curated["remote"]) == documents(curated["local"])
    assert not (curated["root"] / "PWNED").exists()


def test_storage_options_are_not_part_of_the_run_identity(curated, s3: S3) -> None:
    """Credentials and endpoints change where data is read from, not what it is: the record has none."""
    record = (curated["remote"] / "work" / "curate" / "run.json").read_text()
    assert s3.endpoint not in record and "endpoint_url" not in record


def test_missing_remote_input_is_one_line(curated, s3: S3, tmp_path: Path) -> None:
    cfg = make_config(
        tmp_path, curated["root"] / "input", curated["root"] / "tok" / "tokenizer.json", tmp_path / "out"
    )
    missing = f"s3://{curated['bucket']}/nothing-here"
    cfg["curate"]["input"] = missing
    cfg["curate"]["storage_options"] = s3.storage_options
    with pytest.raises(ConfigError, match=f"curate.input: {missing} does not exist"):
        jobs.curate(parse_config(cfg))
    assert not (tmp_path / "out").exists()
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_readme_snippet_curates_from_s3_with_a_hub_tokenizer(curated, s3: S3, tmp_path: Path) -> None:
    (block,) = code_blocks("Inputs in object storage, tokenizers from the hub", "yaml")
    snippet = yaml.safe_load(block)
    repo_id = snippet["tokenizer"]["path"]
    tokenizer = curated["root"] / "tok" / "tokenizer.json"
    hub = tmp_path / "hub"
    lay_out_hub_cache(
        hub,
        repo_id,
        {"tokenizer.json": tokenizer, "tokenizer_config.json": tokenizer.with_name("tokenizer_config.json")},
    )
    cfg = make_config(tmp_path, curated["root"] / "input", tokenizer, tmp_path / "out")
    cfg["tokenizer"] = snippet["tokenizer"]
    cfg["curate"] |= snippet["curate"] | {
        "input": snippet["curate"]["input"].replace("my-bucket", curated["bucket"]),
        "storage_options": s3.storage_options,
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env |= {"HF_HUB_CACHE": str(hub), "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "longctx.cli", "curate", "--config", str(tmp_path / "run.yaml")],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert (tmp_path / "out" / "tokenizer.json").read_bytes() == tokenizer.read_bytes()
    assert documents(tmp_path / "out") == documents(curated["local"])
    shutil.rmtree(tmp_path, ignore_errors=True)


def test_wrong_credentials_are_access_denied_naming_the_url(
    s3_auth: AuthS3, tmp_path: Path, tokenizer_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With authentication enforced (moto's IAM), an input or a publish destination in an existing
    bucket read with a wrong secret is one line saying access is denied, naming the URL, before any
    work; the output folder is not created."""
    build_input(tmp_path / "input")
    s3fs = pytest.importorskip("s3fs")
    fs = s3fs.S3FileSystem(skip_instance_cache=True, **s3_auth.storage_options())
    fs.put(str(tmp_path / "input"), f"{s3_auth.bucket}/corpus", recursive=True)
    wrong = s3_auth.storage_options(secret="not-the-secret")
    url = f"s3://{s3_auth.bucket}/corpus"
    cases = {
        "input": ({"input": url, "storage_options": wrong}, url),
        "publish": (
            {"output": f"s3://{s3_auth.bucket}/run", "storage_options": wrong},
            f"s3://{s3_auth.bucket}/run",
        ),
    }
    for name, (curate, named) in cases.items():
        cfg = make_config(tmp_path, tmp_path / "input", tokenizer_file, tmp_path / f"out-{name}")
        cfg["curate"] |= curate
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(cfg))
        assert main(["curate", "--config", str(tmp_path / f"{name}.yaml")]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"longctx curate: {named}: access denied while "), err
        assert len(err.strip().splitlines()) == 1 and "no such bucket" not in err
        assert not (tmp_path / f"out-{name}").exists()


SECRET = "sEcReT-never-on-disk-7f3a9c"
KEY_ID = "AKIDNEVERONDISK7F3A9C"


@pytest.mark.slow
def test_credentials_in_storage_options_never_reach_a_file(
    s3: S3, tmp_path: Path, tokenizer_file: Path
) -> None:
    """`curate` from S3 and publishing to it, then `pack` publishing its shards, with the key and
    secret in storage_options: neither appears in any file the runs write (run folder, logs, run
    records, datatrove's executor.json records, work/, the temporary folder), on the console, or in
    anything published. (datatrove's executor.json of the finalize stage held them in plain text.)"""
    build_input(tmp_path / "input")
    bucket = s3.bucket("creds")
    s3.fs().put(str(tmp_path / "input"), f"{bucket}/corpus", recursive=True)
    options = {"key": KEY_ID, "secret": SECRET, "client_kwargs": {"endpoint_url": s3.endpoint}}
    cfg = make_config(tmp_path, tmp_path / "input", tokenizer_file, tmp_path / "out")
    cfg["curate"] |= {
        "input": f"s3://{bucket}/corpus",
        "output": f"s3://{bucket}/run",
        "storage_options": options,
    }
    cfg["pack"] = {
        "seq_lens": [256],
        "output": f"s3://{bucket}/shards",
        "storage_options": options,
        "executor": {"tasks": 2},
    }
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(cfg))
    system_tmp = tmp_path / "tmp"
    system_tmp.mkdir()
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "TMPDIR": str(system_tmp)}
    console = ""
    for command in ("curate", "pack"):
        done = subprocess.run(
            [sys.executable, "-m", "longctx.cli", command, "--config", str(tmp_path / "run.yaml")],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        console += done.stdout + done.stderr
    written = [p for p in tmp_path.rglob("*") if p.is_file() and not p.is_relative_to(tmp_path / "input")]
    written = [p for p in written if p != tmp_path / "run.yaml"]  # the test's own config
    assert any(p.name == "executor.json" for p in written) and any(p.suffix == ".arrow" for p in written)
    for secret in (SECRET, KEY_ID):
        assert secret not in console
        leaks = [str(p) for p in written if secret.encode() in p.read_bytes()]
        assert leaks == [], f"{secret} written to {leaks}"
        published = remote_files(s3, f"s3://{bucket}")
        assert "run/curation.json" in published and "shards/seq256/manifest.json" in published
        assert [name for name, data in published.items() if secret.encode() in data] == []


def test_credentials_for_a_slurm_job_are_refused(tmp_path: Path, tokenizer_file: Path) -> None:
    """datatrove pickles a Slurm job's steps, file systems and their credentials included, into the run
    folder: credentials in storage_options are refused for Slurm, before anything is written."""
    build_input(tmp_path / "input")
    cfg = make_config(tmp_path, tmp_path / "input", tokenizer_file, tmp_path / "out")
    cfg["curate"]["executor"] = {"kind": "slurm", "slurm": {"partition": "any"}}
    cfg["curate"]["sources"] = [
        {
            "name": "more",
            "kind": "books",
            "path": str(tmp_path / "input" / "books"),
            "storage_options": {"client_kwargs": {"aws_secret_access_key": SECRET}},
        }
    ]
    with pytest.raises(ConfigError) as err:
        jobs.curate(parse_config(cfg))
    assert str(err.value).startswith(
        "curate.sources.0.storage_options: client_kwargs.aws_secret_access_key would be written to disk "
    )
    assert SECRET not in str(err.value) and not (tmp_path / "out").exists()


@pytest.mark.slow
def test_changed_objects_of_an_s3_input_are_refused_then_updated(
    s3: S3, tmp_path: Path, tokenizer_file: Path
) -> None:
    """Inputs in object storage are recorded by the listing's size, ETag and modification time: an
    object rewritten with bytes of the same length is seen (its ETag changed), and `--update`
    curates the change."""
    build_input(tmp_path / "input")
    bucket = s3.bucket("inputs")
    fs = s3.fs()
    fs.put(str(tmp_path / "input"), f"{bucket}/corpus", recursive=True)
    cfg = make_config(tmp_path, tmp_path / "input", tokenizer_file, tmp_path / "out")
    cfg["curate"] |= {"input": f"s3://{bucket}/corpus", "storage_options": s3.storage_options}
    jobs.curate(parse_config(cfg))
    record = json.loads((tmp_path / "out" / "work" / "curate" / "run.json").read_text())
    entry = next(e for e in record["inputs"] if e[0] == "books/other_novel.txt")
    assert entry[3] == fs.info(f"{bucket}/corpus/books/other_novel.txt")["ETag"].strip('"')
    text = fs.cat_file(f"{bucket}/corpus/books/other_novel.txt")
    fs.pipe_file(f"{bucket}/corpus/books/other_novel.txt", text.replace(b"alpha", b"gamma"))
    url = f"s3://{bucket}/corpus/books/other_novel.txt"
    with pytest.raises(
        ConfigError, match=rf"^{url} was changed since .* \(1 changed\); run `longctx curate --update`"
    ):
        jobs.curate(parse_config(cfg))
    summary = jobs.curate(parse_config(cfg), update=True)
    assert summary["update"]["units"]["changed"] == ["books/other_novel.txt"]
    assert ledger(tmp_path / "out")["books/other_novel.txt"]["change"] == "changed"
