"""``plan capacity`` over deployments: each deployment's cheapest fleet and the Pareto frontier.

Every probe that met the SLO is a point: per-user speed (output tokens per second one request
sees, 1 / its median TPOT) against throughput per device (the replica's output tokens per
second over its ``tp`` devices). A point is on the frontier when no other point is at least as
good on both and better on one: faster for each user, or more tokens from each device bought.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from operator import itemgetter
from typing import Any

from specsim.planning.common import metric
from specsim.planning.plots import Figure, Panel, Series
from specsim.planning.report import Column, Paragraph, Table, column_table


@dataclass(frozen=True)
class ParetoPoint:
    candidate: str
    deployment: str
    tp: int
    rate_rps: float
    user_tokens_per_s: float
    tokens_per_s_per_device: float
    on_frontier: bool = False


def frontier_flags(points: list[tuple[float, float]]) -> list[bool]:
    """For each (x, y), whether no other point dominates it (>= on both, > on one); equal
    points are all kept."""
    return [
        not any(ox >= x and oy >= y and (ox > x or oy > y) for ox, oy in points) for x, y in points
    ]


def user_speed(summary: dict[str, Any]) -> float | None:
    """Output tokens per second one request sees while it decodes: 1 / its median TPOT."""
    tpot = metric(summary, "tpot_s", "p50")
    return 1.0 / tpot if tpot else None


def pareto_points(results: list) -> list[ParetoPoint]:
    """Every sustained probe of every candidate, marked on or off the frontier."""
    raw = []
    for r in results:
        deployment = r.candidate.deployment
        for rate, summary in r.sustained:
            speed = user_speed(summary)
            throughput = metric(summary, "throughput_tokens_per_s")
            if speed is None or throughput is None:
                continue
            raw.append(
                ParetoPoint(
                    r.candidate.label,
                    "" if deployment is None else deployment.label,
                    r.candidate.tp,
                    rate,
                    speed,
                    throughput / r.candidate.devices,
                )
            )
    return mark_frontier(raw)


def mark_frontier(points: list) -> list:
    """The points (frozen dataclasses with ``user_tokens_per_s``, ``tokens_per_s_per_device``
    and ``on_frontier``: a ``ParetoPoint``, or a disaggregated plan's layout point), each
    marked on or off the frontier."""
    flags = frontier_flags([(p.user_tokens_per_s, p.tokens_per_s_per_device) for p in points])
    return [replace(p, on_frontier=flag) for p, flag in zip(points, flags, strict=True)]


PARETO_COLUMNS: list[Column] = [
    ("candidate", lambda p: p.candidate),
    ("deployment", lambda p: p.deployment),
    ("TP", lambda p: p.tp),
    ("rate per replica (req/s)", lambda p: p.rate_rps),
    ("tokens/s per user", lambda p: p.user_tokens_per_s),
    ("tokens/s per device", lambda p: p.tokens_per_s_per_device),
    ("on frontier", lambda p: "yes" if p.on_frontier else ""),
]


def pareto_table(points: list[ParetoPoint]) -> Table:
    return column_table(
        "pareto",
        PARETO_COLUMNS,
        sorted(points, key=lambda p: (-p.tokens_per_s_per_device, -p.user_tokens_per_s)),
        "Every probe that met the SLO: per-user speed (1 / median TPOT) against output tokens "
        "per second per device; the frontier is the points no other beats on both",
    )


def pareto_figure(
    points: list,
    group: Callable[[Any], str] = lambda p: p.deployment,
    title: str = "Probes within the SLO",
) -> Figure:
    """The points as one series per ``group`` (default: per deployment) and the frontier."""
    panel = Panel(
        title,
        "throughput per device",
        "speed per user",
        xunit="output tokens/s",
        yunit="output tokens/s",
    )
    groups = sorted({group(p) for p in points})
    for name in groups:
        mine = sorted(
            (p for p in points if group(p) == name), key=lambda p: p.tokens_per_s_per_device
        )
        panel.series.append(
            Series(
                name or "scenario's profile",
                [p.tokens_per_s_per_device for p in mine],
                [p.user_tokens_per_s for p in mine],
                linestyle="none",
            )
        )
    # The frontier is a line through rings drawn under the points: each point keeps its
    # group's colour and marker, on the frontier or not.
    front = sorted((p for p in points if p.on_frontier), key=lambda p: p.tokens_per_s_per_device)
    panel.series.insert(
        0,
        Series(
            "Pareto frontier",
            [p.tokens_per_s_per_device for p in front],
            [p.user_tokens_per_s for p in front],
            marker="o",
            color="0.45",
            size=12.0,
        ),
    )
    return Figure(
        "pareto_frontier",
        "Per-user speed against throughput per device: the frontier is what each device's "
        "share of tokens costs in speed per user",
        [panel],
        ncols=1,
    )


def deployment_rows(plan, results: list, choose) -> list[dict[str, Any]]:
    """Per deployment: whether it fits, and the candidate ``choose`` (the plan's ranking)
    picks among its own."""
    rows = []
    for d in plan.deployments:
        best = choose([r for r in results if r.candidate.deployment is d])
        unfit = [why for label, why in plan.unfit if label.startswith(f"{d.label}, ")]
        rows.append(
            {
                "deployment": d.label,
                "tensor_parallel_size": d.tp,
                "precision": d.precision,
                "source": d.source,
                "profile": None if d.profile is None else str(d.profile.path),
                "fits": d.fits,
                "reason": d.reason,
                "candidates_not_fitting": [
                    label for label, _ in plan.unfit if label.startswith(f"{d.label}, ")
                ],
                "not_fitting_reason": unfit[0] if unfit else None,
                "device_price_usd_per_hour": d.device_price,
                "best_candidate": None
                if best is None
                else best.candidate.label.removeprefix(f"{d.label}, "),
                "replicas": None if best is None else best.replicas,
                "devices": None if best is None else best.replicas * d.devices,
                "cost_usd_per_hour": None if best is None else best.cost_per_hour,
            }
        )
    return rows


def _why_not(r: dict[str, Any]) -> str:
    if r["reason"]:
        return r["reason"]
    if not r["candidates_not_fitting"]:
        return ""
    count = len(r["candidates_not_fitting"])
    return f"{count} candidate(s) do not fit: {r['not_fitting_reason']}"


DEPLOYMENT_COLUMNS: list[Column] = [
    ("deployment", itemgetter("deployment")),
    ("TP", itemgetter("tensor_parallel_size")),
    ("precision", itemgetter("precision")),
    ("fits", lambda r: "yes" if r["fits"] else "no"),
    ("cheapest candidate", itemgetter("best_candidate")),
    ("replicas", itemgetter("replicas")),
    ("devices", itemgetter("devices")),
    ("$/hour", itemgetter("cost_usd_per_hour")),
    ("why not", _why_not),
]


def deployment_table(rows: list[dict[str, Any]], target_rps: float) -> Table:
    return column_table(
        "deployments",
        DEPLOYMENT_COLUMNS,
        rows,
        f"Each deployment's cheapest fleet for {target_rps:g} req/s (price = replicas x TP x "
        "the device's price)",
    )


def checked_too_words(item: dict[str, Any]) -> str:
    """One of summary.json's ``fleet_checked_too`` in words: a candidate whose fleet was
    checked because a cheaper plan's check needed more replicas, and what its check found."""
    outcome = (
        f"its fleet met the SLO with {item['replicas']} replicas, "
        f"${item['cost_usd_per_hour']:,.2f}/hour"
        if item["meets_slo"]
        else f"no fleet of it up to {item['replicas']} replicas met the SLO"
    )
    return (
        f"A fleet check needed more replicas than planned, so {item['candidate']} (planned "
        f"{item['planned_replicas']}) was checked as well: {outcome}."
    )


def reasons(
    rows: list[dict[str, Any]], chosen, confirmed: int | None, checked_too: list[dict[str, Any]]
) -> list[Paragraph]:
    """Why the chosen deployment: its fleet by capacity and as the fleet check confirmed it,
    the other deployments' cheapest fleets, and what did not fit."""
    if chosen is None:
        return []
    mine = chosen.candidate.deployment
    price = chosen.cost_per_hour / chosen.replicas
    text = (
        f"By capacity the cheapest fleet is **{chosen.replicas} x {mine.label}** "
        f"({chosen.replicas * mine.devices} devices at ${price / mine.devices:g}/hour each, "
        f"${chosen.cost_per_hour:,.2f}/hour) with "
        f"{chosen.candidate.label.removeprefix(mine.label + ', ')}, "
        f"{chosen.capacity:.4g} req/s per replica"
    )
    if confirmed is None:
        text += "; the fleet check did not confirm it (see the answer)."
    elif confirmed != chosen.replicas:
        text += (
            f"; the fleet check needed {confirmed} replicas ({confirmed * mine.devices} devices, "
            f"${confirmed * price:,.2f}/hour)."
        )
    else:
        text += "; the fleet check confirmed it."
    others = sorted(
        (r for r in rows if r["deployment"] != mine.label and r["cost_usd_per_hour"] is not None),
        key=lambda r: r["cost_usd_per_hour"],
    )
    words = [
        f"{r['deployment']} needs {r['replicas']} replicas ({r['devices']} devices, "
        f"${r['cost_usd_per_hour']:,.2f}/hour) with {r['best_candidate']}"
        for r in others
    ]
    blocks = [Paragraph(text)]
    if words:
        blocks.append(Paragraph("Against the other deployments: " + "; ".join(words) + "."))
    blocks += [Paragraph(checked_too_words(item)) for item in checked_too]
    unfit = [f"{r['deployment']}: {r['reason']}" for r in rows if not r["fits"]]
    if unfit:
        blocks.append(Paragraph("Not fitting: " + "; ".join(unfit) + "."))
    return blocks
