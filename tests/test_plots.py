"""How the report figures draw their panels: ticks, lines, log axes, legends and colours."""

from __future__ import annotations

import pytest

from specsim.planning.plots import (
    MIN_CONTRAST,
    Panel,
    Series,
    build_figure,
    contrast_on_white,
    gradient,
    palette,
)


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
