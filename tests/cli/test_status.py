"""``--status`` says where a run stands without running anything: on a finished curation or packing
it says the job is finished and where its results are, not that running the command would finish
it."""

from __future__ import annotations

from pathlib import Path

import pytest

from longctx.cli import main
from tests.cli.test_refusals import contents, run  # noqa: F401  (the curated and packed run)


@pytest.mark.parametrize(
    ("command", "what", "results"), [("curate", "curation", ""), ("pack", "packing", "shards")]
)
def test_status_of_a_finished_run_says_it_is_finished(
    run: dict[str, Path],
    capsys: pytest.CaptureFixture[str],
    command: str,
    what: str,
    results: str,
) -> None:
    before = contents(run["root"] / "run")
    capsys.readouterr()
    assert main([command, "--config", str(run["config"]), "--status"]) == 0
    out = capsys.readouterr().out
    folder = run["root"] / "run" / results if results else run["root"] / "run"
    assert "to finish" not in out, out
    assert out.splitlines()[-1] == (
        f"every task is done: the {what} is finished, its results are in {folder}; the command without "
        "--status prints its summary"
    )
    assert contents(run["root"] / "run") == before
