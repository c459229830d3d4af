"""Figures for the planner's reports: PNG bytes from matplotlib (Agg), plus the numbers as CSV.

A figure is a list of ``Panel``s, each a list of ``Series``. The same structure is written as a
long-format CSV (panel, series, x, y), so every number plotted is also available as data.
matplotlib is imported inside the functions that draw, so importing the planner stays cheap.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Series:
    label: str
    x: list[float]
    y: list[float | None]
    marker: str = "o"
    linestyle: str = "-"
    color: Any = None
    legend: bool = True  # False: drawn, but not listed in the legend (still in the CSV)


@dataclass
class Panel:
    title: str
    xlabel: str
    ylabel: str
    series: list[Series] = field(default_factory=list)
    xticks: tuple[list[float], list[str]] | None = None
    logy: bool = False
    integer_y: bool = False  # counts (replicas, k): whole-number ticks only
    hlines: list[tuple[float, str]] = field(default_factory=list)


@dataclass
class Figure:
    """``name`` is the file stem (``name.png``, ``name.csv``)."""

    name: str
    caption: str
    panels: list[Panel]
    ncols: int = 2

    def csv_text(self) -> str:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(["panel", "series", "x", "y"])
        for panel in self.panels:
            for series in panel.series:
                for x, y in zip(series.x, series.y, strict=True):
                    writer.writerow([panel.title, series.label, _num(x), _num(y)])
        return buf.getvalue()

    def png(self) -> bytes:
        return render_png(self.panels, self.ncols)


def _num(value: float | None) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    return repr(float(value)) if isinstance(value, float) else str(value)


def render_png(panels: list[Panel], ncols: int = 2, dpi: int = 110) -> bytes:
    """Draw the panels in a grid and return PNG bytes (deterministic: no timestamp metadata)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure as MplFigure

    ncols = max(1, min(ncols, len(panels)))
    nrows = math.ceil(len(panels) / ncols)
    fig = MplFigure(figsize=(5.2 * ncols, 3.6 * nrows), dpi=dpi, layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    for index, ax in enumerate(axes.flat):
        if index >= len(panels):
            ax.set_visible(False)
            continue
        _draw_panel(ax, panels[index])
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def _draw_panel(ax, panel: Panel) -> None:
    for series in panel.series:
        points = [(x, y) for x, y in zip(series.x, series.y, strict=True) if y is not None]
        if not points:
            continue
        xs, ys = zip(*points, strict=True)
        ax.plot(
            xs,
            ys,
            marker=series.marker,
            linestyle=series.linestyle,
            label=series.label if series.legend else "_nolegend_",
            color=series.color,
            markersize=4,
            linewidth=1.4,
        )
    for value, label in panel.hlines:
        ax.axhline(value, color="0.35", linestyle=":", linewidth=1.0, label=label)
    ax.set_title(panel.title, fontsize=10)
    ax.set_xlabel(panel.xlabel)
    ax.set_ylabel(panel.ylabel)
    if panel.logy:
        from matplotlib.ticker import FuncFormatter

        ax.set_yscale("log")
        # Plain numbers (0.5, 2, 20) rather than 5x10^-1: the readers are operators.
        plain = FuncFormatter(lambda value, _: f"{value:g}")
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(plain if _few_decades(ax) else FuncFormatter(lambda v, _: ""))
    if panel.integer_y:
        from matplotlib.ticker import MaxNLocator

        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    if panel.xticks is not None:
        ax.set_xticks(panel.xticks[0], panel.xticks[1])
    ax.grid(True, alpha=0.3)
    listed = [s for s in panel.series if s.legend and any(y is not None for y in s.y)]
    if len(listed) + len(panel.hlines) > 1:
        ax.legend(fontsize=7, frameon=False)


def _few_decades(ax) -> bool:
    """Label minor ticks too when the axis spans less than a decade (else it has no labels)."""
    low, high = ax.get_ylim()
    return low > 0 and high / low < 10


def gradient(n: int, cmap: str = "viridis") -> list[Any]:
    """``n`` colours along a colour map (load levels: light = low load, dark = high)."""
    import matplotlib

    colours = matplotlib.colormaps[cmap]
    if n <= 1:
        return [colours(0.3)]
    return [colours(0.9 - 0.8 * i / (n - 1)) for i in range(n)]
