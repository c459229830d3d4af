"""The report of ``plan capacity --disaggregated``: each search's choice with its reasons (which
pool limits it, the transfer's share of TTFT, co-located against disaggregated), every layout
tried as a CSV row, the short human summary, and report.html / report.md as every plan writes."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

from specsim.fileio import atomic_output_dir, dump_json
from specsim.planning.capacity.capacity_split_report import (
    CANDIDATE_COLUMNS,
    candidate_rows,
    deployment_rows,
)
from specsim.planning.capacity.disagg import (
    COLOCATED,
    DISAGGREGATED,
    DisaggregatedPlan,
    Layout,
    Search,
    fewer,
)
from specsim.planning.capacity.disagg_pareto import (
    frontier_line,
    pareto_csv,
    pareto_plot,
    pareto_points,
)
from specsim.planning.capacity.disagg_search import meets
from specsim.planning.common import metric, not_fitting_rows, rows_csv
from specsim.planning.report import Paragraph, Report, Section, write_report

CSV_COLUMNS = (
    "setting",
    "layout",
    "placement",
    "prefill_replicas",
    "decode_replicas",
    "devices",
    "price_per_hour_usd",
    "meets_slo",
    "slo_attainment",
    "ttft_p90_s",
    "tpot_p90_s",
    "throughput_tokens_per_s",
    "cost_usd_per_million_tokens",
    "transfer_share_of_ttft",
    "prefill_busy_fraction",
    "decode_busy_fraction",
    "link_busy_fraction",
)


def layout_figures(plan: DisaggregatedPlan, layout: Layout, result) -> dict[str, Any]:
    """One layout's row: its size and price, and what its simulation measured."""
    summary = result.summary if result is not None and result.ok else None
    split = (summary or {}).get("disaggregation") or {}
    busy = split.get("busy_fraction") or {}
    return {
        "setting": layout.setting,
        "layout": layout.label,
        "placement": layout.placement,
        "prefill_replicas": layout.prefill,
        "decode_replicas": layout.decode,
        "devices": layout.devices(plan.pricing),
        "price_per_hour_usd": layout.price(plan.pricing),
        "meets_slo": meets(result, plan.attainment),
        "slo_attainment": metric(summary, "slo_attainment"),
        "ttft_p90_s": metric(summary, "ttft_s", "p90"),
        "tpot_p90_s": metric(summary, "tpot_s", "p90"),
        "throughput_tokens_per_s": metric(summary, "throughput_tokens_per_s"),
        "cost_usd_per_million_tokens": metric(summary, "cost_usd_per_million_tokens"),
        "transfer_share_of_ttft": split.get("transfer_share_of_ttft"),
        "prefill_busy_fraction": busy.get("prefill"),
        "decode_busy_fraction": busy.get("decode") if layout.prefill else None,
        "link_busy_fraction": split.get("link_busy_fraction"),
    }


def _fewer(search: Search, layout: Layout, dx: int, dy: int) -> tuple[Layout, float] | None:
    """One replica fewer in a pool, and the share of requests it kept within the SLO (when
    that layout was tried)."""
    smaller = fewer(layout, dx, dy)
    result = search.tried.get(smaller)
    if result is None or not result.ok:
        return None
    return smaller, metric(result.summary, "slo_attainment")


def _bottleneck(search: Search, layout: Layout, row: dict[str, Any]) -> list[str]:
    """The pool whose replica the layout can least spare: the one whose removal keeps the
    fewest requests within the SLO; busy fractions beside it."""
    out = []
    fewer = {
        name: found
        for name, dx, dy in (("prefill", -1, 0), ("decode", 0, -1))
        if (found := _fewer(search, layout, dx, dy)) is not None
    }
    for name, (smaller, attained) in fewer.items():
        out.append(f"one {name} replica fewer ({smaller.label}): SLO met for {attained:.1%}")
    if fewer:
        pool = min(fewer, key=lambda name: fewer[name][1])
        link, prefill = row["link_busy_fraction"], row["prefill_busy_fraction"]
        if pool == "prefill" and link is not None and prefill is not None and link > prefill:
            pool = "prefill pool's KV links are"  # they carry bytes longer than it computes
        else:
            pool = f"{pool} pool is"
        out.insert(0, f"the {pool} the bottleneck")
    else:
        out.insert(0, f"{layout.label} is the smallest disaggregated layout")
    busy = [(name, row[f"{name}_busy_fraction"]) for name in ("prefill", "decode")]
    if all(value is not None for _, value in busy):
        out.append("busy " + ", ".join(f"{name} {value:.0%}" for name, value in busy))
    return out


def reasons(plan: DisaggregatedPlan, search: Search) -> list[str]:
    """Why a search chose what it chose (or nothing)."""
    if search.chosen is None:
        return [
            f"no {search.kind} layout within {plan.max_replicas} replicas holds the SLO for "
            f"{plan.attainment:.0%} of requests at {plan.target_rps:g} req/s"
        ]
    layout = search.chosen
    row = layout_figures(plan, layout, search.tried[layout])
    out = [
        f"{layout.label}: {row['devices']} devices at ${row['price_per_hour_usd']:.2f}/h, "
        f"SLO met for {row['slo_attainment']:.1%} of requests"
    ]
    if layout.kind == COLOCATED:
        fewer = _fewer(search, layout, 0, -1)
        if fewer is not None:
            out.append(f"one replica fewer ({fewer[0].label}): SLO met for {fewer[1]:.1%}")
        return out
    out += _bottleneck(search, layout, row)
    share, link = row["transfer_share_of_ttft"], row["link_busy_fraction"]
    if share is not None:
        out.append(f"the KV transfer is {share:.1%} of the mean TTFT (links busy {link:.0%})")
    return out


def _choice(plan: DisaggregatedPlan, search: Search) -> dict[str, Any] | None:
    if search.chosen is None:
        return None
    return layout_figures(plan, search.chosen, search.tried[search.chosen])


def comparison(plan: DisaggregatedPlan, searches: list[Search], setting: str) -> str:
    """Co-located against disaggregated, for one speculation setting."""
    found = {s.kind: _choice(plan, s) for s in searches if s.setting == setting}
    colocated, split = found.get(COLOCATED), found.get(DISAGGREGATED)
    if colocated is None or split is None:
        missing = "co-located" if colocated is None else "disaggregated"
        return f"{setting}: no {missing} layout holds the SLO within the replicas searched"
    a, b = colocated["price_per_hour_usd"], split["price_per_hour_usd"]
    if a == b:
        verdict = "cost the same"
    else:
        cheaper = "disaggregated" if b < a else "co-located"
        verdict = f"{cheaper} is cheaper by ${abs(a - b):.2f}/h"
    return (
        f"{setting}: {split['layout']} (${b:.2f}/h) against {colocated['layout']} "
        f"(${a:.2f}/h): {verdict}"
    )


def _capacity(plan: DisaggregatedPlan, search: Search) -> dict[str, Any] | None:
    if search.headroom is None:
        return None
    return search.headroom.figures(plan.scale, plan.target_rps)


def json_summary(plan: DisaggregatedPlan, searches: list[Search]) -> dict[str, Any]:
    settings = list(dict.fromkeys(s.setting for s in searches))
    summary = {
        "command": "plan capacity --disaggregated",
        "scenario": plan.scenario.name,
        "target_rps": plan.target_rps,
        "attainment": plan.attainment,
        "tolerance": plan.tolerance,
        "max_replicas": plan.max_replicas,
        "replica_price_per_hour_usd": {
            "co-located": plan.pricing.colocated[0],
            "prefill": plan.pricing.prefill[0],
            "decode": plan.pricing.decode[0],
        },
        "searches": [
            {
                "setting": s.setting,
                "kind": s.kind,
                "chosen": _choice(plan, s),
                "layouts_tried": len(s.tried),
                "reasons": reasons(plan, s),
                "capacity": _capacity(plan, s),
            }
            for s in searches
        ],
        "comparison": [comparison(plan, searches, setting) for setting in settings],
        "candidates": candidate_rows(plan, searches),
        "pareto": [asdict(p) for p in pareto_points(plan, searches)],
        "failed": [lay.label for s in searches for lay, result in s.tried.items() if not result.ok],
    }
    if plan.deployments:
        summary["deployments"] = deployment_rows(plan)
        summary["not_fitting"] = not_fitting_rows(plan.unfit)
    return summary


def layouts_csv(plan: DisaggregatedPlan, searches: list[Search]) -> str:
    rows = [
        layout_figures(plan, layout, result)
        for search in searches
        for layout, result in search.tried.items()
    ]
    return rows_csv(CSV_COLUMNS, rows)


def candidates_csv(summary: dict[str, Any]) -> str:
    return rows_csv(CANDIDATE_COLUMNS, summary["candidates"])


def human(summary: dict[str, Any]) -> str:
    lines = [
        f"{summary['scenario']}: prefill/decode pools against co-located replicas at "
        f"{summary['target_rps']:g} req/s, SLO for {summary['attainment']:.0%} of requests"
    ]
    for search in summary["searches"]:
        lines.append(f"{search['setting']}, {search['kind']}:")
        lines += [f"  {reason}" for reason in search["reasons"]]
        if search["capacity"] is not None:
            lines.append(f"  {_headroom_line(search['capacity'], summary['tolerance'])}")
    lines += summary["comparison"]
    lines.append(frontier_line(summary["pareto"]))
    lines += [
        f"not fitting: {item['candidate']}: {item['reason']}"
        for item in summary.get("not_fitting", [])
    ]
    return "\n".join(lines)


def _headroom_line(capacity: dict[str, Any], tolerance: float) -> str:
    lo, hi = capacity["bracket_rps"]
    if capacity["status"] == "failed":
        return f"its capacity search failed: {capacity['error']}"
    if hi is None:
        return (
            f"holds the SLO at {lo:.4g} req/s, the highest rate searched (its capacity is at "
            "least that)"
        )
    return (
        f"holds the SLO up to {lo:.4g} req/s ({capacity['headroom']:+.0%} over the target; "
        f"{hi:.4g} req/s misses it, bisected to {tolerance:.0%})"
    )


def build(summary: dict[str, Any], attachments: dict[str, str] | None = None) -> Report:
    """report.html's content: the human summary's parts as sections, and the frontier plot."""
    sections = [
        Section(
            "Answer",
            [Paragraph(line) for line in summary["comparison"]]
            + [Paragraph(frontier_line(summary["pareto"]))],
        )
    ]
    for search in summary["searches"]:
        lines = list(search["reasons"])
        if search["capacity"] is not None:
            lines.append(_headroom_line(search["capacity"], summary["tolerance"]))
        sections.append(
            Section(f"{search['setting']}, {search['kind']}", [Paragraph(x) for x in lines])
        )
    unfit = [f"{item['candidate']}: {item['reason']}" for item in summary.get("not_fitting", [])]
    if unfit:
        sections.append(Section("Not fitting", [Paragraph(line) for line in unfit]))
    sections.append(Section("Pareto frontier", [pareto_plot(summary["pareto"])]))
    return Report(
        title=f"Disaggregated capacity plan: {summary['scenario']}",
        subtitle=f"prefill/decode pools against co-located replicas at {summary['target_rps']:g} "
        f"req/s, SLO for {summary['attainment']:.0%} of requests; every layout in layouts.csv, "
        "why each deployment won or lost in candidates.csv",
        sections=sections,
        attachments=dict(attachments or {}),
    )


def write(
    out: str | Path,
    plan: DisaggregatedPlan,
    searches,
    summary: dict[str, Any],
    attachments: dict[str, str] | None = None,
) -> None:
    """report.html, report.md, pareto_frontier.png (and its CSV), summary.json, layouts.csv,
    candidates.csv, pareto.csv and ``attachments`` (name -> text: the engines' files) into
    ``out``, atomically."""
    with atomic_output_dir(out) as staging:
        write_report(build(summary, attachments), staging)
        (staging / "summary.json").write_text(dump_json(summary), encoding="utf-8")
        (staging / "layouts.csv").write_text(layouts_csv(plan, searches), encoding="utf-8")
        (staging / "candidates.csv").write_text(candidates_csv(summary), encoding="utf-8")
        (staging / "pareto.csv").write_text(pareto_csv(summary["pareto"]), encoding="utf-8")
