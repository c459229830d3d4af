"""Figures for the planner's reports: PNG bytes from matplotlib (Agg), plus the numbers as CSV.

A figure is a list of ``Panel``s, each a list of ``Series``. The same structure is written as a
long-format CSV (panel, series, x, y and the units of x and y), so every number plotted is
also available as data, in the unit it is drawn in.
matplotlib is imported inside the functions that draw, so importing the planner stays cheap.

The rules of drawing (axes from zero, milliseconds, whole-number ticks, colour and marker
pairs, legends outside the data) live in ``specsim.axes``; here they are applied to every panel,
and on a whole-number x axis a line joins only neighbouring values: k = 0, 2, 4 are three
markers, not a line that looks as if k = 1 and 3 ran.
"""

from __future__ import annotations

import io
import itertools
import math
from dataclasses import dataclass, field
from typing import Any

from specsim import axes as rules


@dataclass
class Series:
    label: str
    x: list[float]
    y: list[float | None]
    marker: str | None = None  # None: the panel's next unused colour and marker pair
    linestyle: str = "-"
    color: Any = None
    legend: bool = True  # False: drawn, but not listed in the legend (still in the CSV)
    size: float = 5.0  # marker size; a larger ring drawn first circles the points it marks


@dataclass
class Panel:
    title: str
    xlabel: str
    ylabel: str
    series: list[Series] = field(default_factory=list)
    xticks: tuple[list[float], list[str]] | None = None
    logy: bool = False
    integer_y: bool = False  # counts (replicas, k): whole-number ticks only
    # x is a whole number (k, replicas, position): whole-number ticks, lines only between
    # neighbours. Explicit ``xticks`` all at whole numbers say the same.
    integer_x: bool = False
    hlines: list[tuple[float, str]] = field(default_factory=list)
    xunit: str = ""
    yunit: str = ""
    # The value each axis includes: zero for a quantity, 1 for a ratio against a baseline;
    # None only where a reader compares from nowhere in particular.
    x_from: float | None = 0.0
    y_from: float | None = 0.0


@dataclass
class Figure:
    """``name`` is the file stem (``name.png``, ``name.csv``)."""

    name: str
    caption: str
    panels: list[Panel]
    ncols: int = 2

    def csv_text(self) -> str:
        return rules.csv_text(
            [panel.title, series.label, x, y, panel.xunit, panel.yunit]
            for panel in self.panels
            for series in panel.series
            for x, y in zip(series.x, series.y, strict=True)
        )

    def png(self) -> bytes:
        return render_png(self.panels, self.ncols)


# The adaptive policy is not a k: its point stands apart, right of the largest k.
ADAPTIVE_GAP = 1.5  # steps of k


def k_ticks(ks: list[int], adaptive: bool) -> tuple[list[float], list[str]]:
    """Ticks at the k values that ran (a tick at a k that did not reads as a result), and
    "adapt." at ``adaptive_x`` when the adaptive policy ran."""
    positions, labels = [float(k) for k in ks], [str(k) for k in ks]
    if adaptive:
        positions.append(adaptive_x(ks))
        labels.append("adapt.")
    return positions, labels


def adaptive_x(ks: list[int]) -> float:
    """``ADAPTIVE_GAP`` steps of k (the smallest step swept) right of the largest k."""
    ks = sorted(set(ks))
    step = min((b - a for a, b in itertools.pairwise(ks)), default=1)
    return float(ks[-1] + ADAPTIVE_GAP * step)


def adaptive_star(label: str, x: float, y: float | None, colour: Any) -> Series:
    """The adaptive policy's lone point beside its line: not a k, so a star, no line to it."""
    return Series(label, [x], [y], "*", "none", colour, legend=False, size=8.0)


def build_figure(panels: list[Panel], ncols: int = 2, dpi: int = 110):
    """The matplotlib figure of the panels in a grid (Agg; nothing is shown), laid out."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure as MplFigure

    ncols = max(1, min(ncols, len(panels)))
    nrows = math.ceil(len(panels) / ncols)
    fig = MplFigure(figsize=(5.2 * ncols, 3.6 * nrows), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)  # a canvas that can lay the figure out and render it
    grid = fig.subplots(nrows, ncols, squeeze=False)
    drawn = []
    for index, ax in enumerate(grid.flat):
        if index >= len(panels):
            ax.set_visible(False)
            continue
        _draw_panel(ax, panels[index])
        drawn.append(ax)
    rules.legends(fig, drawn)
    rules.separate_ticks(fig)
    return fig


def render_png(panels: list[Panel], ncols: int = 2, dpi: int = 110) -> bytes:
    """Draw the panels in a grid and return PNG bytes (deterministic: no timestamp metadata)."""
    return png_bytes(build_figure(panels, ncols, dpi))


def png_bytes(fig) -> bytes:
    """The figure's PNG, the bytes ``fig.savefig(buf, format="png", metadata={"Software":
    None})`` writes, in one draw: savefig lays the figure out in a draw of its own, without
    rendering, before the draw that renders; here the rendering draw lays it out itself (where
    the figure still has a layout engine)."""
    from matplotlib.image import imsave

    fig.canvas.draw()
    buf = io.BytesIO()
    imsave(
        buf,
        fig.canvas.buffer_rgba(),
        format="png",
        origin="upper",
        dpi=fig.dpi,
        metadata={"Software": None},
    )
    return buf.getvalue()


def integer_axis(panel: Panel) -> bool:
    """Whether the panel's x values are whole numbers (k, replicas, draft positions)."""
    if panel.integer_x:
        return True
    return panel.xticks is not None and all(float(t).is_integer() for t in panel.xticks[0])


def segments(xs: list[float], ys: list[float], whole: bool) -> list[tuple[list, list]]:
    """Runs of points a line may join: all of them, or on a whole-number axis only runs of
    neighbouring values (k = 2 and 4 are not joined: k = 3 did not run)."""
    if not whole or len(xs) < 2:
        return [(list(xs), list(ys))]
    runs = [([xs[0]], [ys[0]])]
    for x0, x, y in zip(xs, xs[1:], ys[1:], strict=False):
        if abs(x - x0) > 1 + 1e-9:
            runs.append(([], []))
        runs[-1][0].append(x)
        runs[-1][1].append(y)
    return runs


def _draw_panel(ax, panel: Panel) -> None:
    whole = integer_axis(panel)
    # Listed series take the next unused colour and marker pair; an unlisted companion (the
    # adaptive policy's lone point beside its load's line) brings its own.
    pairs = iter(rules.styles(len(panel.series)))
    for series in panel.series:
        colour, marker = next(pairs) if series.legend else ("0.45", "o")
        colour = series.color if series.color is not None else colour
        marker = series.marker if series.marker is not None else marker
        points = [(x, y) for x, y in zip(series.x, series.y, strict=True) if y is not None]
        if not points:
            continue
        xs, ys = zip(*points, strict=True)
        for i, (run_x, run_y) in enumerate(segments(list(xs), list(ys), whole)):
            listed = series.legend and i == 0
            ax.plot(
                run_x,
                run_y,
                marker=marker,
                linestyle=series.linestyle,
                label=series.label if listed else "_nolegend_",
                color=colour,
                markersize=series.size,
                linewidth=1.5,
                **rules.hollow(colour),
            )
    for value, label in panel.hlines:
        ax.axhline(value, color="0.35", linestyle=":", linewidth=1.0, label=label)
    ax.set_title(panel.title, fontsize=10)
    ax.set_xlabel(rules.axis_label(panel.xlabel, panel.xunit))
    ylabel = rules.axis_label(panel.ylabel, panel.yunit)
    values = [y for s in panel.series for y in s.y if y is not None]
    if panel.logy and rules.log_axis(ax, values + [v for v, _ in panel.hlines]):
        ylabel += ", log scale"
    ax.set_ylabel(ylabel)
    if panel.y_from is not None:
        rules.from_zero(ax, "y", panel.y_from)
    if panel.x_from is not None:
        rules.from_zero(ax, "x", panel.x_from)
    if panel.integer_y:
        rules.integer_ticks(ax, "y")
    if panel.xticks is not None:
        ax.set_xticks(panel.xticks[0], panel.xticks[1])
    elif whole:
        rules.integer_ticks(ax, "x")
    rules.plain_numbers(ax)
    ax.grid(True, alpha=0.3)
