"""Fixtures of the cluster tests: one real Ray cluster and one real one-node Slurm cluster per session,
each stopped at the end (even after failures) and checked to leave no process and no file behind;
and the small input both curate, with its reference output from the local executor."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.cluster.raycluster import RayCluster, local_ray_cluster
from tests.pipeline.test_curate import build_input, prose, python_module, wrap

HERE = Path(__file__).resolve().parent
TMP = Path(tempfile.gettempdir())


def _ray_leftovers() -> set[str]:
    """What Ray may leave in the system's temporary folders: its default folder, datatrove's Ray task
    logs, object-store files."""
    found = {p.name for p in TMP.glob("ray*")} | {p.name for p in TMP.glob("lcray-*")}
    shm = Path("/dev/shm")
    return found | ({f"/dev/shm/{p.name}" for p in shm.glob("*plasma*")} if shm.is_dir() else set())


def _home_ray() -> dict[str, bytes]:
    """The machine's ``~/.ray`` (where Ray keeps the token it generates), file by file."""
    home = Path.home() / ".ray"
    return {str(p): p.read_bytes() for p in sorted(home.rglob("*")) if p.is_file()} if home.is_dir() else {}


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[RayCluster]:
    """A local Ray cluster of 2 CPUs on 127.0.0.1 (``ray start --head``) with token authentication,
    shared by the session; the machine's ``~/.ray`` is left as it was."""
    if importlib.util.find_spec("ray") is None:
        pytest.skip("ray is not installed (the test extra installs it: pip install -e '.[test]')")
    before, home_before = _ray_leftovers(), _home_ray()
    with local_ray_cluster(num_cpus=2) as cluster:
        yield cluster
    assert not cluster.processes()
    assert not cluster.temp_dir.exists()
    assert _ray_leftovers() <= before, _ray_leftovers() - before
    assert _home_ray() == home_before


def _slurm_answers(env: dict[str, str]) -> bool:
    if shutil.which("sinfo") is None:
        return False
    try:
        done = subprocess.run(
            ["sinfo", "-h", "-o", "%T"], env=env, capture_output=True, text=True, timeout=10
        )
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0 and any(s in done.stdout for s in ("idle", "mixed", "allocated"))


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory) -> Iterator[dict[str, str]]:
    """The environment (``SLURM_CONF``) of a one-node Slurm cluster: the one ``SLURM_CONF`` names
    (``.ci/run`` starts one with tests/cluster/slurm_up.sh), else one started here for the session when
    this runs as root with Slurm's and munge's daemons installed; skips, saying why, otherwise."""
    if os.environ.get("SLURM_CONF") and _slurm_answers(dict(os.environ)):
        yield dict(os.environ)
        return
    missing = [c for c in ("munged", "slurmctld", "slurmd", "sbatch") if shutil.which(c) is None]
    if missing:
        pytest.skip(
            f"no Slurm cluster: {', '.join(missing)} not installed (apt-get install slurm-wlm munge; "
            ".ci/run does it when run as root)"
        )
    if os.geteuid() != 0:
        pytest.skip("no Slurm cluster: starting one (tests/cluster/slurm_up.sh) needs root")
    folder = Path(tempfile.mkdtemp(prefix="lcslurm-"))
    env = {**os.environ, "LONGCTX_SLURM_DIR": str(folder), "SLURM_CONF": str(folder / "slurm.conf")}
    try:
        up = subprocess.run([HERE / "slurm_up.sh"], env=env, capture_output=True, text=True, timeout=120)
        if up.returncode != 0:
            pytest.fail(f"tests/cluster/slurm_up.sh failed:\n{up.stdout}{up.stderr}")
        yield env
    finally:
        subprocess.run([HERE / "slurm_down.sh"], env=env, capture_output=True, timeout=120)
    assert not folder.exists()


@pytest.fixture(scope="session")
def cluster_tokenizer(tmp_path_factory) -> Path:
    from longctx.pipeline.bpe import train_bpe

    path = tmp_path_factory.mktemp("cluster_tok") / "tokenizer.json"
    train_bpe([prose(s, 2000) for s in range(5)] + [python_module(s, 20) for s in range(5)], 400, path)
    return path


@pytest.fixture(scope="session")
def cluster_input(tmp_path_factory) -> Path:
    """Curation's test input (books, papers, code with known duplicates and defects) plus a long
    book (~1.5 MB, so that reading it keeps a task busy for a while)."""
    root = tmp_path_factory.mktemp("cluster_input")
    build_input(root)
    (root / "books" / "long.txt").write_text(wrap(prose(11, 250_000), 70))
    return root


@pytest.fixture(scope="session")
def prose_input(tmp_path_factory) -> Path:
    """The books and papers of curation's test input (no code: no file-level dedup stages, so that a
    Slurm job has five stages to go through rather than eight)."""
    root = tmp_path_factory.mktemp("prose_input")
    build_input(root)
    shutil.rmtree(root / "code")
    return root


def run_config(
    output: Path, input_dir: Path, tokenizer: Path, executor: dict, path: Path | None = None
) -> Path:
    """A run config (curate and pack) with ``executor`` for both jobs, written to ``path``."""
    cfg = {
        "output": str(output),
        "context": {"original": 64, "target": 256},
        "tokenizer": {"path": str(tokenizer)},
        "curate": {"input": str(input_dir), "executor": executor},
        "pack": {"seq_lens": [256, 512], "shard_tokens": 4096, "pool_tokens": 8192, "executor": executor},
    }
    path = path or output.with_suffix(".yaml")
    path.write_text(yaml.safe_dump(cfg))
    return path


OUTPUTS = ("documents", "ledger.parquet", "shards")
"""What the executors must write byte for byte alike."""


def output_bytes(root: Path) -> dict[str, bytes]:
    """Every file of the compared parts of a run folder, by relative path (shards' manifests included)."""
    found = {}
    for name in OUTPUTS:
        path = root / name
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        found |= {str(f.relative_to(root)): f.read_bytes() for f in files}
    return found


def local_output(root: Path, input_dir: Path, tokenizer: Path) -> dict[str, bytes]:
    """The local executor's output of ``input_dir`` (curate, then pack), 2 tasks."""
    from longctx import jobs
    from longctx.config import load_config

    cfg = load_config(run_config(root / "run", input_dir, tokenizer, {"kind": "local", "tasks": 2}))
    jobs.curate(cfg)
    jobs.pack(cfg)
    found = output_bytes(root / "run")
    assert any(name.endswith("manifest.json") for name in found) and "ledger.parquet" in found
    return found


@pytest.fixture(scope="session")
def local_reference(tmp_path_factory, cluster_input: Path, cluster_tokenizer: Path) -> dict[str, bytes]:
    """The local executor's output of ``cluster_input``."""
    return local_output(tmp_path_factory.mktemp("local_reference"), cluster_input, cluster_tokenizer)


@pytest.fixture(scope="session")
def prose_reference(tmp_path_factory, prose_input: Path, cluster_tokenizer: Path) -> dict[str, bytes]:
    """The local executor's output of ``prose_input``."""
    return local_output(tmp_path_factory.mktemp("prose_reference"), prose_input, cluster_tokenizer)
