"""Whether a profile's latency fits are close enough to their own measurements to validate with.

The profiler reports each fit's held-out error: leave-one-out over the timing grid, each point
predicted by a fit that did not see it. A fit whose median held-out error exceeds
``FIT_ERROR_LIMIT`` mispredicts a typical pass by more than validate's 10 % thresholds on the
latency percentiles, so a miss there can be the fit's rather than the simulator's. ``validate``
flags such a profile in its report and in comparison.json (``profile_fit``).
"""

from __future__ import annotations

from typing import Any

FIT_ERROR_LIMIT = 0.10  # median held-out relative error of a latency fit


def fit_check(profile, drafter: str | None) -> dict[str, Any]:
    """The held-out errors of the target's fit and the drafter's (where it has one), and which
    exceed the limit; a fit without a held-out error (hand-written) is ``None``."""
    models = [("target", profile.profile.target)]
    spec = profile.profile.drafters.get(drafter) if drafter else None
    if spec is not None and spec.latency is not None:
        models.append((drafter, spec))
    errors: dict[str, Any] = {}
    for name, model in models:
        held = model.latency.fit.held_out if model.latency is not None else None
        errors[name] = (
            None
            if held is None
            else {
                "median_rel_error": held.median_rel_error,
                "max_rel_error": held.max_rel_error,
                "points": held.points,
                "exceeds": held.median_rel_error > FIT_ERROR_LIMIT,
            }
        )
    flagged = [name for name, e in errors.items() if e is not None and e["exceeds"]]
    return {"limit_median_rel_error": FIT_ERROR_LIMIT, "models": errors, "flagged": flagged}


def fit_warnings(check: dict[str, Any]) -> list[str]:
    """One line per fit beyond the limit."""
    lines = []
    for name in check["flagged"]:
        e = check["models"][name]
        lines.append(
            f"warning: the profile's {name} latency fit misses its own held-out grid points by "
            f"{e['median_rel_error']:.0%} (median; max {e['max_rel_error']:.0%}), above the "
            f"{check['limit_median_rel_error']:.0%} this validation can be judged against: a "
            "latency miss may be the fit's; profile again (a quieter machine, --clock "
            "reference, more repeats)"
        )
    return lines
