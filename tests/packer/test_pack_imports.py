"""The pack job's fixed costs: Arrow arrays built without ``pa.array`` equal ``pa.array``'s, and a
whole pack (planning, reading stored ids, packing, writing shards and manifests) never imports pandas,
which pyarrow would import in every process (0.3-0.5 s of CPU each) for ``pa.array``, ``to_numpy``
and ``pq.read_table``; workers forked from the driver (nothing to start) only when none tokenizes, and
a small pack of stored ids run in the driver, writing exactly what pool workers write."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from longctx import jobs
from longctx.core.tokenizer import tokenizer_fingerprint
from longctx.packer import run as run_module
from longctx.packer.rows import arrow_array, string_array
from longctx.packer.run import PackPlan, driver_stages, worker_start_method
from longctx.pipeline.bpe import train_bpe
from tests.packer.test_pack_helpers import make_config, make_run, synthetic_texts, write_curated
from tests.packer.test_pack_reuse import curated_with_ids


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8])
def test_arrow_array_equals_pa_array(dtype: type) -> None:
    rng = np.random.default_rng(0)
    for n in (0, 1, 7, 8, 9, 1000):
        values = rng.integers(0, 100, size=2 * n).astype(dtype)[::2]  # not contiguous
        valid = rng.random(n) < 0.7
        assert arrow_array(values).equals(pa.array(values))
        masked = arrow_array(values, valid=valid)
        assert masked.equals(pa.array(values, mask=~valid)), n
        assert masked.null_count == int((~valid).sum())
    with pytest.raises(TypeError, match="not bool"):
        arrow_array(np.ones(3, dtype=bool))


def test_string_array_equals_pa_array() -> None:
    for values in ([], [""], ["a", "", "héllo wörld", "书", "x" * 1000], [f"doc-{i}" for i in range(300)]):
        assert string_array(values).equals(pa.array(values, pa.string()))


def test_packing_imports_no_pandas(tmp_path: Path) -> None:
    make_run(tmp_path)
    (tmp_path / "run.yaml").write_text(
        f"output: {tmp_path}\ncontext: {{original: 64, target: 256}}\n"
        "pack: {seq_lens: [256], executor: {tasks: 1, workers: 1}}\n"
    )
    code = (
        "import sys; from longctx.cli import main; "
        f"assert main(['pack', '--config', {str(tmp_path / 'run.yaml')!r}]) == 0; "
        "assert 'pandas' not in sys.modules, 'pandas was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    assert (tmp_path / "shards" / "seq256" / "manifest.json").is_file()


def test_workers_are_forked_only_when_none_tokenizes(tmp_path: Path) -> None:
    """Forked workers would tokenize on one thread after a driver that used the tokenizer's pool: they
    are forked only when every curated file's stored ids are of the run's tokenizer."""
    texts = synthetic_texts(0)
    train_bpe([t for docs in texts.values() for t in docs], 320, tmp_path / "tokenizer.json")
    sha = tokenizer_fingerprint(tmp_path / "tokenizer.json")
    curated_with_ids(tmp_path, texts, sha, scramble=False)
    assert worker_start_method(tmp_path / "documents", sha) == "fork"
    assert worker_start_method(tmp_path / "documents", "0" * 64) == "forkserver"  # another tokenizer
    write_curated(tmp_path / "plain", texts, None)  # no stored ids
    assert worker_start_method(tmp_path / "plain" / "documents", sha) == "forkserver"


def test_small_packs_of_stored_ids_run_in_the_driver() -> None:
    def plan(tokens: dict[str, int], lengths: int = 1) -> PackPlan:
        return PackPlan({}, [None] * lengths, None, None, tokens, None, {}, Path())  # type: ignore[list-item]

    limit = run_module.IN_DRIVER_TOKENS
    assert driver_stages(plan({"a": limit // 2, "b": limit // 2}), "fork") == {"pack"}
    assert driver_stages(plan({"a": limit // 2, "b": limit // 2 + 1}), "fork") == set()
    assert driver_stages(plan({"a": limit // 2}, lengths=3), "fork") == set()  # every length is written
    assert driver_stages(plan({"a": 10}), "forkserver") == set()  # tokenizing: fresh workers, in parallel
    assert driver_stages(plan({"a": 10, "b": -1}), "fork") == set()  # counts unknown


def test_the_driver_writes_what_pool_workers_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every file under shards/ (shards, manifests, run record) is byte-identical whether the pack
    stage's two tasks ran one after another in this process or in two forked pool workers."""
    texts = synthetic_texts(0)
    train_bpe([t for docs in texts.values() for t in docs], 320, tmp_path / "tokenizer.json")
    sha = tokenizer_fingerprint(tmp_path / "tokenizer.json")
    curated_with_ids(tmp_path, texts, sha, scramble=False)
    seen: dict[str, frozenset[str]] = {}

    def recording(*args: object, in_driver: frozenset[str] = frozenset(), **kwargs: object) -> bool:
        seen[str(args[2])] = frozenset(in_driver)
        return real_run_stages(*args, in_driver=in_driver, **kwargs)

    real_run_stages = run_module.run_stages
    monkeypatch.setattr(run_module, "run_stages", recording)
    outputs = {}
    for name, limit in (("driver", run_module.IN_DRIVER_TOKENS), ("pooled", -1)):
        root = tmp_path / name
        root.mkdir()
        for item in ("documents", "tokenizer.json"):
            (root / item).symlink_to(tmp_path / item)
        monkeypatch.setattr(run_module, "IN_DRIVER_TOKENS", limit)
        jobs.pack(make_config(root, executor={"tasks": 2, "workers": 2}))
        files = sorted(f for f in (root / "shards").rglob("*") if f.is_file())
        outputs[name] = {str(f.relative_to(root / "shards")): f.read_bytes() for f in files}
    assert sorted(seen.values(), key=len) == [frozenset(), frozenset({"pack"})]
    assert sum(name.endswith(".arrow") for name in outputs["driver"]) >= 4
    assert outputs["driver"] == outputs["pooled"]
