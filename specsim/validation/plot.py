"""The validation plot: relative error per metric against its threshold, and latency CDFs.

Drawn by the rules in ``specsim.axes``: latencies in their readers' units (TPOT in ms), axes
from zero, tick labels apart, and one key for the bars' colours and the lines below the figure.
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


def plot_validation(comparison, predicted_records, measured_records, title, path: Path) -> None:
    """Write ``validation_figure`` as a PNG (byte-identical for identical figures)."""
    _save(validation_figure(comparison, predicted_records, measured_records, title), path)


def plot_bench_validation(runs, title: str, path: Path) -> None:
    """Write ``bench_validation_figure`` as a PNG."""
    _save(bench_validation_figure(runs, title), path)


def validation_figure(
    comparison: Comparison,
    predicted_records: dict[str, np.ndarray],
    measured_records: dict[str, np.ndarray],
    title: str,
):
    """The relative errors, and the simulator's and the engine's E2E and TPOT distributions."""
    fig, axes = _figure(1, 4.8)
    row = axes[0]
    _errors(row[0], comparison)
    predicted = request_latencies(predicted_records)
    measured = request_latencies(measured_records)
    for ax, (name, label) in zip(row[1:], LATENCIES, strict=True):
        _cdf(ax, predicted[name], name, "--", "simulator", SIMULATOR)
        _cdf(ax, measured[name], name, "-", "engine", ENGINE)
        _latency_axes(ax, name, label, f"{label}: distribution")
    return _finish(fig, title)


def bench_validation_figure(runs, title: str):
    """``validate --bench``: per run (a row), the relative errors and the simulator's E2E and
    TPOT distributions with the run's measured percentiles marked on them (a result file holds
    percentiles, not every request's latency). ``runs``: (name, comparison, the simulator's
    records, measured figures keyed like ``e2e_s.p90``)."""
    fig, axes = _figure(len(runs), 4.2)
    for row, (name, comparison, records, measured) in zip(axes, runs, strict=True):
        _errors(row[0], comparison)
        row[0].set_title(f"{name}: relative error", fontsize=9)
        predicted = request_latencies(records)
        for ax, (metric, what) in zip(row[1:], LATENCIES, strict=True):
            _cdf(ax, predicted[metric], metric, "--", "simulator", SIMULATOR)
            points = [
                (rules.latency(metric, value), float(key.split(".p", 1)[1]) / 100)
                for key, value in measured.items()
                if key.startswith(f"{metric}.p")
            ]
            if points:
                xs, ys = zip(*sorted(points), strict=True)
                ax.plot(
                    xs,
                    ys,
                    "o",
                    color=ENGINE,
                    label="benchmark (its percentiles)",
                    **rules.hollow(ENGINE),
                )
            _latency_axes(ax, metric, what, f"{name}: {what}")
    return _finish(fig, title)


def _figure(rows: int, height: float):
    import matplotlib

    matplotlib.use("Agg", force=True)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(15, height * rows + 0.6), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)
    return fig, fig.subplots(rows, 3, squeeze=False)


def _cdf(ax, seconds: np.ndarray, metric: str, style: str, who: str, colour: str) -> None:
    x = np.sort(seconds) * (rules.MS if rules.LATENCY_UNIT[metric] == "ms" else 1.0)
    if x.size:
        y = np.arange(1, x.size + 1) / x.size
        ax.step(x, y, style, where="post", label=who, color=colour, linewidth=1.5)


def _latency_axes(ax, metric: str, label: str, title: str) -> None:
    ax.set_xlabel(rules.axis_label(label, rules.LATENCY_UNIT[metric]))
    ax.set_ylabel("share of requests")
    ax.set_title(title, fontsize=9)
    rules.from_zero(ax, "x")
    ax.set_ylim(0, 1.04)
    rules.plain_numbers(ax)
    ax.grid(alpha=0.3)


def _errors(ax, comparison: Comparison) -> None:
    rows = [r for r in comparison.rows if r.relative_error is not None]
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
    ax.set_title("relative error", fontsize=9)
    ax.grid(axis="x", alpha=0.3)


def _finish(fig, title: str):
    """One key below the figure (the bars' colours, the threshold, the lines), tick labels
    apart."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = [
        Patch(facecolor=WITHIN, label="within threshold"),
        Patch(facecolor=EXCEEDED, label="threshold exceeded"),
        Patch(facecolor=REPORTED, label="reported (no threshold)"),
        Line2D([], [], color="black", linestyle=":", label="threshold (±)"),
    ]
    seen = set()
    for ax in fig.axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if label not in seen:
                seen.add(label)
                handles.append(handle)
    fig.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=9)
    fig.suptitle(title)
    rules.separate_ticks(fig)
    return fig


def _save(fig, path: Path) -> None:
    fig.savefig(path, metadata={"Software": None})  # no timestamp: identical figures, bytes
