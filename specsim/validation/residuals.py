"""Where a prediction misses: each engine iteration's measured time against the profile's cost.

For every iteration the engine ran, ask the simulator's cost model (``StepCosts``, the same
formulas the simulated replica charges) what that exact pass should have cost: the target pass
over its tokens, context and query-key pairs, the drafter's k passes (or its prompt pass), and the
overhead (per step, per sequence and, for each of the k draft passes, per draft pass and per
drafting sequence), times the profile's iteration-time spread as the simulator draws it.
Grouped by kind (prefill, decode at each k), measured and predicted stand side by side as
means (with their ratio and gap in milliseconds) and as medians, like against like. They say
which part of the model is off, and by how much per iteration: a constant gap is a fixed
per-iteration cost the profile lacks; a ratio that grows with batch is a per-sequence cost.
The measured p10..p90 of identical iterations shows how much of a miss is the machine's own
noise (a shared machine's speed can change during a run).

On the CPU clocks the engine also timed each iteration's target pass, drafter passes and own
work apart (``iterations.csv``'s ``target_s`` and ``drafter_s``), and each group then says
which of the three parts the profile mispredicts (``parts``; ``split_table``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from specsim.engine.clock import ROLES as PARTS  # the columns of LogGroup's parts

# Probabilities at which the profile's iteration-time spread is sampled for a predicted median.
SPREAD_DRAWS = 200


def spread_multipliers(profile, kind: str, jitter: bool = True) -> np.ndarray:
    """The simulator's iteration-time multipliers at evenly spaced probabilities (drawn as
    ``specsim.simulation.jitter`` draws them): an iteration that only prefills takes the
    profile's ``prefill_jitter`` where it has one, every other its ``jitter``; [1] without
    a spread (or with the scenario's ``engine.jitter`` off)."""
    p = profile.profile
    spec = p.prefill_jitter if kind == "prefill" and p.prefill_jitter is not None else p.jitter
    if spec is None or not jitter:
        return np.ones(1)
    quantiles = np.asarray(spec.quantiles, dtype=float)
    probs = (np.arange(SPREAD_DRAWS) + 0.5) / SPREAD_DRAWS
    return np.interp(probs, np.linspace(0.0, 1.0, len(quantiles)), quantiles)


def iteration_residuals(
    log, profile, drafter: str | None, jitter: bool = True, tree=None
) -> list[dict]:
    """Per (kind, k, batch) group: iterations, measured and predicted mean and median ms, the
    ratio and gap of the means, and the measured p10..p90.

    The prediction for an iteration is what the simulator would charge for that same pass:
    the cost model times the profile's spread. The spread averages 1, so the predicted mean is
    the cost model's mean; the predicted median is the median of the cost times the spread's
    multipliers. Mean stands against mean and median against median. With a tree (a
    ``TreeShape``) the steps are priced as the simulator prices that tree's."""
    from specsim.costs import StepCosts
    from specsim.engine.log_groups import engine_log_groups

    out = []
    groups = engine_log_groups(log, StepCosts(profile, drafter, tree))
    for (kind, k, batch), group in groups.items():
        measured, predicted = group.measured, group.predicted
        spread = spread_multipliers(profile, kind, jitter)
        predicted_mean = float(predicted.mean() * spread.mean())
        row = {
            "kind": kind,
            "k": k,
            "batch": batch,
            "iterations": len(measured),
            "measured_mean_ms": float(measured.mean() * 1e3),
            "predicted_mean_ms": predicted_mean * 1e3,
            "ratio": float(measured.mean() / predicted_mean),
            "gap_ms": float(measured.mean() - predicted_mean) * 1e3,
            "measured_median_ms": float(np.median(measured) * 1e3),
            "predicted_median_ms": float(np.median(np.outer(predicted, spread)) * 1e3),
            # The spread of identical iterations: machine noise the profile cannot model.
            "measured_p10_ms": float(np.percentile(measured, 10) * 1e3),
            "measured_p90_ms": float(np.percentile(measured, 90) * 1e3),
        }
        if group.measured_parts is not None:
            row["parts"] = {
                part: {
                    "measured_mean_ms": float(group.measured_parts[:, i].mean() * 1e3),
                    "predicted_mean_ms": float(
                        group.predicted_parts[:, i].mean() * spread.mean() * 1e3
                    ),
                }
                for i, part in enumerate(PARTS)
            }
        out.append(row)
    return out


def residual_table(rows: list[dict[str, Any]]) -> str:
    """Measured against predicted per iteration group: the means (with their ratio and gap),
    then the medians, then the measured p10..p90."""
    lines = [
        f"{'':<24}{'mean ms':^38}{'median ms':^22}",
        f"{'iteration':<18}{'n':>6}{'measured':>10}{'predicted':>11}{'ratio':>8}{'gap':>9}"
        f"{'measured':>11}{'predicted':>11}{'measured p10..p90 ms':>22}",
    ]
    for r in rows:
        label = f"{r['kind']} k={r['k']} b={r['batch']}"
        spread = f"{r['measured_p10_ms']:.1f}..{r['measured_p90_ms']:.1f}"
        lines.append(
            f"{label:<18}{r['iterations']:>6}{r['measured_mean_ms']:>10.2f}"
            f"{r['predicted_mean_ms']:>11.2f}{r['ratio']:>8.2f}{r['gap_ms']:>9.2f}"
            f"{r['measured_median_ms']:>11.2f}{r['predicted_median_ms']:>11.2f}{spread:>22}"
        )
    lines.append(
        "predicted: what the simulator charges for each logged pass, times the profile's "
        "iteration-time spread (it averages 1); ratio and gap: measured mean against predicted"
    )
    return "\n".join(lines)


def split_table(rows: list[dict[str, Any]]) -> str:
    """Measured / predicted ms of each part per group (the groups the engine split), or ''."""
    split = [r for r in rows if "parts" in r]
    if not split:
        return ""
    header = f"{'iteration':<18}" + "".join(
        f"{name:>20}" for name in ("target pass ms", "drafter passes ms", "engine's own ms")
    )
    lines = [header + "   (means: measured / predicted)"]
    for r in split:
        label = f"{r['kind']} k={r['k']} b={r['batch']}"
        cells = "".join(
            f"{r['parts'][p]['measured_mean_ms']:>11.2f} / "
            f"{r['parts'][p]['predicted_mean_ms']:<6.2f}"
            for p in PARTS
        )
        lines.append(f"{label:<18}{cells}")
    return "\n".join(lines)
