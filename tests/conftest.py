"""Shared fixtures: the read-only corpus beside the checkout, and small built-in inputs (built once per
session, here, so that every folder's tests read the same copy)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_CORPUS = Path(os.environ.get("LONGCTX_SHARED_CORPUS", REPO_ROOT.parent / "shared" / "corpus"))


@pytest.fixture(scope="session")
def shared_corpus() -> Path:
    """``../shared/corpus`` (real books and papers); skips when the checkout has no ``../shared``."""
    if not (SHARED_CORPUS / "MANIFEST.md").is_file():
        pytest.skip(f"shared corpus not found at {SHARED_CORPUS} (set LONGCTX_SHARED_CORPUS to point at it)")
    return SHARED_CORPUS


WINDOW = 256
"""The window length of :func:`packed` (twice its original context, 128)."""


@pytest.fixture(scope="session")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run folder with a tokenizer, curated documents and 256-token windows (original context 128)
    whose positions reach 200: the training tests read it, and write only outside it."""
    from longctx import jobs
    from tests.packer.test_pack_helpers import make_config, make_run

    root = tmp_path_factory.mktemp("packed")
    make_run(root)
    manifests = jobs.pack(make_config(root, seq_lens=[WINDOW]))
    assert manifests and manifests[WINDOW].max_position >= 200
    return root
