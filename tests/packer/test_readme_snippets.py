"""The README's Python snippets for the dataloader and for transformers/TRL run as written (paths
pointed at the test's packed run)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from tests.packer.test_pack_helpers import PackedRun

pytest_plugins = ["tests.packer.test_pack_helpers"]  # the shared packed_run fixture
README = Path(__file__).resolve().parents[2] / "README.md"


def snippet(after_heading_text: str) -> str:
    """The first ```python block after ``after_heading_text`` in the README."""
    text = README.read_text(encoding="utf-8")
    start = text.index(after_heading_text)
    return re.search(r"```python\n(.*?)```", text[start:], re.S).group(1)


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
        exec(compile(code, "README.md", "exec"), namespace)
    finally:
        os.chdir(cwd)
    return namespace


def test_the_dataloader_snippet_runs(packed_run: PackedRun, tmp_path: Path) -> None:
    ns = run(snippet("The dataloader is importable on its own"), packed_run, tmp_path)
    assert ns["state"]["position"] == 1 and ns["state"]["global_batch_rows"] == 4
    assert ns["part"].input_ids.numel() == 128


@pytest.mark.slow
def test_the_transformers_snippet_runs(packed_run: PackedRun, tmp_path: Path) -> None:
    pytest.importorskip("accelerate")
    pytest.importorskip("datasets")
    ns = run(snippet("### transformers / TRL batches"), packed_run, tmp_path)
    assert ns["out"].logits.shape[:2] == (2, 256)
    assert ns["header"].seq_len == 256 and len(ns["rows"]) == len(ns["ds"].shards)
