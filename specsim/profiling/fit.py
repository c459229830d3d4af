"""Fitting the profile's latency form to measured passes (numpy and scipy only, no torch).

The form (see ``specsim.profile.schema.LatencyFit``) is linear in its five non-negative
coefficients once ``knee_tokens`` is fixed::

    seconds = fixed + per_sequence x B + per_batched_token x max(0, N - knee)
              + per_kv_token x KV + per_attention_pair x P

so each candidate knee is a non-negative least-squares problem, and the knee is chosen by search.
Rows are weighted by 1 / measured seconds: the fit minimises *relative* error, because passes span
orders of magnitude (a decode of one sequence vs a long prefill) and a plain least-squares fit
would ignore the small ones that matter most to inter-token latency. The held-out error refits
with each point (or fold) left out, knee search included, and predicts it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import nnls

from specsim.errors import SpecsimError
from specsim.profile.latency import HeldOutError, Latency, LatencyFit, LatencySample, ValidRange

LOO_MAX_POINTS = 200  # above this, 10-fold cross-validation instead of leave-one-out
FOLDS = 10
REFINE_STEPS = 8  # knee values tried between the best grid candidate and its neighbours


@dataclass(frozen=True)
class Features:
    """Per-sample batch totals of the fit form: B, N, KV, P, and the measured seconds."""

    batch: np.ndarray
    new: np.ndarray
    kv: np.ndarray
    pairs: np.ndarray
    seconds: np.ndarray

    @classmethod
    def of(cls, samples: Sequence[LatencySample]) -> Features:
        b = np.array([s.batch for s in samples], dtype=np.float64)
        ctx = np.array([s.context for s in samples], dtype=np.float64)
        new = np.array([s.new_tokens for s in samples], dtype=np.float64)
        return cls(
            batch=b,
            new=b * new,
            kv=b * ctx,
            pairs=b * new * (ctx + (new + 1.0) / 2.0),
            seconds=np.array([s.seconds for s in samples], dtype=np.float64),
        )

    def take(self, index: np.ndarray) -> Features:
        return Features(
            *(a[index] for a in (self.batch, self.new, self.kv, self.pairs, self.seconds))
        )

    def design(self, knee: float) -> np.ndarray:
        """Columns: fixed, per_sequence, per_batched_token, per_kv_token, per_attention_pair."""
        hinge = np.maximum(0.0, self.new - knee)
        return np.column_stack([np.ones_like(self.batch), self.batch, hinge, self.kv, self.pairs])


def _solve(features: Features, knee: float) -> tuple[np.ndarray, float]:
    """Non-negative coefficients for a fixed knee, and the sum of squared relative errors."""
    a = features.design(knee) / features.seconds[:, None]
    y = np.ones_like(features.seconds)
    scale = np.abs(a).max(axis=0)
    scale[scale == 0] = 1.0  # a column that is all zeros (e.g. no context) stays at 0
    coef, _ = nnls(a / scale, y, maxiter=50 * a.shape[1])
    coef = coef / scale
    residual = a @ coef - y
    return coef, float(residual @ residual)


def _knee_candidates(features: Features) -> np.ndarray:
    values = np.unique(features.new)
    return np.unique(np.concatenate([[0.0], values[values < values.max()]]))


def _best_fit(features: Features) -> tuple[np.ndarray, float]:
    """Coefficients and knee with the least relative error: grid search, then refinement."""
    candidates = _knee_candidates(features)
    errors = []
    for knee in candidates:
        errors.append(_solve(features, knee)[1])
    best = int(np.argmin(errors))
    low = candidates[max(best - 1, 0)]
    high = candidates[min(best + 1, len(candidates) - 1)]
    fine = np.linspace(low, high, 2 * REFINE_STEPS + 1)
    fine_errors = [_solve(features, knee)[1] for knee in fine]
    knee = float(fine[int(np.argmin(fine_errors))])
    if min(fine_errors) > errors[best]:
        knee = float(candidates[best])
    return _solve(features, knee)[0], knee


def _to_fit(coef: np.ndarray, knee: float, held_out: HeldOutError | None) -> LatencyFit:
    fixed, per_seq, per_tok, per_kv, per_pair = (float(c) for c in coef)
    return LatencyFit(
        fixed_s=fixed,
        per_sequence_s=per_seq,
        per_batched_token_s=per_tok,
        knee_tokens=knee if per_tok > 0 else 0.0,
        per_kv_token_s=per_kv,
        per_attention_pair_s=per_pair,
        held_out=held_out,
    )


def predict(fit: LatencyFit, features: Features) -> np.ndarray:
    coef = np.array(
        [
            fit.fixed_s,
            fit.per_sequence_s,
            fit.per_batched_token_s,
            fit.per_kv_token_s,
            fit.per_attention_pair_s,
        ]
    )
    return features.design(fit.knee_tokens) @ coef


def held_out_error(features: Features, seed: int = 0) -> HeldOutError:
    """Relative error of predictions for points the fit did not see (median and max)."""
    n = len(features.seconds)
    if n <= LOO_MAX_POINTS:
        folds = [np.array([i]) for i in range(n)]
        method = "leave-one-out relative error"
    else:
        order = np.random.default_rng(seed).permutation(n)
        folds = np.array_split(order, FOLDS)
        method = f"{FOLDS}-fold relative error"
    errors = np.empty(n)
    for fold in folds:
        keep = np.setdiff1d(np.arange(n), fold)
        coef, knee = _best_fit(features.take(keep))
        guess = predict(_to_fit(coef, knee, None), features.take(fold))
        errors[fold] = np.abs(guess - features.seconds[fold]) / features.seconds[fold]
    return HeldOutError(
        method=method,
        points=n,
        median_rel_error=float(np.median(errors)),
        max_rel_error=float(errors.max()),
    )


MIN_POINTS = 7  # five coefficients and a knee, plus at least one point to spare


def fit_latency(samples: Sequence[LatencySample], source: str = "latency samples") -> LatencyFit:
    """Fit the latency form to ``samples``, with held-out error measured by cross-validation."""
    if len(samples) < MIN_POINTS:
        raise SpecsimError(
            f"{len(samples)} measured points, need at least {MIN_POINTS} to fit latency",
            file=source,
            key="samples",
            fix="profile a larger grid or a longer --time-budget",
        )
    features = Features.of(samples)
    coef, knee = _best_fit(features)
    return _to_fit(coef, knee, held_out_error(features))


def valid_range(samples: Sequence[LatencySample]) -> ValidRange:
    return ValidRange(
        batch=(min(s.batch for s in samples), max(s.batch for s in samples)),
        context=(min(s.context for s in samples), max(s.context for s in samples)),
        new_tokens=(min(s.new_tokens for s in samples), max(s.new_tokens for s in samples)),
    )


def latency_section(
    samples: Sequence[LatencySample], outside_range: str = "extrapolate", source: str = "samples"
) -> Latency:
    """The profile's ``latency`` section: the fit, the measured range and the raw samples."""
    return Latency(
        fit=fit_latency(samples, source),
        valid_range=valid_range(samples),
        outside_range=outside_range,
        samples=list(samples),
    )
