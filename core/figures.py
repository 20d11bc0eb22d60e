"""Figures (the PNG plots of curation, ``longctx inspect --plot`` and evaluation), made without pyplot.

Figures are ``matplotlib.figure.Figure`` objects drawn by the Agg canvas: no pyplot state machine,
no registry of open figures to close (a figure is freed when it is no longer referenced), no
interactive backend looked for, nothing global changed (pyplot's ``matplotlib.use("Agg")`` would
switch the backend of the user's whole process), and ``matplotlib.pyplot`` is never imported.
matplotlib itself is imported only when a figure is made, so commands that plot nothing never pay
for it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from longctx.core.atomic import atomic_path

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def new_figure(**kwargs: Any) -> Figure:
    """A figure drawn by the Agg canvas; ``kwargs`` go to ``matplotlib.figure.Figure`` (``figsize``,
    ``layout``...). Add axes with ``figure.subplots(...)``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(**kwargs)
    FigureCanvasAgg(figure)
    return figure


def write_figure(path: Path, figure: Figure, *, dpi: int = 100) -> None:
    """Save ``figure`` at ``path`` atomically, in the format its suffix names (PNG when there is
    none)."""
    from matplotlib.layout_engine import PlaceHolderLayoutEngine

    if isinstance(figure.get_layout_engine(), PlaceHolderLayoutEngine):
        # what ``figure.tight_layout()`` leaves: the layout is final, but savefig would lay the figure
        # out again in a draw of its own (about 0.1 s of CPU; the saved bytes are the same without it)
        figure.set_layout_engine(None)
    path = Path(path)
    with atomic_path(path) as tmp:
        figure.savefig(tmp, dpi=dpi, format=path.suffix.lstrip(".") or "png")
