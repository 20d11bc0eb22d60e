"""Every plot of the product (curation's ``stats.png``, ``longctx inspect --plot``, the evaluation's
loss-by-position and needle plots), drawn without pyplot, has the pixels pyplot draws from the same
drawing code: the reference replaces :func:`~longctx.core.figures.new_figure` with ``pyplot.figure``
and :func:`~longctx.core.figures.write_figure` with a plain ``savefig``."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from PIL import Image

from tests.packer.test_pack_helpers import PackedRun

pytest_plugins = ["tests.packer.test_pack_helpers"]  # the shared packed_run fixture

SEQ_LEN = 256


def pyplot_reference(monkeypatch: pytest.MonkeyPatch, module: ModuleType) -> None:
    """Make ``module`` draw with pyplot, as the plots did before."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def save(path: Path, figure, *, dpi: int = 100) -> None:
        figure.savefig(path, dpi=dpi, format=Path(path).suffix.lstrip(".") or "png")
        plt.close(figure)

    monkeypatch.setattr(module, "new_figure", lambda **kwargs: plt.figure(**kwargs))
    monkeypatch.setattr(module, "write_figure", save)


def same_as_pyplot(
    monkeypatch: pytest.MonkeyPatch, module: ModuleType, plot: Callable[[Path], None], folder: Path
) -> np.ndarray:
    """The plot's pixels, after checking them against the pyplot reference's."""
    plot(folder / "ours.png")
    with monkeypatch.context() as patch:
        pyplot_reference(patch, module)
        plot(folder / "pyplot.png")
    ours, reference = (np.asarray(Image.open(folder / n).convert("RGBA")) for n in ("ours.png", "pyplot.png"))
    assert ours.shape == reference.shape
    assert np.array_equal(ours, reference)
    return ours


def test_curation_summary(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from longctx.pipeline import stats

    summary = {
        "sources": {
            name: {"kept": k, "filtered": f, "duplicate": d, "skipped": s, "length_histogram": hist}
            for name, k, f, d, s, hist in (
                ("books", 16, 0, 3, 0, {"32768": 1, "65536": 3, "131072": 12}),
                ("code", 15, 2, 0, 1, {"2048": 1, "8192": 3, "16384": 11}),
            )
        }
    }
    image = same_as_pyplot(monkeypatch, stats, lambda p: stats.plot_summary(summary, p), tmp_path)
    assert image.shape == (450, 1200, 4)  # figsize (12, 4.5) at 100 dpi

    # the length axis has every power-of-two bucket from 2K to 128K, the empty 4K one too
    drawn = []
    monkeypatch.setattr(stats, "write_figure", lambda path, figure, **kwargs: drawn.append(figure))
    stats.plot_summary(summary, tmp_path / "unused.png")
    lengths = drawn[0].axes[1]
    assert [t.get_text() for t in lengths.get_xticklabels()] == [
        "2K",
        "4K",
        "8K",
        "16K",
        "32K",
        "64K",
        "128K",
    ]
    heights = [[bar.get_height() for bar in container] for container in lengths.containers]
    assert heights == [[0, 0, 0, 0, 1, 3, 12], [1, 0, 3, 11, 0, 0, 0]]  # books, code


def test_inspect_plot(monkeypatch: pytest.MonkeyPatch, packed_run: PackedRun, tmp_path: Path) -> None:
    from longctx.packer import report

    manifest = packed_run.manifests[SEQ_LEN]
    image = same_as_pyplot(monkeypatch, report, lambda p: report.plot_manifest(manifest, p), tmp_path)
    assert image.shape == (540, 1560, 4)  # figsize (13, 4.5) at 120 dpi


def test_evaluation_plots(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from longctx.trainer.evaluation import measures as evaluate

    table = [{"start": 2**i, "end": 2 ** (i + 1), "tokens": 10, "mean_loss": 3.0 - 0.2 * i} for i in range(8)]
    tables = {"base": table, "extended": [dict(r, mean_loss=r["mean_loss"] - 0.3) for r in table]}
    (tmp_path / "loss").mkdir()
    image = same_as_pyplot(
        monkeypatch, evaluate, lambda p: evaluate.plot_loss_by_position(tables, 64, p), tmp_path / "loss"
    )
    assert image.shape == (400, 700, 4)  # figsize (7, 4) at 100 dpi

    results = {
        label: [
            evaluate.NeedleResult(
                n, d, "single_needle", s, "42", "42" if (n + s) % 3 else "7", bool((n + s) % 3)
            )
            for n in (256, 512)
            for d in (0.0, 0.5, 1.0)
            for s in range(2)
        ]
        for label in ("base", "extended")
    }
    (tmp_path / "needle").mkdir()
    same_as_pyplot(
        monkeypatch, evaluate, lambda p: evaluate.plot_needle_heatmap(results, p), tmp_path / "needle"
    )


def test_titles_count_in_the_singular_for_one(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """One needle per cell reads "1 sample per cell" (it read "1 samples")."""
    from longctx.trainer.evaluation import measures as evaluate

    drawn = []
    monkeypatch.setattr(evaluate, "write_figure", lambda path, figure, **kwargs: drawn.append(figure))
    for samples in (1, 3):
        results = {
            "base": [
                evaluate.NeedleResult(256, 0.5, "single_needle", s, "42", "42", True) for s in range(samples)
            ]
        }
        evaluate.plot_needle_heatmap(results, tmp_path / "unused.png")
    assert [[ax.get_title() for ax in figure.axes if ax.images] for figure in drawn] == [
        ["base: single_needle (1 sample per cell)"],
        ["base: single_needle (3 samples per cell)"],
    ]


def test_the_needle_heatmap_has_a_panel_per_model_and_task_kind_with_true_counts(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Two task kinds of 2 samples each are two rows of panels, each cell saying correct/total of its
    own kind (counted here from the results), each title its true samples per cell; they are never
    pooled into one "4 per cell" under a title that says 2."""
    from longctx.trainer.evaluation import measures as evaluate

    results = {
        label: [
            evaluate.NeedleResult(n, d, kind, s, "42", "", (n + s + shift + len(kind)) % 3 == 0)
            for kind in ("single_needle", "multi_key")
            for n in (256, 512)
            for d in (0.0, 1.0)
            for s in range(2)
        ]
        for label, shift in (("base", 0), ("extended", 1))
    }
    drawn = []
    monkeypatch.setattr(evaluate, "write_figure", lambda path, figure, **kwargs: drawn.append(figure))
    evaluate.plot_needle_heatmap(results, tmp_path / "unused.png")
    (figure,) = drawn
    panels = {ax.get_title(): ax for ax in figure.axes if ax.images}
    assert sorted(panels) == sorted(
        f"{label}: {kind} (2 samples per cell)"
        for label in results
        for kind in ("single_needle", "multi_key")
    )
    for title, ax in panels.items():
        label, kind = title.split(" (")[0].split(": ")
        want = []
        for d in (0.0, 1.0):
            for n in (256, 512):
                cell = [
                    r.correct
                    for r in results[label]
                    if r.task == kind and r.depth == d and r.context_tokens == n
                ]
                want.append(f"{sum(cell)}/{len(cell)}")
        assert [t.get_text() for t in ax.texts] == want, title


def wilson(k: int, n: int) -> tuple[float, float]:
    """Wilson's closed form at 95%: (k + z^2/2 -+ z sqrt(k (n - k) / n + z^2 / 4)) / (n + z^2)."""
    z = 1.959963984540054
    root = z * math.sqrt(k * (n - k) / n + z * z / 4)
    return (k + z * z / 2 - root) / (n + z * z), (k + z * z / 2 + root) / (n + z * z)


def test_every_models_line_stays_visible_when_their_scores_coincide(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Two models with the same score at every length (a base and a trained model that both score
    5 of 10): around each point of the PNG, each model's own colour is drawn, the points sit apart,
    each with its interval as error bars; each model's threshold is a line and the legend names
    both models and their effective lengths."""
    from matplotlib.colors import to_rgb

    from longctx.trainer.evaluation import measures as evaluate

    low, high = wilson(5, 10)
    scores = [
        {
            "context_tokens": n,
            "score": 0.5,
            "count": 10,
            "low": low,
            "high": high,
            "passes": True,
            "enough": False,
        }
        for n in (256, 512, 1024)
    ]
    verdict = {
        "scores": scores,
        "effective_length": 1024,
        "status": "determined",
        "reason": None,
        "threshold": 0.25,
        "threshold_source": "absolute",
        "fraction": None,
        "reference": {"context_tokens": 256, **scores[0]},
        "first_failure": None,
    }
    effective = {"models": {"base": verdict, "trained": verdict}}
    drawn = []
    write = evaluate.write_figure

    def keep(path: Path, figure, **kwargs) -> None:
        drawn.append(figure)
        write(path, figure, **kwargs)

    monkeypatch.setattr(evaluate, "write_figure", keep)
    evaluate.plot_score_by_length(effective, tmp_path / "score.png")
    (figure,) = drawn
    ax = figure.axes[0]
    image = np.asarray(Image.open(tmp_path / "score.png").convert("RGB")).astype(int)
    bars = {c.get_label(): c for c in ax.containers}
    legend = {t.get_text() for t in ax.get_legend().get_texts()}
    # the legend says how many items each score has, and that 10 are too few for +/-0.1
    names = {f"{label} (effective 1024; n=10, too few items for +/-0.1)" for label in ("base", "trained")}
    assert names <= legend
    assert sum("threshold 0.25 (absolute" in t for t in legend) == 2
    xs = {}
    for label in sorted(names):
        data_line, _, (segments,) = bars[label].lines
        colour = np.array(to_rgb(data_line.get_color())) * 255
        xs[label] = [x for x, _ in data_line.get_xydata()]
        for (x, y), segment in zip(data_line.get_xydata(), segments.get_segments()):
            assert y == 0.5 and [p[1] for p in segment] == pytest.approx([low, high])  # the interval
            px, py = ax.transData.transform((x, y))
            row, col = image.shape[0] - round(py), round(px)
            around = image[row - 12 : row + 13, col - 12 : col + 13]
            assert (np.abs(around - colour).sum(axis=2) < 60).sum() >= 20, (label, x)
    first, second = xs.values()
    for a, b, n in zip(first, second, (256, 512, 1024)):
        assert a < n < b  # shifted apart around the true length


def test_scores_beyond_the_histograms_range_are_counted_and_said(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from longctx.pipeline import stats

    values = [1.6, 1.0, 0.999, 0.2, -1.5]
    block = stats.score_summary(values, unscored=0)
    assert block["outside"] == {"below_-1": 1, "from_1": 2}
    assert block["histogram"] == {"-1.00": 1, "0.20": 1, "0.95": 3}  # the edge bins hold the scores beyond
    assert "outside" not in stats.score_summary([0.2, 0.5], unscored=1)

    summary = {
        "sources": {
            "books": {"kept": 5, "filtered": 0, "duplicate": 0, "skipped": 0, "length_histogram": {"8192": 5}}
            | {"dependency": block}
        }
    }
    drawn = []
    monkeypatch.setattr(stats, "write_figure", lambda path, figure, **kwargs: drawn.append(figure))
    stats.plot_summary(summary, tmp_path / "unused.png")
    notes = [t.get_text() for t in drawn[0].axes[2].texts]
    assert notes == ["2 at 1 or above, 1 below -1: in the edge bins"]
