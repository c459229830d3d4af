"""The ``plan capacity`` report's figures: capacity and replicas against k per drafter (the
adaptive policy a lone star at the right), and every probe's SLO attainment against its rate.
"""

from __future__ import annotations

from specsim.axes import styles
from specsim.planning.capacity.capacity import CandidateResult, CapacityPlan, off_result
from specsim.planning.plots import Figure, Panel, Series, adaptive_star, adaptive_x, k_ticks


def _by_drafter(results: list[CandidateResult]) -> dict[str, list[CandidateResult]]:
    """Candidates per drafter (per deployment and drafter when several are searched)."""
    groups: dict[str, list[CandidateResult]] = {}
    for r in results:
        if r.candidate.drafter is not None:
            place = r.candidate.deployment
            name = r.candidate.drafter if place is None else f"{place.label}, {r.candidate.drafter}"
            groups.setdefault(name, []).append(r)
    return groups


def figures(plan: CapacityPlan, results: list[CandidateResult]) -> list[Figure]:
    groups = _by_drafter(results)
    tried = sorted({0, *(r.candidate.k for r in results if r.candidate.policy == "fixed")})
    adaptive_at = adaptive_x(tried)
    xticks = k_ticks(tried, any(r.candidate.policy != "fixed" for r in results))
    capacity = Panel(
        "Sustained rate per replica",
        "k (0 = speculation off)",
        "sustained rate",
        xticks=xticks,
        integer_x=True,
        yunit="req/s",
    )
    replicas = Panel(
        f"Replicas for {plan.target_rps:g} req/s",
        "k (0 = speculation off)",
        "replicas",
        xticks=xticks,
        integer_y=True,
        integer_x=True,
    )
    for (colour, marker), (drafter, entries) in zip(
        styles(len(groups)), groups.items(), strict=True
    ):
        static = [r for r in entries if r.candidate.policy == "fixed"]
        adaptive = [r for r in entries if r.candidate.policy != "fixed"]
        xs = [0.0] + [float(r.candidate.k) for r in static]
        off = off_result(results, entries[0].candidate)
        for panel, value in ((capacity, "capacity"), (replicas, "replicas")):
            ys = [getattr(off, value)] + [getattr(r, value) for r in static]
            panel.series.append(Series(drafter, xs, ys, color=colour, marker=marker))
            if adaptive:
                y = getattr(adaptive[0], value)
                panel.series.append(adaptive_star(f"{drafter} adaptive", adaptive_at, y, colour))
    curve = Panel(
        "SLO attainment against arrival rate (every probe)",
        "arrival rate",
        "share of requests meeting the SLO",
        hlines=[(plan.attainment, f"required {plan.attainment:g}")],
        xunit="req/s",
    )
    for entry in results:
        if entry.attainment_curve:
            xs, ys = zip(*entry.attainment_curve, strict=True)
            curve.series.append(Series(entry.candidate.label, list(xs), list(ys)))
    return [
        Figure(
            "capacity_vs_k",
            "Capacity of one replica and replicas needed, per drafter and k",
            [capacity, replicas],
        ),
        Figure(
            "attainment_vs_rate",
            "How each candidate's SLO attainment falls with load; "
            "its capacity is the last rate above the line",
            [curve],
            ncols=1,
        ),
    ]
