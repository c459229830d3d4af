"""Where a prediction misses: each engine iteration's measured time against the profile's cost.

For every iteration the engine ran, ask the simulator's cost model (``StepCosts``, the same
formulas the simulated replica charges) what that exact pass should have cost: the target pass
over its tokens, context and query-key pairs, the drafter's k passes (or its prompt pass), and the
overhead (per step, per sequence and, for each of the k draft passes, per draft pass and per
drafting sequence). Grouped by kind (prefill, decode at each k), the median ratio measured /
predicted and the median gap in milliseconds say which part of the model is off, and by how much
per iteration: a constant gap is a fixed per-iteration cost the profile lacks; a ratio that grows
with batch is a per-sequence cost. The measured p10..p90 of identical iterations shows how much
of a miss is the machine's own noise (a shared machine's speed can change during a run).
"""

from __future__ import annotations

from typing import Any

import numpy as np


def iteration_residuals(log, profile, drafter: str | None) -> list[dict[str, Any]]:
    """Per (kind, k, batch) group: iterations, median measured and predicted ms, ratio, gap."""
    from specsim.simulation.costs import StepCosts, engine_log_groups

    out = []
    groups = engine_log_groups(log, StepCosts(profile, drafter))
    for (kind, k, batch), (measured, predicted, _) in groups.items():
        out.append(
            {
                "kind": kind,
                "k": k,
                "batch": batch,
                "iterations": len(measured),
                "measured_ms": float(np.median(measured) * 1e3),
                # The spread of identical iterations: machine noise the profile cannot model.
                "measured_p10_ms": float(np.percentile(measured, 10) * 1e3),
                "measured_p90_ms": float(np.percentile(measured, 90) * 1e3),
                "predicted_ms": float(np.median(predicted) * 1e3),
                "ratio": float(np.median(measured / predicted)),
                "gap_ms": float(np.median(measured - predicted) * 1e3),
            }
        )
    return out


def residual_table(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"{'iteration':<18}{'n':>6}{'measured ms':>13}{'p10..p90 ms':>15}{'predicted ms':>14}"
        f"{'ratio':>8}{'gap ms':>9}"
    ]
    for r in rows:
        label = f"{r['kind']} k={r['k']} b={r['batch']}"
        spread = f"{r['measured_p10_ms']:.1f}..{r['measured_p90_ms']:.1f}"
        lines.append(
            f"{label:<18}{r['iterations']:>6}{r['measured_ms']:>13.2f}{spread:>15}"
            f"{r['predicted_ms']:>14.2f}{r['ratio']:>8.2f}{r['gap_ms']:>9.2f}"
        )
    return "\n".join(lines)
