"""Fitting the terms to the runs: least squares on log(simulated / measured), with the prior.

The residuals are every fitted figure's weighted log(simulated / measured) over ``NOISE`` (a
run's figures together taken as one observation known to about 5 %; the weights:
``specsim.calibration.simulate``), and one row per term, (theta - prior) over the prior's
spread, so the fit is the posterior mode of a Gaussian prior and a likelihood on the log scale
(``scipy.optimize.least_squares``, bounded trust region).

The likelihood is a Cauchy one per run (a Student t of one degree of freedom, scale
``ROBUST_SCALE`` noises): a run whose figures the terms reproduce to a few noises counts as in
a Gaussian fit, one they miss by far more counts less and less (weight 1 / (1 + z^2 / c^2) at z
noises). A run that the cost model cannot describe whatever the terms (a cost it lacks) then
no longer sets the terms for all the others, as under a Gaussian likelihood, where such runs
made the runs a fit never saw worse than its prior (docs/notes/2026-12-03-honest-fits.md).
Each run's weight at the fit is in the report, and the runs it discounts are named
(``DISCOUNTED``).

Which terms the runs determine: the posterior covariance at the optimum,
(J'WJ / s^2 + prior precision)^-1, from a central-difference Jacobian J of the weighted figures,
W the runs' Cauchy weights there and s the larger of ``NOISE`` and the runs' own
root-mean-square weighted error (each run's times its weight's square root). The simulated
figures are not smooth in the terms (an iteration more or less, a request admitted a step
earlier), so the differences span ``SPREAD_STEP`` either way (20 % on a factor): narrower ones
read those jumps as slopes, and so as information the runs do not hold. A term
whose posterior standard deviation is below ``DETERMINED`` of its prior's (the runs hold at
least three times the prior's information on it) is determined; the others are reset to the
prior and the determined ones fitted again.

Held out: each run in turn is left out, the determined terms refitted on the rest (staged, from
the prior, as the full fit is), and the left-out run predicted. Which terms are determined is
decided once, on every run.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares

from specsim.calibration.simulate import Evaluator

NOISE = 0.05
DETERMINED = 0.5
ROBUST_SCALE = 3.0  # noises: a run fitted to 15 % weighs half as much as a Gaussian fit's
DISCOUNTED = 0.5  # a run whose weight at the fit is below this is named in the report
STEP = 0.1  # the optimiser's forward differences (10 % on a factor)
SPREAD_STEP = 0.2  # the posterior's central differences
MAX_NFEV = 25  # trust-region iterations per fit (Jacobian evaluations not counted)


@dataclass
class FitResult:
    theta: np.ndarray  # every term, the undetermined at their prior
    spread_ratio: np.ndarray  # per term
    correlation: np.ndarray  # the terms' posterior correlations
    determined: list[int]
    held_out: dict[int, np.ndarray] | None  # run -> theta fitted without it
    weights: np.ndarray  # each run's Cauchy weight at theta (module docstring)


def _priors(evaluator: Evaluator) -> tuple[np.ndarray, np.ndarray]:
    terms = evaluator.terms
    return np.array([t.theta0 for t in terms]), np.array([t.prior_sd for t in terms])


def errors(evaluator: Evaluator, theta: np.ndarray, runs: list[int]) -> np.ndarray:
    """The weighted log(simulated / measured) of every fitted figure of ``runs`` (each run's
    weights with a sum of squares of 1: ``specsim.calibration.simulate``)."""
    return np.concatenate([evaluator.weighted_errors(theta, run) for run in runs])


def run_weight(error: np.ndarray) -> float:
    """A run's Cauchy weight, 1 / (1 + z^2 / c^2), its weighted errors ``z`` noises long."""
    z2 = float(np.sum(error**2)) / NOISE**2
    return 1.0 / (1.0 + z2 / ROBUST_SCALE**2)


def robust(error: np.ndarray) -> np.ndarray:
    """A run's weighted errors over ``NOISE``, shortened so that their sum of squares is the
    Cauchy cost c^2 log(1 + z^2 / c^2): least squares on these is the robust fit."""
    z2 = float(np.sum(error**2)) / NOISE**2
    if z2 == 0.0:
        return error / NOISE
    cost = ROBUST_SCALE**2 * np.log1p(z2 / ROBUST_SCALE**2)
    return error / NOISE * np.sqrt(cost / z2)


def robust_errors(evaluator: Evaluator, theta: np.ndarray, runs: list[int]) -> np.ndarray:
    return np.concatenate([robust(evaluator.weighted_errors(theta, run)) for run in runs])


def weights(evaluator: Evaluator, theta: np.ndarray, runs: list[int]) -> np.ndarray:
    return np.array([run_weight(evaluator.weighted_errors(theta, run)) for run in runs])


def fit(evaluator: Evaluator, free: list[int], runs: list[int], start: np.ndarray) -> np.ndarray:
    """``start`` with the ``free`` terms fitted to ``runs``.

    The optimiser works in coordinates u = theta - start + 1: scipy's trust region starts with
    a radius of about |u0|, which would all but vanish at a start of 0 (every term's prior).
    """
    if not free:
        return start.copy()
    theta0, sd = _priors(evaluator)
    shift = 1.0 - start[free]
    bounds = np.array([evaluator.terms[i].bounds for i in free]) + shift[:, None]

    def residuals(u: np.ndarray) -> np.ndarray:
        theta = start.copy()
        theta[free] = u - shift
        prior = (theta[free] - theta0[free]) / sd[free]
        return np.concatenate([robust_errors(evaluator, theta, runs), prior])

    def forward_differences(u: np.ndarray) -> np.ndarray:
        # Absolute steps of STEP (scipy's own are relative to u and far smaller).
        base = residuals(u)
        columns = []
        for j in range(u.size):
            step = STEP if u[j] + STEP <= bounds[j, 1] else -STEP
            moved = u.copy()
            moved[j] += step
            columns.append((residuals(moved) - base) / step)
        return np.column_stack(columns)

    u0 = np.clip(start[free] + shift, bounds[:, 0], bounds[:, 1])
    result = least_squares(
        residuals,
        u0,
        jac=forward_differences,
        bounds=(bounds[:, 0], bounds[:, 1]),
        max_nfev=MAX_NFEV,
        xtol=1e-4,
        ftol=1e-4,
    )
    theta = start.copy()
    theta[free] = result.x - shift
    return theta


def jacobian(evaluator: Evaluator, theta: np.ndarray, runs: list[int], free: list[int]):
    """d (weighted log error) / d theta for every fitted figure, by central differences."""
    columns = []
    for i in free:
        low, high = evaluator.terms[i].bounds
        up, down = theta.copy(), theta.copy()
        up[i], down[i] = min(theta[i] + SPREAD_STEP, high), max(theta[i] - SPREAD_STEP, low)
        columns.append(
            (errors(evaluator, up, runs) - errors(evaluator, down, runs)) / (up[i] - down[i])
        )
    return np.column_stack(columns)


def posterior(evaluator: Evaluator, theta: np.ndarray, runs: list[int]):
    """Each term's posterior standard deviation over its prior's, and the terms' posterior
    correlations (module docstring)."""
    free = list(range(len(evaluator.terms)))
    _, sd = _priors(evaluator)
    # Each figure's row scaled by the square root of its run's weight.
    per_run = [evaluator.weighted_errors(theta, run) for run in runs]
    scale = np.concatenate([np.full(e.size, np.sqrt(run_weight(e))) for e in per_run])
    residual = np.concatenate(per_run) * scale
    noise = max(NOISE, float(np.sqrt(np.sum(residual**2) / len(runs))))
    J = jacobian(evaluator, theta, runs, free) * scale[:, None]
    precision = J.T @ J / noise**2 + np.diag(1.0 / sd**2)
    covariance = np.linalg.inv(precision)
    spread = np.sqrt(np.clip(np.diag(covariance), 1e-300, None))
    return np.minimum(spread / sd, 1.0), covariance / np.outer(spread, spread)


def staged_fit(evaluator: Evaluator, free: list[int], runs: list[int], start: np.ndarray):
    """``fit`` in stages that follow what pins what: the target's terms and the request delay
    on the runs without speculation, then the drafter's on the runs with it, then all
    together, and that once more (a fresh trust region: the simulated figures are not smooth
    in the terms, and a single pass stops where a step over a discrete event is refused)."""
    theta = start.copy()
    target = [i for i in free if evaluator.terms[i].model in ("target", "engine")]
    drafter = [i for i in free if i not in target]
    plain = [r for r in runs if evaluator.replays[r].speculation is None]
    speculative = [r for r in runs if r not in plain]
    if target and plain and drafter and speculative:
        theta = fit(evaluator, target, plain, theta)
        theta = fit(evaluator, drafter, speculative, theta)
    for _ in range(2):
        theta = fit(evaluator, free, runs, theta)
    return theta


def calibrate(evaluator: Evaluator, held_out: bool = True) -> FitResult:
    """Fit every term, keep the determined ones, refit them, and the held-out fits."""
    theta0, _ = _priors(evaluator)
    runs = list(range(len(evaluator.replays)))
    every = list(range(len(evaluator.terms)))
    first = staged_fit(evaluator, every, runs, theta0)
    ratio, correlation = posterior(evaluator, first, runs)
    determined = [i for i in every if ratio[i] < DETERMINED]
    start = theta0.copy()
    start[determined] = first[determined]
    theta = fit(evaluator, determined, runs, start) if determined != every else first
    left_out = None
    if held_out and len(runs) > 1:
        # Each held-out fit starts from the prior, as the full fit does: started from the full
        # fit (which saw the run) it often stays there, and the held-out error leaks the run.
        left_out = {
            run: staged_fit(evaluator, determined, [r for r in runs if r != run], theta0)
            for run in runs
        }
    return FitResult(
        theta, ratio, correlation, determined, left_out, weights(evaluator, theta, runs)
    )
