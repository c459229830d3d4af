"""The engine's overhead per iteration, measured on the real speculative step and fitted (torch).

A latency fit predicts bare forward passes; the engine's iteration also samples, verifies, rolls
its caches back and does the serving loop's bookkeeping. ``measure_overhead`` times that
difference with the engine's own ``step_overhead`` (a serving iteration against the same passes
alone, interleaved) at a few batch sizes and windows k, for every draft model, and
``fit_overhead`` fits the profile's formula (see ``specsim.profile.schema.Overhead``)::

    overhead(B, k) = per_step + per_sequence * B + k * (per_draft_step + per_draft_token * B)

by non-negative least squares, relative to each point's size so large batches do not drown the
small ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

TERMS = ("per_step_s", "per_sequence_s", "per_draft_step_s", "per_draft_token_s")


@dataclass(frozen=True)
class OverheadPoint:
    batch: int
    k: int
    seconds: float  # the iteration's time beyond its forward passes


@dataclass(frozen=True)
class OverheadFit:
    terms: dict[str, float]
    points: list[OverheadPoint]
    max_abs_error_s: float  # largest |fit - measured| over the points

    def predict(self, batch: int, k: int) -> float:
        return float((_design([batch], [k]) @ np.asarray([self.terms[t] for t in TERMS]))[0])

    def describe(self) -> str:
        t = self.terms
        return (
            f"{t['per_step_s'] * 1e3:.3f} ms per step + {t['per_sequence_s'] * 1e3:.3f} ms per "
            f"sequence + k x ({t['per_draft_step_s'] * 1e3:.3f} ms + "
            f"{t['per_draft_token_s'] * 1e3:.3f} ms per sequence)"
        )


def _design(batches: Sequence[int], ks: Sequence[int]) -> np.ndarray:
    b = np.asarray(batches, dtype=float)
    k = np.asarray(ks, dtype=float)
    return np.stack([np.ones_like(b), b, k, k * b], axis=1)


def fit_overhead(points: Sequence[OverheadPoint]) -> OverheadFit:
    """Non-negative least squares of the overhead formula over the points. Terms the points
    cannot identify (no k > 0: the draft terms) stay 0. A negative measured difference (noise
    around a tiny overhead) counts as 0."""
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
) -> OverheadFit:
    """Time the engine's serving iteration against its bare passes at every batch x k, for each
    draft model in ``drafters`` (k = 0 alone without one), and fit the overhead terms."""
    from specsim.engine.overhead import step_overhead

    points = []
    for drafter in drafters or [None]:
        for batch in batches:
            for k in windows if drafter is not None else (0,):
                result = step_overhead(
                    target, drafter, batch, k, context, repeats=repeats, clock=clock
                )
                points.append(OverheadPoint(batch, k, result.overhead_s))
    return fit_overhead(points)
