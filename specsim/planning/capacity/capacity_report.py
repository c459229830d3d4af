"""The ``plan capacity`` report: capacity per candidate, replicas and cost, the fleet check."""

from __future__ import annotations

from typing import Any

from specsim.comparison import Change
from specsim.metrics import round_floats
from specsim.planning.capacity.capacity import (
    OFF,
    CandidateResult,
    CapacityPlan,
    attainment_of,
    attains_slo,
    fleet_changes,
)
from specsim.planning.capacity.capacity_figures import figures
from specsim.planning.capacity.capacity_pareto import (
    checked_too_words,
    deployment_table,
    pareto_figure,
    pareto_points,
    pareto_table,
    reasons,
)
from specsim.planning.common import lossy_note, method_text, metric, slo_text
from specsim.planning.report import (
    Callout,
    Column,
    Paragraph,
    Report,
    Section,
    Table,
    column_table,
)

PERCENTILE_COLUMNS = [
    (f"{label} {stat} (s)", name, stat)
    for name, label in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("e2e_s", "e2e"))
    for stat in ("p50", "p90", "p99")
]


CANDIDATE_COLUMNS: list[Column] = [
    ("candidate", lambda r: r.candidate.label),
    ("capacity (req/s)", lambda r: r.capacity),
    ("first failing (req/s)", lambda r: r.first_failing),
    ("search", lambda r: (r.error and f"failed: {r.error}") or r.search.status),
    ("probes", lambda r: len(r.probes)),
    ("replicas", lambda r: r.replicas),
    ("$/hour", lambda r: r.cost_per_hour),
    ("$/M tokens", lambda r: r.cost_per_million),
    ("TPOT p99 at capacity (s)", lambda r: metric(r.at_capacity, "tpot_s", "p99")),
    ("e2e p99 at capacity (s)", lambda r: metric(r.at_capacity, "e2e_s", "p99")),
    ("accept. length", lambda r: metric(r.at_capacity, "mean_acceptance_length")),
]


def _candidate_table(plan: CapacityPlan, results: list[CandidateResult]) -> Table:
    return column_table(
        "capacity",
        CANDIDATE_COLUMNS,
        results,
        f"Highest sustained rate per replica (bisection to {plan.tolerance:g} relative), and "
        f"what {plan.target_rps:g} req/s then needs",
    )


def _fleet_table(plan: CapacityPlan, fleet) -> Table:
    def summary(run):  # a (replicas, PointResult) pair's summary (None: the run failed)
        return run[1].summary if run[1].ok else None

    def meets(run) -> str:
        if attains_slo(summary(run), plan.attainment):
            return "yes"
        return "no" if run[1].ok else "failed"

    def of(name: str, stat: str | None = None):
        return lambda run: metric(summary(run), name, stat)

    columns: list[Column] = [
        ("replicas", lambda run: run[0]),
        ("SLO attainment", lambda run: attainment_of(summary(run))),
        ("meets SLO", meets),
        *[(label, of(name, stat)) for label, name, stat in PERCENTILE_COLUMNS],
        ("throughput (tok/s)", of("throughput_tokens_per_s")),
        ("$/M tokens", of("cost_usd_per_million_tokens")),
    ]
    return column_table("fleet", columns, fleet, f"Fleet simulation at {plan.target_rps:g} req/s")


def _against_off_table(plan: CapacityPlan, outcome: dict[str, Any], changes) -> Table:
    replicas = outcome["baseline_fleet"][0]
    rows = [
        [c.label, c.value, c.baseline, round_floats(c.worse_by), "worse" if c.worse else ""]
        for c in changes
    ]
    return Table(
        "fleet_vs_off",
        ["metric", "chosen fleet", f"speculation off, {replicas} replicas", "worse by", "verdict"],
        rows,
        f"The chosen fleet against speculation off on the replicas its capacity calls for, both "
        f"at {plan.target_rps:g} req/s (worse by: the relative change in the bad direction; "
        "negative = better)",
    )


def _against_off_words(summary: dict[str, Any]) -> str | None:
    """'Against speculation off on its N replicas: worse ...' for the answer and the summary."""
    rec = summary["recommendation"]
    worse = rec.get("regressions_vs_speculation_off") if rec else None
    if worse is None:
        return None
    off = rec["speculation_off_fleet"]
    head = f"against speculation off on its {off['replicas']} replicas at the target rate"
    if not off["meets_slo"]:
        head += " (a fleet that misses the SLO)"
    if not worse:
        compared = len(rec["compared_vs_speculation_off"])
        return f"{head}, none of the {compared} compared metrics is worse"
    return f"{head}, worse: " + ", ".join(Change(**item).words() for item in worse)


def build(plan: CapacityPlan, outcome: dict[str, Any], summary: dict[str, Any]) -> Report:
    results: list[CandidateResult] = outcome["candidates"]
    answer = _answer(plan, outcome, summary)
    sections = [Section("Answer", answer)]
    if plan.deployments:
        sections.append(_deployments_section(plan, outcome, summary))
    sections.append(
        Section(
            "Capacity per candidate", [_candidate_table(plan, results), *figures(plan, results)]
        )
    )
    if outcome["fleet"]:
        check = [_fleet_table(plan, outcome["fleet"])]
        changes = fleet_changes(outcome)
        if changes is not None:
            check.append(_against_off_table(plan, outcome, changes))
        sections.append(Section("Fleet check", check))
    sections.append(
        Section(
            "Method",
            [
                Paragraph(method_text(plan.scenario, plan.seed)),
                Paragraph(
                    f"Each candidate's rate is found by bisection on one replica, from "
                    f"{plan.scale.axis.fmt(plan.scale.axis.base)} outwards, until the highest "
                    f"sustained and the lowest failing load are within {plan.tolerance:.0%} of "
                    "each other; the sustained one is reported. The fleet check runs the chosen "
                    "candidate on the planned number of replicas behind the scenario's router "
                    f"({plan.scenario.fleet.router})."
                ),
            ],
        )
    )
    return Report(
        title=f"Capacity plan: {plan.scenario.name}",
        subtitle=f"{len(results)} candidates, bisection on the arrival rate; seed {plan.seed}.",
        sections=sections,
    )


def _deployments_section(plan: CapacityPlan, outcome: dict[str, Any], summary) -> Section:
    rows = summary["deployments"]
    points = pareto_points(outcome["candidates"])
    return Section(
        "Deployments",
        [
            *reasons(
                rows,
                outcome["chosen"],
                (summary["recommendation"] or {}).get("replicas"),
                summary["fleet_checked_too"],
            ),
            deployment_table(rows, plan.target_rps),
            pareto_table(points),
            pareto_figure(points),
        ],
    )


def _answer(plan: CapacityPlan, outcome: dict[str, Any], summary: dict[str, Any]) -> list:
    """The answer in words: the target, the recommendation, its confirmation, lossy notes."""
    target = (
        f"Target **{plan.target_rps:g} req/s** with the SLO {slo_text(plan.scenario)} met by "
        f"at least {plan.attainment:.0%} of requests; "
    )
    answer = _method_words(plan, target)
    if summary["recommendation"] is None:
        answer.append(
            Callout("no candidate sustains any rate within the SLO in the range searched")
        )
    else:
        answer += _recommendation_words(plan, outcome, summary)
    notes = {
        lossy_note(plan.profile, plan.scenario.speculation.model_copy(update={"drafter": d}))
        for d in {c.drafter for c in plan.candidates if c.drafter is not None}
    }
    for note in sorted(n for n in notes if n):
        answer.append(
            Callout(f"{note}; the capacities with speculation assume that is acceptable.")
        )
    return answer


def _method_words(plan: CapacityPlan, target: str) -> list:
    """What was searched and how candidates are ranked: one device kind, or deployments."""
    if not plan.deployments:
        return [
            Paragraph(
                target + f"{replica_devices(plan)} per replica at "
                f"${plan.profile.profile.hardware.price_per_hour_usd:g}/hour "
                f"({plan.profile.profile.hardware.name})."
            ),
            Paragraph(
                "Candidates are ranked by the replicas they need, at equal replicas speculation "
                "off first, then by their headroom (capacity per replica); a rate counts as "
                "sustained when the share above meets the SLO."
            ),
        ]
    fitting = sum(d.fits for d in plan.deployments)
    return [
        Paragraph(
            target + f"{len(plan.deployments)} deployments ({fitting} fit), a replica of "
            "TP devices each; a fleet costs replicas x TP x the device's price."
        ),
        Paragraph(
            "Candidates (deployment x speculation) are ranked by what their fleet costs, "
            "at equal cost speculation off first, then by the replicas and the capacity "
            "per device; a rate counts as sustained when the share above meets the SLO."
        ),
    ]


def _recommendation_words(plan: CapacityPlan, outcome: dict[str, Any], summary: dict) -> list:
    """The recommended fleet (or why it is unconfirmed), and how it compares with the rest."""
    rec = summary["recommendation"]
    answer: list = []
    chosen = outcome["chosen"]
    if rec["fleet_meets_slo"]:
        answer.append(
            Paragraph(
                f"**Run {rec['replicas']} replicas with {rec['candidate']}** "
                f"(${rec['cost_usd_per_hour']:,.2f}/hour"
                + (
                    f", ${chosen.cost_per_million:.3g} per million tokens"
                    if chosen.cost_per_million
                    else ""
                )
                + f"); {_fleet_words(plan, rec)}."
            )
        )
    else:
        answer.append(
            Callout(
                f"{rec['candidate']} needs {rec['planned_replicas']} replicas by capacity, "
                "but the fleet simulation missed the SLO even with "
                f"{len(outcome['fleet']) - 1} more; treat the plan as unconfirmed."
            )
        )
    if not plan.deployments:  # the deployments section says it otherwise
        answer += [Paragraph(checked_too_words(i)) for i in summary["fleet_checked_too"]]
    against = _against_off_words(summary)
    if against is not None:
        answer.append(Paragraph(against[0].upper() + against[1:] + "."))
    if rec["tie_on_cost"] is not None:
        answer.append(
            Paragraph(
                rec["tie_on_cost"]["reason"][0].upper() + rec["tie_on_cost"]["reason"][1:] + "."
            )
        )
    elif chosen.candidate.drafter is None:
        answer.append(Paragraph("Speculation does not reduce the replicas needed at this target."))
    elif rec["replicas_without_speculation"] is not None:
        answer.append(
            Paragraph(
                "Without speculation, capacity alone calls for "
                f"{rec['replicas_without_speculation']} replicas."
            )
        )
    return answer


def _fleet_words(plan: CapacityPlan, rec: dict[str, Any]) -> str:
    if rec["replicas"] == rec["planned_replicas"]:
        return f"the fleet simulation at {plan.target_rps:g} req/s meets the SLO"
    return (
        f"capacity alone suggested {rec['planned_replicas']}, but the fleet simulation at "
        f"{plan.target_rps:g} req/s needed {rec['replicas']} to meet the SLO"
    )


def human(plan: CapacityPlan, summary: dict[str, Any]) -> str:
    sims = summary["simulations"]
    lines = [
        f"plan capacity: {plan.scenario.name} for {plan.target_rps:g} req/s "
        f"({len(plan.candidates)} candidates, {sims['computed']} simulated, "
        f"{sims['cached']} reused)"
    ]
    for item in summary["candidates"]:
        cap = item["capacity_rps"]
        lines.append(
            f"  {item['label']:<24} "
            + (
                f"{cap:8.3g} req/s/replica -> {item['replicas']} replicas"
                if cap
                else item["status"]
            )
        )
    for item in summary.get("not_fitting", []):
        lines.append(f"  {item['candidate']:<24} does not fit: {item['reason']}")
    for item in summary.get("deployments", []):
        if not item["fits"]:
            lines.append(f"  {item['deployment']:<24} does not fit: {item['reason']}")
    rec = summary["recommendation"]
    if rec and rec["fleet_meets_slo"]:
        lines.append(
            f"recommendation: {rec['replicas']} replicas with {rec['candidate']} "
            f"(${rec['cost_usd_per_hour']:,.2f}/h); {_fleet_words(plan, rec)}"
        )
        if rec.get("devices") is not None:
            lines.append(
                f"  {rec['devices']} devices: {rec['replicas']} x TP{rec['tensor_parallel_size']}"
            )
        if rec["tie_on_cost"] is not None:
            lines.append(f"tie on cost: {rec['tie_on_cost']['reason']}")
        lines += [checked_too_words(item) for item in summary["fleet_checked_too"]]
        if not rec["candidate"].endswith(OFF):
            lines.append(
                f"without speculation: {rec['replicas_without_speculation']} replicas by capacity"
            )
        against = _against_off_words(summary)
        if against is not None:
            lines.append(against)
    elif rec:
        lines.append(
            f"recommendation unconfirmed: the fleet check missed the SLO ({rec['candidate']})"
        )
    else:
        lines.append("no candidate sustains a rate within the SLO")
    return "\n".join(lines)


def replica_devices(plan) -> str:
    """A replica's devices in words (a tensor-parallel profile's price is the replica's)."""
    devices = plan.profile.profile.hardware.devices
    return "one device" if devices == 1 else f"{devices} devices (tensor parallel)"
