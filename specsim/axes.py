"""The rules every figure follows, so that none misleads; each figure applies them from here.

- A quantity's axis starts at zero (``from_zero``), or at the value a reader compares with (1
  for a speed-up); a log axis says "log scale" in its label.
- Latencies are drawn in the unit readers use: milliseconds (``MS``), as serving engines report
  them; the figure's CSV names the unit of every number.
- Whole-number quantities (k, replicas, positions) get whole-number ticks (``integer_ticks``).
- Tick labels are plain numbers and never run together (``separate_ticks``).
- Series are told apart by a colour *and* a marker, and no two share both (``styles``);
  markers are hollow, so that series drawn over each other all stay visible.
- Legends and keys sit outside the data (``legends``, ``key``).
- Colours have at least ``MIN_CONTRAST`` : 1 contrast on white: Okabe and Ito's colour-blind-safe
  palette for things told apart, the dark part of viridis for ordered levels (loads).

matplotlib is imported inside the functions, so importing a report module stays cheap.
"""

from __future__ import annotations

import csv
import io
import itertools
import math
from typing import Any

MS = 1e3  # milliseconds per second
MARGIN = 0.04  # of an axis's span, beyond its extreme point
LINEAR_BELOW = 10.0  # a log axis over less than a decade is drawn linear
MIN_CONTRAST = 3.0  # WCAG's minimum for graphics, against the white background
# Okabe & Ito's colour-blind-safe palette, the colours of it with 3:1 contrast on white (its
# orange, sky blue and yellow have less), then two dark ones for more series.
CATEGORICAL = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#000000", "#8C510A", "#5E3C99")
MARKERS = ("o", "s", "^", "D", "v", "P", "X")
_VIRIDIS_LIGHTEST = 0.6  # viridis above this is too light on white (below 3:1)


# Per-token and first-token latencies in milliseconds, as serving engines report them; a whole
# request's in seconds, the scale its reader waits on.
LATENCY_UNIT = {"ttft_s": "ms", "tpot_s": "ms", "itl_s": "ms", "e2e_s": "s"}


def latency(name: str, seconds: float | None) -> float | None:
    """A latency metric (``tpot_s``) in its unit, ``LATENCY_UNIT[name]`` (None: did not run)."""
    if seconds is None:
        return None
    return seconds * MS if LATENCY_UNIT[name] == "ms" else seconds


# A figure's CSV: one row per point drawn, in the unit it is drawn in, which the row names.
CSV_COLUMNS = ("panel", "series", "x", "y", "x_unit", "y_unit")


def csv_text(rows) -> str:
    """The rows (``CSV_COLUMNS`` each) as CSV; a point that did not run is an empty cell."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for panel, series, x, y, x_unit, y_unit in rows:
        writer.writerow([panel, series, _num(x), _num(y), x_unit, y_unit])
    return buf.getvalue()


def _num(value) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return ""
    # Twelve significant digits: a value scaled to its drawn unit (seconds x 1000) without the
    # binary noise of the product (0.0392321 s is 39.2321 ms, not 39.232099999999996).
    return repr(float(f"{value:.12g}")) if isinstance(value, float) else str(value)


def axis_label(name: str, unit: str) -> str:
    """``name (unit)``, unless the name already says its unit."""
    return name if not unit or f"({unit}" in name else f"{name} ({unit})"


def styles(n: int, colours: list[Any] | None = None) -> list[tuple[Any, str]]:
    """``n`` (colour, marker) pairs, no pair twice (up to 49 with the palette): the marker
    advances with each colour, so the eighth series differs from the first in its marker."""
    colours = list(colours) if colours else list(CATEGORICAL)
    count = len(colours)
    return [(colours[i % count], MARKERS[(i + i // count) % len(MARKERS)]) for i in range(n)]


def from_zero(ax, which: str = "y", reference: float = 0.0) -> None:
    """Widen a linear axis to include ``reference`` (zero for a quantity), so a small spread
    is drawn as small."""
    scale = ax.get_yscale() if which == "y" else ax.get_xscale()
    if scale != "linear":
        return
    get, set_ = (ax.get_ylim, ax.set_ylim) if which == "y" else (ax.get_xlim, ax.set_xlim)
    low, high = get()
    # The data's own margin was a share of its spread; keep the same share of the new one,
    # so the extreme point is not drawn on the frame.
    if reference < low:
        set_(reference, high + MARGIN * (high - reference))
    elif reference > high:
        set_(low - MARGIN * (reference - low), reference)


def log_axis(ax, values: list[float]) -> bool:
    """Log scale with several labels, where the values span a decade or more; returns whether
    the axis became logarithmic (the caller's label then says so)."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    values = [v for v in values if v is not None and v > 0]
    if not values or max(values) / min(values) < LINEAR_BELOW:
        return False
    ax.set_yscale("log")
    wide = max(values) / min(values) > 1000
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0,) if wide else (1.0, 2.0, 5.0)))
    # Plain numbers (0.5, 2, 20) rather than 5x10^-1: the readers are operators.
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    return True


def integer_ticks(ax, which: str = "y") -> None:
    """Whole-number ticks, with the view wide enough to hold at least three of them."""
    from matplotlib.ticker import MaxNLocator

    axis = ax.yaxis if which == "y" else ax.xaxis
    get, set_ = (ax.get_ylim, ax.set_ylim) if which == "y" else (ax.get_xlim, ax.set_xlim)
    low, high = get()
    if high - low < 2.0:
        middle = round((low + high) / 2)
        set_(min(low, middle - 1.25), max(high, middle + 1.25))
    axis.set_major_locator(MaxNLocator(integer=True))


def plain_numbers(ax) -> None:
    """No offset or scientific notation on a linear axis: ticks read 282.5, never 2.5 beside
    an offset of +280 that a reader misses."""
    from matplotlib.ticker import ScalarFormatter

    for axis in (ax.xaxis, ax.yaxis):
        formatter = axis.get_major_formatter()
        if isinstance(formatter, ScalarFormatter):
            formatter.set_useOffset(False)
            formatter.set_scientific(False)


def _label_boxes(axis, renderer) -> list:
    labels = [t for t in axis.get_ticklabels() if t.get_visible() and t.get_text()]
    return [(t, t.get_window_extent(renderer)) for t in labels]


def _crowded(boxes) -> list[tuple[str, str]]:
    return [
        (ta.get_text(), tb.get_text())
        for (ta, a), (tb, b) in itertools.combinations(boxes, 2)
        if a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1
    ]


def overlapping_ticks(fig) -> list[tuple[str, str]]:
    """Pairs of tick labels whose drawn extents overlap, over every axis of the figure."""
    renderer = fig.canvas.get_renderer()
    found = []
    for ax in fig.axes:
        if ax.get_visible():
            for axis in (ax.xaxis, ax.yaxis):
                found += _crowded(_label_boxes(axis, renderer))
    return found


def lay_out(fig) -> None:
    """Place the axes as the figure's layout engine would before drawing (tick labels and
    their extents with them), without drawing: what ``separate_ticks`` reads needs no more."""
    engine = fig.get_layout_engine()
    if engine is not None:
        engine.execute(fig)


def separate_ticks(fig) -> None:
    """Thin the ticks of any axis whose labels run together; fixed labels (k and "adapt.")
    are turned upright first, then every other one left blank (the last, "adapt.", kept).
    Lays the figure out as many times as it takes."""
    from matplotlib.ticker import FixedLocator, MaxNLocator

    lay_out(fig)
    for _ in range(6):
        if not overlapping_ticks(fig):
            return
        renderer = fig.canvas.get_renderer()
        for ax in fig.axes:
            for axis in (ax.xaxis, ax.yaxis):
                boxes = _label_boxes(axis, renderer)
                if not _crowded(boxes):
                    continue
                if isinstance(axis.get_major_locator(), FixedLocator):
                    if axis is ax.xaxis and boxes[0][0].get_rotation() != 90:
                        axis.set_tick_params(labelrotation=90)
                    else:
                        texts = [t.get_text() for t in axis.get_majorticklabels()]
                        shown = [i for i, text in enumerate(texts) if text]
                        for i in shown[-2::-2]:
                            texts[i] = ""
                        axis.set_ticks(axis.get_majorticklocs(), texts)
                elif axis.get_scale() == "linear":
                    integer = all(float(v).is_integer() for v in axis.get_majorticklocs())
                    axis.set_major_locator(
                        MaxNLocator(nbins=max(2, len(boxes) // 2), integer=integer)
                    )
        lay_out(fig)


def hollow(colour: Any) -> dict[str, Any]:
    """Marker settings that keep a point drawn under another series' point visible."""
    return {"markerfacecolor": "white", "markeredgecolor": colour, "markeredgewidth": 1.4}


def key(fig, patches: list[tuple[str, Any]], handles: list) -> None:
    """One key below the figure: what each bar colour means (``patches``: label, colour), then
    the other ``handles`` (lines, markers), each label once."""
    from matplotlib.patches import Patch

    entries = [Patch(facecolor=colour, label=label) for label, colour in patches]
    seen = {e.get_label() for e in entries}
    for handle in handles:
        if handle.get_label() not in seen:
            seen.add(handle.get_label())
            entries.append(handle)
    fig.legend(handles=entries, loc="outside lower center", ncols=len(entries), fontsize=9)


def legends(fig, axes) -> None:
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
    """``n`` colours for things told apart (drafters, candidates): colour-blind safe. Past
    seven they repeat; ``styles`` pairs them with markers so that no series is confused."""
    return [CATEGORICAL[i % len(CATEGORICAL)] for i in range(n)]


def gradient(n: int, cmap: str = "viridis") -> list[Any]:
    """``n`` colours for ordered levels (loads: lighter = low load, darker = high), along the
    part of the colour map dark enough to read on white."""
    import matplotlib

    colours = matplotlib.colormaps[cmap]
    if n <= 1:
        return [colours(_VIRIDIS_LIGHTEST / 2)]
    return [colours(_VIRIDIS_LIGHTEST * (1 - i / (n - 1))) for i in range(n)]
