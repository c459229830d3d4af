"""The validation plot: relative error per metric against its threshold, and latency CDFs."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specsim.metrics import request_latencies
from specsim.validation.compare import Comparison

# Okabe & Ito's colour-blind-safe blue and vermillion (red and green are not told apart by
# the most common colour blindness), both at 3:1 contrast or more on white.
WITHIN, EXCEEDED = "#0072B2", "#D55E00"
SIMULATOR, ENGINE = "#0072B2", "#D55E00"


def plot_validation(
    comparison: Comparison,
    predicted_records: dict[str, np.ndarray],
    measured_records: dict[str, np.ndarray],
    title: str,
    path: Path,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.8))
    _errors(axes[0], comparison)
    predicted = request_latencies(predicted_records)
    measured = request_latencies(measured_records)
    for ax, name, label in ((axes[1], "e2e_s", "E2E latency"), (axes[2], "tpot_s", "TPOT")):
        for values, style, who, colour in (
            (predicted, "--", "simulator", SIMULATOR),
            (measured, "-", "engine", ENGINE),
        ):
            x = np.sort(values[name])
            if x.size:
                y = np.arange(1, x.size + 1) / x.size
                ax.step(x, y, style, where="post", label=who, color=colour, linewidth=1.5)
        ax.set_xlabel(f"{label} (s)")
        ax.set_ylabel("share of requests")
        ax.set_title(f"{label}: distribution")
        ax.grid(alpha=0.3)
        ax.legend(loc="lower right")  # a distribution's lower right is empty
    fig.suptitle(title)
    fig.tight_layout()
    # Fixed metadata keeps the PNG byte-identical for identical figures.
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)


def _errors(ax, comparison: Comparison) -> None:
    rows = [r for r in comparison.rows if r.relative_error is not None]
    y = np.arange(len(rows))
    errors = np.array([100 * r.relative_error for r in rows])
    colors = ["0.6" if r.ok is None else (WITHIN if r.ok else EXCEEDED) for r in rows]
    ax.barh(y, errors, color=colors)
    for i, r in enumerate(rows):
        if r.threshold is not None:
            t = 100 * r.threshold
            ax.plot([-t, -t], [i - 0.4, i + 0.4], "k:", lw=1)
            ax.plot([t, t], [i - 0.4, i + 0.4], "k:", lw=1)
    ax.set_yticks(y, [r.metric for r in rows], fontsize=8)
    ax.invert_yaxis()
    ax.axvline(0, color="black", lw=0.8)
    ax.set_xlabel("simulator vs engine (%); dotted: threshold")
    ax.set_title("relative error (blue ok, vermillion exceeded, grey reported)")
    ax.grid(axis="x", alpha=0.3)


def plot_bench_validation(runs, title: str, path: Path) -> None:
    """``validate --bench``: per run (a row), the relative errors and the simulator's E2E and
    TPOT distributions with the run's measured percentiles marked on them (a result file holds
    percentiles, not every request's latency). ``runs``: (name, comparison, the simulator's
    records, measured figures keyed like ``e2e_s.p90``)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 3, figsize=(15, 4.2 * len(runs)), squeeze=False)
    for row, (name, comparison, records, measured) in zip(axes, runs, strict=True):
        _errors(row[0], comparison)
        row[0].set_title(f"{name}: relative error", fontsize=9)
        predicted = request_latencies(records)
        for ax, metric, what in ((row[1], "e2e_s", "E2E latency"), (row[2], "tpot_s", "TPOT")):
            x = np.sort(predicted[metric])
            if x.size:
                y = np.arange(1, x.size + 1) / x.size
                ax.step(x, y, "--", where="post", label="simulator", color=SIMULATOR, lw=1.5)
            points = [
                (value, float(key.split(".p", 1)[1]) / 100)
                for key, value in measured.items()
                if key.startswith(f"{metric}.p")
            ]
            if points:
                xs, ys = zip(*sorted(points), strict=True)
                ax.plot(xs, ys, "o", color=ENGINE, label="benchmark (its percentiles)")
            ax.set_xlabel(f"{what} (s)")
            ax.set_ylabel("share of requests")
            ax.set_title(f"{name}: {what}", fontsize=9)
            ax.grid(alpha=0.3)
            ax.legend(loc="lower right")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})
    plt.close(fig)
