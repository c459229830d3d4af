"""Why each deployment (or prefill/decode pair) of ``plan capacity --disaggregated`` won or
lost, in one table for co-located and disaggregated layouts alike: the search's choice; one that
holds the SLO but costs more; one whose every layout tried missed the SLO, with its bottleneck
pool; one never reached because its cheapest layout costs more than the choice."""

from __future__ import annotations

from typing import Any

from specsim.planning.capacity.disagg import COLOCATED, DisaggregatedPlan, Layout, Search
from specsim.planning.capacity.disagg_search import meets
from specsim.planning.common import metric

CANDIDATE_COLUMNS = (
    "setting",
    "kind",
    "placement",
    "status",
    "layout",
    "price_per_hour_usd",
    "devices",
    "slo_attainment",
    "layouts_tried",
    "reason",
)
CHOSEN, COSTLIER, MISSED, NOT_REACHED = "chosen", "lost on cost", "missed the SLO", "not reached"


def candidate_rows(plan: DisaggregatedPlan, searches: list[Search]) -> list[dict[str, Any]]:
    """One row per search and placement, in the searches' order, then the layouts' (cheapest
    first)."""
    rows = []
    for search in searches:
        groups: dict[str | None, list[Layout]] = {}
        for layout in search.layouts:
            groups.setdefault(layout.placement, []).append(layout)
        for placement, layouts in groups.items():
            rows.append(_row(plan, search, placement, layouts))
    return rows


def _row(plan, search: Search, placement, layouts: list[Layout]) -> dict[str, Any]:
    tried = [lay for lay in layouts if lay in search.tried]
    passing = [lay for lay in tried if meets(search.tried[lay], plan.attainment)]
    chosen = search.chosen
    price = None if chosen is None else chosen.price(plan.pricing)
    if chosen is not None and chosen in layouts:
        status, shown = CHOSEN, chosen
        reason = f"the cheapest {search.kind} layout that holds the SLO"
    elif passing:
        status, shown = COSTLIER, passing[0]
        extra = shown.price(plan.pricing) - price
        reason = f"holds the SLO at ${extra:.2f}/h more than {chosen.label}"
    elif not tried:
        status, shown = NOT_REACHED, layouts[0]
        reason = (
            f"its cheapest layout costs ${shown.price(plan.pricing):.2f}/h, above "
            f"{chosen.label} at ${price:.2f}/h"
        )
    else:
        status = MISSED
        shown = max(tried, key=lambda lay: (_attained(search, lay), lay.price(plan.pricing)))
        top = max(lay.price(plan.pricing) for lay in tried)
        reason = f"every layout tried up to ${top:.2f}/h missed the SLO"
        missed = _missed_limits(search, shown)
        if missed:
            reason += f"; {missed}"
        if len(tried) < len(layouts):
            reason += "; the rest cost more than the choice"
    attained = _attained(search, shown) if shown in search.tried else None
    attained = None if attained is not None and attained < 0 else attained  # a failed run
    return {
        "setting": search.setting,
        "kind": search.kind,
        "placement": placement,
        "status": status,
        "layout": shown.label,
        "price_per_hour_usd": shown.price(plan.pricing),
        "devices": shown.devices(plan.pricing),
        "slo_attainment": attained,
        "layouts_tried": len(tried),
        "reason": reason,
    }


def _attained(search: Search, layout: Layout) -> float:
    result = search.tried[layout]
    value = metric(result.summary if result.ok else None, "slo_attainment")
    return -1.0 if value is None else value


# Which pool a missed limit points at: TTFT and queueing wait on prefill, TPOT on decode.
LIMIT_POOL = {"ttft_s": "prefill", "queueing_s": "prefill", "tpot_s": "decode"}
LIMIT_NAMES = {"ttft_s": "TTFT", "tpot_s": "TPOT", "e2e_s": "E2E", "queueing_s": "queueing"}


def _missed_limits(search: Search, layout: Layout) -> str | None:
    """The SLO limits ``layout``'s run misses at its 99th percentile and, split, the pool they
    point at (co-located: the limits alone)."""
    result = search.tried[layout]
    if not result.ok:
        return f"its simulation failed: {result.error}"
    summary = result.summary or {}
    missed = [
        (name, value, limit)
        for name, limit in (summary.get("slo") or {}).items()
        if (value := metric(summary, name, "p99")) is not None and value > limit
    ]
    if not missed:
        return None
    text = ", ".join(
        f"{LIMIT_NAMES[name]} p99 {value:.3g} s over {limit:g} s" for name, value, limit in missed
    )
    pools = {LIMIT_POOL[name] for name, _, _ in missed if name in LIMIT_POOL}
    if layout.kind == COLOCATED or len(pools) != 1:
        return f"at {layout.label}: {text}"
    return f"the {pools.pop()} pool is the bottleneck at {layout.label} ({text})"


def deployment_rows(plan: DisaggregatedPlan) -> list[dict[str, Any]]:
    return [
        {
            "deployment": d.label,
            "tensor_parallel_size": d.tp,
            "precision": d.precision,
            "fits": d.fits,
            "reason": d.reason,
            "profile": None if d.profile is None else str(d.profile.path),
            "price_per_hour_usd": d.replica_price if d.fits else None,
            "devices": d.devices,
        }
        for d in plan.deployments
    ]
