"""The validation plot: relative error per metric against its threshold, and latency CDFs.

Drawn by the rules in ``specsim.axes``: latencies in their readers' units (TPOT in ms), axes
from zero, tick labels apart, and one key for the bars' colours and the lines below the figure.
Every number drawn is also written beside the PNG as a CSV (``axes.CSV_COLUMNS``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specsim import axes as rules
from specsim.metrics import request_latencies
from specsim.validation.compare import Comparison

# Okabe & Ito's colour-blind-safe blue and vermillion (red and green are not told apart by
# the most common colour blindness), both at 3:1 contrast or more on white.
WITHIN, EXCEEDED, REPORTED = "#0072B2", "#D55E00", "0.6"
SIMULATOR, ENGINE = "#0072B2", "#D55E00"
LATENCIES = (("e2e_s", "E2E latency"), ("tpot_s", "TPOT"))
SHARE = "share of requests"


def plot_validation(comparison, predicted_records, measured_records, title, path: Path) -> None:
    """Write ``validation_figure`` as a PNG and its numbers as the CSV beside it."""
    _save(*validation_figure(comparison, predicted_records, measured_records, title), path)


def plot_bench_validation(runs, title: str, path: Path) -> None:
    """Write ``bench_validation_figure`` as a PNG and its numbers as the CSV beside it."""
    _save(*bench_validation_figure(runs, title), path)


def validation_figure(
    comparison: Comparison,
    predicted_records: dict[str, np.ndarray],
    measured_records: dict[str, np.ndarray],
    title: str,
):
    """The relative errors, and the simulator's and the engine's E2E and TPOT distributions:
    the figure and its numbers (rows of ``axes.CSV_COLUMNS``)."""
    fig, axes = _figure(1, 4.8)
    row, data = axes[0], []
    _errors(row[0], comparison, "relative error", data)
    predicted = request_latencies(predicted_records)
    measured = request_latencies(measured_records)
    for ax, (name, label) in zip(row[1:], LATENCIES, strict=True):
        panel = f"{label}: distribution"
        _cdf(ax, predicted[name], name, "--", "simulator", SIMULATOR, panel, data)
        _cdf(ax, measured[name], name, "-", "engine", ENGINE, panel, data)
        _latency_axes(ax, name, label, panel)
    return _finish(fig, title), data


def bench_validation_figure(runs, title: str):
    """``validate --bench``: per run (a row), the relative errors and the simulator's E2E and
    TPOT distributions with the run's measured percentiles marked on them (a result file holds
    percentiles, not every request's latency). ``runs``: (name, comparison, the simulator's
    records, measured figures keyed like ``e2e_s.p90``)."""
    fig, axes = _figure(len(runs), 4.2)
    data: list = []
    for row, (name, comparison, records, measured) in zip(axes, runs, strict=True):
        _errors(row[0], comparison, f"{name}: relative error", data)
        predicted = request_latencies(records)
        for ax, (metric, what) in zip(row[1:], LATENCIES, strict=True):
            panel = f"{name}: {what}"
            _cdf(ax, predicted[metric], metric, "--", "simulator", SIMULATOR, panel, data)
            points = [
                (rules.latency(metric, value), float(key.split(".p", 1)[1]) / 100)
                for key, value in measured.items()
                if key.startswith(f"{metric}.p")
            ]
            if points:
                xs, ys = zip(*sorted(points), strict=True)
                unit = rules.LATENCY_UNIT[metric]
                who = "benchmark (its percentiles)"
                data += [[panel, who, x, y, unit, SHARE] for x, y in zip(xs, ys, strict=True)]
                ax.plot(
                    xs,
                    ys,
                    "o",
                    color=ENGINE,
                    label=who,
                    **rules.hollow(ENGINE),
                )
            _latency_axes(ax, metric, what, panel)
    return _finish(fig, title), data


def _figure(rows: int, height: float):
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(15, height * rows + 0.6), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(rows, 3, squeeze=False)


def _cdf(ax, seconds, metric: str, style: str, who: str, colour: str, panel: str, data) -> None:
    unit = rules.LATENCY_UNIT[metric]
    x = np.sort(seconds) * (rules.MS if unit == "ms" else 1.0)
    if x.size:
        y = np.arange(1, x.size + 1) / x.size
        ax.step(x, y, style, where="post", label=who, color=colour, linewidth=1.5)
        data += [[panel, who, float(a), float(b), unit, SHARE] for a, b in zip(x, y, strict=True)]


def _latency_axes(ax, metric: str, label: str, title: str) -> None:
    ax.set_xlabel(rules.axis_label(label, rules.LATENCY_UNIT[metric]))
    ax.set_ylabel(SHARE)
    ax.set_title(title, fontsize=9)
    rules.from_zero(ax, "x")
    ax.set_ylim(0, 1.04)
    rules.plain_numbers(ax)
    ax.grid(alpha=0.3)


def _errors(ax, comparison: Comparison, panel: str, data: list) -> None:
    """Bars of the relative error per metric (in the CSV: the metric's error and threshold as
    y, in %, x empty)."""
    rows = [r for r in comparison.rows if r.relative_error is not None]
    for r in rows:
        data.append([panel, r.metric, None, 100 * r.relative_error, "", "%"])
        if r.threshold is not None:
            data.append([panel, f"{r.metric} threshold", None, 100 * r.threshold, "", "%"])
    y = np.arange(len(rows))
    errors = np.array([100 * r.relative_error for r in rows])
    colors = [REPORTED if r.ok is None else (WITHIN if r.ok else EXCEEDED) for r in rows]
    ax.barh(y, errors, color=colors)
    for i, r in enumerate(rows):
        if r.threshold is not None:
            t = 100 * r.threshold
            ax.plot([-t, -t], [i - 0.4, i + 0.4], "k:", lw=1)
            ax.plot([t, t], [i - 0.4, i + 0.4], "k:", lw=1)
    ax.set_yticks(y, [r.metric for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.axvline(0, color="black", lw=0.8)
    ax.set_xlabel("simulator vs engine (%)")
    ax.set_title(panel, fontsize=9)
    ax.grid(axis="x", alpha=0.3)


def _finish(fig, title: str):
    """One key below the figure (the bars' colours, the threshold, the lines), tick labels
    apart."""
    from matplotlib.lines import Line2D

    threshold = Line2D([], [], color="black", linestyle=":", label="threshold (±)")
    drawn = [h for ax in fig.axes for h in ax.get_legend_handles_labels()[0]]
    bars = [
        ("within threshold", WITHIN),
        ("threshold exceeded", EXCEEDED),
        ("reported (no threshold)", REPORTED),
    ]
    rules.key(fig, bars, [threshold, *drawn])
    fig.suptitle(title)
    rules.separate_ticks(fig)
    return fig


def _save(fig, data: list, path: Path) -> None:
    fig.savefig(path, metadata={"Software": None})  # no timestamp: identical figures, bytes
    path.with_suffix(".csv").write_text(rules.csv_text(data), encoding="utf-8")
