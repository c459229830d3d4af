"""Figures for the planner's reports: PNG bytes from matplotlib (Agg), plus the numbers as CSV.

A figure is a list of ``Panel``s, each a list of ``Series``. The same structure is written as a
long-format CSV (panel, series, x, y), so every number plotted is also available as data.
matplotlib is imported inside the functions that draw, so importing the planner stays cheap.

How the panels are drawn, so that they do not mislead:

- whole-number quantities (k, replicas, draft positions) get whole-number ticks, and on a
  whole-number x axis a line joins only neighbouring values: k = 0, 2, 4 are three markers,
  not a line that looks as if k = 1 and 3 ran;
- a log axis spanning less than ``LINEAR_BELOW`` x is drawn linear; a wider one is labelled at
  1, 2 and 5 times each power of ten (every power past three decades), so it never has a
  single label;
- legends sit outside the data: one below the figure when every panel lists the same series,
  else beside each panel;
- colours have at least ``MIN_CONTRAST`` : 1 contrast on white: Okabe and Ito's colour-blind-safe
  palette for things told apart, the dark part of viridis for ordered levels (loads).
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
    # x is a whole number (k, replicas, position): whole-number ticks, lines only between
    # neighbours. Explicit ``xticks`` all at whole numbers say the same.
    integer_x: bool = False
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


LINEAR_BELOW = 10.0  # a log axis over less than a decade is drawn linear
MIN_CONTRAST = 3.0  # WCAG's minimum for graphics, against the white background
# Okabe & Ito's colour-blind-safe palette, the colours of it with 3:1 contrast on white (its
# orange, sky blue and yellow have less), then two dark ones for more series.
CATEGORICAL = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#000000", "#8C510A", "#5E3C99")
_VIRIDIS_LIGHTEST = 0.6  # viridis above this is too light on white (below 3:1)


def build_figure(panels: list[Panel], ncols: int = 2, dpi: int = 110):
    """The matplotlib figure of the panels in a grid (Agg; nothing is shown)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure as MplFigure

    ncols = max(1, min(ncols, len(panels)))
    nrows = math.ceil(len(panels) / ncols)
    fig = MplFigure(figsize=(5.2 * ncols, 3.6 * nrows), dpi=dpi, layout="constrained")
    FigureCanvasAgg(fig)  # a canvas that can lay the figure out and render it
    axes = fig.subplots(nrows, ncols, squeeze=False)
    drawn = []
    for index, ax in enumerate(axes.flat):
        if index >= len(panels):
            ax.set_visible(False)
            continue
        _draw_panel(ax, panels[index])
        drawn.append(ax)
    _legends(fig, drawn)
    return fig


def render_png(panels: list[Panel], ncols: int = 2, dpi: int = 110) -> bytes:
    """Draw the panels in a grid and return PNG bytes (deterministic: no timestamp metadata)."""
    fig = build_figure(panels, ncols, dpi)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
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
    colours = iter(palette(len(panel.series)))
    for series in panel.series:
        colour = series.color if series.color is not None else next(colours)
        points = [(x, y) for x, y in zip(series.x, series.y, strict=True) if y is not None]
        if not points:
            continue
        xs, ys = zip(*points, strict=True)
        for i, (run_x, run_y) in enumerate(segments(list(xs), list(ys), whole)):
            listed = series.legend and i == 0
            ax.plot(
                run_x,
                run_y,
                marker=series.marker,
                linestyle=series.linestyle,
                label=series.label if listed else "_nolegend_",
                color=colour,
                markersize=4.5,
                linewidth=1.5,
            )
    for value, label in panel.hlines:
        ax.axhline(value, color="0.35", linestyle=":", linewidth=1.0, label=label)
    ax.set_title(panel.title, fontsize=10)
    ax.set_xlabel(panel.xlabel)
    ax.set_ylabel(panel.ylabel)
    if panel.logy:
        _log_axis(ax, panel)
    if panel.integer_y:
        _integer_y(ax)
    if panel.xticks is not None:
        ax.set_xticks(panel.xticks[0], panel.xticks[1])
    elif whole:
        from matplotlib.ticker import MaxNLocator

        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, alpha=0.3)


def _log_axis(ax, panel: Panel) -> None:
    """Log scale with several labels, or linear where the values span less than a decade."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    values = [y for s in panel.series for y in s.y if y is not None and y > 0]
    values += [v for v, _ in panel.hlines if v > 0]
    if not values or max(values) / min(values) < LINEAR_BELOW:
        return  # a log axis over so little range has one label or none
    ax.set_yscale("log")
    wide = max(values) / min(values) > 1000
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0,) if wide else (1.0, 2.0, 5.0)))
    # Plain numbers (0.5, 2, 20) rather than 5x10^-1: the readers are operators.
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _integer_y(ax) -> None:
    """Whole-number ticks, with the view wide enough to hold at least three of them."""
    from matplotlib.ticker import MaxNLocator

    low, high = ax.get_ylim()
    if high - low < 2.0:
        middle = round((low + high) / 2)
        ax.set_ylim(min(low, middle - 1.25), max(high, middle + 1.25))
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))


def _legends(fig, axes) -> None:
    """One legend below the figure when every panel lists the same entries, else one beside
    each panel that lists more than one; never over the data."""
    entries = [ax.get_legend_handles_labels() for ax in axes]
    listed = [(h, labels) for h, labels in entries if labels]
    shared = len(axes) > 1 and len(listed) == len(axes)
    shared = shared and all(labels == listed[0][1] for _, labels in listed)
    if shared and len(listed[0][1]) > 1:
        handles, labels = listed[0]
        fig.legend(
            handles, labels, loc="outside lower center", ncols=min(len(labels), 4), fontsize=8
        )
        return
    for ax, (_, labels) in zip(axes, entries, strict=True):
        if len(labels) > 1:
            ax.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0, fontsize=7)


def relative_luminance(colour: Any) -> float:
    """WCAG relative luminance of a matplotlib colour."""
    from matplotlib.colors import to_rgb

    def linear(c: float) -> float:
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (linear(c) for c in to_rgb(colour))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast_on_white(colour: Any) -> float:
    """WCAG contrast ratio of a colour against white (1 to 21)."""
    return 1.05 / (relative_luminance(colour) + 0.05)


def palette(n: int) -> list[str]:
    """``n`` colours for things told apart (drafters, candidates): colour-blind safe."""
    return [CATEGORICAL[i % len(CATEGORICAL)] for i in range(n)]


def gradient(n: int, cmap: str = "viridis") -> list[Any]:
    """``n`` colours for ordered levels (loads: lighter = low load, darker = high), along the
    part of the colour map dark enough to read on white. ``tab10`` (things told apart, as
    callers once asked for it) gives ``palette``."""
    import matplotlib

    if cmap == "tab10":
        return palette(n)
    colours = matplotlib.colormaps[cmap]
    if n <= 1:
        return [colours(_VIRIDIS_LIGHTEST / 2)]
    return [colours(_VIRIDIS_LIGHTEST * (1 - i / (n - 1))) for i in range(n)]
