"""The engine's overhead per iteration, measured on the real speculative step and fitted (torch).

A latency fit predicts bare forward passes; the engine's iteration also samples, verifies, rolls
its caches back and does the serving loop's bookkeeping. ``measure_overhead`` times the engine's
own serving iteration (``step_overhead``) at a few batch sizes and windows k, for every draft
model, and takes away what the latency fits predict for its passes (``predict_passes``; without
it, the same passes timed alone). Against the fits, the overhead also holds what the fits miss
inside the serving loop: passes there run cache-cold after the other model's and after sampling,
which a grid that times each model on its own cannot see (on a CPU the drafter's passes in the
loop took about 1.2x their isolated time). ``fit_overhead`` fits the profile's formula (see
``specsim.profile.schema.Overhead``)::

    overhead(B, k) = per_step + per_sequence * B + k * (per_draft_step + per_draft_token * B)

by non-negative least squares, relative to each point's size so large batches do not drown the
small ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

TERMS = ("per_step_s", "per_sequence_s", "per_draft_step_s", "per_draft_token_s")


DRAFT_TERMS = ("per_draft_step_s", "per_draft_token_s")


@dataclass(frozen=True)
class OverheadPoint:
    batch: int
    k: int
    seconds: float  # the iteration's time beyond its forward passes
    drafter: str | None = None  # the draft model the point ran with (None: target alone)


@dataclass(frozen=True)
class OverheadFit:
    terms: dict[str, float]
    points: list[OverheadPoint]
    max_abs_error_s: float  # largest |fit - measured| over the points
    # Per draft model, its own draft terms (fitted on its points alone): a bigger drafter's
    # passes lose more to running cache-cold in the loop, so one shared term misfits both.
    drafters: dict[str, dict[str, float]] = field(default_factory=dict)

    def predict(self, batch: int, k: int) -> float:
        return float((_design([batch], [k]) @ np.asarray([self.terms[t] for t in TERMS]))[0])

    def describe(self) -> str:
        t = self.terms
        text = (
            f"{t['per_step_s'] * 1e3:.3f} ms per step + {t['per_sequence_s'] * 1e3:.3f} ms per "
            f"sequence + k x ({t['per_draft_step_s'] * 1e3:.3f} ms + "
            f"{t['per_draft_token_s'] * 1e3:.3f} ms per sequence)"
        )
        for name, own in self.drafters.items():
            text += (
                f"; {name}: k x ({own['per_draft_step_s'] * 1e3:.3f} ms + "
                f"{own['per_draft_token_s'] * 1e3:.3f} ms per sequence)"
            )
        return text


def _design(batches: Sequence[int], ks: Sequence[int]) -> np.ndarray:
    b = np.asarray(batches, dtype=float)
    k = np.asarray(ks, dtype=float)
    return np.stack([np.ones_like(b), b, k, k * b], axis=1)


def fit_overhead(points: Sequence[OverheadPoint]) -> OverheadFit:
    """Non-negative least squares of the overhead formula over all the points, and of each
    labelled draft model's points alone for its own draft terms. Terms the points cannot
    identify (no k > 0: the draft terms) stay 0. A negative measured difference (noise around a
    tiny overhead) counts as 0."""
    shared = _fit_terms(points)
    names = sorted({p.drafter for p in points if p.drafter is not None and p.k})
    drafters = {}
    for name in names:
        own = _fit_terms([p for p in points if p.drafter == name])
        drafters[name] = {t: own.terms[t] for t in DRAFT_TERMS}
    return OverheadFit(shared.terms, shared.points, shared.max_abs_error_s, drafters)


def _fit_terms(points: Sequence[OverheadPoint]) -> OverheadFit:
    from scipy.optimize import nnls

    if not points:
        raise ValueError("no overhead points to fit")
    design = _design([p.batch for p in points], [p.k for p in points])
    seconds = np.maximum([p.seconds for p in points], 0.0)
    used = [i for i in range(len(TERMS)) if np.any(design[:, i] != design[0, i]) or i == 0]
    if not any(p.k for p in points):
        used = [i for i in used if i < 2]
    # Each row weighted by 1 / its size (1 + B)(1 + k): errors count relative to the point.
    weight = 1.0 / ((1.0 + design[:, 1]) * (1.0 + design[:, 2]))
    coef, _ = nnls(design[:, used] * weight[:, None], seconds * weight)
    full = np.zeros(len(TERMS))
    full[used] = coef
    error = float(np.max(np.abs(design @ full - seconds)))
    return OverheadFit(dict(zip(TERMS, map(float, full), strict=True)), list(points), error)


def measure_overhead(
    target,
    drafters: Sequence,
    context: int,
    batches: Sequence[int] = (1, 4, 8),
    windows: Sequence[int] = (0, 2, 4),
    repeats: int = 9,
    clock: str = "wall",
    normalise=None,
    predict_passes=None,
    names: Sequence[str] | None = None,
) -> OverheadFit:
    """Time the engine's serving iteration at every batch x k, for each draft model in
    ``drafters`` (k = 0 alone without one), and fit the overhead terms to what it takes beyond
    ``predict_passes(drafter_index, batch, k, context)`` (the latency fits' seconds for its
    passes; by default the passes timed alone). ``names`` label the drafters' points, so each
    gets its own draft terms."""
    from specsim.engine.overhead import step_overhead

    points = []
    for index, drafter in enumerate(drafters or [None]):
        for batch in batches:
            for k in windows if drafter is not None else (0,):
                result = step_overhead(
                    target, drafter, batch, k, context, repeats, clock=clock, normalise=normalise
                )
                if predict_passes is None:
                    seconds = result.overhead_s
                else:
                    seconds = result.step_s - predict_passes(index, batch, k, context)
                name = names[index] if names and drafter is not None else None
                points.append(OverheadPoint(batch, k, seconds, name))
    return fit_overhead(points)
