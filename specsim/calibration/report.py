"""The report of ``profile from-bench`` (``NEW.calibration.json``): per run and figure the
measured value, the prior's prediction, the fit's and the held-out one; the terms, with which
the runs determine; the method; and the errors' summaries."""

from __future__ import annotations

from typing import Any

import numpy as np

from specsim.calibration.fit import DETERMINED, DISCOUNTED, NOISE, ROBUST_SCALE, FitResult
from specsim.calibration.simulate import Evaluator, unfitted_reason
from specsim.calibration.terms import (
    ENGINE_REQUEST_SPREAD_S,
    ENGINE_REQUEST_TERM,
    FACTOR_PRIOR_SD,
    REQUEST_SPREAD_S,
    REQUEST_TERM,
    SECONDS_PRIOR_SD,
)


def run_report(evaluator: Evaluator, result: FitResult, index: int) -> dict[str, Any]:
    replay_ = evaluator.replays[index]
    run = replay_.run
    theta0 = np.array([t.theta0 for t in evaluator.terms])
    prior = evaluator.metrics(theta0, index)
    fitted = evaluator.metrics(result.theta, index)
    held = None if result.held_out is None else evaluator.metrics(result.held_out[index], index)
    metrics = {}
    for key, measured in run.metrics.items():
        reason = unfitted_reason(key, measured, replay_.spread_known)
        if reason is not None:
            metrics[key] = {"measured": measured, "not_fitted": reason}
            continue
        row = {
            "measured": measured,
            "prior": prior[key],
            "prior_error": prior[key] / measured - 1,
            "fitted": fitted[key],
            "error": fitted[key] / measured - 1,
        }
        if held is not None:
            row.update(held_out=held[key], held_out_error=held[key] / measured - 1)
        metrics[key] = row
    spec = replay_.speculation
    return {
        "file": run.source,
        "run": run.index + 1,
        "label": run.label,
        "engine": run.engine,
        "engine_version": run.engine_version,
        "model": run.model,
        "traffic": {
            "request_rate": run.traffic.request_rate
            if np.isfinite(run.traffic.request_rate)
            else "inf",
            "burstiness": run.traffic.burstiness,
            "max_concurrency": run.traffic.max_concurrency,
        },
        "workload": replay_.describe(),
        "speculation": None if spec is None else {"drafter": spec.drafter, "k": spec.k},
        "weight": float(result.weights[index]),
        "metrics": metrics,
        "notes": list(run.notes),
    }


def errors(per_run: list[dict], column: str) -> np.ndarray:
    return np.array(
        [abs(row[column]) for run in per_run for row in run["metrics"].values() if column in row]
    )


def calibration_report(evaluator, result, per_run, loaded, acceptance) -> dict[str, Any]:
    fit_errors, held_errors = errors(per_run, "error"), errors(per_run, "held_out_error")
    notes = []
    if evaluator.out_of_range:
        notes.append("the runs' loads took the prior's latency fits outside their measured range")
    discounted = [
        f"{run['label'] or run['run']} ({run['weight']:.2f})"
        for run in per_run
        if run["weight"] < DISCOUNTED
    ]
    if discounted:
        notes.append(
            "the fitted terms do not reproduce run(s) "
            + ", ".join(discounted)
            + " within a few noises, and the fit gives them the weight in brackets: a cost the "
            "model lacks, or runs of another deployment; their fit error says how far off"
        )
    models = sorted({run["model"] for run in per_run if run["model"]})
    target = loaded.profile.target.description
    if models and target and target not in models:
        notes.append(f"the runs serve {models[0]}; the prior's target is {target!r}")
    # Named only where fitted, so that reports of fits without it keep their bytes.
    fitted = any(t.name == ENGINE_REQUEST_TERM for t in evaluator.terms)
    engine_spread = f", {ENGINE_REQUEST_SPREAD_S:g} s ({ENGINE_REQUEST_TERM})" if fitted else ""
    return {
        "prior": {"path": str(loaded.path), "source": loaded.profile.provenance.source},
        "method": {
            "residuals": "log(simulated / measured) of every figure the simulation gives, "
            "a percentile weighted by a mean's sampling error over its own, each run's figures "
            f"together one observation known to {NOISE:.0%}, a Cauchy likelihood per run (scale "
            f"{ROBUST_SCALE:g} noises), with a Gaussian prior on each term",
            "prior_spread": {
                "factor": f"log-normal, sd {FACTOR_PRIOR_SD:.3f} (a factor of 4)",
                "seconds": f"sd {SECONDS_PRIOR_SD:g} target decode pass (a drafter's added "
                f"seconds), {REQUEST_SPREAD_S:g} s ({REQUEST_TERM})" + engine_spread,
            },
            "determined_below": DETERMINED,
            "held_out": (
                "each run left out in turn; the determined terms refitted on the rest, from the "
                "prior"
            ),
            "simulations": evaluator.simulations,
        },
        "terms": terms(evaluator, result),
        "undetermined": [
            t.name for i, t in enumerate(evaluator.terms) if i not in result.determined
        ],
        "correlation": np.round(result.correlation, 3).tolist(),
        "fit": summary(fit_errors),
        "held_out": None if result.held_out is None else summary(held_errors),
        "acceptance": acceptance,
        "runs": per_run,
        "notes": notes,
    }


def summary(errors: np.ndarray) -> dict[str, float]:
    return {
        "figures": int(errors.size),
        "median_abs_error": float(np.median(errors)) if errors.size else 0.0,
        "max_abs_error": float(np.max(errors)) if errors.size else 0.0,
    }


def terms(evaluator: Evaluator, result: FitResult) -> list[dict[str, Any]]:
    return [
        {
            "name": term.name,
            "kind": term.kind,
            "value": term.value(result.theta[i]),
            "prior": term.prior,
            "determined": i in result.determined,
            "spread_ratio": float(min(result.spread_ratio[i], 1.0)),
            "description": term.description,
        }
        for i, term in enumerate(evaluator.terms)
    ]


def check_report(checker: Evaluator, theta: np.ndarray, files: list[dict]) -> dict[str, Any]:
    """Runs the fit never saw (``--check-runs``) predicted with the fitted terms: per run and
    figure the signed error, and per figure the median and largest |error| over the runs; and
    the prior's signed errors on the same runs (what the quality gate compares the fit with)."""
    runs: dict[str, dict[str, float]] = {}
    prior_runs: dict[str, dict[str, float]] = {}
    by_figure: dict[str, list[float]] = {}
    theta0 = np.array([t.theta0 for t in checker.terms])
    for index, replay_ in enumerate(checker.replays):
        measured = replay_.run.metrics
        label = replay_.run.label or f"run {index + 1}"
        for into, at in ((runs, theta), (prior_runs, theta0)):
            predicted = checker.metrics(at, index)
            into[label] = {key: predicted[key] / measured[key] - 1 for key in checker.keys[index]}
        errors = runs[label]
        for key, error in errors.items():
            by_figure.setdefault(key, []).append(abs(error))
    return {
        "files": files,
        "runs": list(runs),
        "figures": {
            key: {
                "runs": len(values),
                "median_abs_error": float(np.median(values)),
                "max_abs_error": float(np.max(values)),
            }
            for key, values in sorted(by_figure.items())
        },
        "errors": runs,
        "prior_errors": prior_runs,
    }
