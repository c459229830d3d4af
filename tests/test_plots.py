"""How the report figures draw their panels: ticks, lines, log axes, legends and colours."""

from __future__ import annotations

import io

import pytest

from specsim import axes
from specsim.axes import (
    MIN_CONTRAST,
    contrast_on_white,
    gradient,
    overlapping_ticks,
    palette,
    styles,
)
from specsim.planning.plots import Figure, Panel, Series, build_figure, render_png


def _drawn(fig) -> None:
    fig.canvas.draw()  # lays the figure out, so ticks, limits and extents are final


def _labelled_ticks(axis) -> list[float]:
    """The major tick positions inside the view that carry a label."""
    low, high = sorted(axis.get_view_interval())
    ticks = axis.get_major_ticks()
    return [
        t.get_loc()
        for t in ticks
        if low <= t.get_loc() <= high and t.label1.get_visible() and t.label1.get_text()
    ]


def test_counts_get_whole_number_ticks_even_when_every_value_is_the_same():
    # Replicas 4, 4, 4: matplotlib's default view (3.8..4.2) labels 3.8, 3.9, ... 4.2.
    panel = Panel("replicas", "k", "replicas", [Series("a", [0, 2, 4], [4, 4, 4])])
    panel.integer_y = True
    fig = build_figure([panel])
    _drawn(fig)
    ticks = _labelled_ticks(fig.axes[0].yaxis)
    assert len(ticks) >= 3 and all(float(t).is_integer() for t in ticks)
    positions = Panel("acceptance", "position", "rate", [Series("a", [1, 2, 3, 4], [0.7] * 4)])
    positions.integer_x = True
    fig = build_figure([positions])
    _drawn(fig)
    assert all(float(t).is_integer() for t in _labelled_ticks(fig.axes[0].xaxis))


def test_a_line_joins_only_neighbouring_k_values():
    """k = 0, 2, 4 ran: three markers, no segment through k = 1 or 3. k = 0..3: one line."""
    ticks = ([0.0, 2.0, 4.0], ["0", "2", "4"])
    gapped = Panel("e2e", "k", "s", [Series("2 req/s", [0, 2, 4], [1.0, 0.8, 0.9])], ticks)
    fig = build_figure([gapped])
    lines = [line for line in fig.axes[0].get_lines() if len(line.get_xdata())]
    assert sorted(list(line.get_xdata()) for line in lines) == [[0], [2], [4]]
    assert len({line.get_color() for line in lines}) == 1  # one series, one colour
    assert [line.get_label() for line in lines].count("2 req/s") == 1  # listed once
    whole = Panel("e2e", "k", "s", [Series("a", [0, 1, 2, 3], [1.0, 0.8, 0.7, 0.7])])
    whole.integer_x = True
    (line,) = build_figure([whole]).axes[0].get_lines()
    assert list(line.get_xdata()) == [0, 1, 2, 3]
    # A load axis is continuous: the points are joined whatever the spacing.
    (line,) = (
        build_figure([Panel("e2e", "load", "s", [Series("a", [2, 6, 14], [1, 2, 3])])])
        .axes[0]
        .get_lines()
    )
    assert list(line.get_xdata()) == [2, 6, 14]


@pytest.mark.parametrize(
    ("values", "scale", "labels"),
    [
        ([0.6, 1.4, 16.0], "log", 3),  # decades alone label only 1 and 10
        ([5.0, 8.0, 19.0], "linear", 3),  # less than a decade: linear, where a log axis had one
        ([0.001, 0.1, 20.0], "log", 3),  # wide: one label per decade, several of them
    ],
)
def test_log_axes_have_several_labels_or_are_linear(values, scale, labels):
    panel = Panel("p99", "load", "s", [Series("a", [1, 2, 3], values)], logy=True)
    fig = build_figure([panel])
    _drawn(fig)
    ax = fig.axes[0]
    assert ax.get_yscale() == scale
    assert len(_labelled_ticks(ax.yaxis)) >= labels


def _overlaps(a, b) -> bool:
    return a.x0 < b.x1 and b.x0 < a.x1 and a.y0 < b.y1 and b.y0 < a.y1


@pytest.mark.parametrize("shared", [True, False])
def test_legends_sit_outside_every_panel(shared):
    """Several series fill a panel: its legend must not lie over any panel's plotting area,
    whether one legend serves every panel (the same series) or each panel has its own."""

    def panel(title, extra):
        series = [Series(f"load {i}", [0, 1, 2, 3], [i, i + 1, i + 2, i + 3]) for i in range(4)]
        return Panel(title, "k", "s", series + extra)

    other = [] if shared else [Series("k = 0", [0, 3], [1, 4])]
    fig = build_figure([panel("a", []), panel("b", other)])
    _drawn(fig)
    renderer = fig.canvas.get_renderer()
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    assert legends and (len(fig.legends) == 1) == shared
    for legend in legends:
        box = legend.get_window_extent(renderer)
        for ax in fig.axes:
            assert not _overlaps(box, ax.get_window_extent(renderer))


def test_colours_read_on_white_and_stay_apart():
    for n in range(1, 9):
        for colour in palette(n) + gradient(n):
            assert contrast_on_white(colour) >= MIN_CONTRAST, colour
    assert len(set(palette(7))) == 7
    # A series without a colour of its own takes the palette, not matplotlib's default cycle
    # (whose olive and cyan are below 3:1 on white).
    panel = Panel("p", "x", "y", [Series(str(i), [0, 1], [i, i]) for i in range(7)])
    colours = [line.get_color() for line in build_figure([panel]).axes[0].get_lines()]
    assert colours == palette(7)


def test_no_two_series_share_a_colour_and_a_marker():
    """Twelve candidates: the palette's seven colours come round again, with other markers."""
    assert len(set(styles(49))) == 49
    panel = Panel(
        "attainment", "rate", "share", [Series(str(i), [0, 1], [1, 1]) for i in range(12)]
    )
    lines = build_figure([panel]).axes[0].get_lines()
    pairs = [(line.get_color(), line.get_marker()) for line in lines]
    assert len(lines) == 12 and len(set(pairs)) == 12
    # Hollow markers: a series drawn over another (all at 1.0) still shows its own marker.
    assert all(line.get_markerfacecolor() == "white" for line in lines)


@pytest.mark.parametrize("logy", [False, True])
def test_quantities_are_drawn_from_zero_or_say_they_are_not(logy):
    """A 13 % spread (10.2..11.6 req/s) must not fill the panel; a log axis says so."""
    panel = Panel("capacity", "k", "rate", [Series("a", [0, 2, 4], [11.6, 10.6, 10.2])])
    panel.yunit, panel.logy = "req/s", logy
    fig = build_figure([panel])
    ax = fig.axes[0]
    low, high = ax.get_ylim()
    assert low == 0 and high > 11.6  # the top point is not drawn on the frame
    assert ax.get_xlim()[0] <= 0
    assert ax.get_ylabel() == "rate (req/s)"
    logged = Panel("p99", "load", "latency", [Series("a", [1, 2], [3, 300])], logy=True)
    ax = build_figure([logged]).axes[0]
    assert ax.get_yscale() == "log" and "log scale" in ax.get_ylabel()
    # A ratio is read against its baseline: the axis holds 1, not 0.
    ratio = Panel("speed-up", "load", "speed-up", [Series("a", [1, 2], [1.3, 1.7])], y_from=1.0)
    low, _ = build_figure([ratio]).axes[0].get_ylim()
    assert 0.5 < low <= 1.0


def test_tick_labels_never_run_together():
    """Long labels on a narrow panel ran together ("0.00240.00260.0028"); after drawing, no
    two labels' extents overlap, for a numeric axis (thinned) and fixed k labels (turned)."""
    xs = [1000.00241, 1000.00263, 1000.00287, 1000.00313, 1000.00377]  # long, finely spaced
    numeric = Panel("TPOT", "TPOT", "share", [Series("a", xs, [1] * 5)], x_from=None)
    ks = list(range(31))
    fixed = Panel("k", "k", "share", [Series("a", ks, [1] * len(ks))])
    fixed.xticks = ([float(k) for k in ks], [f"k={k}" for k in ks[:-1]] + ["adapt."])
    fig = build_figure([numeric, fixed], ncols=2, dpi=60)
    assert overlapping_ticks(fig) == []
    shown = [t.get_text() for t in fig.axes[1].get_xticklabels() if t.get_text()]
    assert shown[-1] == "adapt." and len(shown) < len(ks)
    # The check itself sees overlaps: the same axes drawn with matplotlib's own ticks do.
    fig.axes[1].set_xticks(ks, [f"k={k}" for k in ks], rotation=0)
    fig.canvas.draw()
    assert overlapping_ticks(fig)


def test_the_png_has_the_bytes_of_drawing_each_layout_and_saving(monkeypatch):
    """The figure is laid out without drawing, then rendered in the draw that lays it out
    again; its bytes are those of laying it out in draws and ``savefig`` (which draws once more
    before rendering): for a panel whose legend beside it moves the axes between the two
    layouts, and for panels whose tick labels were thinned and turned."""
    loads = [2.0, 6.0, 10.0, 14.0]
    legend = Panel(
        "speed-up",
        "load",
        "speed-up",
        [Series("static", loads, [1.62, 1.71, 1.62, 1.11]), Series("table", loads, [1.6] * 4)],
    )
    xs = [1000.00241, 1000.00263, 1000.00287, 1000.00313, 1000.00377]
    numeric = Panel("TPOT", "TPOT", "share", [Series("a", xs, [1] * 5)], x_from=None)
    ks = list(range(31))
    fixed = Panel("k", "k", "share", [Series("a", ks, [1] * len(ks))])
    fixed.xticks = ([float(k) for k in ks], [f"k={k}" for k in ks[:-1]] + ["adapt."])
    figures = [[legend], [numeric, fixed]]
    pngs = [render_png(panels, ncols=2, dpi=60) for panels in figures]
    assert pngs == [render_png(panels, ncols=2, dpi=60) for panels in figures]  # same bytes
    monkeypatch.setattr(axes, "lay_out", lambda fig: fig.draw_without_rendering())
    for panels, png in zip(figures, pngs, strict=True):
        drawn = io.BytesIO()
        fig = build_figure(panels, ncols=2, dpi=60)
        fig.savefig(drawn, format="png", metadata={"Software": None})
        assert png == drawn.getvalue()


def test_the_csv_names_the_unit_of_every_number():
    panel = Panel("TPOT p50", "k", "latency", [Series("2 req/s", [0, 1], [4.5, None])])
    panel.yunit, panel.xunit = "ms", ""
    lines = Figure("tpot", "TPOT", [panel]).csv_text().splitlines()
    assert lines == [
        "panel,series,x,y,x_unit,y_unit",
        "TPOT p50,2 req/s,0,4.5,,ms",
        "TPOT p50,2 req/s,1,,,ms",
    ]


def test_a_value_scaled_to_its_unit_is_written_without_binary_noise():
    """0.0392321 s drawn in ms is 39.2321 in the CSV (the product alone is 39.232099999999996)."""
    ms = 0.0392321 * 1000
    assert repr(ms) != "39.2321"
    panel = Panel("TTFT p50", "k", "latency", [Series("2 req/s", [0.0], [ms])])
    panel.yunit, panel.xunit = "ms", ""
    assert (
        Figure("ttft", "TTFT", [panel]).csv_text().splitlines()[1]
        == "TTFT p50,2 req/s,0.0,39.2321,,ms"
    )
