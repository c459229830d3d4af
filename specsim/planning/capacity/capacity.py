"""``plan capacity``: the highest arrival rate one replica sustains within the SLO, per candidate.

Candidates are speculation off, every (drafter, k) asked for and each drafter's adaptive policy
(``capacity_plan``). Each gets a ``Bisection`` on the load knob (``workload.rate``, or a trace's
speed; see ``rates``); the searches advance together, one batch of probes per round through the
sweep engine (``capacity_search``). A load is sustained when at least ``attainment`` of its
requests meet every SLO limit. From each capacity follow the replicas needed for the target rate
and their cost (one device per replica, at the profile's price). The candidate needing the
fewest replicas (then: the most headroom) is confirmed by one fleet simulation at the target
rate; if that fleet misses the SLO (a router spreads load unevenly), one more replica is tried,
up to ``MAX_EXTRA_REPLICAS``.
"""

from __future__ import annotations

import math
from typing import Any

from specsim.bounds import MAX_REPLICAS
from specsim.comparison import Change, compare, regressions_json
from specsim.planning.capacity.capacity_pareto import deployment_rows, pareto_points
from specsim.planning.capacity.capacity_plan import (  # noqa: F401 (OFF, prepare: the command's names)
    OFF,
    Candidate,
    CapacityPlan,
    prepare,
)
from specsim.planning.capacity.capacity_search import (
    CandidateResult,
    attainment_of,
    attains_slo,
    find_capacities,
    replica_price,
)
from specsim.planning.common import metric, not_fitting_rows
from specsim.planning.sweep.points import SweepPoint
from specsim.planning.sweep.sweeper import PointResult, Sweeper

MAX_EXTRA_REPLICAS = 3
MAX_RECHECKS = 2  # the next candidates confirmed when the first check needed more replicas


def ranked(results: list[CandidateResult]) -> list[CandidateResult]:
    """The candidates that sustain a rate, best first: the cheapest fleet; at equal cost
    speculation off before speculation, then the fewest replicas, the highest capacity per
    device, a fixed k before the adaptive policy. Speculation that saves nothing still adds a
    drafter to deploy and keep in step with the target (and a draft model's prefill to every
    TTFT); ``cost_ties`` names such a tie for the report."""
    order = {id(r): i for i, r in enumerate(results)}
    return sorted(
        (r for r in results if r.replicas is not None),
        key=lambda r: (
            r.cost_per_hour,
            r.candidate.drafter is not None,
            r.replicas,
            -r.capacity / r.candidate.devices,
            r.candidate.policy == "adaptive",
            order[id(r)],
        ),
    )


def choose_candidate(results: list[CandidateResult]) -> CandidateResult | None:
    """The first of ``ranked`` (None: no candidate sustains a rate)."""
    return next(iter(ranked(results)), None)


def cost_ties(results: list[CandidateResult], chosen: CandidateResult | None) -> dict | None:
    """The speculative candidates whose fleet costs what the chosen one's does, passed over
    because ``chosen`` runs without speculation, and why (None: no such tie)."""
    if chosen is None or chosen.candidate.drafter is not None:
        return None
    tied = [
        r
        for r in results
        if r.candidate.drafter is not None
        and r.cost_per_hour is not None
        and math.isclose(r.cost_per_hour, chosen.cost_per_hour, rel_tol=1e-9)
    ]
    if not tied:
        return None
    best = max(tied, key=lambda r: r.capacity / r.candidate.devices)
    cost = f"${chosen.cost_per_hour:,.2f}/hour"
    if best.replicas == chosen.replicas:
        on = f"replicas and cost ({best.replicas} replicas, {cost})"
    else:
        on = f"cost ({cost}; {best.replicas} replicas against {chosen.replicas})"
    head = f"{best.candidate.label} ties with speculation off on {on}"
    capacities = f"{best.capacity:.4g} against {chosen.capacity:.4g} req/s per replica"
    if best.capacity / best.candidate.devices > chosen.capacity / chosen.candidate.devices:
        why = (
            f"speculation would add headroom ({capacities}) but no saving, so the simpler "
            "setting wins the tie"
        )
    else:
        why = f"speculation adds no headroom either ({capacities}), and the simpler setting wins"
    return {
        "candidates": [r.candidate.label for r in tied],
        "reason": f"{head}: {why}: no drafter to deploy and keep in step with the target",
    }


def off_result(results: list[CandidateResult], candidate: Candidate) -> CandidateResult:
    """Speculation off on ``candidate``'s deployment."""
    return next(
        r
        for r in results
        if r.candidate.drafter is None and r.candidate.deployment is candidate.deployment
    )


def fleet_point(plan: CapacityPlan, chosen: CandidateResult, replicas: int) -> SweepPoint:
    extra = [f"fleet.replicas={replicas}"]
    requests = plan.scenario.workload.requests
    if requests is not None and plan.scale.times is None:
        # Keep each replica's share of requests as long as in the one-replica runs.
        extra.append(f"workload.requests={requests * replicas}")
    point = plan.point(chosen.candidate, plan.scale.knob(plan.target_rps), extra)
    return SweepPoint(point.scenario, point.overrides, {**point.tags, "replicas": replicas})


def confirm(
    plan: CapacityPlan, chosen: CandidateResult, sweeper: Sweeper
) -> list[tuple[int, PointResult]]:
    """Fleet simulations at the target rate: the planned size, then more until the SLO holds."""
    runs = []
    # A fleet past MAX_REPLICAS cannot be simulated: the recommendation stays unconfirmed.
    last = min(chosen.replicas + MAX_EXTRA_REPLICAS, MAX_REPLICAS)
    for replicas in range(chosen.replicas, last + 1):
        (result,) = sweeper.run([fleet_point(plan, chosen, replicas)], desc="fleet check")
        runs.append((replicas, result))
        if result.ok and attains_slo(result.summary, plan.attainment):
            break
        if not result.ok:
            break
    return runs


def baseline_fleet(
    plan: CapacityPlan, results: list[CandidateResult], chosen: CandidateResult | None, sweeper
) -> tuple[int, PointResult] | None:
    """Speculation off on the replicas its capacity calls for, at the target rate: what the
    chosen speculative candidate's fleet is compared with, metric by metric (None when the
    choice is speculation off, or speculation off sustains no rate)."""
    if chosen is None:
        return None
    off = off_result(results, chosen.candidate)
    if chosen is off or off.replicas is None:
        return None
    (result,) = sweeper.run([fleet_point(plan, off, off.replicas)], desc="speculation-off fleet")
    return off.replicas, result


def run(plan: CapacityPlan, sweeper: Sweeper) -> dict[str, Any]:
    results = find_capacities(plan, sweeper)
    chosen, fleet, rechecked = cheapest_confirmed(plan, results, sweeper)
    baseline = baseline_fleet(plan, results, chosen, sweeper)
    return {
        "candidates": results,
        "chosen": chosen,
        "fleet": fleet,
        "baseline_fleet": baseline,
        "rechecked": rechecked,
    }


def confirmed_cost(plan: CapacityPlan, entry: CandidateResult, fleet) -> float | None:
    """What the fleet check's last fleet costs per hour, if it met the SLO."""
    if not fleet or not (fleet[-1][1].ok and attains_slo(fleet[-1][1].summary, plan.attainment)):
        return None
    return fleet[-1][0] * replica_price(plan, entry.candidate)


def cheapest_confirmed(plan: CapacityPlan, results: list[CandidateResult], sweeper: Sweeper):
    """The chosen candidate and its fleet check. A check that needed more replicas may cost
    more than the next candidates' plans (another deployment's, or a setting tied on cost that
    ``ranked`` put second): those are checked too, in ranking order while their planned cost is
    below the cheapest confirmed one (up to ``MAX_RECHECKS``), and the cheapest confirmed fleet
    wins (ties: the first checked). Returns (chosen, its fleet runs, [(other candidate, its
    fleet runs)] checked too)."""
    order = ranked(results)
    if not order:
        return None, [], []
    checked = [(order[0], confirm(plan, order[0], sweeper))]
    for entry in order[1 : MAX_RECHECKS + 1]:
        costs = [confirmed_cost(plan, e, f) for e, f in checked]
        if entry.cost_per_hour >= min((c for c in costs if c is not None), default=math.inf):
            break
        checked.append((entry, confirm(plan, entry, sweeper)))
    costs = [confirmed_cost(plan, e, f) for e, f in checked]
    confirmed = [i for i, c in enumerate(costs) if c is not None]
    pick = min(confirmed, key=lambda i: (costs[i], i)) if confirmed else 0
    entry, fleet = checked[pick]
    return entry, fleet, [pair for i, pair in enumerate(checked) if i != pick]


def fleet_changes(outcome: dict[str, Any]) -> list[Change] | None:
    """The chosen fleet against speculation off's, every compared metric (None: no pair)."""
    baseline, fleet = outcome.get("baseline_fleet"), outcome["fleet"]
    if baseline is None or not fleet or not (fleet[-1][1].ok and baseline[1].ok):
        return None
    return compare(fleet[-1][1].summary, baseline[1].summary)


def json_summary(plan: CapacityPlan, outcome: dict[str, Any], sweeper: Sweeper) -> dict[str, Any]:
    chosen: CandidateResult | None = outcome["chosen"]
    off = off_result(outcome["candidates"], (chosen or outcome["candidates"][0]).candidate)
    fleet = outcome["fleet"]
    final = fleet[-1] if fleet else None
    fleet_ok = bool(final and final[1].ok and attains_slo(final[1].summary, plan.attainment))
    summary = {
        "command": "plan capacity",
        "scenario": plan.scenario_path,
        "target_rps": plan.target_rps,
        "tolerance": plan.tolerance,
        "attainment": plan.attainment,
        "candidates": [
            {
                "label": r.candidate.label,
                "drafter": r.candidate.drafter,
                "k": r.candidate.k,
                "policy": r.candidate.policy,
                "capacity_rps": r.capacity,
                "bracket_rps": [r.capacity, r.first_failing],
                "status": "failed" if r.error else r.search.status,
                "error": r.error,
                "probes": len(r.probes),
                "replicas": r.replicas,
                "cost_usd_per_hour": r.cost_per_hour,
                "cost_usd_per_million_tokens": r.cost_per_million,
            }
            for r in outcome["candidates"]
        ],
        "recommendation": None
        if chosen is None
        else {
            "candidate": chosen.candidate.label,
            "replicas": final[0] if fleet_ok else None,
            "planned_replicas": chosen.replicas,
            "replicas_without_speculation": off.replicas,
            "cost_usd_per_hour": None
            if not fleet_ok
            else final[0] * replica_price(plan, chosen.candidate),
            "fleet_meets_slo": fleet_ok,
            "fleet": _fleet_figures(final[1].summary) if final and final[1].ok else None,
            "tie_on_cost": cost_ties(outcome["candidates"], chosen),
            **_against_off(plan, outcome),
        },
        "fleet_checked_too": [
            {
                "candidate": entry.candidate.label,
                "planned_replicas": entry.replicas,
                "replicas": fleet[-1][0] if fleet else None,
                "cost_usd_per_hour": cost,
                "meets_slo": cost is not None,
            }
            for entry, fleet in outcome["rechecked"]
            for cost in [confirmed_cost(plan, entry, fleet)]
        ],
        **sweeper.stats.json(),
    }
    if plan.deployments:
        _with_deployments(plan, outcome, summary)
    elif plan.unfit:  # a plain plan names its misfits only when it has some
        summary["not_fitting"] = not_fitting_rows(plan.unfit)
    return summary


def _with_deployments(plan: CapacityPlan, outcome: dict[str, Any], summary: dict) -> None:
    """The deployment search's parts of the summary: each candidate's TP and devices, each
    deployment's fit and cheapest fleet, the Pareto points and the chosen deployment."""
    for item, r in zip(summary["candidates"], outcome["candidates"], strict=True):
        item["deployment"] = r.candidate.deployment.label
        item["tensor_parallel_size"] = r.candidate.tp
        item["devices"] = None if r.replicas is None else r.replicas * r.candidate.devices
    summary["deployments"] = deployment_rows(plan, outcome["candidates"], choose_candidate)
    summary["not_fitting"] = not_fitting_rows(plan.unfit)
    summary["pareto"] = [p.__dict__ for p in pareto_points(outcome["candidates"])]
    rec, chosen = summary["recommendation"], outcome["chosen"]
    if rec is not None:
        rec["deployment"] = chosen.candidate.deployment.label
        rec["tensor_parallel_size"] = chosen.candidate.tp
        rec["devices"] = (
            None if rec["replicas"] is None else rec["replicas"] * chosen.candidate.devices
        )


def _against_off(plan: CapacityPlan, outcome: dict[str, Any]) -> dict[str, Any]:
    """The speculation-off fleet at the target rate and what is worse with the chosen one."""
    baseline = outcome.get("baseline_fleet")
    changes = fleet_changes(outcome)
    ok = baseline is not None and baseline[1].ok
    return {
        "speculation_off_fleet": None
        if baseline is None
        else {
            "replicas": baseline[0],
            "meets_slo": ok and attains_slo(baseline[1].summary, plan.attainment),
            "fleet": _fleet_figures(baseline[1].summary) if ok else None,
        },
        "compared_vs_speculation_off": None if changes is None else [c.metric for c in changes],
        "regressions_vs_speculation_off": None if changes is None else regressions_json(changes),
    }


def _fleet_figures(summary: dict[str, Any]) -> dict[str, Any]:
    figures = {
        f"{name}_{stat}": metric(summary, name, stat)
        for name in ("ttft_s", "tpot_s", "e2e_s")
        for stat in ("p50", "p90", "p99")
    }
    figures["slo_attainment"] = attainment_of(summary)
    figures["throughput_tokens_per_s"] = metric(summary, "throughput_tokens_per_s")
    figures["cost_usd_per_million_tokens"] = metric(summary, "cost_usd_per_million_tokens")
    return figures
