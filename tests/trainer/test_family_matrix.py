"""The family matrix (tests/benchmarks/family_matrix.py) on every test run: each RoPE decoder family of
the installed transformers is refused in one line before any rank starts, or trains with per-document
logits equal to transformers' own; one family per architectural trait goes the whole way (a two-stage
gated run at cp 2, the export, ``longctx eval``); and the committed results, and the table of
docs/training.md made from them, are not stale.

References: transformers itself (each document run alone in float64, ``families.reference_logits``;
``from_pretrained`` of the exported folder), and the committed results of the matrix script.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers", reason="the transformers extra is not installed")
from tests.benchmarks import family_matrix
from tests.trainer import families

FAMILIES = families.rope_families()
REFRESH = "tests/benchmarks/family_matrix.py --full --docs docs/training.md"
RESULTS = json.loads(family_matrix.RESULTS.read_text())
RECORDED = {row["family"]: row for row in RESULTS["families"]}
# One family per trait, together all of them: the full path of each runs on every test run.
TRAIT_FAMILIES = {
    "qwen3_moe": ("mixture of experts", "q/k norms", "renamed checkpoint keys"),
    "gpt_neox": ("biases", "partial rotary", "renamed checkpoint keys"),
    "cohere2": ("sliding window", "tied embeddings"),
}
TRAITS = (
    "mixture of experts",
    "partial rotary",
    "q/k norms",
    "biases",
    "sliding window",
    "tied embeddings",
    "renamed checkpoint keys",
)


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """Tiny models run several times faster on one thread than on two contended ones."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_the_results_are_those_of_the_installed_transformers_and_its_families() -> None:
    import transformers

    stale = f"{family_matrix.RESULTS} is stale: run {REFRESH}"
    assert RESULTS["transformers"] == transformers.__version__, stale
    assert [row["family"] for row in RESULTS["families"]] == FAMILIES, stale


def test_the_docs_table_is_the_results_table() -> None:
    text = family_matrix.DOCS.read_text()
    start = text.index(family_matrix.TABLE_START)
    end = text.index(family_matrix.TABLE_END) + len(family_matrix.TABLE_END)
    assert text[start:end] == family_matrix.table(RESULTS["families"]), (
        f"docs/training.md's family table is stale: run {REFRESH}"
    )


def test_every_family_that_trains_went_the_whole_way() -> None:
    """The committed results hold a passed full path for every family the check trains (a family
    whose full path failed is a bug to fix, not a row to keep)."""
    not_passed = {
        row["family"]: row.get("full_path")
        for row in RESULTS["families"]
        if row["check"] == "trains" and (row.get("full_path") or {}).get("result") != "passed"
    }
    assert not_passed == {}


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_is_refused_in_one_line_or_trains_with_transformers_logits(
    family: str, tmp_path: Path
) -> None:
    row = family_matrix.check(family, tmp_path / family)
    recorded = RECORDED[family]
    assert row.check in ("trains", "refused"), (
        f"{family}: logits differ from transformers' by {row.error:.2e}"
    )
    if row.check == "refused":
        assert "\n" not in row.reason and row.reason.startswith(family), row.reason
        assert row.reason == recorded["reason"], "the refusal differs from the committed results"
    else:
        assert row.error <= row.tolerance
        assert (row.implementation, row.traits) == (recorded["implementation"], recorded["traits"])
    assert recorded["check"] == row.check


def test_the_trait_families_cover_every_trait() -> None:
    for family, traits in TRAIT_FAMILIES.items():
        assert set(traits) <= set(RECORDED[family]["traits"]), family
    assert {t for traits in TRAIT_FAMILIES.values() for t in traits} == set(TRAITS)


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(TRAIT_FAMILIES))
def test_a_family_of_each_trait_goes_the_whole_way_at_cp_2(
    family: str, staged_packed: Path, tmp_path: Path
) -> None:
    """Two gated stages at cp 2 (the gate measures with the transformers code that trained), the export
    (which transformers opens with no tensor missing and the same logits) and ``longctx eval``."""
    outcome: dict[str, Any] = family_matrix.full_path(family, staged_packed, tmp_path)
    assert outcome["result"] == "passed", outcome
    assert outcome["export_error"] <= family_matrix.families.FLOAT32_TOLERANCE
