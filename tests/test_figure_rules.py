"""The figures a reader gets, drawn from made-up results: latencies in ms, quantities from zero,
best k as markers, no series confused with another, tick labels apart, the bars' colours keyed."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from specsim.axes import overlapping_ticks
from specsim.planning.common import LoadAxis
from specsim.planning.plots import build_figure
from specsim.planning.window.window import ADAPTIVE, LoadResult
from specsim.planning.window.window_report import _figures
from specsim.validation.compare import Comparison, Row
from specsim.validation.plot import bench_validation_figure, validation_figure

AXIS = LoadAxis("rate", "arrival rate (req/s)", "req/s", 2.0)
KS = [0, 1, 2, 3]


def _summary(load: float, k: int) -> dict:
    latency = 0.004 * (1 + load / 10) / (1 + 0.1 * k)
    return {
        "e2e_s": {s: 100 * latency * f for s, f in (("mean", 1), ("p50", 1), ("p99", 1.5))},
        "tpot_s": {s: latency * f for s, f in (("mean", 1), ("p50", 1), ("p99", 1.5))},
        "ttft_s": {s: 5 * latency * f for s, f in (("mean", 1), ("p50", 1), ("p99", 1.5))},
        "throughput_tokens_per_s": 1000 + 10 * load + k,  # a 1 % spread must look small
        "goodput_requests_per_s": load,
    }


def _window_figures():
    plan = SimpleNamespace(ks=KS, axis=AXIS)
    loads = []
    for load, best in ((2.0, 3), (6.0, 3), (14.0, 0)):
        configs = [f"k={k}" for k in KS] + [ADAPTIVE]
        points = {
            c: SimpleNamespace(ok=True, summary=_summary(load, int(c[2:]) if c[:2] == "k=" else 2))
            for c in configs
        }
        loads.append(LoadResult(load, points, best_k=best, best_config=f"k={best}"))
    return {f.name: (f, build_figure(f.panels, f.ncols)) for f in _figures(plan, loads)}


def test_window_figures_follow_the_rules():
    figures = _window_figures()
    assert set(figures) == {
        "e2e_vs_k",
        "tpot_vs_k",
        "ttft_vs_k",
        "throughput_vs_k",
        "best_k_vs_load",
    }
    for name, (figure, fig) in figures.items():
        assert overlapping_ticks(fig) == [], name
        for panel, ax in zip(figure.panels, fig.axes, strict=False):
            listed = [line for line in ax.get_lines() if not line.get_label().startswith("_")]
            pairs = {(str(line.get_color()), line.get_marker()) for line in listed}
            assert len(pairs) == len(listed), (name, panel.title)
            if ax.get_yscale() == "linear" and panel.y_from == 0:
                # Zero, or a margin below it where a point lies at zero (k = 0).
                low, high = ax.get_ylim()
                assert -0.06 * high <= low <= 0, (name, panel.title)
            else:  # a log axis cannot start at zero: its label says it is not linear
                assert ax.get_yscale() == "linear" or "log scale" in ax.get_ylabel()
    tpot, fig = figures["tpot_vs_k"]
    assert fig.axes[0].get_ylabel().startswith("latency (ms)")
    # The CSV holds what is drawn: TPOT p50 of 2 req/s at k = 0 is 4.8 ms, and says "ms".
    rows = [line.split(",") for line in tpot.csv_text().splitlines()]
    assert rows[0][-2:] == ["x_unit", "y_unit"]
    first = next(r for r in rows if r[:3] == ["TPOT p50", "2 req/s", "0.0"])
    assert float(first[3]) == 4.8 and first[-1] == "ms"
    _, fig = figures["e2e_vs_k"]
    assert "(s)" in fig.axes[0].get_ylabel()
    _, fig = figures["throughput_vs_k"]
    low, high = fig.axes[0].get_ylim()
    assert low == 0 and high > 1140


def test_best_k_is_markers_at_the_loads_that_ran():
    """k = 3 at 6 req/s and k = 0 at 14: no line between them draws k = 1.5 at 10 req/s."""
    (figure, fig) = _window_figures()["best_k_vs_load"]
    ax = fig.axes[0]
    (line,) = [line for line in ax.get_lines() if len(line.get_xdata())]
    assert line.get_linestyle() == "None" and line.get_marker() not in ("", "None", None)
    assert list(line.get_ydata()) == [3, 3, 0]
    ticks = [t for t in ax.get_yticks() if ax.get_ylim()[0] <= t <= ax.get_ylim()[1]]
    assert ax.get_ylim()[0] <= 0 and all(float(t).is_integer() for t in ticks)
    # The speed-up is read against break-even: its axis holds 1.
    assert figure.panels[1].y_from == 1.0 and fig.axes[1].get_ylim()[0] <= 1.0


def _records(tpot_s: float, n: int = 40) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    arrival = np.sort(rng.uniform(0, 10, n))
    first = arrival + 0.01
    output = np.full(n, 64)
    tpot = tpot_s * rng.uniform(0.9, 1.2, n)
    return {
        "arrival_s": arrival,
        "scheduled_s": arrival,
        "first_token_s": first,
        "finish_s": first + tpot * 63,
        "output_tokens": output,
    }


def _comparison() -> Comparison:
    return Comparison(
        [
            Row("tpot_s.p50", 0.0027, 0.0025, 0.08, 0.10, True),
            Row("e2e_s.p90", 0.2, 0.17, 0.18, 0.10, False),
            Row("ttft_s.p50", 0.011, 0.010, 0.1, None, None),
        ]
    )


def test_validation_figure_is_in_ms_with_keyed_bars_and_apart_labels():
    """TPOT of 2.4..3.8 ms on a narrow panel: labels in ms, from zero, never running together;
    the bars' three colours named in a key outside the panels."""
    fig, data = validation_figure(_comparison(), _records(0.0025), _records(0.0031), "check")
    _, e2e, tpot = fig.axes
    assert fig.get_suptitle() == "check"
    assert tpot.get_xlabel() == "TPOT (ms)" and e2e.get_xlabel() == "E2E latency (s)"
    assert tpot.get_xlim()[0] == 0 and max(tpot.get_lines()[0].get_xdata()) < 5
    assert overlapping_ticks(fig) == []
    (legend,) = fig.legends
    labels = [t.get_text() for t in legend.get_texts()]
    assert {"within threshold", "threshold exceeded", "reported (no threshold)"} <= set(labels)
    assert {"simulator", "engine"} <= set(labels)
    renderer = fig.canvas.get_renderer()
    box = legend.get_window_extent(renderer)
    for ax in fig.axes:
        assert not box.overlaps(ax.get_window_extent(renderer))
    measured = {"tpot_s.p50": 0.0025, "tpot_s.p99": 0.0036, "e2e_s.p50": 0.17}
    runs = [(name, _comparison(), _records(0.003), measured) for name in ("a", "b")]
    bench, bench_data = bench_validation_figure(runs, "bench")
    tpot = bench.axes[2]
    assert bench.get_suptitle() == "bench"
    marks = [line for line in tpot.get_lines() if line.get_label().startswith("benchmark")]
    assert list(marks[0].get_xdata()) == [2.5, 3.6]  # the percentiles, in ms
    assert overlapping_ticks(bench) == []
    # Every number drawn is in the CSV, in the unit drawn, which the row names.
    marked = [r for r in bench_data if r[0] == "b: TPOT" and r[1].startswith("benchmark")]
    assert [(r[2], r[3], r[4]) for r in marked] == [(2.5, 0.5, "ms"), (3.6, 0.99, "ms")]
    simulated = [r[2] for r in data if r[:2] == ["TPOT: distribution", "simulator"]]
    assert simulated == list(fig.axes[2].get_lines()[0].get_xdata()) and len(simulated) == 40
    errors = {r[1]: r[3] for r in data if r[0] == "relative error"}
    assert errors == {
        "tpot_s.p50": 8.0,
        "tpot_s.p50 threshold": 10.0,
        "e2e_s.p90": 18.0,
        "e2e_s.p90 threshold": 10.0,
        "ttft_s.p50": 10.0,
    }
