"""The fit quality gate of ``profile from-bench``: a poor fit is not written as good.

The gate judges the error on runs the fit never saw: those given as ``--check-runs`` where
there are any, else the held-out error (each run predicted from a fit without it); the median
of |predicted / measured - 1| over every fitted figure of every run: the error a user of the
profile meets on runs it did not see. Without either (a single run, ``--no-held-out``) it
judges the fit's own error, which can only understate it. Above ``--max-held-out-error``
(default ``MAX_HELD_OUT_ERROR``) nothing is written and the command exits 1, unless
``--accept-poor-fit`` is given: then the profile is written, with the error and the flag in
its provenance notes and the report's ``gate``.
"""

from __future__ import annotations

import statistics
from typing import Any

MAX_HELD_OUT_ERROR = 0.10
ACCEPT_FLAG = "--accept-poor-fit"


def figure_errors(per_run: list[dict[str, Any]], column: str) -> dict[str, float]:
    """Each figure's median |error| over the runs that have it, in ``column``."""
    by_figure: dict[str, list[float]] = {}
    for run in per_run:
        for key, row in run["metrics"].items():
            if column in row:
                by_figure.setdefault(key, []).append(abs(row[column]))
    # The standard library's median: the command line reads this module's default, and
    # building the parser loads no numerical library.
    return {key: float(statistics.median(values)) for key, values in by_figure.items()}


def judge(report: dict[str, Any], threshold: float, accepted: bool) -> dict[str, Any]:
    """The gate's verdict on a calibration report (``from_bench._report``)."""
    held, checked = report["held_out"], report.get("checked")
    if checked is not None:
        basis = "checked"
        every = [abs(e) for run in checked["errors"].values() for e in run.values()]
        error = float(statistics.median(every)) if every else 0.0
        figures = {k: f["median_abs_error"] for k, f in checked["figures"].items()}
    else:
        basis = "fit" if held is None else "held_out"
        error = (report["fit"] if held is None else held)["median_abs_error"]
        figures = figure_errors(report["runs"], "error" if held is None else "held_out_error")
    worst = max(figures, key=lambda key: (figures[key], key)) if figures else None
    passed = error <= threshold
    return {
        "basis": basis,
        "median_abs_error": error,
        "threshold": threshold,
        "passed": passed,
        "worst_figure": None
        if worst is None
        else {"name": worst, "median_abs_error": figures[worst]},
        "accepted_with": ACCEPT_FLAG if accepted and not passed else None,
    }


def _words(gate: dict[str, Any]) -> str:
    what = {
        "checked": "--check-runs",
        "held_out": "held-out",
        "fit": "fit (no held-out runs)",
    }[gate["basis"]]
    text = (
        f"{what} median |error| {gate['median_abs_error']:.1%} is above the "
        f"{gate['threshold']:.0%} threshold"
    )
    worst = gate["worst_figure"]
    if worst is not None:
        text += f" (worst figure {worst['name']}: median {worst['median_abs_error']:.1%})"
    return text


def warning_line(gate: dict[str, Any], out: str) -> str:
    """The one line a refused fit prints."""
    return (
        f"warning: poor fit, {out} not written: {_words(gate)}; fix: describe the deployment "
        f"better (engine caps, prefix cache, a closer prior), or pass {ACCEPT_FLAG} to write "
        "it anyway, or --max-held-out-error to state another threshold"
    )


def accepted_note(gate: dict[str, Any]) -> str:
    """The provenance note of a fit written above the threshold."""
    return f" Written above the quality gate with {ACCEPT_FLAG}: {_words(gate)}."
