"""``plan capacity``'s search: per candidate, the highest rate one replica sustains within the
SLO (a ``Bisection`` on the load knob, the searches advancing together one batch of probes per
round), and from it the replicas and cost the target rate needs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from specsim.planning.capacity.capacity_plan import RANGE_FACTOR, Candidate, CapacityPlan
from specsim.planning.common import metric
from specsim.planning.rates import ArrivalScale
from specsim.planning.sweep.search import Bisection
from specsim.planning.sweep.sweeper import Sweeper


def attainment_of(summary: dict[str, Any] | None) -> float | None:
    """Share of requests that met the SLO: the summary's own figure, or goodput x time / count."""
    if summary is None:
        return None
    direct = metric(summary, "slo_attainment")
    if direct is not None:
        return direct
    goodput, duration = metric(summary, "goodput_requests_per_s"), metric(summary, "duration_s")
    requests = metric(summary, "requests")
    if None in (goodput, duration, requests) or not requests:
        return None
    return min(1.0, goodput * duration / requests)


def attains_slo(summary: dict[str, Any] | None, attainment: float) -> bool:
    share = attainment_of(summary)
    return share is not None and share >= attainment - 1e-12


@dataclass
class CandidateResult:
    """One candidate's search. The search runs on the load knob; ``capacity`` is in req/s."""

    candidate: Candidate
    search: Bisection
    scale: ArrivalScale
    at_capacity: dict[str, Any] | None = None  # summary of the highest sustained probe
    error: str | None = None
    replicas: int | None = None
    cost_per_hour: float | None = None
    cost_per_million: float | None = None
    probes: list[tuple[float, bool]] = field(default_factory=list)
    # (rate, share of requests meeting the SLO) for every probe, sorted by rate.
    attainment_curve: list[tuple[float, float | None]] = field(default_factory=list)
    # (rate, summary) of every probe that met the SLO, sorted by rate: the Pareto points.
    sustained: list[tuple[float, dict[str, Any]]] = field(default_factory=list)

    @property
    def capacity(self) -> float | None:
        knob = self.search.estimate
        return None if knob is None else self.scale.rate(knob)

    @property
    def first_failing(self) -> float | None:
        knob = self.search.hi
        return None if knob is None else self.scale.rate(knob)


def find_capacities(plan: CapacityPlan, sweeper: Sweeper) -> list[CandidateResult]:
    start = plan.scale.axis.base
    results = {
        c.label: CandidateResult(
            c,
            scale=plan.scale,
            search=Bisection(
                start=start,
                rel_tol=plan.tolerance,
                lower_limit=start / RANGE_FACTOR,
                upper_limit=start * RANGE_FACTOR,
            ),
        )
        for c in plan.candidates
    }
    summaries: dict[tuple[str, float], dict[str, Any]] = {}
    rounds = 0
    while True:
        active = [r for r in results.values() if not r.search.done and r.error is None]
        if not active:
            break
        rounds += 1
        per_search = max(1, sweeper.parallelism // len(active))
        points = [
            plan.point(r.candidate, knob)
            for r in active
            for knob in r.search.next_probes(per_search)
        ]
        outcomes: dict[str, list[tuple[float, bool]]] = {}
        for result in sweeper.run(points, desc=f"capacity round {rounds}"):
            label, knob = result.tags["candidate"], result.tags["knob"]
            if not result.ok:
                results[label].error = result.error
                continue
            summaries[(label, knob)] = result.summary
            outcomes.setdefault(label, []).append(
                (knob, attains_slo(result.summary, plan.attainment))
            )
        for label, probes in outcomes.items():
            if results[label].error is None:
                results[label].search.record_all(probes)
    for entry in results.values():
        entry.probes = list(entry.search.probes)
        entry.attainment_curve = sorted(
            (plan.scale.rate(knob), attainment_of(summary))
            for (label, knob), summary in summaries.items()
            if label == entry.candidate.label
        )
        entry.sustained = sorted(
            (
                (plan.scale.rate(knob), summary)
                for (label, knob), summary in summaries.items()
                if label == entry.candidate.label and attains_slo(summary, plan.attainment)
            ),
            key=lambda item: item[0],
        )
        if entry.search.estimate is not None:
            entry.at_capacity = summaries.get((entry.candidate.label, entry.search.estimate))
        _price(plan, entry)
    return list(results.values())


def tokens_per_request(summary: dict[str, Any] | None) -> float | None:
    throughput, duration = metric(summary, "throughput_tokens_per_s"), metric(summary, "duration_s")
    requests = metric(summary, "requests")
    if None in (throughput, duration, requests) or not requests:
        return None
    return throughput * duration / requests


def replica_price(plan: CapacityPlan, candidate: Candidate) -> float:
    """A replica's price per hour: its deployment's, else the profile's (tp x the device's)."""
    if candidate.deployment is not None:
        return candidate.deployment.replica_price
    return plan.profile.profile.hardware.price_per_hour_usd


def _price(plan: CapacityPlan, entry: CandidateResult) -> None:
    if not entry.capacity:
        return
    price = replica_price(plan, entry.candidate)
    entry.replicas = math.ceil(plan.target_rps / entry.capacity - 1e-9)
    entry.cost_per_hour = entry.replicas * price
    per_request = tokens_per_request(entry.at_capacity)
    if per_request:
        tokens_per_hour = plan.target_rps * per_request * 3600
        entry.cost_per_million = entry.cost_per_hour / tokens_per_hour * 1e6
