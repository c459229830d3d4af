"""The drafter-swap report: acceptance, latency across load, throughput, waste, cost, best k."""

from __future__ import annotations

import statistics
from typing import Any

from specsim import axes as rules
from specsim.axes import styles
from specsim.planning.common import k_text, method_text, metric, plural, slo_text
from specsim.planning.plots import Figure, Panel, Series
from specsim.planning.report import (
    Callout,
    Column,
    Paragraph,
    Report,
    Section,
    Table,
    column_table,
)
from specsim.planning.swap.swap import DrafterPlan, SwapPlan, regression_sentences
from specsim.planning.window.window import LoadResult
from specsim.planning.window.window_report import METRIC_COLUMNS, sweep_table
from specsim.simulation.acceptance import window_rates

# plan window's sweep columns but those a drafter comparison leaves out.
SWEEP_COLUMNS = [
    column
    for column in METRIC_COLUMNS
    if column[0] not in ("TTFT p50 (s)", "e2e p50 (s)", "batch size")
]


def distribution_note(d: DrafterPlan) -> str:
    """'exact' or 'lossy (...)' with the distance from p, or a clear 'not measured'."""
    if not d.lossy:
        return "exact (output distributed as p)"
    if d.tv_distance is None:
        return "LOSSY: distance from p not measured (profile has no tv_distance)"
    return f"LOSSY: TV distance from p = {d.tv_distance:.3g}"


def _median(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _speedups(loads: list[LoadResult]) -> list[float | None]:
    return [e.speedup(e.best_setting) for e in loads]


def _figures(plan: SwapPlan, per: dict[str, list[LoadResult]]) -> list[Figure]:
    paint = _Painter(plan, per)
    return [_acceptance_figure(paint), _latency_figure(paint), _economics_figure(paint)]


class _Painter:
    """The series of a drafter-swap figure: a drafter keeps its colour and marker in every
    panel."""

    def __init__(self, plan: SwapPlan, per: dict[str, list[LoadResult]]):
        self.plan, self.per = plan, per
        self.style = dict(zip(per, styles(len(per)), strict=True))

    def drafter(self, name: str, label: str, xs, ys, **kwargs) -> Series:
        colour, marker = self.style[name]
        return Series(label, xs, ys, color=colour, marker=marker, **kwargs)

    def across(self, title, ylabel, unit, name, stat, logy=False, baseline=True, scale=1.0):
        """A panel of ``name`` across load: each drafter at its best k, and k = 0 dashed."""
        plan, axis = self.plan, self.plan.first.axis
        panel = Panel(title, axis.label, ylabel, logy=logy, xunit=axis.unit, yunit=unit)

        def value(summary):
            y = metric(summary, name, stat)
            if name in rules.LATENCY_UNIT:
                return rules.latency(name, y)
            return None if y is None else y * scale

        for d in plan.drafters:
            ys = [value(e.best_setting) for e in self.per[d.name]]
            panel.series.append(self.drafter(d.name, f"{d.name} (best k)", plan.loads, ys))
        if baseline:
            first = self.per[plan.drafters[0].name]
            ys = [value(e.summary("k=0")) for e in first]
            panel.series.append(
                Series("k = 0", plan.loads, ys, linestyle="--", marker="x", color="0.45")
            )
        return panel


def _acceptance_figure(paint: _Painter) -> Figure:
    plan, per = paint.plan, paint.per
    conditional = Panel(
        "Acceptance per position (profile, conditional)",
        "draft position",
        "P(accept | earlier accepted)",
        integer_x=True,
    )
    length = Panel(
        "Mean acceptance length (simulated, lowest load)",
        "k",
        "mean acceptance length",
        integer_x=True,
        yunit="tokens per step",
    )
    for d in plan.drafters:
        if d.tree is not None:  # its tree's length at its depth; its chain rates are not drawn
            y = metric(per[d.name][0].summary(d.tree.config), "mean_acceptance_length")
            length.series.append(paint.drafter(d.name, d.name, [d.tree.shape.depth], [y]))
            continue
        rates = d.acceptance.per_position
        positions = list(range(1, len(rates) + 1))
        conditional.series.append(paint.drafter(d.name, d.name, positions, list(rates)))
        ks = [k for k in plan.ks if k > 0]
        lengths = [metric(per[d.name][0].summary(f"k={k}"), "mean_acceptance_length") for k in ks]
        length.series.append(paint.drafter(d.name, d.name, ks, lengths))
    return Figure("acceptance", "Acceptance of each drafter", [conditional, length])


def _latency_figure(paint: _Painter) -> Figure:
    def latency(title, name, stat) -> Panel:
        return paint.across(title, "latency", rules.LATENCY_UNIT[name], name, stat, True)

    return Figure(
        "latency_vs_load",
        "Latency across load, each drafter at its best k per load (dashed: speculation off)",
        [
            latency("End-to-end p50", "e2e_s", "p50"),
            latency("End-to-end p99", "e2e_s", "p99"),
            latency("TPOT p99", "tpot_s", "p99"),
            latency("TTFT p99", "ttft_s", "p99"),
        ],
    )


def _economics_figure(paint: _Painter) -> Figure:
    plan, axis = paint.plan, paint.plan.first.axis
    best_k = Panel("Best k", axis.label, "k", integer_y=True, xunit=axis.unit)
    for d in plan.drafters:
        ys = [d.best_window(e) for e in paint.per[d.name]]
        # A marker per load simulated: a line between loads would draw a k that never ran.
        best_k.series.append(paint.drafter(d.name, d.name, plan.loads, ys, linestyle="none"))
    across = paint.across
    return Figure(
        "throughput_waste_cost",
        "Throughput, wasted FLOPs, cost per million tokens and the best k, across load "
        "(series drawn over each other keep their markers visible)",
        [
            across("Throughput", "throughput", "tokens/s", "throughput_tokens_per_s", None),
            across(
                "Wasted FLOPs (rejected drafts)",
                "wasted FLOPs",
                "% of FLOPs",
                "flops_wasted_fraction",
                None,
                baseline=False,
                scale=100.0,
            ),
            across(
                "Cost per million tokens",
                "cost",
                "USD per million tokens",
                "cost_usd_per_million_tokens",
                None,
            ),
            best_k,
        ],
    )


def _side_by_side(plan: SwapPlan, per, outcome) -> Table:
    top = max(plan.ks)

    def at_best(name: str):  # the median over the loads of a drafter's best setting's figure
        return lambda d: _median([metric(e.best_setting, name) for e in per[d.name]])

    def length(d: DrafterPlan):
        config = f"k={top}" if d.tree is None else d.tree.config
        return metric(per[d.name][0].summary(config), "mean_acceptance_length")

    tree = " (a tree drafter: its tree)" if any(d.tree for d in plan.drafters) else ""
    columns: list[Column] = [
        ("drafter", lambda d: d.name),
        ("verifier", lambda d: d.plan.scenario.speculation.verifier),
        ("output distribution", distribution_note),
        ("acceptance, position 1", lambda d: d.acceptance.per_position[0]),
        (f"accept. length at k={top}{tree}", length),
        (f"loads won (of {len(plan.loads)})", lambda d: outcome["wins"][d.name]),
        ("median speed-up vs k=0", lambda d: _median(_speedups(per[d.name]))),
        ("median wasted FLOPs", at_best("flops_wasted_fraction")),
        ("median $/M tokens", at_best("cost_usd_per_million_tokens")),
    ]
    return column_table(
        "drafters",
        columns,
        plan.drafters,
        "Side by side (medians over the loads, each drafter at its best k)",
    )


def _acceptance_table(plan: SwapPlan, per) -> Table:
    """Per position: the rate the simulator chains (``window_rates``), what it implies, and what
    the simulation saw."""
    top = max(plan.ks)
    rows = []
    for d in plan.drafters:
        if d.tree is not None:
            continue  # a tree's acceptance is its accepted-length table, not positions
        rates = window_rates(d.acceptance)
        simulated = (per[d.name][0].summary(f"k={top}") or {}).get("per_position_acceptance") or []
        chained = 1.0
        for i in range(top):
            rate = rates[min(i, len(rates) - 1)]
            chained *= rate
            seen = simulated[i] if i < len(simulated) else None
            rows.append([d.name, i + 1, rate, chained, seen])
    return Table(
        "acceptance_per_position",
        [
            "drafter",
            "position",
            "profile: P(accept, given earlier accepted)",
            "profile: P(first i accepted)",
            f"simulated at k={top}: P(first i accepted)",
        ],
        rows,
        "Per-position acceptance (vLLM's per-position metric is the unconditional one; the "
        "simulation includes request heterogeneity and, for prompt lookup, steps without a "
        "proposal)",
    )


def _per_load(plan: SwapPlan, per, outcome) -> Table:
    columns = [plan.first.axis.label]
    for d in plan.drafters:
        columns += [f"{d.name}: best k", f"{d.name}: e2e p99 (s)", f"{d.name}: tok/s"]
    columns.append("best drafter")
    rows = []
    for i, load in enumerate(plan.loads):
        row: list[Any] = [load]
        for d in plan.drafters:
            e = per[d.name][i]
            row += [
                e.best_k if d.tree is None else e.best_config,
                metric(e.best_setting, "e2e_s", "p99"),
                metric(e.best_setting, "throughput_tokens_per_s"),
            ]
        row.append(outcome["winners"][i]["drafter"])
        rows.append(row)
    return Table("per_load", columns, rows, "Each load: the drafters at their best k")


def _all(plan: SwapPlan, per) -> Table:
    items = []
    for d in plan.drafters:
        configs = [(k, f"k={k}") for k in d.plan.ks]
        configs += [] if d.tree is None else [(d.tree.config, d.tree.config)]
        for e in per[d.name]:
            items += [([d.name, e.load, k], e.summary(config)) for k, config in configs]
    return sweep_table(["drafter", plan.first.axis.label, "k"], items, SWEEP_COLUMNS)


def build(plan: SwapPlan, outcome: dict[str, Any], summary: dict[str, Any]) -> Report:
    per = outcome["per_drafter"]
    first = plan.first
    rule = (
        f"goodput under the SLO ({slo_text(first.scenario)}), then mean end-to-end latency"
        if first.use_slo
        else "mean end-to-end latency"
    )
    best = outcome["recommended"]
    rec = [
        Paragraph(
            f"**Recommendation: {best}.** Drafters compared at their best k per load, "
            f"chosen by {rule}."
        ),
        *[Paragraph(text) for text in outcome["reasons"]],
    ]
    for d in plan.drafters:
        if d.lossy:
            gain = _median(_speedups(per[d.name]))
            gain_text = f"its median speed-up over k = 0 is {gain:.2f}x, but " if gain else ""
            rec.append(
                Callout(
                    f"{d.name} runs with the {d.plan.scenario.speculation.verifier} verifier: "
                    f"{gain_text}the output is not the target's distribution "
                    f"({distribution_note(d)})."
                )
            )
    if summary["failed"]:
        rec.append(Callout(f"{len(summary['failed'])} simulations failed; see the sweep table."))
    sections = [
        Section("Recommendation", rec),
        Section("Side by side", [_side_by_side(plan, per, outcome), _per_load(plan, per, outcome)]),
    ]
    figures = _figures(plan, per)
    sections.append(Section("Acceptance", [figures[0], _acceptance_table(plan, per)]))
    sections.append(Section("Latency across load", [figures[1]]))
    sections.append(Section("Throughput, waste, cost and best k", [figures[2]]))
    sections.append(
        Section(
            "All simulations", [Paragraph(method_text(first.scenario, plan.seed)), _all(plan, per)]
        )
    )
    names = " vs ".join(d.name for d in plan.drafters)
    return Report(
        title=f"Drafter swap: {names}",
        subtitle=f"Scenario `{first.scenario.name}`; k {k_text(plan.ks)} at "
        f"{plural(len(plan.loads), 'load')} ({first.axis.label}); seed {plan.seed}.",
        sections=sections,
    )


def human(plan: SwapPlan, summary: dict[str, Any]) -> str:
    sims = summary["simulations"]
    lines = [
        f"report drafter-swap: {' vs '.join(d.name for d in plan.drafters)} on "
        f"{plan.first.scenario.name} ({sims['computed']} simulated, {sims['cached']} reused)",
        f"recommendation: {summary['recommendation']['drafter']}",
    ]
    rec = summary["recommendation"]
    shown = rec["reasons"][:3]
    # What the recommendation costs is always printed, however many reasons come before it.
    shown += [r for r in regression_sentences(rec["drafter"], rec["regressions"]) if r not in shown]
    lines += [f"  {r}" for r in shown]
    for d in plan.drafters:
        if d.lossy:
            lines.append(f"note: {d.name}: {distribution_note(d)}")
    return "\n".join(lines)
