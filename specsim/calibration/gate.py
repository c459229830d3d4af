"""The fit quality gate of ``profile from-bench``: a poor fit is not written as good.

The gate judges the error on runs the fit never saw: those given as ``--check-runs`` where
there are any, else the held-out error (each run predicted from a fit without it); the median
of |predicted / measured - 1| over every fitted figure of every run: the error a user of the
profile meets on runs it did not see. Without either (a single run, ``--no-held-out``) it
judges the fit's own error, which can only understate it. Above ``--max-held-out-error``
(default ``MAX_HELD_OUT_ERROR``) nothing is written and the command exits 1, unless
``--accept-poor-fit`` is given: then the profile is written, with the error and the flag in
its provenance notes and the report's ``gate``.

A fit that predicts those same runs worse than its prior does fails the gate too, whatever the
threshold: a calibration that makes unseen runs worse than no calibration is not a fit to use.
Worse means a mean's or a throughput's median |error| over the judged runs above the prior's on
the same runs by more than ``PRIOR_MARGIN`` (the 5 % each run's figures are fitted to), or the
median over every figure so. A percentile counts in that median, not alone: one run's p99 is
set by its last few requests (a sampling error several times a mean's), and a fit that trades
it for the means is no worse than its prior (docs/notes/2026-12-03-honest-fits.md).
"""

from __future__ import annotations

import statistics
from typing import Any

MAX_HELD_OUT_ERROR = 0.10
ACCEPT_FLAG = "--accept-poor-fit"
PRIOR_MARGIN = 0.05  # the fit's NOISE: closer than this, fit and prior are not told apart


def figure_errors(per_run: list[dict[str, Any]], column: str) -> dict[str, float]:
    """Each figure's median |error| over the runs that have it, in ``column``."""
    return _figure_medians(_signed(per_run, column))


def _signed(per_run: list[dict[str, Any]], column: str, where: str | None = None) -> list[dict]:
    """Each run's {figure: signed error} in ``column``, over its figures whose rows have
    ``where`` (default: ``column``)."""
    return [
        {key: row[column] for key, row in run["metrics"].items() if (where or column) in row}
        for run in per_run
    ]


def _median(values: list[float]) -> float:
    # The standard library's median: the command line reads this module's default, and
    # building the parser loads no numerical library.
    return float(statistics.median(values)) if values else 0.0


def _overall(runs) -> float:
    """The median |error| over every figure of ``runs`` ({figure: signed error} each)."""
    return _median([abs(error) for run in runs for error in run.values()])


def _figure_medians(runs) -> dict[str, float]:
    """Each figure's median |error| over ``runs`` ({figure: signed error} each)."""
    by_figure: dict[str, list[float]] = {}
    for run in runs:
        for key, error in run.items():
            by_figure.setdefault(key, []).append(abs(error))
    return {key: _median(values) for key, values in by_figure.items()}


def _judged_alone(key: str) -> bool:
    """A mean or a throughput (module docstring): ``ttft_s.mean``, ``request_throughput``."""
    _, _, statistic = key.partition(".")
    return statistic in ("", "mean")


def judge(report: dict[str, Any], threshold: float, accepted: bool) -> dict[str, Any]:
    """The gate's verdict on a calibration report (``from_bench._report``)."""
    held, checked = report["held_out"], report.get("checked")
    if checked is not None:
        basis = "checked"
        error = _overall(checked["errors"].values())
        figures = {k: f["median_abs_error"] for k, f in checked["figures"].items()}
        prior_error = _overall(checked["prior_errors"].values())
        prior = _figure_medians(checked["prior_errors"].values())
    else:
        basis = "fit" if held is None else "held_out"
        column = "error" if held is None else "held_out_error"
        error = (report["fit"] if held is None else held)["median_abs_error"]
        figures = figure_errors(report["runs"], column)
        prior_error = _overall(_signed(report["runs"], "prior_error", column))
        prior = figure_errors(report["runs"], "prior_error")
    worst = max(figures, key=lambda key: (figures[key], key)) if figures else None
    worse = [
        {"name": key, "median_abs_error": figures[key], "prior_median_abs_error": prior[key]}
        for key in sorted(figures)
        if _judged_alone(key) and key in prior and figures[key] > prior[key] + PRIOR_MARGIN
    ]
    if error > prior_error + PRIOR_MARGIN:
        worse.insert(
            0, {"name": "all", "median_abs_error": error, "prior_median_abs_error": prior_error}
        )
    passed = error <= threshold and not worse
    return {
        "basis": basis,
        "median_abs_error": error,
        "prior_median_abs_error": prior_error,
        "threshold": threshold,
        "passed": passed,
        "worst_figure": None
        if worst is None
        else {"name": worst, "median_abs_error": figures[worst]},
        "worse_than_prior": worse,
        "accepted_with": ACCEPT_FLAG if accepted and not passed else None,
    }


def verdict(gate: dict[str, Any]) -> str:
    """Why the gate failed, in words."""
    what = {
        "checked": "--check-runs",
        "held_out": "held-out",
        "fit": "fit (no held-out runs)",
    }[gate["basis"]]
    parts = []
    if gate["median_abs_error"] > gate["threshold"]:
        text = (
            f"{what} median |error| {gate['median_abs_error']:.1%} is above the "
            f"{gate['threshold']:.0%} threshold"
        )
        worst = gate["worst_figure"]
        if worst is not None:
            text += f" (worst figure {worst['name']}: median {worst['median_abs_error']:.1%})"
        parts.append(text)
    if gate["worse_than_prior"]:
        parts.append(
            f"on the same {what} runs the fit predicts worse than its prior: "
            + ", ".join(
                f"{w['name']} median |error| {w['median_abs_error']:.1%} against the prior's "
                f"{w['prior_median_abs_error']:.1%}"
                for w in gate["worse_than_prior"]
            )
        )
    return "; ".join(parts)


def warning_line(gate: dict[str, Any], out: str) -> str:
    """The one line a refused fit prints."""
    return (
        f"warning: poor fit, {out} not written: {verdict(gate)}; fix: describe the deployment "
        f"better (engine caps, prefix cache, a closer prior), use the prior as it is, or pass "
        f"{ACCEPT_FLAG} to write it anyway, or --max-held-out-error to state another threshold"
    )


def accepted_note(gate: dict[str, Any]) -> str:
    """The provenance note of a fit written above the threshold."""
    return f" Written above the quality gate with {ACCEPT_FLAG}: {verdict(gate)}."
