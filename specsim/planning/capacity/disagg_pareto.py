"""The Pareto frontier of ``plan capacity --disaggregated``: co-located and prefill/decode
layouts on one frontier.

Every layout the searches simulated at the target rate that met the SLO (``disagg_search.meets``)
is a point, whichever search it belongs to (co-located or xPyD, speculation on or off, on any
deployment): per-user speed (``capacity_pareto.user_speed``, 1 / median TPOT) against the fleet's
output tokens per second over all its devices (each pool's replicas x TP). The frontier is
``capacity_pareto``'s: the points no other beats on both. The choices' capacity probes above the
target are not points: they measure one layout at other loads, not another fleet.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from specsim.planning.capacity.capacity_pareto import mark_frontier, pareto_figure, user_speed
from specsim.planning.capacity.disagg import DisaggregatedPlan, Layout, Search
from specsim.planning.capacity.disagg_search import meets
from specsim.planning.common import metric, rows_csv


@dataclass(frozen=True)
class LayoutPoint:
    """One layout within the SLO, labelled by its placement: ``kind`` (co-located or
    disaggregated), ``layout`` (n co-located or xPyD, with its deployments), ``placement`` (the
    deployment or pair; null: the scenario's own replicas) and ``setting`` (speculation or
    speculation off)."""

    setting: str
    kind: str
    layout: str
    placement: str | None
    prefill_replicas: int
    decode_replicas: int
    devices: int
    throughput_tokens_per_s: float
    user_tokens_per_s: float
    tokens_per_s_per_device: float
    on_frontier: bool = False


COLUMNS = tuple(f.name for f in fields(LayoutPoint))


def layout_point(layout: Layout, devices: int, summary: dict[str, Any]) -> LayoutPoint | None:
    """A layout's point from its simulation's summary (None when it lacks TPOT or throughput:
    no request decoded)."""
    speed = user_speed(summary)
    throughput = metric(summary, "throughput_tokens_per_s")
    if speed is None or throughput is None:
        return None
    return LayoutPoint(
        layout.setting,
        layout.kind,
        layout.label,
        layout.placement,
        layout.prefill,
        layout.decode,
        devices,
        throughput,
        speed,
        throughput / devices,
    )


def pareto_points(plan: DisaggregatedPlan, searches: list[Search]) -> list[LayoutPoint]:
    """Every layout tried that met the SLO, in the searches' order, marked on or off the
    frontier."""
    found = [
        layout_point(layout, layout.devices(plan.pricing), result.summary)
        for search in searches
        for layout, result in search.tried.items()
        if meets(result, plan.attainment)
    ]
    return mark_frontier([p for p in found if p is not None])


def pareto_csv(points: list[dict[str, Any]]) -> str:
    """summary.json's ``pareto`` rows, most tokens per device first (as the co-located plan's
    pareto.csv)."""
    rows = sorted(points, key=lambda p: (-p["tokens_per_s_per_device"], -p["user_tokens_per_s"]))
    return rows_csv(COLUMNS, rows)


def pareto_plot(points: list[dict[str, Any]]):
    """The frontier plot, one series per kind and setting (co-located against disaggregated,
    each with speculation and without)."""
    return pareto_figure(
        [LayoutPoint(**p) for p in points],
        group=lambda p: f"{p.kind}, {p.setting}",
        title="Layouts within the SLO at the target rate",
    )


def frontier_line(points: list[dict[str, Any]]) -> str:
    """The human report's line: how many layouts met the SLO (the plot's points), how many of
    them are on the frontier, and which."""
    if not points:
        return "Pareto frontier: no layout met the SLO (pareto.csv is empty)"
    front = sorted(
        (p for p in points if p["on_frontier"]), key=lambda p: -p["tokens_per_s_per_device"]
    )
    named = "; ".join(
        f"{p['layout']}, {p['setting']} ({p['user_tokens_per_s']:.4g} tokens/s per user, "
        f"{p['tokens_per_s_per_device']:.4g} per device)"
        for p in front
    )
    return (
        f"Pareto frontier (pareto.csv, pareto_frontier.png): {len(points)} layouts within the "
        f"SLO, {len(front)} of them on the frontier: {named}"
    )
