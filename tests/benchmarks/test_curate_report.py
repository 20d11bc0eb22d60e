"""``curate_report.py``: throughputs against both baselines, the goals, and the check that fails a run
more than 5% slower than a recorded report (and refuses to compare different inputs)."""

from __future__ import annotations

import copy
import json
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
import curate_report as cr


def _rows(e2e: list[float], whole: list[float], pieces: list[float]) -> cr.Rows:
    return {
        cr.END_TO_END: {"wall": e2e, "cpu": [2 * x for x in e2e]},
        cr.BASELINES["whole"]: {"wall": whole, "cpu": whole},
        cr.BASELINES["pieces"]: {"wall": pieces, "cpu": pieces},
    }


def _report() -> dict:
    small = (20.0, _rows([10.0, 11.0, 12.0], [6.0, 6.0, 6.0], [5.0, 5.5, 5.0]))
    large = (80.0, _rows([28.0, 29.0, 30.0], [21.0, 21.0, 21.0], [18.0, 18.5, 18.0]))
    return {
        "sizes": [
            {"megabytes": mb, "throughput": cr.whole_run(rows), "seconds": rows}
            for mb, rows in (small, large)
        ],
        "per_extra_mb": cr.per_extra_mb(small, large),
    }


def test_throughputs_are_each_repetitions_baseline_over_curate_and_pack() -> None:
    rows = _rows([10.0, 12.0], [6.0, 6.0], [5.0, 4.0])
    assert cr.throughputs(rows, "whole") == [0.6, 0.5]
    assert cr.throughputs(rows, "pieces") == [0.5, 4.0 / 12.0]
    assert cr.whole_run(rows)["whole"] == {"median": 0.55, "min": 0.5, "max": 0.6}


def test_per_extra_mb_compares_slopes_per_repetition() -> None:
    report = _report()
    # whole: (21 - 6) / 60 over (28 - 10) / 60, (29 - 11) / 60, (30 - 12) / 60: 15 / 18 each time
    assert report["per_extra_mb"]["whole"]["median"] == pytest.approx(15 / 18)
    assert report["per_extra_mb"]["pieces"]["min"] == pytest.approx(13 / 18)


def _scaled(figure: dict[str, float], factor: float) -> None:
    """Every repetition of a figure ``factor`` times as fast (a change, not one slow repetition)."""
    for key in figure:
        figure[key] *= factor


def test_a_figure_more_than_5_percent_lower_is_named() -> None:
    recorded = _report()
    current = copy.deepcopy(recorded)
    _scaled(current["sizes"][1]["throughput"]["pieces"], 0.94)
    _scaled(current["per_extra_mb"]["pieces"], 0.96)  # within the tolerance
    (line,) = cr.regressions(recorded, current)
    assert line.startswith("whole run, size 2 of 2, against pieces:")
    assert "-6.0%" in line
    assert cr.regressions(recorded, recorded) == []


def test_only_figures_against_curations_own_tokenizer_calls_are_guarded() -> None:
    recorded = _report()
    current = copy.deepcopy(recorded)
    # the whole-document tokenizer's threads vary between runs: figures against it are not guarded
    _scaled(current["sizes"][1]["throughput"]["whole"], 0.8)
    _scaled(current["per_extra_mb"]["whole"], 0.8)
    assert cr.regressions(recorded, current) == []


def test_a_median_lowered_by_slow_repetitions_alone_is_not_a_regression() -> None:
    recorded = _report()
    current = copy.deepcopy(recorded)
    figure = current["per_extra_mb"]["pieces"]
    figure["median"] *= 0.9
    figure["min"] *= 0.9
    figure["max"] = recorded["per_extra_mb"]["pieces"]["median"]  # one repetition as fast as recorded
    assert cr.regressions(recorded, current) == []
    figure["max"] *= 0.99
    (line,) = cr.regressions(recorded, current)
    assert line.startswith("per extra MB against pieces:")


def test_reports_of_different_inputs_are_not_compared() -> None:
    recorded = _report()
    other = copy.deepcopy(recorded)
    other["sizes"][1]["megabytes"] = 100.0
    with pytest.raises(ValueError, match=re.escape("measured 20.0, 80.0 MB, this run 20.0, 100.0 MB")):
        cr.regressions(recorded, other)
    one_size = copy.deepcopy(recorded)
    del one_size["per_extra_mb"]
    one_size["sizes"] = one_size["sizes"][:1]
    with pytest.raises(ValueError, match="--copies"):
        cr.regressions(recorded, one_size)
    # the same input, slightly larger on another machine's Python: compared by size rank
    nearby = copy.deepcopy(recorded)
    nearby["sizes"][1]["megabytes"] = 80.5
    assert cr.regressions(recorded, nearby) == []


def test_goals_are_against_the_whole_document_tokenizer_at_the_largest_size() -> None:
    lines = cr.goal_lines(_report())
    # largest size: 21 / 29 = 0.72 < 0.75; per extra MB: 15 / 18 = 0.83 < 0.85
    assert lines == [
        "goal: whole run at 80.0 MB at least 0.75x of the whole-document tokenizer: 0.72x, NOT MET",
        "goal: per extra MB at least 0.85x of the whole-document tokenizer: 0.83x, NOT MET",
    ]
    faster = _report()
    faster["sizes"][1]["throughput"]["whole"]["median"] = 0.8
    assert cr.goal_lines(faster)[0].endswith("0.80x, met")


def test_the_default_reference_is_the_newest_report_of_the_same_input(tmp_path: Path) -> None:
    recorded = _report()
    other_input = copy.deepcopy(recorded)
    other_input["sizes"][1]["megabytes"] = 200.0
    faster = copy.deepcopy(recorded)
    _scaled(faster["per_extra_mb"]["pieces"], 1.2)
    (tmp_path / "2026-12-01-curate.json").write_text(json.dumps(recorded))
    (tmp_path / "2026-12-02-curate.json").write_text(json.dumps(faster))
    (tmp_path / "2026-12-03-curate.json").write_text(json.dumps(other_input))
    (tmp_path / "2026-12-04-curate.json").write_text("{not json")
    path, slower = cr.newest_comparable(tmp_path, recorded)
    assert path == tmp_path / "2026-12-02-curate.json"
    (line,) = slower
    assert line.startswith("per extra MB against pieces:") and line.endswith("(-16.7%)")
    assert cr.newest_comparable(tmp_path / "none", recorded) == (None, [])


def _with_allocator(report: dict, library: str) -> dict:
    """``report`` as a run whose curation preloaded ``library``: its whole-document baseline with the
    same allocator measured too (here 1.3x as fast as the plain one)."""
    out = copy.deepcopy(report)
    out["allocator"] = library
    for size in out["sizes"]:
        rows = size["seconds"]
        rows[cr.BASELINES["whole_allocator"]] = {
            k: [x / 1.3 for x in v] for k, v in rows[cr.BASELINES["whole"]].items()
        }
        size["throughput"] = cr.whole_run(rows)
    small, large = ((s["megabytes"], s["seconds"]) for s in out["sizes"])
    out["per_extra_mb"] = cr.per_extra_mb(small, large)
    return out


def test_the_allocator_baseline_is_reported_only_where_it_was_measured() -> None:
    plain = _report()
    assert set(plain["sizes"][0]["throughput"]) == set(plain["per_extra_mb"]) == {"whole", "pieces"}
    fast = _with_allocator(plain, "libmimalloc.so.2.0")
    assert set(fast["per_extra_mb"]) == {"whole", "pieces", "whole_allocator"}
    assert fast["per_extra_mb"]["whole_allocator"]["median"] == pytest.approx(15 / 18 / 1.3)
    assert cr.allocator_kind(fast) == "mimalloc" and cr.allocator_kind(plain) == "system"
    # the goals stay against the plain tokenizer; the same-allocator figure is shown under each
    assert cr.goal_lines(fast) == [
        cr.goal_lines(plain)[0],
        "  (against the whole-document tokenizer with curation's allocator, mimalloc: 0.56x)",
        cr.goal_lines(plain)[1],
        "  (against the whole-document tokenizer with curation's allocator, mimalloc: 0.64x)",
    ]


def test_reports_of_different_allocators_are_not_compared(tmp_path: Path) -> None:
    plain = _report()
    fast = _with_allocator(plain, "libmimalloc.so.2.0")
    with pytest.raises(ValueError, match="ran curation with the system allocator, this run with mimalloc"):
        cr.regressions(plain, fast)
    assert cr.regressions(fast, _with_allocator(plain, "/usr/lib/libmimalloc.so.2.1")) == []
    # the newest report of the same allocator is the reference, however new a report of another one
    (tmp_path / "2026-12-01-curate.json").write_text(json.dumps(plain))
    (tmp_path / "2026-12-05-curate.json").write_text(json.dumps(fast))
    assert cr.newest_comparable(tmp_path, plain) == (tmp_path / "2026-12-01-curate.json", [])
    assert cr.newest_comparable(tmp_path, fast) == (tmp_path / "2026-12-05-curate.json", [])
