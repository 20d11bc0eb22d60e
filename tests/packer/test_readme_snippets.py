"""The Python snippets of docs/packing.md for the dataloader and for transformers/TRL run as written
(paths pointed at the test's packed run)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.packer.test_pack_helpers import PackedRun
from tests.readme import code_blocks

pytest_plugins = ["tests.packer.test_pack_helpers"]  # the shared packed_run fixture


def snippet(heading: str) -> str:
    """The one ```python block of the docs section titled ``heading``."""
    (code,) = code_blocks(heading, "python")
    return code


def run(code: str, run_: PackedRun, tmp_path: Path) -> dict:
    code = (
        code.replace("runs/demo/shards/seq2048", str(run_.folder(256)))
        .replace("runs/demo/tokenizer.json", str(run_.tokenizer_path))
        .replace('"runs/hf"', repr(str(tmp_path / "hf")))
        .replace('"runs/trl"', repr(str(tmp_path / "trl")))
        .replace('"runs/demo"', repr(str(run_.root)))
    )
    namespace: dict = {}
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        exec(compile(code, "docs/packing.md", "exec"), namespace)
    finally:
        os.chdir(cwd)
    return namespace


def test_the_dataloader_snippet_runs(packed_run: PackedRun, tmp_path: Path) -> None:
    ns = run(snippet("The dataloader"), packed_run, tmp_path)
    assert ns["state"]["position"] == 1 and ns["state"]["global_batch_rows"] == 4
    assert ns["part"].input_ids.numel() == 128


@pytest.mark.slow
def test_the_transformers_snippet_runs(packed_run: PackedRun, tmp_path: Path) -> None:
    pytest.importorskip("accelerate")
    pytest.importorskip("datasets")
    ns = run(snippet("transformers / TRL batches"), packed_run, tmp_path)
    assert ns["out"].logits.shape[:2] == (2, 256)
    assert ns["header"].seq_len == 256 and len(ns["rows"]) == len(ns["ds"].shards)


@pytest.mark.slow
def test_the_trl_snippet_trains_on_whole_rows(packed_run: PackedRun, tmp_path: Path) -> None:
    """TRL's SFTTrainer as the README sets it up: the collator gets the shard rows whole (the
    positions of every row as stored, not cut to max_length) and the trainer runs its steps."""
    pytest.importorskip("trl")
    pytest.importorskip("datasets")
    import torch

    from longctx.packer import PackedCollator

    seen: list[dict] = []
    original = PackedCollator.__call__

    def recording(self, features):  # what the trainer hands the collator, kept for the check below
        seen.extend(dict(f) for f in features)
        return original(self, features)

    PackedCollator.__call__ = recording
    try:
        ns = run(snippet("TRL's SFTTrainer"), packed_run, tmp_path)
    finally:
        PackedCollator.__call__ = original
    trainer, rows = ns["trainer"], ns["rows"]
    assert trainer.state.global_step == 4
    loss = trainer.state.log_history[-1]["train_loss"]
    assert 0 < loss < 10, loss  # finite, and about ln(320) = 5.8 for a random model
    stored = {(tuple(row["doc_id"]), tuple(row["doc_offset"])): row for row in rows}
    assert len(stored) == len(rows) and len(seen) >= 8  # 4 steps of 2 rows (the loader may prefetch)
    for feature in seen:
        row = stored[(tuple(feature["doc_id"]), tuple(feature["doc_offset"]))]
        assert len(feature["input_ids"]) == 256
        for key in ("input_ids", "position_ids", "loss_mask", "cu_seqlens"):
            assert torch.equal(torch.as_tensor(feature[key]), torch.as_tensor(row[key])), key
