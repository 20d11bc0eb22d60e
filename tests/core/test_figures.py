"""Figures without pyplot: the same pixels as pyplot draws, the format from the suffix, nothing global
touched."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from longctx.core.figures import new_figure, write_figure


def draw(figure) -> None:
    """Two panels with bars, a line, a legend and rotated tick labels, laid out by ``tight_layout``."""
    left, right = figure.subplots(1, 2)
    left.bar(["a", "b", "c"], [3, 1, 2], label="bars")
    left.legend()
    right.plot([1, 2, 4, 8], [2.0, 1.5, 1.2, 1.1], marker="o")
    right.set_xscale("log", base=2)
    right.tick_params(axis="x", labelrotation=45)
    right.set_title("a title long enough to need the layout")
    figure.tight_layout()


def pixels(path: Path) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGBA"))


def test_a_figure_is_drawn_as_pyplot_draws_it(tmp_path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    reference = plt.figure(figsize=(8, 3))
    draw(reference)
    reference.savefig(tmp_path / "pyplot.png", dpi=90)
    plt.close(reference)

    figure = new_figure(figsize=(8, 3))
    draw(figure)
    write_figure(tmp_path / "new.png", figure, dpi=90)
    ours = pixels(tmp_path / "new.png")
    assert ours.shape == (3 * 90, 8 * 90, 4)
    assert np.array_equal(ours, pixels(tmp_path / "pyplot.png"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.png", "pyplot.png"]  # no temporary left


def test_the_format_comes_from_the_suffix(tmp_path: Path) -> None:
    for name, magic in (
        ("plot.png", b"\x89PNG\r\n\x1a\n"),
        ("plot", b"\x89PNG\r\n\x1a\n"),
        ("plot.pdf", b"%PDF"),
    ):
        figure = new_figure()
        figure.subplots().plot([0, 1], [1, 0])
        write_figure(tmp_path / name, figure)
        assert (tmp_path / name).read_bytes().startswith(magic), name
    figure = new_figure()
    figure.subplots()
    write_figure(tmp_path / "plot.svg", figure)
    assert b"<svg" in (tmp_path / "plot.svg").read_bytes()[:500]


def test_a_failed_save_leaves_nothing(tmp_path: Path) -> None:
    figure = new_figure()
    figure.subplots()
    with pytest.raises(ValueError):
        write_figure(tmp_path / "plot.nosuchformat", figure)
    assert not list(tmp_path.iterdir())


def test_plotting_imports_no_pyplot_and_keeps_the_backend(tmp_path: Path) -> None:
    """Curation's summary plot, in a fresh interpreter: pyplot is never imported and the process's
    backend setting is what it was."""
    code = f"""
import sys
import matplotlib
before = matplotlib.rcParams._get("backend")
from longctx.pipeline.stats import plot_summary
summary = {{"sources": {{"books": {{"kept": 3, "filtered": 1, "duplicate": 0, "skipped": 1,
                                 "length_histogram": {{"1024": 2, "4096": 1}}}}}}}}
plot_summary(summary, __import__("pathlib").Path({str(tmp_path / "stats.png")!r}))
assert "matplotlib.pyplot" not in sys.modules, "pyplot was imported"
assert matplotlib.rcParams._get("backend") == before, "the backend changed"
"""
    subprocess.run([sys.executable, "-c", code], check=True)
    assert pixels(tmp_path / "stats.png").shape == (450, 1200, 4)  # figsize (12, 4.5) at 100 dpi
