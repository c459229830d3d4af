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

On the CPU clocks the engine also timed each iteration's target pass, drafter passes and own
work apart (``iterations.csv``'s ``target_s`` and ``drafter_s``), and each group then says
which of the three parts the profile mispredicts (``parts``; ``split_table``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from specsim.engine.clock import ROLES as PARTS  # the columns of LogGroup's parts


def iteration_residuals(log, profile, drafter: str | None) -> list[dict[str, Any]]:
    """Per (kind, k, batch) group: iterations, median measured and predicted ms, ratio, gap."""
    from specsim.simulation.costs import StepCosts, engine_log_groups

    out = []
    groups = engine_log_groups(log, StepCosts(profile, drafter))
    for (kind, k, batch), group in groups.items():
        measured, predicted = group.measured, group.predicted
        row = {
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
        if group.measured_parts is not None:
            row["parts"] = {
                part: {
                    "measured_ms": float(np.median(group.measured_parts[:, i]) * 1e3),
                    "predicted_ms": float(np.median(group.predicted_parts[:, i]) * 1e3),
                }
                for i, part in enumerate(PARTS)
            }
        out.append(row)
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


def split_table(rows: list[dict[str, Any]]) -> str:
    """Measured / predicted ms of each part per group (the groups the engine split), or ''."""
    split = [r for r in rows if "parts" in r]
    if not split:
        return ""
    header = f"{'iteration':<18}" + "".join(
        f"{name:>20}" for name in ("target pass ms", "drafter passes ms", "engine's own ms")
    )
    lines = [header + "   (measured / predicted)"]
    for r in split:
        label = f"{r['kind']} k={r['k']} b={r['batch']}"
        cells = "".join(
            f"{r['parts'][p]['measured_ms']:>11.2f} / {r['parts'][p]['predicted_ms']:<6.2f}"
            for p in PARTS
        )
        lines.append(f"{label:<18}{cells}")
    return "\n".join(lines)
