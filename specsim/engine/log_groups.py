"""The real engine's iteration log against the cost model, grouped by (kind, k, batch).

The profiler's overhead fit and ``validate``'s residuals both read it: per group, what each
iteration measured beside what ``StepCosts`` charges for it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specsim.costs import NO_ROWS, PassTotals, StepCosts


@dataclass(frozen=True)
class LogGroup:
    """One (kind, k, batch) group of the real engine's iterations: per iteration the measured
    seconds, what ``StepCosts.iteration_s`` charges for it, the tokens fed, and both split into
    (target pass, drafter passes, the engine's own work): ``predicted_parts`` always,
    ``measured_parts`` when the engine's clock kept the split (None otherwise). ``full``: the
    iteration ran the whole window, k drafter passes (False on a step whose every row was so
    near its end that it drafted fewer, while the cost model charges k)."""

    measured: np.ndarray
    predicted: np.ndarray
    new: np.ndarray
    predicted_parts: np.ndarray  # [iterations, 3]
    measured_parts: np.ndarray | None  # [iterations, 3]
    full: np.ndarray  # [iterations] bool


def engine_log_groups(log, costs: StepCosts) -> dict[tuple[str, int, int], LogGroup]:
    """The real engine's iteration log (``specsim.engine``) against the cost model, grouped by
    (kind, k, batch): a prefill of whole prompts, or a decode step with window k."""
    rows: dict[tuple[str, int, int], list] = {}
    split = bool(log.target_s)
    passes = zip(log.target_s, log.drafter_s, strict=True) if split else [None] * len(log.dt)
    drafted = iter(getattr(log, "drafted", None) or [])  # per decode iteration, when logged
    for kind, k, batch, new, context, pairs, dt, measured in zip(
        log.kind,
        log.window,
        log.batch,
        log.new_tokens,
        log.context,
        log.pairs,
        log.dt,
        passes,
        strict=True,
    ):
        full = True
        totals = PassTotals(batch, new, context, pairs)
        if kind == "prefill":
            parts = costs.iteration_parts(0, NO_ROWS, totals)
        else:
            parts = costs.iteration_parts(k, totals)
            rows_drafted = next(drafted, None)
            full = rows_drafted is None or k == 0 or int(np.max(rows_drafted)) >= k
        own = None if measured is None else (*measured, dt - sum(measured))
        rows.setdefault((kind, k, batch), []).append((dt, sum(parts), new, parts, own, full))
    groups = {}
    for key, values in sorted(rows.items()):
        dt, predicted, new, parts, own, full = zip(*values, strict=True)
        groups[key] = LogGroup(
            np.asarray(dt, dtype=float),
            np.asarray(predicted, dtype=float),
            np.asarray(new, dtype=float),
            np.asarray(parts, dtype=float),
            np.asarray(own, dtype=float) if split else None,
            np.asarray(full, dtype=bool),
        )
    return groups
