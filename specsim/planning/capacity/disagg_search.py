"""The disaggregated plan's searches run: layouts simulated in rounds until each search has chosen
one or run out, then each choice's capacity bisected upwards from the target."""

from __future__ import annotations

from specsim.planning.capacity.capacity_split import Headroom
from specsim.planning.capacity.disagg import DisaggregatedPlan, Search
from specsim.planning.common import metric
from specsim.planning.sweep.sweeper import PointResult, Sweeper


def meets(result: PointResult | None, attainment: float) -> bool:
    value = metric(result.summary if result is not None and result.ok else None, "slo_attainment")
    return value is not None and value >= attainment


def run(plan: DisaggregatedPlan, sweeper: Sweeper) -> list[Search]:
    """Advance the searches round by round until each has chosen a layout or run out, then
    bisect each choice's capacity."""
    size = max(2, sweeper.parallelism)
    while True:
        rounds = [(s, s.next_round(size)) for s in plan.searches if not s.done]
        rounds = [(s, layouts) for s, layouts in rounds if layouts]
        for search in plan.searches:
            if not search.done and not search.next_round(1):
                search.done = True  # every layout within max_replicas missed the SLO
        if not rounds:
            break
        points = [plan.point(layout) for _, layouts in rounds for layout in layouts]
        results = iter(sweeper.run(points, desc="layouts"))
        for search, layouts in rounds:
            for layout in layouts:
                search.tried[layout] = next(results)
            passing = [lay for lay in layouts if meets(search.tried[lay], plan.attainment)]
            if passing:
                search.chosen, search.done = passing[0], True
    if plan.scale is not None:
        find_headroom(plan, sweeper)
    return plan.searches


def find_headroom(plan: DisaggregatedPlan, sweeper: Sweeper) -> None:
    """Each chosen layout's highest sustained load, the bisections advancing together with
    ``per_search`` probes each a round, as the co-located capacity search does."""
    target = plan.scale.knob(plan.target_rps)
    chosen = [s for s in plan.searches if s.chosen is not None]
    for search in chosen:
        search.headroom = Headroom.above(target, plan.tolerance)
    while True:
        active = [s for s in chosen if not s.headroom.done]
        if not active:
            return
        per_search = max(1, sweeper.parallelism // len(active))
        asked = [(s, knob) for s in active for knob in s.headroom.search.next_probes(per_search)]
        points = [plan.point(s.chosen, plan.scale.axis.overrides(knob)) for s, knob in asked]
        outcomes: dict[int, list[tuple[float, bool]]] = {}
        for (search, knob), result in zip(asked, sweeper.run(points, desc="headroom"), strict=True):
            if not result.ok:
                search.headroom.error = result.error
            outcomes.setdefault(id(search), []).append((knob, meets(result, plan.attainment)))
        for search in active:
            if search.headroom.error is None:
                search.headroom.search.record_all(outcomes[id(search)])
