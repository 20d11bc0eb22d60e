"""Shared fixtures: the read-only corpus beside the checkout, and small built-in inputs."""

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
