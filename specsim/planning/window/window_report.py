"""The ``plan window`` report: tables and figures from the analysed sweep."""

from __future__ import annotations

import json
import math
from typing import Any

from specsim import axes as rules
from specsim.comparison import across_loads_text
from specsim.planning.common import (
    k_text,
    lossy_note,
    method_text,
    metric,
    plural,
    slo_text,
)
from specsim.planning.plots import Figure, Panel, Series, adaptive_star, adaptive_x, k_ticks
from specsim.planning.report import (
    Callout,
    Column,
    Paragraph,
    Report,
    Section,
    Table,
    column_table,
)
from specsim.planning.window.window import (
    ADAPTIVE,
    BY_BATCH,
    LoadResult,
    WindowPlan,
)
from specsim.planning.window.window_policies import LABELS, deployable_winner
from specsim.planning.window.window_policies import table as policies_table
from specsim.planning.window.window_table import vllm_ranges
from specsim.planning.window.window_table_report import (
    off_text,
    serving_config,
    table_section,
    verdict_text,
)
from specsim.planning.window.window_trees_report import human as trees_human
from specsim.planning.window.window_trees_report import section as trees_section

METRIC_COLUMNS = [
    ("throughput (tok/s)", "throughput_tokens_per_s", None),
    ("goodput (req/s)", "goodput_requests_per_s", None),
    ("TTFT p50 (s)", "ttft_s", "p50"),
    ("TTFT p99 (s)", "ttft_s", "p99"),
    ("TPOT p50 (s)", "tpot_s", "p50"),
    ("TPOT p99 (s)", "tpot_s", "p99"),
    ("e2e mean (s)", "e2e_s", "mean"),
    ("e2e p50 (s)", "e2e_s", "p50"),
    ("e2e p99 (s)", "e2e_s", "p99"),
    ("accept. length", "mean_acceptance_length", None),
    ("batch size", "batch_size", None),
    ("wasted FLOPs", "flops_wasted_fraction", None),
    ("$/M tokens", "cost_usd_per_million_tokens", None),
]


def _configs(plan: WindowPlan) -> list[str]:
    configs = [f"k={k}" for k in plan.ks]
    if max(plan.ks) > 0:
        configs.append(ADAPTIVE)
    return configs


def _against_k(plan, loads, title, ylabel, name, stat, unit, logy=False) -> Panel:
    """One line per load against k; a latency (``unit`` ms or s) is converted to its unit."""
    adaptive = ADAPTIVE in _configs(plan)
    panel = Panel(
        title,
        "k (drafted tokens per step)",
        ylabel,
        xticks=k_ticks(plan.ks, adaptive),
        logy=logy,
        integer_x=True,
        yunit=unit,
    )

    def value(summary):
        y = metric(summary, name, stat)
        return rules.latency(name, y) if name in rules.LATENCY_UNIT else y

    for colour, entry in zip(rules.gradient(len(loads)), loads, strict=True):
        label = plan.axis.fmt(entry.load)
        ys = [value(entry.summary(f"k={k}")) for k in plan.ks]
        panel.series.append(Series(label, [float(k) for k in plan.ks], ys, color=colour))
        if adaptive:
            y = value(entry.summary(ADAPTIVE))
            panel.series.append(adaptive_star(f"{label} adaptive", adaptive_x(plan.ks), y, colour))
    return panel


def _figures(plan: WindowPlan, loads: list[LoadResult]) -> list[Figure]:
    lat = []
    for metric_name, label in (("e2e_s", "end-to-end"), ("tpot_s", "TPOT"), ("ttft_s", "TTFT")):
        unit = rules.LATENCY_UNIT[metric_name]
        lat.append(
            Figure(
                name=f"{metric_name[:-2]}_vs_k",
                caption=f"{label} latency (p50 and p99) against k, one line per load "
                "(the star at the right is the adaptive policy)",
                panels=[
                    _against_k(
                        plan, loads, f"{label} p50", "latency", metric_name, "p50", unit, True
                    ),
                    _against_k(
                        plan, loads, f"{label} p99", "latency", metric_name, "p99", unit, True
                    ),
                ],
            )
        )
    throughput = Figure(
        name="throughput_vs_k",
        caption="Throughput and goodput against k, one line per load",
        panels=[
            _against_k(
                plan, loads, "Throughput", "throughput", "throughput_tokens_per_s", None, "tokens/s"
            ),
            _against_k(
                plan,
                loads,
                "Goodput (SLO-meeting)",
                "goodput",
                "goodput_requests_per_s",
                None,
                "req/s",
            ),
        ],
    )
    return [*lat, throughput, _best_k_figure(plan, loads)]


def _best_k_figure(plan: WindowPlan, loads: list[LoadResult]) -> Figure:
    """The best static k per load, and the speed-up over k = 0 of it, the adaptive policy and
    the k-by-batch table."""
    xs = [entry.load for entry in loads]
    speedup = [e.speedup(e.best) for e in loads]
    adaptive = [e.speedup(e.summary(ADAPTIVE)) for e in loads]
    table = [e.speedup(e.summary(BY_BATCH)) for e in loads]
    return Figure(
        name="best_k_vs_load",
        caption="Best static k per load (a marker per load simulated: between them nothing "
        "ran), and the mean end-to-end speed-up over k = 0 (above 1: speculation pays)",
        panels=[
            Panel(
                "Best static k",
                plan.axis.label,
                "k",
                [Series("best k", xs, [e.best_k for e in loads], linestyle="none", marker="s")],
                integer_y=True,
                xunit=plan.axis.unit,
            ),
            Panel(
                "Speed-up over k = 0 (mean e2e)",
                plan.axis.label,
                "speed-up",
                [
                    Series("best static k", xs, speedup),
                    Series("adaptive", xs, adaptive, linestyle="--"),
                    *(
                        [Series("k-by-batch table", xs, table, linestyle=":")]
                        if any(v is not None for v in table)
                        else []
                    ),
                ],
                hlines=[(1.0, "break-even")],
                xunit=plan.axis.unit,
                yunit="× k = 0",
                y_from=1.0,  # a speed-up is read against break-even
            ),
        ],
    )


def sweep_table(heads: list[str], items, columns=METRIC_COLUMNS) -> Table:
    """ "Every simulation of the sweep": per (leading cells, summary) item, the leading cells
    under ``heads`` and the summary's ``columns`` (empty where the run failed)."""
    rows = [[*lead, *[metric(s, n, st) for _, n, st in columns]] for lead, s in items]
    return Table("sweep", [*heads, *[c[0] for c in columns]], rows, "Every simulation of the sweep")


def _sweep_table(plan: WindowPlan, loads: list[LoadResult]) -> Table:
    items = []
    for entry in loads:
        for config in [*_configs(plan), *(c.config for c in plan.trees), BY_BATCH, *plan.policies]:
            result = entry.by_config.get(config)
            if result is not None:
                label = config if result.ok else f"{config} (failed)"
                items.append(([entry.load, label], entry.summary(config)))
    return sweep_table([plan.axis.label, "config"], items)


def build(plan: WindowPlan, outcome: dict[str, Any], summary: dict[str, Any]) -> Report:
    loads: list[LoadResult] = outcome["loads"]
    rows: list[dict[str, int]] = outcome["rows"]
    sections = [
        Section("Answer", _answer(plan, outcome, summary)),
        Section("Best k per load", [_best_k_table(plan, loads, summary)]),
        Section("Window policy per load", [policies_table(plan, outcome["policies"])]),
        *([trees_section(plan, summary["trees"])] if plan.trees else []),
        Section("k by batch size", table_section(plan, outcome, summary)),
        Section("Latency and throughput against k", _figures(plan, loads)),
        Section(
            "All simulations",
            [Paragraph(method_text(plan.scenario, plan.seed)), _sweep_table(plan, loads)],
        ),
    ]
    report = Report(
        title=f"Choosing k: {plan.scenario.name}",
        subtitle=f"{plural(len(plan.ks), 'value')} of k"
        + (" and the adaptive policy" if ADAPTIVE in _configs(plan) else "")
        + f" at {plural(len(loads), 'load')} ({plan.axis.label}); seed {plan.seed}.",
        sections=sections,
    )
    report.attachments["k_by_batch.yaml"] = serving_config(plan, rows, summary["k_by_batch"])
    return report


def _answer(plan: WindowPlan, outcome: dict[str, Any], summary: dict[str, Any]) -> list:
    """The answer in words: the choice rule, where speculation stops paying, the serving table."""
    loads: list[LoadResult] = outcome["loads"]
    spec = plan.scenario.speculation
    rule = (
        f"goodput under the SLO ({slo_text(plan.scenario)}), then mean end-to-end latency"
        if plan.use_slo
        else "mean end-to-end latency (the scenario sets no SLO)"
    )
    answer: list = [
        Paragraph(
            f"Scenario `{plan.scenario.name}`, drafter **{spec.drafter}**, verifier "
            f"**{spec.verifier}** at temperature {spec.temperature:g}; k chosen by {rule}."
        )
    ]
    off = off_text(plan, outcome)
    if off is not None:
        answer.append(Paragraph(off))
    elif any(e.best_k for e in loads):
        answer.append(Paragraph("Speculation pays at every load swept (k = 0 never wins)."))
    chosen = any(e.best_k for e in loads)
    answer.append(Paragraph(regressions_vs_off_text(summary["regressions_vs_k0"], chosen)))
    verdict = f"**{verdict_text(summary['k_by_batch'])}**"
    if outcome["rows"]:
        ranges = json.dumps(vllm_ranges(outcome["rows"]))
        verdict += (
            f" Its ranges for vLLM: `num_speculative_tokens_per_batch_size: {ranges}`; specsim "
            "`speculation.k_by_batch` in `k_by_batch.yaml`."
        )
    answer.append(Paragraph(verdict))
    note = lossy_note(plan.profile, spec)
    if note:
        answer.append(Callout(f"{note}. The speed-ups above are not free."))
    if summary["failed"]:
        answer.append(Callout(f"{len(summary['failed'])} simulations failed; see the sweep table."))
    if "screening" in summary:
        answer.append(Callout(screening_text(summary["screening"])))
    return answer


def screening_text(screening: dict[str, Any]) -> str:
    """What the screen pruned, in one sentence (the list is in summary.json)."""
    margin = screening["margin"]
    return (
        f"Screened: {screening['pruned']} of {screening['configurations']} points were not "
        "simulated, because their closed-form estimate, even with its margin (x"
        f"{math.exp(margin['e2e_log_ratio']):.3g} on mean E2E, x"
        f"{math.exp(margin['goodput_met_log_ratio']):.3g} on goodput), cannot beat the best "
        "simulated k at their load; summary.json lists each under `screening` with its reason. "
        "Rerun with --exhaustive to simulate them all."
    )


def _best_k_table(plan: WindowPlan, loads: list[LoadResult], summary: dict[str, Any]) -> Table:
    """Per load: the best static k, beside the adaptive policy and the derived k-by-batch table."""

    def best(name: str, stat: str | None = None):  # of the best static run, per (entry, item)
        return lambda pair: metric(pair[0].best, name, stat)

    columns: list[Column] = [
        (plan.axis.label, lambda pair: pair[0].load),
        *(
            [("offered (req/s)", lambda pair: pair[1]["offered_rps"])]
            if plan.axis.kind == "speed"
            else []
        ),
        ("best k", lambda pair: pair[0].best_k),
        ("batch size", best("batch_size")),
        ("speed-up vs k=0", lambda pair: pair[1]["e2e_speedup_vs_k0"]),
        ("e2e p99 (s)", best("e2e_s", "p99")),
        ("goodput (req/s)", best("goodput_requests_per_s")),
        ("adaptive e2e mean (s)", lambda pair: pair[1]["adaptive_e2e_mean_s"]),
        (
            "k-by-batch e2e mean (s)",
            lambda pair: metric(pair[0].summary(BY_BATCH), "e2e_s", "mean"),
        ),
        ("best static e2e mean (s)", lambda pair: pair[1]["best_e2e_mean_s"]),
    ]
    return column_table(
        "best_k",
        columns,
        list(zip(loads, summary["best_k"], strict=True)),
        "Best static k per load, with the adaptive policy and the derived k-by-batch table "
        "run at the same load",
    )


def policies_text(plan: WindowPlan, rows: list[dict[str, Any]]) -> str:
    """The policy verdict in one line: the winner per load, whether it beats k = 0, and the
    best an engine can run where the goodput policy wins."""
    parts = []
    for row in rows:
        if row["winner"] is None:
            continue
        beats = "beats k = 0" if row["winner_beats_off"] else "does not beat k = 0"
        text = f"{plan.axis.fmt(row['load'])} -> {LABELS[row['winner']]} ({beats})"
        runnable = deployable_winner(row["figures"], plan.use_slo)
        if runnable != row["winner"] and runnable is not None:
            text += f", of what an engine runs: {LABELS[runnable]}"
        parts.append(text)
    return "window policy: " + ("; ".join(parts) or "no load has every policy's run")


def human(plan: WindowPlan, summary: dict[str, Any]) -> str:
    """A few lines for the terminal."""
    axis = plan.axis
    sims = summary["simulations"]
    lines = [
        f"plan window: {plan.scenario.name}, drafter {summary['drafter']}, verifier "
        f"{summary['verifier']}; k {k_text(plan.ks)} at {plural(len(plan.loads), 'load')} "
        f"({sims['computed']} simulated, {sims['cached']} reused); "
        f"chosen by {summary['chosen_by']}",
        "best k: "
        + ", ".join(
            f"{axis.fmt(item['load'])} -> {'?' if item['best_k'] is None else item['best_k']}"
            for item in summary["best_k"]
        ),
    ]
    table = summary["k_by_batch"]
    off = table["speculation_off_above_load"]
    if summary["crossover_load"] is None:
        lines.append("speculation stops paying: not within the loads swept")
    elif off is None:
        lines.append("turn speculation off: k = 0 (no drafter) is best at every load swept")
    else:
        lines.append(
            f"turn speculation off above {axis.fmt(off)} "
            f"(k = 0 is best from {axis.fmt(summary['crossover_load'])} on)"
        )
    if table["rows"]:
        lines.append(
            "num_speculative_tokens_per_batch_size: "
            + json.dumps(table["num_speculative_tokens_per_batch_size"])
        )
    lines.append(verdict_text(table))
    if "screening" in summary:
        screening = summary["screening"]
        lines.append(
            f"screened: {screening['pruned']} of {screening['configurations']} points pruned "
            "(listed in summary.json; --exhaustive simulates them)"
        )
    chosen = any(item["best_k"] for item in summary["best_k"])
    lines.append(regressions_vs_off_text(summary["regressions_vs_k0"], chosen))
    if plan.policies:
        lines.append(policies_text(plan, summary["policies"]))
    if plan.trees:
        lines += trees_human(plan, summary["trees"])
    note = lossy_note(plan.profile, plan.scenario.speculation)
    if note:
        lines.append(f"note: {note}")
    return "\n".join(lines)


def regressions_vs_off_text(regressions: list[dict[str, Any]], chosen_anywhere: bool) -> str:
    """The sentence that states what the best k makes worse (or that nothing is)."""
    if not chosen_anywhere:
        return "Speculation is not chosen at any load, so nothing is compared with it off."
    if not regressions:
        return "No compared metric is worse at the best k than with speculation off, at any load."
    return f"Worse at the best k than with speculation off: {across_loads_text(regressions)}."
