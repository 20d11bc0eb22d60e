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
