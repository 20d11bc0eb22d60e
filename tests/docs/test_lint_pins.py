"""The style check contributors run before a commit is the one `make lint` runs: the same ruff."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def test_pre_commit_runs_the_ruff_version_pinned_in_the_test_extra() -> None:
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    (pinned,) = re.findall(r'"ruff==([0-9.]+)"', pyproject)
    hooks = yaml.safe_load((REPO / ".pre-commit-config.yaml").read_text(encoding="utf-8"))
    (ruff_repo,) = [r for r in hooks["repos"] if r["repo"].endswith("/ruff-pre-commit")]
    assert ruff_repo["rev"] == f"v{pinned}", "pre-commit rev != the ruff pin"
    assert {h["id"] for h in ruff_repo["hooks"]} == {"ruff-check", "ruff-format"}
