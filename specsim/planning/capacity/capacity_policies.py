"""``plan capacity --policies``: the replicas each window policy needs for the target rate, per
drafter, which policy wins and where one needs more replicas than speculation off.

The plan's own search already holds speculation off, every k (the static policy: a drafter's
best k by the plan's ranking) and each drafter's goodput policy. ``--policies`` adds, searched
after it and in the same way, the engines' policies named (``window_policies.EXTRA_POLICIES``,
each starting where ``policy_compare.start_k`` says) and, with ``by_batch``, a k-by-batch table
per drafter, derived as ``plan window`` derives its table (``best_window_by_batch``) at the
context a sequence held in the drafter's best static candidate at its capacity.

The recommendation and its fleet check stay among the plan's own candidates; ``deployable``
names what ``--emit`` writes instead (the rule ``plan window`` and ``report drafter-swap``
follow): the best policy an engine runs, where it is not the static k and needs fewer replicas
than speculation off.

The winner needs the fewest replicas for the target, then costs least, then is the simplest
policy (``policy_compare``), then the first drafter asked for: replicas are the plan's
quantum, so capacities that round to the same fleet tie, as on cost in the plan's ranking.
The plan has one traffic level, its target rate; the verdict is a list of one per level.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from specsim.planning.capacity import capacity, capacity_report
from specsim.planning.capacity.capacity import choose_candidate, off_result
from specsim.planning.capacity.capacity_plan import Candidate, CapacityPlan
from specsim.planning.capacity.capacity_search import CandidateResult, find_capacities
from specsim.planning.common import answerable_k
from specsim.planning.policy_compare import (
    ADAPTIVE,
    BY_BATCH,
    STATIC,
    check_reach,
    simplicity,
    start_k,
)
from specsim.planning.report import Column, Paragraph, Section, Table, column_table
from specsim.planning.window.window_policies import EXTRA_POLICIES, LABELS
from specsim.planning.window.window_table import (
    best_window_by_batch,
    context_per_sequence,
    table_text,
)

TABLE = "k-by-batch"


def add(plan: CapacityPlan, names: tuple[str, ...]) -> None:
    """The policies to compare and the engines' policies' candidates (each beside a drafter's
    goodput policy, on its deployment); one-line error for a policy the profile cannot run."""
    if not names:
        return
    plan.policies = names
    for adaptive in [c for c in plan.candidates if c.policy == ADAPTIVE]:
        settings = plan.scenario.speculation.model_copy(update={"drafter": adaptive.drafter})
        check_reach(names, settings, answerable_k(adaptive.profile(plan), settings))
        for name in (n for n in names if n in EXTRA_POLICIES):
            k = start_k(name, settings, adaptive.k)
            label = adaptive.label.removesuffix(ADAPTIVE) + name
            plan.policy_candidates.append(replace(adaptive, label=label, k=k, policy=name))


def compared(plan: CapacityPlan) -> list[str]:
    """The policies judged: the static k and the goodput policy (always searched), and those
    ``--policies`` names, in ``LABELS``' order."""
    return [n for n in LABELS if n in (STATIC, ADAPTIVE, *plan.policies)]


def tables(plan: CapacityPlan, results: list[CandidateResult]) -> tuple[list, list]:
    """Each drafter's k-by-batch table as a (candidate, rows) pair, and why a drafter has
    none."""
    made: list[tuple[Candidate, list[dict[str, int]]]] = []
    missing: list[str] = []
    if BY_BATCH not in plan.policies:
        return made, missing
    for adaptive in [c for c in plan.candidates if c.policy == ADAPTIVE]:
        name = adaptive.label.removesuffix(f" {ADAPTIVE}")
        fixed = [r for r in _group(results, adaptive) if r.candidate.policy == "fixed"]
        best = choose_candidate(fixed)
        if best is None or best.at_capacity is None:
            missing.append(f"{name}: no static k sustains a rate to derive a table at")
            continue
        settings = plan.scenario.speculation.model_copy(update={"drafter": adaptive.drafter})
        rows = best_window_by_batch(
            adaptive.profile(plan),
            settings,
            sorted({0, *(r.candidate.k for r in fixed)}),
            plan.scenario.engine.max_batch,
            context_per_sequence([best.at_capacity]),
        )
        if all(row["k"] == 0 for row in rows):
            missing.append(f"{name}: with the drafter deployed no k beats k = 0 at any batch size")
            continue
        extra = (f"speculation.k_by_batch={table_text(rows)}",)
        top = max(row["k"] for row in rows)
        candidate = replace(adaptive, label=f"{name} {TABLE}", k=top, policy=BY_BATCH, extra=extra)
        made.append((candidate, rows))
    return made, missing


def run(plan: CapacityPlan, sweeper) -> dict[str, Any]:
    """The plan's search and fleet check, then the policies' own searches."""
    outcome = capacity.run(plan, sweeper)
    made, outcome["no_table"] = tables(plan, outcome["candidates"])
    outcome["tables"] = {c.label: rows for c, rows in made}
    searched = [*plan.policy_candidates, *(c for c, _ in made)]
    only = replace(plan, candidates=searched)
    outcome["policy_candidates"] = find_capacities(only, sweeper) if searched else []
    return outcome


def _group(results: list[CandidateResult], like: Candidate) -> list[CandidateResult]:
    return [
        r
        for r in results
        if r.candidate.drafter == like.drafter and r.candidate.deployment is like.deployment
    ]


def _policy(candidate: Candidate) -> str:
    return STATIC if candidate.policy == "fixed" else candidate.policy


def _fleet(result: CandidateResult | None) -> tuple[float, float]:
    """(replicas, cost): what the verdict orders by (no sustained rate: no fleet at all)."""
    if result is None or result.replicas is None:
        return math.inf, math.inf
    return result.replicas, result.cost_per_hour


def entries(plan: CapacityPlan, outcome: dict[str, Any]) -> list[dict[str, Any]]:
    """Per drafter (and deployment) and policy: its best candidate against speculation off."""
    results = [*outcome["candidates"], *outcome["policy_candidates"]]
    out = []
    for adaptive in [c for c in plan.candidates if c.policy == ADAPTIVE]:
        mine = _group(results, adaptive)
        off = off_result(outcome["candidates"], adaptive)
        for name in compared(plan):
            best = choose_candidate([r for r in mine if _policy(r.candidate) == name])
            searched = any(_policy(r.candidate) == name for r in mine)
            more = None if not searched else _fleet(best)[0] > _fleet(off)[0]
            item = {
                "drafter": adaptive.drafter,
                "policy": name,
                "candidate": None if best is None else best.candidate.label,
                "capacity_rps": None if best is None else best.capacity,
                "replicas": None if best is None else best.replicas,
                "cost_usd_per_hour": None if best is None else best.cost_per_hour,
                "replicas_without_speculation": off.replicas,
                "more_replicas_than_off": more,
            }
            if adaptive.deployment is not None:
                item["deployment"] = adaptive.deployment.label
            out.append({"json": item, "best": best, "off": off})
    return out


def _standing(found: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``entries`` that sustain a rate, best first: the fewest replicas, then the lowest cost,
    then the simplest policy, then the first drafter asked for."""
    order = {id(e): i for i, e in enumerate(found)}
    return sorted(
        (e for e in found if e["best"] is not None and e["best"].replicas is not None),
        key=lambda e: (*_fleet(e["best"]), simplicity(e["json"]["policy"]), order[id(e)]),
    )


def deployable(plan: CapacityPlan, outcome: dict[str, Any]) -> CandidateResult | None:
    """What ``--emit`` writes instead of the plan's own candidate: the best policy an engine
    runs (the goodput policy left out, as ``window_policies.deployable_winner`` leaves it),
    when that is not the static k and needs a smaller fleet than speculation off (None: the
    plan's own recommendation stands)."""
    if not plan.policies:
        return None
    runnable = [e for e in entries(plan, outcome) if e["json"]["policy"] != ADAPTIVE]
    best = next(iter(_standing(runnable)), None)
    if best is None or best["json"]["policy"] == STATIC:
        return None
    return best["best"] if _fleet(best["best"]) < _fleet(best["off"]) else None


def verdict(plan: CapacityPlan, outcome: dict[str, Any]) -> list[dict[str, Any]]:
    """The summary's ``policies``: one entry per traffic level (the target rate)."""
    found = entries(plan, outcome)
    standing = _standing(found)
    winner = standing[0] if standing else None
    tied = [
        e
        for e in standing[1:]
        if e["best"].replicas == winner["best"].replicas
        and math.isclose(e["best"].cost_per_hour, winner["best"].cost_per_hour, rel_tol=1e-9)
    ]
    other = next((e for e in standing if e is not winner), None)
    margin_replicas = margin = None
    if winner is not None and other is not None:
        margin_replicas = other["best"].replicas - winner["best"].replicas
        margin = _per_device(winner["best"]) / _per_device(other["best"]) - 1.0
    beats = None
    if winner is not None:
        beats = _fleet(winner["best"]) < _fleet(winner["off"])
    return [
        {
            "target_rps": plan.target_rps,
            "by_policy": [e["json"] for e in found],
            "winner": None if winner is None else _name(winner),
            "margin_replicas": margin_replicas,
            "margin": margin,
            "tied_with": [_name(e) for e in tied],
            "winner_beats_off": beats,
            "no_table": outcome["no_table"],
        }
    ]


def _per_device(result: CandidateResult) -> float:
    return result.capacity / result.candidate.devices


def _name(entry: dict[str, Any]) -> dict[str, Any]:
    item = entry["json"]
    return {"drafter": item["drafter"], "policy": item["policy"], "candidate": item["candidate"]}


def json_summary(plan: CapacityPlan, outcome: dict[str, Any], sweeper) -> dict[str, Any]:
    summary = capacity.json_summary(plan, outcome, sweeper)
    summary["policies"] = verdict(plan, outcome)
    return summary


# -- the report -----------------------------------------------------------------------------


def build(plan: CapacityPlan, outcome: dict[str, Any], summary: dict[str, Any]):
    """The capacity report with the section "Window policy at the target" before its method."""
    report = capacity_report.build(plan, outcome, summary)
    report.sections.insert(len(report.sections) - 1, section(plan, summary["policies"]))
    return report


def section(plan: CapacityPlan, levels: list[dict[str, Any]]) -> Section:
    blocks: list = []
    for level in levels:
        blocks.append(Paragraph(words(level)))
        blocks += [Paragraph(f"No k-by-batch table for {why}.") for why in level["no_table"]]
    blocks.append(table(plan, levels))
    return Section("Window policy at the target", blocks)


def _who(name: dict[str, Any]) -> str:
    return f"{name['drafter']} with the {LABELS[name['policy']]}"


def words(level: dict[str, Any]) -> str:
    """The verdict at one traffic level in a sentence or three."""
    at = f"At {level['target_rps']:g} req/s"
    winner = level["winner"]
    if winner is None:
        return f"{at} no policy sustains a rate within the SLO."
    mine = next(i for i in level["by_policy"] if i["candidate"] == winner["candidate"])
    text = f"{at} {_who(winner)} ({winner['candidate']}) " + _lead(level, mine)
    off = mine["replicas_without_speculation"]
    text += (
        f". Speculation off needs {off}."
        if level["winner_beats_off"]
        else f". It needs no fewer than speculation off ({off})."
    )
    more = [_who(i) for i in level["by_policy"] if i["more_replicas_than_off"]]
    if more:
        text += " More replicas than speculation off: " + ", ".join(more) + "."
    return text


def _lead(level: dict[str, Any], mine: dict[str, Any]) -> str:
    """How the winner leads: by replicas, or, tied on them, by cost or by simplicity."""
    replicas, cost = mine["replicas"], mine["cost_usd_per_hour"]
    level_with = [
        i
        for i in level["by_policy"]
        if i["replicas"] == replicas and i["candidate"] not in (None, mine["candidate"])
    ]
    if not level_with:
        if level["margin_replicas"] is None:
            return f"needs the fewest replicas, {replicas}"
        return (
            f"needs the fewest replicas, {replicas}, {level['margin_replicas']} fewer than the "
            f"next (capacity per device {level['margin']:+.1%})"
        )
    tied = {n["candidate"] for n in level["tied_with"]}
    dearer = [i for i in level_with if i["candidate"] not in tied]
    same = {n["policy"] == mine["policy"] for n in level["tied_with"]}
    by = {False: "the simpler policy", True: "the drafter given first"}
    decides = ", then ".join(by[p] for p in sorted(same))
    if not dearer:
        others = ", ".join(_who(i) for i in level_with)
        return (
            f"needs {replicas} replicas and ties on replicas and cost with {others}; {decides} wins"
        )
    text = f"needs {replicas} replicas and ties on them with "
    text += ", ".join(_who(i) for i in level_with)
    text += f"; it costs least (${cost:,.2f}/hour against "
    text += ", ".join(f"${i['cost_usd_per_hour']:,.2f}" for i in dearer) + ")"
    if tied:
        text += f"; at equal cost {decides} wins over "
        text += ", ".join(_who(n) for n in level["tied_with"])
    return text


def table(plan: CapacityPlan, levels: list[dict[str, Any]]) -> Table:
    def won(pair) -> bool:
        level, item = pair
        winner = level["winner"] or {}
        return item["candidate"] is not None and item["candidate"] == winner.get("candidate")

    def of(key: str):
        return lambda pair: pair[1][key]

    columns: list[Column] = [
        ("target (req/s)", lambda pair: pair[0]["target_rps"]),
        *([("deployment", of("deployment"))] if plan.deployments else []),
        ("drafter", of("drafter")),
        ("policy", lambda pair: LABELS[pair[1]["policy"]]),
        ("best candidate", of("candidate")),
        ("capacity (req/s)", of("capacity_rps")),
        ("replicas", of("replicas")),
        ("$/hour", of("cost_usd_per_hour")),
        ("replicas without speculation", of("replicas_without_speculation")),
        ("more replicas than speculation off", of("more_replicas_than_off")),
        ("winner", won),
    ]
    return column_table(
        "policies",
        columns,
        [(level, item) for level in levels for item in level["by_policy"]],
        "Each window policy's best candidate per drafter, and the replicas the target then "
        "needs; the winner needs the fewest replicas, then costs least, then is the simplest "
        "policy (compared, not recommended: the recommendation stays among the plan's own "
        "candidates)",
    )


def human(summary: dict[str, Any]) -> str:
    """The verdict's lines for the command's printout."""
    return "\n".join(f"policies: {words(level)}" for level in summary["policies"])
